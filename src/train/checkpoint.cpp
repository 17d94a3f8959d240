// Checkpoints of a run (see checkpoint.h).
#include "snip/train/checkpoint.h"

#include <spdlog/spdlog.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <filesystem>
#include <regex>
#include <sstream>
#include <utility>
#include <vector>

#include "snip/hw/platform.h"
#include "snip/io/atomic_file.h"
#include "snip/io/safetensors.h"
#include "snip/model/hf.h"
#include "snip/train/memory.h"
#include "snip/util/error.h"

namespace snip {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// The files trainer_state.json's "crc32" covers; manifest.json covers these
// and trainer_state.json.
const char* kFiles[] = {"model.safetensors", "optimizer.pt", "config.json"};
const char* kManifest = "manifest.json";

uint32_t crc32_of(const std::string& bytes) {
  return static_cast<uint32_t>(crc32(0L, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size()));
}

uint32_t file_crc32(const std::string& path) { return crc32_of(io::read_file(path)); }

// Complete checkpoints of RUN (folders step-N), oldest first. With `warn`,
// every other entry of checkpoints/ (a stray folder, a step number past
// 2^63 - 1, a step-N without trainer_state.json) is named in a warning and
// ignored; step-N.tmp folders (a write cut short) and last_good.json are
// expected there.
std::vector<std::pair<int64_t, fs::path>> complete_checkpoints(const fs::path& root, bool warn = false) {
  std::vector<std::pair<int64_t, fs::path>> all;
  if (!fs::is_directory(root)) return all;
  const std::regex re("step-([0-9]+)"), tmp("step-[0-9]+\\.tmp");
  for (auto& e : fs::directory_iterator(root)) {
    std::smatch m;
    const std::string n = e.path().filename().string();
    const char* why = nullptr;
    if (e.is_directory() && std::regex_match(n, m, re)) {
      errno = 0;
      char* end = nullptr;
      const std::string digits = m[1];
      const unsigned long long v = std::strtoull(digits.c_str(), &end, 10);
      if (errno == ERANGE || v > uint64_t(std::numeric_limits<int64_t>::max()))
        why = "its step number is out of range";
      else if (!fs::exists(e.path() / "trainer_state.json"))
        why = "it has no trainer_state.json (not a complete checkpoint)";
      else
        all.emplace_back(int64_t(v), e.path());
    } else if (!(e.is_directory() && std::regex_match(n, tmp)) && n != "last_good.json") {
      why = "it is not a checkpoint folder step-N";
    }
    if (why && warn) spdlog::warn("ignoring {}: {}", e.path().string(), why);
  }
  std::sort(all.begin(), all.end());
  return all;
}

// The model shape a checkpoint's config.json describes.
LlamaConfig model_config_of(const std::string& dir) {
  const std::string cp = (fs::path(dir) / "config.json").string();
  json j;
  try {
    j = json::parse(io::read_file(cp));
  } catch (const json::parse_error& e) {
    fail(cp, ": invalid JSON (", e.what(), ")");
  }
  return LlamaConfig::from_hf_json(j, cp);
}

}  // namespace

void write_checkpoint_manifest(const std::string& dir) {
  json manifest = {{"format", "snip-checkpoint"}, {"version", 1}, {"files", json::object()}};
  for (const char* f : {"model.safetensors", "optimizer.pt", "config.json", "trainer_state.json"}) {
    const std::string bytes = io::read_file((fs::path(dir) / f).string());
    manifest["files"][f] = {{"bytes", bytes.size()}, {"crc32", crc32_of(bytes)}};
  }
  io::write_file_atomic((fs::path(dir) / kManifest).string(), manifest.dump(2) + "\n");
}

