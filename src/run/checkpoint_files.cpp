// The files of a checkpoint folder, read and checked without LibTorch (see
// snip/run/checkpoint_files.h).
#include "snip/run/checkpoint_files.h"
#include "snip/run/trainer_state.h"

#include <spdlog/spdlog.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <regex>
#include <set>

#include "snip/io/atomic_file.h"
#include "snip/io/json.h"
#include "snip/core/error.h"

namespace snip {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const char* kManifest = "manifest.json";

}  // namespace

uint32_t crc32_of(const std::string& bytes) {
  return static_cast<uint32_t>(crc32(0L, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size()));
}

std::vector<std::pair<int64_t, std::string>> complete_checkpoints(const std::string& root_dir, bool warn) {
  const fs::path root(root_dir);
  std::vector<std::pair<int64_t, std::string>> all;
  if (!fs::is_directory(root)) return all;
  // step-N, or step-N.old: the checkpoint save_checkpoint set aside to put a
  // rewritten step-N in its place, which counts while no complete step-N is
  // there (a process killed between the two renames).
  const std::regex re("step-([0-9]+)(\\.old)?"), tmp("step-[0-9]+\\.tmp"), atomic_tmp(".+\\.tmp\\.[0-9]+");
  std::map<int64_t, std::string> kept, aside;
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
        (m[2].matched ? aside : kept)[int64_t(v)] = e.path().string();
    } else if (!(e.is_directory() && std::regex_match(n, tmp)) && !(e.is_regular_file() && std::regex_match(n, atomic_tmp)) &&
               n != "last_good.json" && n != "good.json") {
      why = "it is not a checkpoint folder step-N";
    }
    if (why && warn) spdlog::warn("ignoring {}: {}", e.path().string(), why);
  }
  for (const auto& [step, dir] : aside) kept.emplace(step, dir);  // only where no complete step-N is
  for (const auto& [step, dir] : kept) all.emplace_back(step, dir);
  return all;
}

uint32_t file_crc32(const std::string& path) { return crc32_of(io::read_file(path)); }

LlamaConfig checkpoint_model_config(const std::string& dir) {
  const std::string cp = (fs::path(dir) / "config.json").string();
  return LlamaConfig::from_hf_json(io::parse_json(io::read_file(cp), cp), cp);
}

std::vector<std::string> checkpoint_optimizer_files(const std::string& dir) {
  const fs::path ip = fs::path(dir) / "optimizer_index.json";
  if (!fs::exists(ip)) return {"optimizer.pt"};
  const json idx = io::parse_json(io::read_file(ip.string()), "checkpoint " + ip.string());
  const json files = idx.is_object() && idx.contains("files") ? idx["files"] : json();
  if (!files.is_array() || files.empty() || files.size() > 1000000)
    fail("checkpoint ", ip.string(), ": files: expected a list of optimizer-rank<r>.safetensors (corrupt)");
  std::vector<std::string> out{"optimizer_index.json"};
  for (size_t r = 0; r < files.size(); ++r) {
    const std::string want = "optimizer-rank" + std::to_string(r) + ".safetensors";
    if (files[r] != want)
      fail("checkpoint ", ip.string(), ": files[", r, "]: expected \"", want, "\" (corrupt)");
    out.push_back(want);
  }
  return out;
}

CheckpointManifest::File CheckpointManifest::of_file(const std::string& dir, const std::string& name) {
  const std::string bytes = io::read_file((fs::path(dir) / name).string());
  return {uint64_t(bytes.size()), crc32_of(bytes)};
}

json CheckpointManifest::to_json() const {
  json j = {{"format", "snip-checkpoint"}, {"version", 1}, {"files", json::object()}};
  for (const auto& [name, f] : files) j["files"][name] = {{"bytes", f.bytes}, {"crc32", f.crc32}};
  return j;
}

CheckpointManifest CheckpointManifest::from_json(const json& j, const std::string& what) {
  if (!j.is_object() || !j.contains("files") || !j["files"].is_object())
    fail(what, ": corrupt (expected a JSON object with a 'files' object)");
  if (j.value("format", json()) != "snip-checkpoint" || j.value("version", json()) != 1)
    fail(what, ": expected \"format\": \"snip-checkpoint\", \"version\": 1 (written by another snip version, or "
         "corrupt)");
  CheckpointManifest m;
  for (const auto& [name, e] : j["files"].items()) {
    if (!e.is_object() || !e.contains("crc32") || !e["crc32"].is_number_unsigned() || !e.contains("bytes") ||
        !e["bytes"].is_number_unsigned() || e["crc32"].get<uint64_t>() > 0xffffffffu)
      fail(what, ": files.", name.substr(0, 64), ": missing its bytes and crc32 (corrupt manifest)");
    m.files[name] = {e["bytes"].get<uint64_t>(), uint32_t(e["crc32"].get<uint64_t>())};
  }
  return m;
}

