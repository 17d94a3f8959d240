// compare.cpp: what two runs were trained on, side by side (snip/report/compare.h).
#include "snip/report/compare.h"

#include <filesystem>
#include <map>
#include <optional>

#include <nlohmann/json.hpp>

#include "snip/config/config.h"
#include "snip/data/data_folder.h"
#include "snip/io/atomic_file.h"
#include "snip/io/json.h"
#include "snip/report/report.h"
#include "snip/run/checkpoint_files.h"
#include "snip/core/error.h"

namespace snip::report {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

bool is_sha256(const json& v) {
  if (!v.is_string() || v.get<std::string>().size() != 64) return false;
  for (char c : v.get<std::string>())
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

json read_json(const std::string& path, const char* what) {
  try {
    return io::read_json_file(path, what);
  } catch (const UserError& e) {
    fail("snip report: ", e.what());
  }
}

// An integer option of config.toml's display map; -1 when absent or not an integer.
int64_t int_of(const std::map<std::string, std::string>& cfg, const char* key) {
  auto it = cfg.find(key);
  if (it == cfg.end()) return -1;
  try {
    size_t used = 0;
    const long long v = std::stoll(it->second, &used);
    return used == it->second.size() ? int64_t(v) : -1;
  } catch (...) {
    return -1;
  }
}

std::string text_of(int64_t v) { return v < 0 ? "unknown" : std::to_string(v); }
std::string short_sha(const std::string& s) { return s.empty() ? "unknown" : "SHA-256 " + s.substr(0, 12) + "..."; }

}  // namespace

std::string run_display_name(const std::string& dir) {
  fs::path p = fs::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  std::string n = p.filename().string();
  if (n.empty() || n == "." || n == "..") {
    std::error_code ec;
    n = fs::weakly_canonical(dir, ec).filename().string();
  }
  return n.empty() ? dir : n;
}

std::string RunDifference::line(const std::string& run_name, const std::string& ref_name) const {
  return what + ": " + run + " (" + run_name + ") vs " + reference + " (" + ref_name + ")";
}

RunRecord read_run_record(const std::string& run_dir) {
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec)) fail("snip report: ", run_dir.empty() ? "\"\"" : run_dir, " does not exist");
  const fs::path d(run_dir);
  RunRecord r;
  r.name = run_display_name(run_dir);

  std::map<std::string, std::string> cfg;
  if (fs::is_regular_file(d / "config.toml", ec)) cfg = read_toml_display((d / "config.toml").string());
  auto cfg_str = [&](const char* k) {
    auto it = cfg.find(k);
    return it == cfg.end() ? std::string() : it->second;
  };
  if (!cfg_str("model.hidden_size").empty()) {
    auto q = [&](const char* k) { const std::string v = cfg_str(k); return v.empty() ? std::string("?") : v; };
    r.model = "C=" + q("model.hidden_size") + ", " + q("model.num_hidden_layers") +
              (cfg_str("model.num_hidden_layers") == "1" ? " layer, " : " layers, ") +
              q("model.num_attention_heads") + "/" + q("model.num_key_value_heads") + " heads, SwiGLU " +
              q("model.intermediate_size");
    const int64_t mv = int_of(cfg, "model.vocab_size");
    if (mv > 0) r.model += ", V=" + std::to_string(mv);
    if (cfg_str("model.tie_word_embeddings") == "true") r.model += ", tied";
  }
  r.max_steps = int_of(cfg, "train.max_steps");
  r.batch_size = int_of(cfg, "train.batch_size");
  r.seq_len = int_of(cfg, "train.seq_len");
  r.grad_accum = int_of(cfg, "train.grad_accum");
  r.eval_batches = int_of(cfg, "train.eval_batches");
  r.data_dir = cfg_str("data.dir");

  // Steps: the summary of a finished run, else what the metrics log reached.
  // The model's vocabulary V as the summary records it (the tokenizer's when
  // model.vocab_size was 0): a data folder whose tokenizer does not fit it
  // was re-prepared since and tells nothing about this run.
  int64_t model_vocab = -1;
  if (fs::is_regular_file(d / "summary.json", ec)) {
    const json s = read_json((d / "summary.json").string(), "summary");
    if (s.is_object() && s.contains("steps") && s["steps"].is_number_integer()) r.steps = s["steps"].get<int64_t>();
    if (s.is_object() && s.contains("vocab_size") && s["vocab_size"].is_number_integer())
      model_vocab = s["vocab_size"].get<int64_t>();
  }
  const int64_t set_vocab = int_of(cfg, "model.vocab_size");
  if (r.steps < 0 && fs::is_regular_file(d / "metrics.jsonl", ec)) {
    const RunCurves c = read_metrics((d / "metrics.jsonl").string());
    if (!c.step.empty()) r.steps = int64_t(c.step.back());
  }

  // The data the model was trained on, as the newest checkpoint recorded it.
  const auto ckpts = complete_checkpoints((d / "checkpoints").string(), /*warn=*/false);
  if (!ckpts.empty()) {
    const std::string sp = (fs::path(ckpts.back().second) / "trainer_state.json").string();
    const json st = read_json(sp, "checkpoint");
    const json data = st.is_object() && st.contains("data") && st["data"].is_object() ? st["data"] : json::object();
    if (is_sha256(data.value("tokenizer_sha256", json()))) r.tokenizer_sha256 = data["tokenizer_sha256"];
    if (data.contains("vocab_size") && data["vocab_size"].is_number_unsigned())
      r.vocab_size = int64_t(data["vocab_size"].get<uint64_t>());
    if (is_sha256(data.value("val_sha256", json()))) r.val_sha256 = data["val_sha256"];
    if (data.contains("dir") && data["dir"].is_string()) r.data_dir = data["dir"];
    if (!r.tokenizer_sha256.empty()) r.data_source = "checkpoint " + ckpts.back().second;
    // Tokens per step count every replica (absent = one process), and a
    // pipeline's micro-batches stand for grad_accum (train/trainer.cpp).
    auto int_at = [&](const json& o, const char* k, int64_t def) {
      return o.is_object() && o.contains(k) && o[k].is_number_integer() ? o[k].get<int64_t>() : def;
    };
    r.replicas = int_at(st, "data_parallel", int_at(st, "world_size", 1));
    if (st.is_object() && st.contains("pipeline")) r.grad_accum = int_at(st["pipeline"], "micro_batches", r.grad_accum);
  }
  // What the checkpoint does not say, from the data folder as it is now,
  // when that folder still holds the tokenizer the checkpoint recorded.
  if ((r.tokenizer_sha256.empty() || r.vocab_size < 0 || r.val_sha256.empty()) && !r.data_dir.empty() &&
      fs::is_regular_file(fs::path(r.data_dir) / "meta.json", ec)) {
    std::optional<data::DataFolderInfo> info;
    try {
      info = data::verify_data_folder(r.data_dir, "data folder");
    } catch (const UserError&) {
      // A folder that no longer checks out tells nothing: unknown.
    }
    // Without a recorded tokenizer, the folder must fit the model: V equal to
    // the tokenizer's (model.vocab_size = 0) or at least it (set explicitly).
    const bool fits = !r.tokenizer_sha256.empty() || model_vocab < 0 ||
                      (set_vocab > 0 ? int64_t(info ? info->vocab_size : 0) <= model_vocab
                                     : int64_t(info ? info->vocab_size : 0) == model_vocab);
    if (info && fits && (r.tokenizer_sha256.empty() || r.tokenizer_sha256 == info->tokenizer_sha256)) {
      const bool from_folder = r.tokenizer_sha256.empty() || r.val_sha256.empty();
      if (r.tokenizer_sha256.empty()) r.tokenizer_sha256 = info->tokenizer_sha256;
      if (r.vocab_size < 0) r.vocab_size = info->vocab_size;
      if (r.val_sha256.empty()) {
        const json meta = read_json((fs::path(r.data_dir) / "meta.json").string(), "data folder meta.json");
        const std::string val = meta.value("shards", json::object()).value("val", json::object()).value("path", std::string("val.bin"));
        r.val_sha256 = data::sha256_hex(io::read_file((fs::path(r.data_dir) / val).string()));
      }
      if (from_folder)
        r.data_source += (r.data_source.empty() ? "" : ", and ") + std::string("data folder ") + r.data_dir + " (now)";
    }
  }
  // No checkpoint or folder said it: the model's V is the tokenizer's when
  // model.vocab_size was left 0.
  if (r.vocab_size < 0 && model_vocab > 0 && set_vocab <= 0) r.vocab_size = model_vocab;
  return r;
}

