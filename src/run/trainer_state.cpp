// trainer_state.json as a typed record (trainer_state.h).
#include "snip/run/trainer_state.h"

#include <set>

#include "snip/util/error.h"

namespace snip {

using json = nlohmann::json;

namespace {

// The keys TrainerState types; every other key goes to `extra`.
const std::set<std::string>& typed_keys() {
  static const std::set<std::string> k = {
      "step",       "tokens",        "loader",     "seed",        "val_loss",    "elapsed_s",
      "resumed_at", "data",          "init_val_loss", "precision", "world_size",  "data_parallel",
      "pipeline",   "zero_stage",    "loader_base",   "guard",     "lora",        "rollback_record"};
  return k;
}

template <class T>
T get_as(const json& j, const char* key, const std::string& what) {
  try {
    return j.at(key).get<T>();
  } catch (const json::exception& e) {
    fail(what, ": ", key, ": ", e.what());
  }
}

template <class T>
std::optional<T> get_opt(const json& j, const char* key, const std::string& what) {
  if (!j.contains(key) || j.at(key).is_null()) return std::nullopt;
  return get_as<T>(j, key, what);
}

}  // namespace

json TrainerState::to_json() const {
  json st = extra.is_object() ? extra : json::object();
  st["step"] = step;
  if (tokens) st["tokens"] = *tokens;
  st["loader"] = {{"epoch", loader.epoch}, {"cursor", loader.cursor}};
  st["seed"] = seed;
  st["val_loss"] = val_loss ? json(*val_loss) : json(nullptr);
  if (elapsed_s) st["elapsed_s"] = *elapsed_s;
  if (resumed_at) st["resumed_at"] = *resumed_at;
  if (data) {
    json d = {{"dir", data->dir}, {"tokenizer_sha256", data->tokenizer_sha256}, {"vocab_size", data->vocab_size}};
    if (data->val_sha256) d["val_sha256"] = *data->val_sha256;
    if (!data->tokenizer.is_null()) d["tokenizer"] = data->tokenizer;
    if (data->seq_len) d["seq_len"] = *data->seq_len;
    st["data"] = std::move(d);
  }
  if (init_val_loss) st["init_val_loss"] = *init_val_loss;
  if (!precision.is_null()) st["precision"] = precision;
  if (world_size) st["world_size"] = *world_size;
  if (data_parallel) st["data_parallel"] = *data_parallel;
  if (pipeline)
    st["pipeline"] = {{"stages", pipeline->stages},   {"replicas", pipeline->replicas},
                      {"bounds", pipeline->bounds},   {"schedule", pipeline->schedule},
                      {"micro_batches", pipeline->micro_batches}};
  if (zero_stage) st["zero_stage"] = *zero_stage;
  if (!loader_base.is_null()) st["loader_base"] = loader_base;
  if (!guard.is_null()) st["guard"] = guard;
  if (!lora.is_null()) st["lora"] = lora;
  if (!rollback_record.is_null()) st["rollback_record"] = rollback_record;
  return st;
}

TrainerState TrainerState::from_json(const json& j, const std::string& what) {
  if (!j.is_object()) fail(what, ": expected an object, got ", j.type_name());
  TrainerState s;
  s.step = get_as<int64_t>(j, "step", what);
  s.tokens = get_opt<int64_t>(j, "tokens", what);
  s.loader.epoch = get_as<uint64_t>(get_as<json>(j, "loader", what), "epoch", what + ": loader");
  s.loader.cursor = get_as<uint64_t>(j.at("loader"), "cursor", what + ": loader");
  s.seed = get_as<uint64_t>(j, "seed", what);
  s.val_loss = get_opt<double>(j, "val_loss", what);
  s.elapsed_s = get_opt<double>(j, "elapsed_s", what);
  s.resumed_at = get_opt<std::vector<int64_t>>(j, "resumed_at", what);
  if (j.contains("data") && !j.at("data").is_null()) {
    const json& d = j.at("data");
    const std::string w = what + ": data";
    TrainerStateData td;
    td.dir = d.contains("dir") ? get_as<std::string>(d, "dir", w) : std::string();
    td.tokenizer_sha256 = get_as<std::string>(d, "tokenizer_sha256", w);
    td.vocab_size = get_as<int64_t>(d, "vocab_size", w);
    td.val_sha256 = get_opt<std::string>(d, "val_sha256", w);
    td.tokenizer = d.value("tokenizer", json(nullptr));
    td.seq_len = get_opt<int64_t>(d, "seq_len", w);
    s.data = std::move(td);
  }
  s.init_val_loss = get_opt<double>(j, "init_val_loss", what);
  s.precision = j.value("precision", json(nullptr));
  s.world_size = get_opt<int64_t>(j, "world_size", what);
  s.data_parallel = get_opt<int64_t>(j, "data_parallel", what);
  if (j.contains("pipeline") && !j.at("pipeline").is_null()) {
    const json& p = j.at("pipeline");
    const std::string w = what + ": pipeline";
    s.pipeline = TrainerStatePipeline{get_as<int64_t>(p, "stages", w), get_as<int64_t>(p, "replicas", w),
                                      get_as<std::vector<int64_t>>(p, "bounds", w),
                                      get_as<std::string>(p, "schedule", w), get_as<int64_t>(p, "micro_batches", w)};
  }
  s.zero_stage = get_opt<int64_t>(j, "zero_stage", what);
  s.loader_base = j.value("loader_base", json(nullptr));
  s.guard = j.value("guard", json(nullptr));
  s.lora = j.value("lora", json(nullptr));
  s.rollback_record = j.value("rollback_record", json(nullptr));
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!typed_keys().count(it.key())) s.extra[it.key()] = it.value();
  return s;
}

}  // namespace snip