void write_checkpoint_manifest(const std::string& dir, const std::vector<std::string>& optimizer_files) {
  CheckpointManifest manifest;
  std::vector<std::string> files{"model.safetensors", "config.json", "trainer_state.json"};
  const std::vector<std::string> opt = optimizer_files.empty() ? checkpoint_optimizer_files(dir) : optimizer_files;
  files.insert(files.end(), opt.begin(), opt.end());
  for (const std::string& f : files) manifest.files[f] = CheckpointManifest::of_file(dir, f);
  io::write_file_atomic((fs::path(dir) / kManifest).string(), manifest.to_json().dump(2) + "\n");
}

json verify_checkpoint(const std::string& dir) {
  const std::string sp = (fs::path(dir) / "trainer_state.json").string();
  if (!fs::is_directory(dir)) fail("checkpoint ", dir, " does not exist");
  // Other folders given where a checkpoint is expected: say what they are.
  if (!fs::exists(sp) && !fs::exists(fs::path(dir) / kManifest)) {
    if (fs::exists(fs::path(dir) / "adapter_config.json"))
      fail(dir, " is a PEFT adapter folder (adapter_config.json), not a snip checkpoint: use its run's checkpoint, "
           "or write a whole model with `snip export --merge`");
    if (fs::exists(fs::path(dir) / "checkpoints"))
      fail(dir, " is a run folder, not a checkpoint: give it with --run-dir, or one of its checkpoints/step-N");
    if (fs::exists(fs::path(dir) / "config.json"))
      fail(dir, " is a Hugging Face folder (config.json, no trainer_state.json), not a snip checkpoint: it is "
           "already what `snip export` writes");
  }
  // manifest.json first: it covers trainer_state.json too (checkpoints of
  // snip before it have none; their trainer_state.json is read unchecked).
  const std::string mp = (fs::path(dir) / kManifest).string();
  if (fs::exists(mp)) {
    const CheckpointManifest man =
        CheckpointManifest::from_json(io::parse_json(io::read_file(mp), "checkpoint " + mp), "checkpoint " + mp);
    std::vector<std::string> files{"model.safetensors", "config.json", "trainer_state.json"};
    for (const std::string& f : checkpoint_optimizer_files(dir)) files.push_back(f);
    const std::set<std::string> known(files.begin(), files.end());
    for (const auto& [name, e] : man.files)
      if (!known.count(name))
        fail("checkpoint ", mp, ": files: unexpected entry \"", name.substr(0, 64), "\" (corrupt manifest)");
    for (const std::string& f : files) {
      const std::string p = (fs::path(dir) / f).string();
      if (!fs::is_regular_file(p)) fail("checkpoint ", dir, ": missing file ", f);
      const auto e = man.files.find(f);
      if (e == man.files.end()) fail("checkpoint ", mp, ": files.", f, ": missing its bytes and crc32 (corrupt manifest)");
      const CheckpointManifest::File now = CheckpointManifest::of_file(dir, f);
      if (e->second.bytes != now.bytes || e->second.crc32 != now.crc32)
        fail("checkpoint ", p, ": checksum mismatch with ", kManifest, " (the file is truncated or corrupted)");
    }
  } else {
    static std::set<std::string> warned;  // once per folder (eval and export read it twice)
    if (warned.insert(dir).second)
      spdlog::warn("checkpoint {} has no {} (written by an older snip): trainer_state.json is not covered by a "
                   "checksum", dir, kManifest);
  }
  const json st = io::parse_json(io::read_file(sp), "checkpoint " + sp);
  // The fields and their types, once (TrainerState::from_json names a wrong
  // one: "checkpoint PATH: loader.cursor: expected an integer >= 0, got ...");
  // then what only the folder can say.
  const TrainerState ts = TrainerState::from_json(st, "checkpoint " + sp);
  if (!st.contains("crc32") || !st["crc32"].is_object()) fail("checkpoint ", sp, ": missing the 'crc32' object");
  const int64_t step = ts.step;
  const std::string folder = fs::path(dir).filename().string(), want = "step-" + std::to_string(step);
  if (folder != want && folder != want + ".old")  // .old: set aside by a rewrite (complete_checkpoints)
    fail("checkpoint ", sp, ": holds step ", step, " but its folder is ", fs::path(dir).filename().string());
  // (an explicit null is refused too: TrainerState reads it as absent)
  if (st.contains("rollback_record") && !(ts.rollback_record.is_object() && ts.rollback_record.contains("step") &&
                                          ts.rollback_record["step"].is_number_unsigned() &&
                                          ts.rollback_record.value("rollback_to", json()) == json(step)))
    fail("checkpoint ", sp, ": rollback_record: expected the record of a rollback to step ", step);
  // Checkpoints with a manifest (this snip) always record their data.
  if (fs::exists(mp) && !ts.data)
    fail("checkpoint ", sp, ": missing the 'data' object (the tokenizer the model was trained with)");
  if (st.contains("precision") && !st["precision"].is_object()) fail("checkpoint ", sp, ": precision: expected an object");
  std::vector<std::string> covered{"model.safetensors", "config.json"};
  for (const std::string& f : checkpoint_optimizer_files(dir)) covered.push_back(f);
  // The extra files the checkpoint was written with (adapter_config.json,
  // grad_residuals.safetensors): listed in "crc32", checked the same way
  // when present. grad_residuals.safetensors alone may be missing: a resume
  // continues without it, with a warning (dist.grad_comm error feedback).
  for (auto& [name, v] : st["crc32"].items())
    if (std::find(covered.begin(), covered.end(), name) == covered.end()) {
      if (name.empty() || name.find('/') != std::string::npos || name.find("..") != std::string::npos)
        fail("checkpoint ", sp, ": crc32: unexpected entry \"", name.substr(0, 64), "\" (corrupt)");
      if (name == "grad_residuals.safetensors" && !fs::exists(fs::path(dir) / name)) continue;
      covered.push_back(name);
    }
  for (const std::string& fname : covered) {
    const char* f = fname.c_str();
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
  uint64_t base_step = 0, base_windows = 0;
  if (state.contains("loader_base")) {
    const json& b = state["loader_base"];
    if (!b.is_object() || !b.contains("step") || !b["step"].is_number_unsigned() || !b.contains("windows") ||
        !b["windows"].is_number_unsigned() || b["step"].get<uint64_t>() > step)
      fail("checkpoint ", what, ": loader_base: expected {\"step\": <= step, \"windows\": >= 0} (corrupt)");
    base_step = b["step"].get<uint64_t>();
    base_windows = b["windows"].get<uint64_t>();
  }
  const u128 want = u128(base_windows) + u128(step - base_step) * uint64_t(batch) * uint64_t(grad_accum);
  if (cursor >= windows_per_epoch || at != want)
    fail("checkpoint ", what, ": loader position (epoch ", epoch, ", cursor ", cursor, ") is not where step ", step,
         " leaves it (", uint64_t(want / windows_per_epoch), ", ", uint64_t(want % windows_per_epoch), ") with ",
         batch, " x ", grad_accum, " windows per step and ", windows_per_epoch,
         " per epoch: the file is corrupt, or the data folder changed since it was written");
  return {epoch, cursor};
}

std::string checkpoint_tokenizer_sha256(const json& state) {
  return state.contains("data") ? state["data"]["tokenizer_sha256"].get<std::string>() : "";
}

std::string checkpoint_data_dir(const json& state) {
  return state.contains("data") && state["data"].contains("dir") ? state["data"]["dir"].get<std::string>() : "";
}

std::string latest_checkpoint(const std::string& run_dir) {
  const auto all = complete_checkpoints((fs::path(run_dir) / "checkpoints").string(), /*warn=*/true);
  return all.empty() ? "" : all.back().second;
}

std::string last_good_checkpoint(const std::string& run_dir) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  const fs::path marker = root / "last_good.json";
  if (!fs::is_regular_file(marker)) return "";
  const json j = json::parse(io::read_file(marker.string()), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("step") || !j["step"].is_number_unsigned()) return "";
  const int64_t step = int64_t(j["step"].get<uint64_t>());
  for (const auto& [s, dir] : complete_checkpoints(root.string(), /*warn=*/false))
    if (s == step) return dir;
  return "";
}

}  // namespace snip