std::vector<RunDifference> compare_runs(const RunRecord& a, const RunRecord& b) {
  std::vector<RunDifference> out;
  // A field both sides know and disagree on, or one side only knows.
  auto add = [&](const char* what, const std::string& va, const std::string& vb, bool known_a, bool known_b,
                 bool breaks_losses) {
    if (!known_a && !known_b) return;
    if (known_a && known_b && va == vb) return;
    out.push_back({what, known_a ? va : "unknown", known_b ? vb : "unknown", breaks_losses && known_a && known_b});
  };
  add("tokenizer", short_sha(a.tokenizer_sha256), short_sha(b.tokenizer_sha256), !a.tokenizer_sha256.empty(),
      !b.tokenizer_sha256.empty(), true);
  add("vocabulary", text_of(a.vocab_size), text_of(b.vocab_size), a.vocab_size >= 0, b.vocab_size >= 0, true);
  add("validation data", short_sha(a.val_sha256) + " of val.bin", short_sha(b.val_sha256) + " of val.bin",
      !a.val_sha256.empty(), !b.val_sha256.empty(), true);
  add("data folder", a.data_dir, b.data_dir, !a.data_dir.empty(), !b.data_dir.empty(), false);
  add("model", a.model, b.model, !a.model.empty(), !b.model.empty(), false);
  auto steps = [](const RunRecord& r) {
    return std::to_string(r.steps) + (r.max_steps >= 0 && r.max_steps != r.steps ? " of " + std::to_string(r.max_steps) : "");
  };
  add("steps", steps(a), steps(b), a.steps >= 0, b.steps >= 0, false);
  auto tps = [](const RunRecord& r) {
    return std::to_string(r.batch_size * r.seq_len * r.grad_accum * r.replicas) + " (" +
           std::to_string(r.batch_size) + " x " + std::to_string(r.seq_len) + " x " + std::to_string(r.grad_accum) +
           (r.replicas > 1 ? " x " + std::to_string(r.replicas) + " ranks" : std::string()) + ")";
  };
  auto tps_known = [](const RunRecord& r) { return r.batch_size > 0 && r.seq_len > 0 && r.grad_accum > 0; };
  add("tokens per step", tps(a), tps(b), tps_known(a), tps_known(b), false);
  auto ev = [](const RunRecord& r) {
    return r.eval_batches == 0 ? std::string("all of val.bin") : std::to_string(r.eval_batches) + " batches";
  };
  add("evaluation", ev(a), ev(b), a.eval_batches >= 0, b.eval_batches >= 0, false);
  return out;
}

bool incomparable(const std::vector<RunDifference>& diffs) {
  for (const RunDifference& d : diffs)
    if (d.incomparable) return true;
  return false;
}

}  // namespace snip::report
