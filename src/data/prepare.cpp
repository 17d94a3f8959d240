// prepare_data: corpus -> tokenizer -> train/val shards + meta.json.
// Behaviour (split rule, idempotence key, atomicity) in
// include/snip/data/prepare.h.
#include "snip/data/prepare.h"

#include "snip/data/data_folder.h"


#include <cerrno>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <optional>
#include <memory>
#include <thread>

#include <signal.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "rng.h"
#include "brown.h"
#include "corpus.h"
#include "debian_corpus.h"
#include "snip/data/shard.h"
#include "snip/data/tokenizer.h"
#include "snip/io/atomic_file.h"
#include "snip/io/signal_cleanup.h"
#include "snip/core/error.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace snip::data {
namespace {

// Part of the up-to-date key: a change in how documents are read or split
// makes earlier preparations stale. 2: text normalisation at read (a leading
// BOM dropped, CRLF/CR read as LF; corpus.h).
constexpr int kMetaVersion = 2;
constexpr uint64_t kSplitSalt = 0x53504C4954ull;  // "SPLIT"
constexpr double kCharacterCoverage = 0.9995;

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string fmt_count(uint64_t v) {
  std::string s = std::to_string(v);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}

std::string fmt_secs(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", s);
  return buf;
}

// One --input with the files it expands to.
struct ExpandedInput {
  std::string path;
  std::vector<InputFile> files;
  std::string kind;  // "folder", "text", "jsonl"
};

std::string fingerprint(const std::vector<InputFile>& files) {
  std::string s;
  for (const auto& f : files) s += f.path + '\0' + std::to_string(f.bytes) + '\0' + std::to_string(f.mtime_ns) + '\n';
  return sha256_hex(s);
}

// Best effort removal of the staging folder (and of out_dir if we made it).
class Staging {
 public:
  Staging(std::string out_dir, bool created_out_dir) : out_(std::move(out_dir)), created_(created_out_dir) {
    dir_ = (fs::path(out_) / (".prepare.tmp." + std::to_string(::getpid()))).string();
    std::error_code ec;
    fs::remove_all(dir_, ec);
    if (!fs::create_directory(dir_, ec) || ec) {
      const std::string why = ec ? ec.message() : "cannot create a folder in it";
      rollback();
      fail("output directory ", out_, " is not writable: ", why);
    }
    // SIGINT/SIGTERM remove it too, when the program installed the watcher
    // (snip-data does; io/signal_cleanup.h).
    on_signal_ = std::make_unique<io::CleanupOnSignal>(dir_, created_ ? out_ : "");
  }
  ~Staging() {
    if (!committed_) rollback();
  }
  std::string file(const char* name) const { return (fs::path(dir_) / name).string(); }
  void commit(const std::vector<const char*>& names) {
    std::error_code ec;
    const std::string meta = (fs::path(out_) / "meta.json").string();
    fs::remove(meta, ec);  // from here until meta.json is renamed in, out_dir is "not prepared"
    for (const char* n : names) io::rename_atomic(file(n), (fs::path(out_) / n).string());
    fs::remove_all(dir_, ec);
    committed_ = true;
  }