std::string save_checkpoint(const std::string& run_dir, int64_t step, LlamaForCausalLM& model,
                            torch::optim::Optimizer& opt, const json& state, int64_t keep) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  fs::create_directories(root);
  const fs::path final_dir = root / ("step-" + std::to_string(step));
  const fs::path tmp = root / ("step-" + std::to_string(step) + ".tmp");
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  try {
    io::write_safetensors((tmp / "model.safetensors").string(), model_to_safetensors(model));
    {
      // Serialised in memory, then written like every other file, so that a
      // full disk is a UserError (LibTorch's own file writer aborts the
      // process when a write fails inside its destructor).
      torch::serialize::OutputArchive a;
      opt.save(a);
      std::ostringstream bytes;
      a.save_to(bytes);
      io::write_file_atomic((tmp / "optimizer.pt").string(), bytes.str());
    }
    io::write_file_atomic((tmp / "config.json").string(), model->cfg.to_hf_json().dump(2) + "\n");
    json st = state;
    for (const char* f : kFiles) st["crc32"][f] = file_crc32((tmp / f).string());
    io::write_file_atomic((tmp / "trainer_state.json").string(), st.dump(2) + "\n");
    write_checkpoint_manifest(tmp.string());
    io::fsync_dir(tmp.string());
    fs::remove_all(final_dir);
    io::rename_atomic(tmp.string(), final_dir.string());
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
  io::write_file_atomic((root / "last_good.json").string(), json{{"step", step}}.dump() + "\n");
  if (keep > 0) {  // drop the oldest complete checkpoints beyond `keep`, never the last good one
    const auto all = complete_checkpoints(root);
    for (size_t i = 0; i + keep < all.size(); ++i)
      if (all[i].first != step) fs::remove_all(all[i].second);
  }
  return final_dir.string();
}

json verify_checkpoint(const std::string& dir) {
  const std::string sp = (fs::path(dir) / "trainer_state.json").string();
  if (!fs::is_directory(dir)) fail("checkpoint ", dir, " does not exist");
  // manifest.json first: it covers trainer_state.json too (checkpoints of
  // snip before it have none; their trainer_state.json is read unchecked).
  const std::string mp = (fs::path(dir) / kManifest).string();
  if (fs::exists(mp)) {
    const json man = json::parse(io::read_file(mp), nullptr, /*allow_exceptions=*/false);
    if (!man.is_object() || !man.contains("files") || !man["files"].is_object())
      fail("checkpoint ", mp, ": corrupt (expected a JSON object with a 'files' object)");
    for (const char* f : {"model.safetensors", "optimizer.pt", "config.json", "trainer_state.json"}) {
      const std::string p = (fs::path(dir) / f).string();
      if (!fs::is_regular_file(p)) fail("checkpoint ", dir, ": missing file ", f);
      const json& e = man["files"].contains(f) ? man["files"][f] : json();
      if (!e.is_object() || !e.contains("crc32") || !e["crc32"].is_number_unsigned() || !e.contains("bytes") ||
          !e["bytes"].is_number_unsigned())
        fail("checkpoint ", mp, ": files.", f, ": missing its bytes and crc32 (corrupt manifest)");
      const std::string bytes = io::read_file(p);
      if (e["bytes"].get<uint64_t>() != bytes.size() || e["crc32"].get<uint64_t>() != crc32_of(bytes))
        fail("checkpoint ", p, ": checksum mismatch with ", kManifest, " (the file is truncated or corrupted)");
    }
  } else {
    spdlog::warn("checkpoint {} has no {} (written by an older snip): trainer_state.json is not covered by a checksum",
                 dir, kManifest);
  }
  json st;
  try {
    st = json::parse(io::read_file(sp));
  } catch (const json::parse_error& e) {
    fail("checkpoint ", sp, ": corrupt JSON at byte ", e.byte);
  }
  auto unsigned_at = [&](const json& j, const char* key, const char* where) -> uint64_t {
    if (!j.is_object() || !j.contains(key) || !j[key].is_number_unsigned())
      fail("checkpoint ", sp, ": ", where, key, ": expected a non-negative integer");
    return j[key].get<uint64_t>();
  };
  if (!st.is_object() || !st.contains("crc32") || !st["crc32"].is_object())
    fail("checkpoint ", sp, ": missing the 'crc32' object");
  const uint64_t step = unsigned_at(st, "step", "");
  if (step > uint64_t(std::numeric_limits<int64_t>::max()))
    fail("checkpoint ", sp, ": step: ", step, " is out of range [0, 2^63)");
  if (fs::path(dir).filename().string() != "step-" + std::to_string(step))
    fail("checkpoint ", sp, ": holds step ", step, " but its folder is ", fs::path(dir).filename().string());
  if (!st.contains("loader")) fail("checkpoint ", sp, ": missing the 'loader' object");
  unsigned_at(st["loader"], "epoch", "loader.");
  unsigned_at(st["loader"], "cursor", "loader.");
  unsigned_at(st, "seed", "");
  if (st.contains("elapsed_s") &&
      !(st["elapsed_s"].is_number() && std::isfinite(st["elapsed_s"].get<double>()) && st["elapsed_s"].get<double>() >= 0))
    fail("checkpoint ", sp, ": elapsed_s: expected a finite number of seconds >= 0");
  if (st.contains("val_loss") && !st["val_loss"].is_null() && !st["val_loss"].is_number())
    fail("checkpoint ", sp, ": val_loss: expected a number or null");
  if (st.contains("precision") && !st["precision"].is_object())
    fail("checkpoint ", sp, ": precision: expected an object");
  for (const char* f : kFiles) {
    const std::string p = (fs::path(dir) / f).string();
    if (!fs::is_regular_file(p)) fail("checkpoint ", dir, ": missing file ", f);
    if (!st["crc32"].contains(f) || !st["crc32"][f].is_number_unsigned() ||
        st["crc32"][f].get<uint64_t>() != file_crc32(p))
      fail("checkpoint ", p, ": checksum mismatch (the file is truncated or corrupted)");
  }
  return st;
}

