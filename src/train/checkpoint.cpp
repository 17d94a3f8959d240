// Checkpoints of a run (see checkpoint.h).
#include "snip/train/checkpoint.h"

#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <regex>
#include <sstream>
#include <utility>
#include <vector>

#include "snip/io/atomic_file.h"
#include "snip/io/safetensors.h"
#include "snip/model/hf.h"
#include "snip/util/error.h"

namespace snip {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const char* kFiles[] = {"model.safetensors", "optimizer.pt", "config.json"};

uint32_t file_crc32(const std::string& path) {
  const std::string bytes = io::read_file(path);
  return static_cast<uint32_t>(crc32(0L, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size()));
}

// Complete checkpoints of RUN (folders step-N), oldest first.
std::vector<std::pair<int64_t, fs::path>> complete_checkpoints(const fs::path& root) {
  std::vector<std::pair<int64_t, fs::path>> all;
  if (!fs::is_directory(root)) return all;
  const std::regex re("step-([0-9]+)");
  for (auto& e : fs::directory_iterator(root)) {
    std::smatch m;
    const std::string n = e.path().filename().string();
    if (e.is_directory() && std::regex_match(n, m, re) && fs::exists(e.path() / "trainer_state.json"))
      all.emplace_back(std::stoll(m[1]), e.path());
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
  if (fs::path(dir).filename().string() != "step-" + std::to_string(step))
    fail("checkpoint ", sp, ": holds step ", step, " but its folder is ", fs::path(dir).filename().string());
  if (!st.contains("loader")) fail("checkpoint ", sp, ": missing the 'loader' object");
  unsigned_at(st["loader"], "epoch", "loader.");
  unsigned_at(st["loader"], "cursor", "loader.");
  for (const char* f : kFiles) {
    const std::string p = (fs::path(dir) / f).string();
    if (!fs::is_regular_file(p)) fail("checkpoint ", dir, ": missing file ", f);
    if (!st["crc32"].contains(f) || !st["crc32"][f].is_number_unsigned() ||
        st["crc32"][f].get<uint64_t>() != file_crc32(p))
      fail("checkpoint ", p, ": checksum mismatch (the file is truncated or corrupted)");
  }
  return st;
}

std::string latest_checkpoint(const std::string& run_dir) {
  const auto all = complete_checkpoints(fs::path(run_dir) / "checkpoints");
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

void load_optimizer_state(torch::optim::Optimizer& opt, const std::string& bytes, const std::string& what) {
  try {
    std::istringstream is(bytes);
    torch::serialize::InputArchive a;
    a.load_from(is);
    opt.load(a);
  } catch (const c10::Error& e) {
    fail("checkpoint ", what, ": cannot be loaded: ", e.what_without_backtrace());
  }
}

LlamaForCausalLM load_checkpoint_model(const std::string& dir) {
  verify_checkpoint(dir);
  LlamaForCausalLM m(model_config_of(dir));
  load_checkpoint_weights(dir, m);
  return m;
}

}  // namespace snip