 private:
  void rollback() noexcept {
    std::error_code ec;
    fs::remove_all(dir_, ec);
    if (created_ && fs::is_empty(out_, ec)) fs::remove(out_, ec);
  }
  std::string out_, dir_;
  bool created_;
  bool committed_ = false;
  std::unique_ptr<io::CleanupOnSignal> on_signal_;  // destroyed after rollback() ran
};

// Removes out_dir/.prepare.tmp.<pid> folders left by a prepare that was killed
// (SIGKILL, a crash, power loss): those whose <pid> names no process
// (kill(pid, 0) fails with ESRCH). A live <pid> (also one of another user:
// EPERM) may be a prepare at work and is left alone; so is a <pid> reused by
// an unrelated process (the folder goes on a later run). Best effort: a
// folder that cannot be removed stays, reported at debug level.
void remove_stale_staging(const std::string& out_dir, const std::function<void(const std::string&)>& report) {
  std::error_code ec;
  if (!fs::is_directory(out_dir, ec)) return;
  const std::string prefix = ".prepare.tmp.";
  std::vector<std::pair<fs::path, long>> stale;  // collected first: no removal while iterating
  for (fs::directory_iterator it(out_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string digits = name.substr(prefix.size());
    if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    const long pid = std::stol(digits);
    if (pid <= 0 || pid == static_cast<long>(::getpid())) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    stale.emplace_back(it->path(), pid);
  }
  for (const auto& [path, pid] : stale) {
    std::error_code rm;
    fs::remove_all(path, rm);
    if (rm)
      spdlog::debug("cannot remove stale staging folder {}: {}", path.string(), rm.message());
    else
      report(str_cat("removed stale staging folder ", path.string(), " (process ", pid, " is gone)"));
  }
}

// The key's name of a built-in corpus: the package it comes from, with its
// version (a Debian update of the text re-prepares the data); null for none.
json corpus_key(const std::string& corpus) {
  if (corpus.empty()) return nullptr;
  if (corpus == "brown") return kBrownPackage;
  const std::string pkg = corpus == "kjv" ? "bible-kjv-text" : kWordnetPackage;
  const std::string v = debian_package_version(pkg);
  return "debian:" + pkg + (v.empty() ? "" : "=" + v);
}

// The sources an up-to-date key names: the corpus, then the --input paths
// ("brown", "notes.txt, more/").
std::string sources_of(const json& key) {
  std::string s = key.value("corpus", json()).is_string() ? key["corpus"].get<std::string>() : "";
  if (key.contains("inputs") && key["inputs"].is_array())
    for (const auto& i : key["inputs"])
      if (i.is_object() && i.contains("path") && i["path"].is_string())
        s += (s.empty() ? "" : ", ") + i["path"].get<std::string>();
  return s;
}

// Returns the reason meta.json in out_dir is not up to date with `key`, or ""
// if it is; fills `summary` from it when it is. When meta.json holds another
// key, `prepared_from` gets the sources that key names.
std::string check_up_to_date(const std::string& out_dir, const json& key, PrepareSummary& summary,
                             std::optional<std::string>& prepared_from) {
  const fs::path out(out_dir);
  std::error_code ec;
  if (!fs::exists(out / "meta.json", ec)) return "no meta.json";
  json meta;
  try {
    meta = json::parse(io::read_file((out / "meta.json").string()));
    if (meta.value("key", json()) != key) {
      if (meta.contains("key") && meta["key"].is_object()) prepared_from = sources_of(meta["key"]);
      return "options or inputs changed";
    }
    const std::string tok = io::read_file((out / "tokenizer.model").string());
    if (sha256_hex(tok) != meta.at("tokenizer").at("sha256").get<std::string>()) return "tokenizer.model changed";
    ShardReader train((out / "train.bin").string());
    ShardReader val((out / "val.bin").string());
    if (train.size() != meta.at("tokens").at("train").get<uint64_t>() ||
        val.size() != meta.at("tokens").at("val").get<uint64_t>())
      return "shard sizes differ from meta.json";
    summary.documents = meta.at("documents").at("total").get<uint64_t>();
    summary.train_documents = meta.at("documents").at("train").get<uint64_t>();
    summary.val_documents = meta.at("documents").at("val").get<uint64_t>();
    summary.train_tokens = train.size();
    summary.val_tokens = val.size();
    summary.vocab_size = meta.at("vocab_size").get<int>();
    summary.tokenizer_trained = meta.at("tokenizer").at("trained").get<bool>();
    summary.tokenizer_sha256 = meta.at("tokenizer").at("sha256").get<std::string>();
    for (const auto& s : meta.at("sources")) {
      summary.sources.push_back({s.at("kind").get<std::string>(), s.at("path").get<std::string>(),
                                 s.at("files").get<uint64_t>(), s.at("documents").get<uint64_t>(),
                                 s.at("bytes").get<uint64_t>(), {}});
      if (s.contains("skipped"))
        for (const auto& k : s.at("skipped"))
          summary.sources.back().skipped.emplace_back(k.at("path").get<std::string>(), k.at("reason").get<std::string>());
    }
  } catch (const std::exception& e) {
    return std::string("existing output unreadable (") + e.what() + ")";
  }
  return "";
}

}  // namespace


std::string default_prepare_dir(const std::vector<std::string>& inputs, const std::string& corpus) {
  if (inputs.empty()) return "data/" + (corpus.empty() ? std::string("kjv") : corpus);
  fs::path p = fs::path(inputs.front()).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "texts/" -> "texts"
  std::string name = p.stem().string();
  if (name.empty() || name == "." || name == "..") name = "corpus";
  return "data/" + name;
}

PrepareSummary prepare_data(const PrepareOptions& opt, const PrepareProgress& progress) {
  const auto t_start = Clock::now();
  auto report = [&](const std::string& line) {
    spdlog::info("{}", line);
    if (progress) progress(line);
  };

  // ---- validate options (nothing touched on disk yet)
  if (opt.corpus != "" && opt.corpus != "kjv" && opt.corpus != "wordnet" && opt.corpus != "brown")
    fail("corpus: expected \"kjv\", \"wordnet\", \"brown\" or none, got \"", opt.corpus, "\"");
  if (opt.corpus.empty() && opt.inputs.empty())
    fail("no corpus given: pass --input PATH (repeatable) or --corpus kjv|wordnet|brown");
  if (opt.out_dir.empty()) fail("out_dir: expected a folder path, got an empty string");
  if (!(opt.val_fraction >= 0.0 && opt.val_fraction < 1.0))
    fail("val_fraction: expected a fraction in [0, 1), got ", opt.val_fraction);
  if (opt.tokenizer_model.empty() && (opt.vocab_size < kMinTrainedVocab || opt.vocab_size > kMaxVocab))
    fail("vocab_size: expected an integer in [", kMinTrainedVocab, ", ", kMaxVocab, "], got ", opt.vocab_size);
  if (opt.text_field.empty()) fail("text_field: expected a JSONL field name, got an empty string");

  // ---- expand inputs, build the up-to-date key
  std::vector<ExpandedInput> inputs;
  json key_inputs = json::array();
  for (const auto& p : opt.inputs) {
    ExpandedInput in{p, list_input_files(p), ""};
    std::error_code ec;
    in.kind = fs::is_directory(p, ec) ? "folder" : (in.files[0].kind == InputKind::kJsonl ? "jsonl" : "text");
    key_inputs.push_back({{"path", p}, {"files", in.files.size()}, {"fingerprint", fingerprint(in.files)}});
    inputs.push_back(std::move(in));
  }
  std::string given_tokenizer;  // bytes of --tokenizer, if any
  json key_tokenizer;
  if (!opt.tokenizer_model.empty()) {
    given_tokenizer = Tokenizer::load(opt.tokenizer_model).serialized();
    key_tokenizer = {{"model_sha256", sha256_hex(given_tokenizer)}};
  } else {
    key_tokenizer = {{"train", {{"model_type", "bpe"}, {"vocab_size", opt.vocab_size},
                                {"character_coverage", kCharacterCoverage}, {"byte_fallback", true}}}};
  }
  json key = {{"version", kMetaVersion},
              {"corpus", corpus_key(opt.corpus)},
              {"inputs", key_inputs},
              {"tokenizer", key_tokenizer},
              {"val_fraction", opt.val_fraction},
              {"seed", opt.seed},
              {"text_field", opt.text_field},
              {"document_encoding", "[bos] + pieces + [eos]"}};
  // Only when given, so folders prepared without it stay up to date; a folder
  // prepared with it is prepared again without it (and stops at the file).
  if (opt.skip_invalid) key["skip_invalid"] = true;

  const fs::path out(opt.out_dir);
  auto fresh_summary = [&] {
    PrepareSummary s;
    s.out_dir = opt.out_dir;
    s.tokenizer_path = (out / "tokenizer.model").string();
    s.train_path = (out / "train.bin").string();
    s.val_path = (out / "val.bin").string();
    s.meta_path = (out / "meta.json").string();
    return s;
  };
  remove_stale_staging(opt.out_dir, report);
  PrepareSummary summary = fresh_summary();
  std::optional<std::string> prepared_from;
  const std::string stale = check_up_to_date(opt.out_dir, key, summary, prepared_from);
  if (stale.empty()) {
    summary.up_to_date = true;
    summary.seconds = since(t_start);
    report(str_cat(opt.out_dir, " is up to date (meta.json matches the options and inputs)"));
    return summary;
  }
  // A run folder (or a checkpoint) is never a data folder.
  for (const char* mark : {"checkpoints", "trainer_state.json", "metrics.jsonl"})
    if (fs::exists(out / mark))
      fail("--out ", opt.out_dir, " is a run folder of `snip train` (it holds ", mark, "): choose another --out");
  // A folder prepared from other sources is not replaced without --force.
  if (prepared_from && !opt.force && *prepared_from != sources_of(key))
    fail("--out ", opt.out_dir, " holds data prepared from ", prepared_from->empty() ? "(unknown)" : *prepared_from,
         "; this run reads ", sources_of(key), ": choose another --out, or pass --force to replace it");
  summary = fresh_summary();
  spdlog::debug("preparing {}: {}", opt.out_dir, stale);

  // ---- output folder (fail early if unwritable) and staging area
  std::error_code ec;
  bool created = false;
  if (fs::exists(out, ec)) {
    if (!fs::is_directory(out, ec)) fail("output directory ", opt.out_dir, " exists and is not a folder");
  } else {
    fs::create_directories(out, ec);
    if (ec) fail("output directory ", opt.out_dir, " cannot be created: ", ec.message());
    created = true;
  }
  Staging staging(opt.out_dir, created);

  // ---- read documents
  auto t0 = Clock::now();
  std::vector<std::string> docs;
  if (opt.corpus == "kjv" || opt.corpus == "wordnet") {
    const bool kjv = opt.corpus == "kjv";
    SourceSummary s{opt.corpus, kjv ? "bible -f Gen1:1-Rev22:21" : kWordnetDir, 0, 0, 0, {}};
    for (auto& d : kjv ? read_kjv() : read_wordnet()) {
      ++s.documents;
      s.bytes += d.size();
      docs.push_back(std::move(d));
    }
    s.files = kjv ? 1 : 4;
    summary.sources.push_back(s);
  }
  if (opt.corpus == "brown") {
    const std::string dir = ensure_brown(opt.cache_dir);
    SourceSummary s{"brown", dir, 0, 0, 0, {}};
    for (auto& d : read_brown(dir)) {
      ++s.files;
      if (!has_text(d.text)) continue;
      ++s.documents;
      s.bytes += d.text.size();
      docs.push_back(std::move(d.text));
    }
    summary.sources.push_back(s);
  }
  for (const auto& in : inputs) {
    SourceSummary s{in.kind, in.path, 0, 0, 0, {}};
    const size_t first = docs.size();
    for (const auto& f : in.files) {
      const size_t before = docs.size();
      try {
        read_documents(f, opt.text_field, docs);
      } catch (const UserError& e) {
        if (!opt.skip_invalid) throw UserError(str_cat(e.what(), " (--skip-invalid leaves such files out)"));
        docs.resize(before);  // none of the file's documents, not the ones before its bad line
        s.skipped.emplace_back(f.path, e.what());
        spdlog::warn("skipped the whole file {} (--skip-invalid): {}", f.path, e.what());
        continue;
      }
      ++s.files;
    }
    s.documents = docs.size() - first;
    for (size_t i = first; i < docs.size(); ++i) s.bytes += docs[i].size();
    summary.sources.push_back(s);
  }
  uint64_t total_bytes = 0;
  for (const auto& s : summary.sources) total_bytes += s.bytes;
  summary.documents = docs.size();
  if (docs.empty()) {
    std::string where;
    for (const auto& s : summary.sources) where += (where.empty() ? "" : ", ") + s.path;
    const size_t skipped = summary.skipped_files();
    if (skipped > 0)
      fail("corpus is empty: --skip-invalid left out ", skipped, " input file", skipped == 1 ? "" : "s",
           " and the rest hold no non-whitespace text (", where, ")");
    fail("corpus is empty: no non-whitespace text in ", where);
  }
  const size_t skipped_files = summary.skipped_files();
  report(str_cat("read ", fmt_count(docs.size()), " documents (", fmt_count(total_bytes), " bytes) from ",
                 summary.sources.size(), " source(s) in ", fmt_secs(since(t0)),
                 skipped_files ? str_cat(" (", skipped_files, " file(s) skipped: --skip-invalid)") : ""));

  // ---- tokenizer
  t0 = Clock::now();
  Tokenizer tok = given_tokenizer.empty()
                      ? train_tokenizer(docs, {opt.vocab_size, kCharacterCoverage, opt.seed})
                      : Tokenizer::from_serialized(given_tokenizer, "tokenizer " + opt.tokenizer_model);
  summary.tokenizer_trained = given_tokenizer.empty();
  summary.vocab_size = tok.vocab_size();
  summary.tokenizer_sha256 = sha256_hex(tok.serialized());
  tok.save(staging.file("tokenizer.model"));
  if (summary.tokenizer_trained)
    report(str_cat("trained BPE tokenizer (vocab ", summary.vocab_size, ") in ", fmt_secs(since(t0))));
  else
    report(str_cat("using tokenizer ", opt.tokenizer_model, " (vocab ", summary.vocab_size, ")"));

  // ---- split
  const uint64_t n = docs.size();
  uint64_t n_val = 0;
  if (opt.val_fraction > 0 && n >= 2)
    n_val = std::min<uint64_t>(n - 1, std::max<uint64_t>(1, static_cast<uint64_t>(std::llround(opt.val_fraction * n))));
  std::vector<char> is_val(n, 0);
  {
    const auto perm = detail::seeded_permutation<uint64_t>(n, detail::stream_key(opt.seed, kSplitSalt));
    for (uint64_t i = 0; i < n_val; ++i) is_val[perm[i]] = 1;
  }
  summary.val_documents = n_val;
  summary.train_documents = n - n_val;
  report(str_cat("split: ", fmt_count(n - n_val), " train / ", fmt_count(n_val), " validation documents (val_fraction ",
                 opt.val_fraction, ", seed ", opt.seed, n_val > 0 && double(n_val) > 2 * opt.val_fraction * double(n)
                 ? "; at least one validation document, so more than the fraction" : "", ")"));
  if (n_val == 0)
    spdlog::warn("no validation documents ({}): val.bin is empty, and `snip train` and `snip eval` need one; {}",
                 opt.val_fraction == 0 ? "--val-fraction 0" : "the corpus has one document",
                 opt.val_fraction == 0 ? "raise --val-fraction" : "give more text (two documents at least)");

  // ---- encode and write shards
  t0 = Clock::now();
  const auto v = static_cast<uint32_t>(summary.vocab_size);
  ShardWriter train(staging.file("train.bin"), v);
  ShardWriter val(staging.file("val.bin"), v);
  // Documents are encoded in parallel in blocks (SentencePiece's Encode is
  // const and thread-safe) and appended in corpus order, so the output does
  // not depend on the thread count.
  const size_t threads = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
  constexpr size_t kBlock = 512;
  std::vector<std::vector<int32_t>> encoded(kBlock);
  for (size_t begin = 0; begin < n; begin += kBlock) {
    const size_t end = std::min<size_t>(n, begin + kBlock);
    std::vector<std::thread> pool;
    std::vector<std::exception_ptr> errors(threads);
    for (size_t w = 0; w < threads; ++w)
      pool.emplace_back([&, w] {
        try {
          for (size_t i = begin + w; i < end; i += threads) encoded[i - begin] = tok.encode_document(docs[i]);
        } catch (...) {
          errors[w] = std::current_exception();
        }
      });
    for (auto& th : pool) th.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
    for (size_t i = begin; i < end; ++i) {
      (is_val[i] ? val : train).append(encoded[i - begin]);
      std::vector<int32_t>().swap(encoded[i - begin]);
      std::string().swap(docs[i]);  // release text as we go
    }
  }
  summary.train_tokens = train.count();
  summary.val_tokens = val.count();
  const ShardDtype dtype = train.dtype();
  train.commit();
  val.commit();
  report(str_cat("wrote ", fmt_count(summary.train_tokens), " train + ", fmt_count(summary.val_tokens), " val tokens (",
                 dtype_name(dtype), ") in ", fmt_secs(since(t0))));

  // ---- meta.json, then move everything into place
  json sources = json::array();
  for (const auto& s : summary.sources) {
    sources.push_back({{"kind", s.kind}, {"path", s.path}, {"files", s.files}, {"documents", s.documents}, {"bytes", s.bytes}});
    if (!s.skipped.empty()) {
      json sk = json::array();
      for (const auto& [path, why] : s.skipped) sk.push_back({{"path", path}, {"reason", why}});
      sources.back()["skipped"] = std::move(sk);
    }
  }
  const json meta = {
      {"format", "snip-data"},
      {"version", kMetaVersion},
      {"key", key},
      {"sources", sources},
      {"documents", {{"total", summary.documents}, {"train", summary.train_documents}, {"val", summary.val_documents}}},
      {"tokens", {{"train", summary.train_tokens}, {"val", summary.val_tokens}}},
      {"vocab_size", summary.vocab_size},
      {"bos_id", tok.bos_id()},
      {"eos_id", tok.eos_id()},
      {"unk_id", tok.unk_id()},
      // The pieces of the special ids, for the Hugging Face tokenizer files
      // `snip export` writes (tokenizer_config.json, special_tokens_map.json).
      {"special_pieces",
       {{"bos", tok.bos_id() >= 0 ? json(tok.id_to_piece(tok.bos_id())) : json(nullptr)},
        {"eos", tok.eos_id() >= 0 ? json(tok.id_to_piece(tok.eos_id())) : json(nullptr)},
        {"unk", tok.unk_id() >= 0 ? json(tok.id_to_piece(tok.unk_id())) : json(nullptr)}}},
      {"seed", opt.seed},
      {"val_fraction", opt.val_fraction},
      {"tokenizer",
       {{"path", "tokenizer.model"},
        {"sha256", summary.tokenizer_sha256},
        {"trained", summary.tokenizer_trained},
        {"source", summary.tokenizer_trained ? json("trained: bpe, byte_fallback") : json(opt.tokenizer_model)}}},
      {"shards",
       {{"train", {{"path", "train.bin"}, {"dtype", dtype_name(dtype)}}},
        {"val", {{"path", "val.bin"}, {"dtype", dtype_name(dtype)}}}}},
  };
  io::write_file_atomic(staging.file("meta.json"), meta.dump(2) + "\n");
  staging.commit({"tokenizer.model", "train.bin", "val.bin", "meta.json"});
  summary.seconds = since(t_start);
  report(str_cat("prepared ", opt.out_dir, " in ", fmt_secs(summary.seconds)));
  return summary;
}

}  // namespace snip::data