data::LoaderState checkpoint_loader_state(const json& state, int64_t batch, int64_t grad_accum,
                                          uint64_t windows_per_epoch, const std::string& what) {
  const uint64_t epoch = state.at("loader").at("epoch").get<uint64_t>();
  const uint64_t cursor = state.at("loader").at("cursor").get<uint64_t>();
  const uint64_t step = state.at("step").get<uint64_t>();
  using u128 = unsigned __int128;
  const u128 at = u128(epoch) * windows_per_epoch + cursor;
  const u128 want = u128(step) * uint64_t(batch) * uint64_t(grad_accum);
  if (cursor >= windows_per_epoch || at != want)
    fail("checkpoint ", what, ": loader position (epoch ", epoch, ", cursor ", cursor, ") is not where step ", step,
         " leaves it (", uint64_t(want / windows_per_epoch), ", ", uint64_t(want % windows_per_epoch), ") with ",
         batch, " x ", grad_accum, " windows per step and ", windows_per_epoch,
         " per epoch: the file is corrupt, or the data folder changed since it was written");
  return {epoch, cursor};
}

std::string latest_checkpoint(const std::string& run_dir) {
  const auto all = complete_checkpoints(fs::path(run_dir) / "checkpoints", /*warn=*/true);
  return all.empty() ? "" : all.back().second.string();
}

std::string last_good_checkpoint(const std::string& run_dir) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  const fs::path marker = root / "last_good.json";
  if (!fs::is_regular_file(marker)) return "";
  const json j = json::parse(io::read_file(marker.string()), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("step") || !j["step"].is_number_unsigned()) return "";
  const fs::path d = root / ("step-" + std::to_string(j["step"].get<uint64_t>()));
  return fs::exists(d / "trainer_state.json") ? d.string() : "";
}

