// trainer_state.json as a typed record (trainer_state.h).
#include "snip/run/trainer_state.h"

#include <cmath>
#include <limits>
#include <set>

#include "json_fields.h"
#include "snip/core/error.h"

namespace snip {

using json = nlohmann::json;

namespace {

using namespace run_fields;

// The keys TrainerState types; every other key goes to `extra`.
const std::set<std::string>& typed_keys() {
  static const std::set<std::string> k = {
      "step",       "tokens",        "loader",     "seed",        "val_loss",    "elapsed_s",
      "resumed_at", "data",          "init_val_loss", "precision", "world_size",  "data_parallel",
      "pipeline",   "zero_stage",    "loader_base",   "guard",     "lora",        "rollback_record"};
  return k;
}

// A SHA-256 as 64 lower-case hex digits.
std::string sha256_text(const json& v, const std::string& what, const std::string& field, const char* expected) {
  if (!v.is_string() || v.get<std::string>().size() != 64 ||
      v.get<std::string>().find_first_not_of("0123456789abcdef") != std::string::npos)
    bad(what, field, expected, v);
  return v.get<std::string>();
}

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMaxSeq = int64_t{1} << 24;  // tokens per sequence: far above any model's context
constexpr int64_t kMaxRanks = int64_t{1} << 20;

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
  s.step = int_in(need(j, "", "step", what), what, "step", 0, kMax, "a step >= 0");
  if (j.contains("tokens")) s.tokens = int_in(j.at("tokens"), what, "tokens", 0, kMax, "a token count >= 0");
  const json& loader = need(j, "", "loader", what);
  if (!loader.is_object()) bad(what, "loader", "an object {epoch, cursor}", loader);
  s.loader.epoch = unsigned_of(need(loader, "loader.", "epoch", what), what, "loader.epoch");
  s.loader.cursor = unsigned_of(need(loader, "loader.", "cursor", what), what, "loader.cursor");
  s.seed = unsigned_of(need(j, "", "seed", what), what, "seed");
  if (j.contains("val_loss") && !j.at("val_loss").is_null()) s.val_loss = nonneg(j.at("val_loss"), what, "val_loss");
  if (j.contains("elapsed_s")) s.elapsed_s = nonneg(j.at("elapsed_s"), what, "elapsed_s");
  if (j.contains("resumed_at")) {
    // The steps at which earlier sessions resumed the run: ascending, none past this step.
    const json& ra = j.at("resumed_at");
    const std::string expected = "an ascending list of steps in [0, " + std::to_string(s.step) + "]";
    if (!ra.is_array() || ra.size() > 1000000) bad(what, "resumed_at", expected.c_str(), ra);
    std::vector<int64_t> v;
    for (const json& x : ra)
      v.push_back(int_in(x, what, "resumed_at", v.empty() ? 0 : v.back(), s.step, expected.c_str()));
    s.resumed_at = std::move(v);
  }
  if (j.contains("data")) {
    const json& d = j.at("data");
    if (!d.is_object()) bad(what, "data", "an object", d);
    TrainerStateData td;
    if (d.contains("dir")) td.dir = text(d.at("dir"), what, "data.dir");
    td.tokenizer_sha256 = sha256_text(need(d, "data.", "tokenizer_sha256", what), what, "data.tokenizer_sha256",
                                      "64 hex digits (the SHA-256 of the tokenizer.model trained with)");
    td.vocab_size = int_in(need(d, "data.", "vocab_size", what), what, "data.vocab_size", 1, int64_t{1} << 31,
                           "a vocabulary size >= 1");
    if (d.contains("val_sha256"))
      td.val_sha256 = sha256_text(d.at("val_sha256"), what, "data.val_sha256",
                                  "64 lower-case hex digits (the SHA-256 of val.bin)");
    td.tokenizer = d.value("tokenizer", json(nullptr));
    if (d.contains("seq_len"))
      td.seq_len = int_in(d.at("seq_len"), what, "data.seq_len", 1, kMaxSeq, "tokens per sequence in [1, 2^24]");
    s.data = std::move(td);
  }
  if (j.contains("init_val_loss")) s.init_val_loss = nonneg(j.at("init_val_loss"), what, "init_val_loss");
  s.precision = j.value("precision", json(nullptr));
  if (j.contains("world_size"))
    s.world_size = int_in(j.at("world_size"), what, "world_size", 1, kMaxRanks, "a number of ranks >= 1");
  if (j.contains("data_parallel"))
    s.data_parallel = int_in(j.at("data_parallel"), what, "data_parallel", 1, kMaxRanks, "a number of ranks >= 1");
  if (j.contains("pipeline")) {
    const json& p = j.at("pipeline");
    if (!p.is_object()) bad(what, "pipeline", "an object", p);
    TrainerStatePipeline tp;
    tp.stages = int_in(need(p, "pipeline.", "stages", what), what, "pipeline.stages", 1, 1024, "stages in [1, 1024]");
    tp.replicas = int_in(need(p, "pipeline.", "replicas", what), what, "pipeline.replicas", 1, kMaxRanks,
                         "replicas >= 1");
    const json& b = need(p, "pipeline.", "bounds", what);
    if (!b.is_array() || b.size() != size_t(tp.stages) + 1)
      bad(what, "pipeline.bounds", "stages + 1 block bounds", b);
    for (size_t i = 0; i < b.size(); ++i) {
      const int64_t lo = i == 0 ? 0 : tp.bounds.back() + 1;  // every stage holds a block
      tp.bounds.push_back(int_in(b[i], what, "pipeline.bounds", i == 0 ? 0 : lo, i == 0 ? 0 : kMax,
                                 "ascending block bounds from 0, one block or more per stage"));
    }
    tp.schedule = text(need(p, "pipeline.", "schedule", what), what, "pipeline.schedule");
    if (tp.schedule != "gpipe" && tp.schedule != "1f1b") bad(what, "pipeline.schedule", "gpipe or 1f1b", p["schedule"]);
    tp.micro_batches = int_in(need(p, "pipeline.", "micro_batches", what), what, "pipeline.micro_batches", 1,
                              int64_t{1} << 30, "micro-batches >= 1");
    s.pipeline = std::move(tp);
  }
  if (j.contains("zero_stage"))
    s.zero_stage = int_in(j.at("zero_stage"), what, "zero_stage", 0, 2, "a ZeRO stage 0, 1 or 2");
  s.loader_base = j.value("loader_base", json(nullptr));
  s.guard = j.value("guard", json(nullptr));
  s.lora = j.value("lora", json(nullptr));
  s.rollback_record = j.value("rollback_record", json(nullptr));
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!typed_keys().count(it.key())) s.extra[it.key()] = it.value();
  return s;
}

}  // namespace snip