void load_checkpoint_weights(const std::string& dir, LlamaForCausalLM& model) {
  const std::string cp = (fs::path(dir) / "config.json").string();
  if (model_config_of(dir).to_hf_json() != model->cfg.to_hf_json())
    fail("the model in ", cp, " differs from the configured model ([model] options changed)");
  const std::string wp = (fs::path(dir) / "model.safetensors").string();
  load_model_from_safetensors(model, io::read_safetensors(wp), wp);
}

void load_optimizer_state(torch::optim::Optimizer& opt, const std::string& bytes, const std::string& what,
                          int64_t step) {
  // The run's configured hyper-parameters win over the file's (the archive
  // carries each group's options; lr is set every step anyway).
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> configured;
  std::vector<size_t> group_sizes;
  for (auto& g : opt.param_groups()) {
    configured.push_back(g.options().clone());
    group_sizes.push_back(g.params().size());
  }
  try {
    std::istringstream is(bytes);
    torch::serialize::InputArchive a;
    a.load_from(is);
    opt.load(a);
  } catch (const c10::Error& e) {
    fail("checkpoint ", what, ": cannot be loaded: ", e.what_without_backtrace());
  } catch (const std::exception& e) {  // std::out_of_range and kin from a damaged archive
    fail("checkpoint ", what, ": cannot be loaded (corrupt archive: ", e.what(), ")");
  }
  if (opt.param_groups().size() != configured.size())
    fail("checkpoint ", what, ": ", opt.param_groups().size(), " parameter groups, the model's optimizer has ",
         configured.size());
  for (size_t gi = 0; gi < configured.size(); ++gi) {
    auto& g = opt.param_groups()[gi];
    if (g.params().size() != group_sizes[gi])
      fail("checkpoint ", what, ": parameter group ", gi, " holds ", g.params().size(), " tensors, the model's ",
           group_sizes[gi]);
    g.set_options(std::move(configured[gi]));
    // Each parameter's AdamW state must fit it: the moments shaped and typed
    // like the parameter, finite, exp_avg_sq >= 0, and step in [1, step].
    for (size_t pi = 0; pi < g.params().size(); ++pi) {
      const torch::Tensor& p = g.params()[pi];
      const auto it = opt.state().find(c10::guts::to_string(p.unsafeGetTensorImpl()));
      if (it == opt.state().end()) continue;  // never stepped (no gradient yet)
      const auto* s = dynamic_cast<const torch::optim::AdamWParamState*>(it->second.get());
      if (!s) continue;  // another optimizer: only AdamW's state is checked
      const std::string where = str_cat("checkpoint ", what, ": parameter group ", gi, " tensor ", pi, " (shape ",
                                        p.sizes(), "): ");
      if (s->step() < 1 || s->step() > step)
        fail(where, "AdamW step ", s->step(), " is outside [1, ", step, "] (corrupt)");
      for (const auto& [name, t] : {std::pair<const char*, torch::Tensor>{"exp_avg", s->exp_avg()},
                                    {"exp_avg_sq", s->exp_avg_sq()}}) {
        if (!t.defined() || t.sizes() != p.sizes() || t.scalar_type() != p.scalar_type())
          fail(where, name, " has shape ", t.defined() ? t.sizes() : c10::IntArrayRef{}, " and dtype ",
               t.defined() ? c10::toString(t.scalar_type()) : "none", ", expected the parameter's (corrupt)");
        if (!torch::isfinite(t).all().item<bool>()) fail(where, name, " holds non-finite values (corrupt)");
      }
      if ((s->exp_avg_sq() < 0).any().item<bool>()) fail(where, "exp_avg_sq holds negative values (corrupt)");
    }
  }
}

LlamaForCausalLM load_checkpoint_model(const std::string& dir) {
  verify_checkpoint(dir);
  const LlamaConfig cfg = model_config_of(dir);
  check_memory(inference_memory(cfg, 0, 0), hw::available_memory_bytes(),
               "checkpoint " + (fs::path(dir) / "config.json").string());
  LlamaForCausalLM m(cfg);
  load_checkpoint_weights(dir, m);
  return m;
}

}  // namespace snip
