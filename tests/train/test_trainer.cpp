// The trainer on real text (the Brown Corpus, prepared by the CTest fixture
// `prepare_kjv512`: BPE vocabulary 512): the loss decreases, resume is
// exact, and bad input fails with one clear error leaving nothing behind.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <signal.h>
#include <sys/resource.h>

#include <filesystem>
#include <fstream>

#include "snip/config/config.h"
#include "snip/data/data_folder.h"
#include "snip/run/checkpoint_files.h"
#include "snip/run/step_record.h"
#include "snip/run/trainer_state.h"
#include "snip/train/trainer.h"
#include "snip/io/atomic_file.h"
#include "snip/io/dir_lock.h"
#include "snip/core/error.h"
#include "micro.h"

using namespace snip;
namespace fs = std::filesystem;

namespace {

using test::fresh_dir;
using test::micro_config;
using test::read_metrics;
const std::string& kData = test::kKjv512;

void require_data() {
  if (!fs::exists(kData + "/train.bin")) GTEST_SKIP() << "no prepared KJV data at " << kData;
}

// Runs f, expects a UserError whose message contains `needle` and is one line.
template <typename F>
void expect_user_error(F f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected UserError containing '" << needle << "'";
  } catch (const UserError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(needle), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << "not one line: " << m;
  }
}

}  // namespace

TEST(Schedule, WarmupThenCosineByHand) {
  // warmup 10 steps to lr=1: step 0 -> 0.1, step 9 -> 1.0
  EXPECT_DOUBLE_EQ(lr_at(0, 110, 10, 1.0, 0.1), 0.1);
  EXPECT_DOUBLE_EQ(lr_at(9, 110, 10, 1.0, 0.1), 1.0);
  EXPECT_DOUBLE_EQ(lr_at(10, 110, 10, 1.0, 0.1), 1.0);  // cosine starts at the peak
  // halfway through the decay: min + (1-min)*0.5*(1+cos(pi/2)) = 0.1 + 0.45 = 0.55
  EXPECT_NEAR(lr_at(60, 110, 10, 1.0, 0.1), 0.55, 1e-15);
  EXPECT_NEAR(lr_at(110, 110, 10, 1.0, 0.1), 0.1, 1e-15);
}

TEST(Trainer, LossDecreasesOnRealText) {
  require_data();
  Config c = micro_config();
  c.set("train.max_steps", int64_t{150}, "test");
  c.set("train.eval_interval", int64_t{150}, "test");
  const std::string run = fresh_dir("loss");
  TrainOptions o;
  o.run_dir = run;
  o.quiet = true;
  TrainSummary s = train(c, o);
  auto m = read_metrics(run);
  ASSERT_EQ(m.size(), 150u);
  const double first = m.front()["loss"].get<double>();
  // An untrained model predicts ~uniformly: loss ~ ln(512) = 6.24 nats.
  EXPECT_NEAR(first, std::log(512.0), 0.1);
  // 150 steps of 512 tokens on Brown reach well below the unigram level.
  EXPECT_LT(s.final_val_loss, 0.8 * std::log(512.0));
  EXPECT_LT(s.final_train_loss, first - 1.0);
  EXPECT_TRUE(m.back().contains("val_loss"));
  EXPECT_TRUE(fs::exists(run + "/checkpoints/step-150/model.safetensors"));
  fs::remove_all(run);
}

// manifest.json as a type: a file's entry is its size and the CRC-32 of its
// bytes (the standard check value: CRC-32 of "123456789" is 0xCBF43926), the
// JSON is the documented form, and what is not one is named in one line.
TEST(CheckpointManifest, EntriesAreSizeAndCrc32AndBadOnesAreNamed) {
  const fs::path dir(fresh_dir("snip_manifest_type"));
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << "123456789";
  const CheckpointManifest::File f = CheckpointManifest::of_file(dir.string(), "config.json");
  EXPECT_EQ(f.bytes, 9u);
  EXPECT_EQ(f.crc32, 0xCBF43926u);
  CheckpointManifest m;
  m.files["config.json"] = f;
  m.files["model.safetensors"] = {0, 0};
  const nlohmann::json j = m.to_json();
  EXPECT_EQ(j.dump(), R"({"files":{"config.json":{"bytes":9,"crc32":3421780262},"model.safetensors":{"bytes":0,)"
                      R"("crc32":0}},"format":"snip-checkpoint","version":1})");
  EXPECT_EQ(CheckpointManifest::from_json(j, "m").to_json(), j);
  const auto err = [](const std::string& text) {
    try {
      CheckpointManifest::from_json(nlohmann::json::parse(text), "m.json");
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string ok = R"("format": "snip-checkpoint", "version": 1)";
  EXPECT_EQ(err("[]"), "m.json: corrupt (expected a JSON object with a 'files' object)");
  EXPECT_EQ(err(R"({"format": "snip-checkpoint", "version": 2, "files": {}})"),
            R"(m.json: expected "format": "snip-checkpoint", "version": 1 (written by another snip version, or corrupt))");
  EXPECT_EQ(err("{" + ok + R"(, "files": {"a": {"bytes": 1}}})"),
            "m.json: files.a: missing its bytes and crc32 (corrupt manifest)");
  EXPECT_EQ(err("{" + ok + R"(, "files": {"a": {"bytes": -1, "crc32": 1}}})"),
            "m.json: files.a: missing its bytes and crc32 (corrupt manifest)");
  EXPECT_EQ(err("{" + ok + R"(, "files": {"a": {"bytes": 1, "crc32": 4294967296}}})"),
            "m.json: files.a: missing its bytes and crc32 (corrupt manifest)");
  EXPECT_EQ(err("{" + ok + R"(, "files": {"a": {"bytes": 1, "crc32": 4294967295}}})"), "no error");
  fs::remove_all(dir);
}

// A metrics.jsonl record reads into its typed fields (values by hand) and
// writes back as the same JSON, unknown keys included; a key of another type
// is named in one line.
TEST(StepRecord, ReadsWhatTheTrainerWritesAndNamesWrongTypes) {
  const nlohmann::json line = nlohmann::json::parse(R"({"step": 41, "loss": null, "lr": 0.0005, "grad_norm": 1.25,
    "tokens_per_s": 6400.5, "elapsed_s": 12.0, "fp4_share": 0.75, "step_s": 0.2, "val_loss": 4.5, "val_ppl": 90.0,
    "precision": {"model.layers.0.mlp.up_proj": "fp4", "model.layers.0.self_attn.q_proj:fprop": "fp8"},
    "plan_step": 40, "phase": "plan", "plan_status": "optimal", "plan_solve_seconds": 0.01, "stats_seconds": 0.5,
    "rel_err_fprop": {"model.layers.0.mlp.up_proj": 0.125}, "guard_replan": true, "skipped": true,
    "guard": [{"step": 41, "condition": "loss_spike", "action": "rollback", "reason": "r", "layers": [],
               "outcome": "o"}],
    "rollback_to": 20, "pipe_bubble": 0.25, "boundary_bytes": 4096, "stage_imbalance": 1.5,
    "rebalanced_to": [0, 7, 8], "grad_comm_bytes": 100, "grad_comm_sent_bytes": 30, "comm_s": 0.125,
    "grad_clip": 0.5, "a_future_key": {"x": [1, 2]}})");
  const StepRecord r = step_record_from_json(line, "metrics.jsonl: line 41");
  EXPECT_EQ(r.step, 41);
  ASSERT_TRUE(r.loss.has_value());
  EXPECT_TRUE(std::isnan(*r.loss));  // null: a non-finite loss
  EXPECT_EQ(*r.lr, 0.0005);
  EXPECT_EQ(*r.val_loss, 4.5);
  EXPECT_EQ(r.precision->at("model.layers.0.self_attn.q_proj:fprop"), "fp8");
  EXPECT_EQ(*r.plan_step, 40);
  EXPECT_EQ(r.rel_err_fprop->at("model.layers.0.mlp.up_proj"), 0.125);
  ASSERT_EQ(r.guard.size(), 1u);
  EXPECT_EQ(r.guard[0].action, GuardAction::kRollback);
  EXPECT_EQ(*r.rollback_to, 20);
  EXPECT_EQ(*r.rebalanced_to, (std::vector<int64_t>{0, 7, 8}));
  EXPECT_EQ(*r.boundary_bytes, 4096);
  EXPECT_TRUE(r.skipped && r.guard_replan);
  EXPECT_EQ(r.extra, (nlohmann::json{{"a_future_key", {{"x", {1, 2}}}}}));
  EXPECT_EQ(r.to_json().dump(), line.dump());  // as written: NaN dumps as null
  // A minimal record has no other key.
  EXPECT_EQ(step_record_from_json({{"step", 1}}, "m").to_json(), (nlohmann::json{{"step", 1}}));
  for (const auto& [bad, message] : std::vector<std::pair<nlohmann::json, std::string>>{
           {{{"step", "x"}}, "m: step: expected an integer >= 0, got \"x\""},
           {{{"step", 1.5}}, "m: step: expected an integer >= 0, got 1.5"},
           {{{"loss", 2.0}}, "m: step: missing"},
           {{{"step", 1}, {"loss", "x"}}, "m: loss: expected a number or null, got \"x\""},
           {{{"step", 1}, {"precision", {{"l", 4}}}}, "m: precision.l: expected a string, got 4"},
           {{{"step", 1}, {"guard", {{{"action", "explode"}}}}}, "m: guard[].action: expected warn, fp8-layer, replan, rollback or stop, got 'explode'"},
           {{{"step", 1}, {"rebalanced_to", {0, 1.5}}}, "m: rebalanced_to[]: expected an integer, got 1.5"},
           {nlohmann::json::array(), "m: expected a JSON record, got array"}}) {
    std::string got = "(no error)";
    try {
      step_record_from_json(bad, "m");
    } catch (const UserError& e) {
      got = e.what();
    }
    EXPECT_EQ(got, message) << bad.dump();
  }
}

// A trainer_state.json field of the wrong type is named, not an internal error.
TEST(TrainerState, WrongTypesAreNamed) {
  const nlohmann::json ok = {{"step", 3}, {"loader", {{"epoch", 0}, {"cursor", 7}}}, {"seed", 1}, {"val_loss", nullptr}};
  const TrainerState s = TrainerState::from_json(ok, "st");
  EXPECT_EQ(s.step, 3);
  EXPECT_EQ(s.loader.cursor, 7u);
  EXPECT_FALSE(s.val_loss.has_value());
  EXPECT_EQ(s.loader_ranks(), 1);
  EXPECT_EQ(s.to_json(), ok);
  nlohmann::json bad = ok;
  bad["pipeline"] = {{"stages", 2}, {"replicas", 1}, {"bounds", {0, 2, 4}}, {"schedule", 1}, {"micro_batches", 2}};
  try {
    TrainerState::from_json(bad, "trainer_state.json");
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()), "trainer_state.json: pipeline.schedule: expected a string, got 1");
  }
  // Values of the right JSON type but out of range, each named with its field.
  for (const auto& [key, value, field] : std::vector<std::tuple<std::string, nlohmann::json, std::string>>{
           {"world_size", 1.9, "world_size"},
           {"world_size", 0, "world_size"},
           {"zero_stage", 9, "zero_stage"},
           {"tokens", -1, "tokens"},
           {"init_val_loss", -5.0, "init_val_loss"},
           {"data", {{"tokenizer_sha256", std::string(64, 'a')}, {"vocab_size", 512.7}}, "data.vocab_size"},
           {"data", {{"tokenizer_sha256", std::string(64, 'a')}, {"vocab_size", 512}, {"seq_len", int64_t{1} << 40}},
            "data.seq_len"},
           {"data", {{"tokenizer_sha256", "x"}, {"vocab_size", 512}}, "data.tokenizer_sha256"},
           {"data", {{"tokenizer_sha256", std::string(64, 'A')}, {"vocab_size", 512}}, "data.tokenizer_sha256"},
           {"resumed_at", {2, 1}, "resumed_at"},   // descending
           {"resumed_at", {4}, "resumed_at"},      // past the step (3)
           {"pipeline", {{"stages", 2}, {"replicas", 1}, {"bounds", {0, 2, 2}}, {"schedule", "1f1b"},
                         {"micro_batches", 2}}, "pipeline.bounds"},
           {"pipeline", {{"stages", 2}, {"replicas", 1}, {"bounds", {0, 1, 2}}, {"schedule", "GPipe"},
                         {"micro_batches", 2}}, "pipeline.schedule"},
           {"pipeline", {{"stages", 2}, {"replicas", 1}, {"bounds", {0, 1, 2}}, {"schedule", "gpipe"},
                         {"micro_batches", 2.5}}, "pipeline.micro_batches"}}) {
    nlohmann::json j = ok;
    j[key] = value;
    try {
      TrainerState::from_json(j, "st");
      ADD_FAILURE() << key << " = " << value.dump() << " accepted";
    } catch (const UserError& e) {
      EXPECT_EQ(std::string(e.what()).rfind("st: " + field + ": expected ", 0), 0u) << e.what();
    }
  }
  bad = ok;
  bad["world_size"] = 2;
  bad["pipeline"] = {{"stages", 2}, {"replicas", 1}, {"bounds", {0, 2, 4}}, {"schedule", "1f1b"}, {"micro_batches", 2}};
  bad["data_parallel"] = 1;
  EXPECT_EQ(TrainerState::from_json(bad, "st").loader_ranks(), 1);  // data_parallel before world_size
  bad.erase("data_parallel");
  EXPECT_EQ(TrainerState::from_json(bad, "st").loader_ranks(), 2);
}

TEST(Trainer, ResumeIsExact) {
  require_data();
  Config c = micro_config();
  c.set("train.max_steps", int64_t{16}, "test");
  c.set("train.checkpoint_interval", int64_t{8}, "test");
  c.set("train.eval_interval", int64_t{8}, "test");
  c.set("train.grad_accum", int64_t{2}, "test");
  TrainOptions o;
  o.quiet = true;
  o.run_dir = fresh_dir("straight");
  train(c, o);
  const auto straight = read_metrics(o.run_dir);

  TrainOptions r = o;
  r.run_dir = fresh_dir("resumed");
  r.stop_after = 11;  // killed after step 11: steps 9-11 are lost, checkpoint at 8
  train(c, r);
  ASSERT_EQ(read_metrics(r.run_dir).size(), 11u);
  r.stop_after = 0;
  r.resume = true;
  const TrainSummary sum = train(c, r);
  const auto resumed = read_metrics(r.run_dir);
  // The summary covers the whole run, not only the resumed invocation.
  EXPECT_EQ(sum.steps, 16);
  EXPECT_EQ(sum.tokens, 16 * 8 * 64 * 2);  // steps x B x T x grad_accum
  EXPECT_EQ(sum.invocation_steps, 8);      // from the step-8 checkpoint
  // Whole-run seconds: the step-8 checkpoint's elapsed_s (the first session up
  // to it) plus this session's, exactly.
  const double elapsed8 = verify_checkpoint(r.run_dir + "/checkpoints/step-8").at("elapsed_s").get<double>();
  EXPECT_GT(elapsed8, 0);
  EXPECT_EQ(sum.seconds, elapsed8 + sum.invocation_seconds);
  const auto summary = nlohmann::json::parse(io::read_file(r.run_dir + "/summary.json"));
  EXPECT_EQ(summary["steps"], 16);
  EXPECT_EQ(summary["resumed_at"], nlohmann::json::array({8}));
  EXPECT_EQ(summary["invocation"]["start_step"], 8);
  EXPECT_EQ(summary["invocation"]["steps"], 8);
  EXPECT_EQ(summary["seconds"].get<double>(), sum.seconds);
  const auto state16 = verify_checkpoint(r.run_dir + "/checkpoints/step-16");
  EXPECT_EQ(state16["resumed_at"], nlohmann::json::array({8}));
  // The typed record reads the file and gives its JSON back unchanged (run/trainer_state.h).
  const TrainerState ts16 = TrainerState::from_json(state16, "step-16");
  EXPECT_EQ(ts16.to_json(), state16);
  EXPECT_EQ(ts16.step, 16);
  EXPECT_EQ(ts16.tokens.value_or(-1), 16 * 8 * 64 * 2);
  EXPECT_EQ(ts16.resumed_at.value_or(std::vector<int64_t>{}), std::vector<int64_t>{8});
  EXPECT_EQ(ts16.loader_ranks(), 1);
  ASSERT_TRUE(ts16.data.has_value());
  EXPECT_EQ(ts16.data->seq_len.value_or(-1), 64);
  EXPECT_TRUE(ts16.extra.contains("crc32"));  // the writer's key, kept untyped
  // The validation set the losses are on: SHA-256 of val.bin.
  EXPECT_EQ(state16["data"]["val_sha256"],
            data::sha256_hex(io::read_file(state16["data"]["dir"].get<std::string>() + "/val.bin")));
  EXPECT_EQ(verify_checkpoint(o.run_dir + "/checkpoints/step-16")["resumed_at"], nlohmann::json::array());
  EXPECT_EQ(sum.best_val_loss, std::min(straight[7]["val_loss"].get<double>(), straight[15]["val_loss"].get<double>()));
  ASSERT_EQ(resumed.size(), straight.size());
  for (size_t i = 0; i < straight.size(); ++i) {
    SCOPED_TRACE(i);
    // Bit-identical: JSON doubles are written with 17 significant digits.
    EXPECT_EQ(resumed[i]["step"], straight[i]["step"]);
    EXPECT_EQ(resumed[i]["loss"].get<double>(), straight[i]["loss"].get<double>());
    EXPECT_EQ(resumed[i]["grad_norm"].get<double>(), straight[i]["grad_norm"].get<double>());
    EXPECT_EQ(resumed[i].value("val_loss", -1.0), straight[i].value("val_loss", -1.0));
  }
  const auto a = io::read_file(o.run_dir + "/checkpoints/step-16/model.safetensors");
  const auto b = io::read_file(r.run_dir + "/checkpoints/step-16/model.safetensors");
  EXPECT_TRUE(a == b) << "final weights differ";
  fs::remove_all(o.run_dir);
  fs::remove_all(r.run_dir);
}

TEST(Trainer, CorruptOrTruncatedCheckpointIsRefused) {
  require_data();
  Config c = micro_config();
  c.set("train.max_steps", int64_t{4}, "test");
  TrainOptions o;
  o.quiet = true;
  o.run_dir = fresh_dir("corrupt");
  train(c, o);
  const std::string w = o.run_dir + "/checkpoints/step-4/model.safetensors";
  std::string bytes = io::read_file(w);
  c.set("train.max_steps", int64_t{8}, "test");
  o.resume = true;
  // One flipped bit in the tensor data: the header is still valid.
  std::string flipped = bytes;
  flipped[flipped.size() - 3] ^= 0x10;
  io::write_file_atomic(w, flipped);
  expect_user_error([&] { train(c, o); }, "checksum mismatch");
  io::write_file_atomic(w, bytes.substr(0, bytes.size() / 2));
  expect_user_error([&] { train(c, o); }, "checksum mismatch");
  expect_user_error([&] { load_checkpoint_model(o.run_dir + "/checkpoints/step-4"); }, "checksum mismatch");
  // Nothing was written by the failed attempts: metrics still hold 4 steps.
  EXPECT_EQ(read_metrics(o.run_dir).size(), 4u);
  fs::remove_all(o.run_dir);
}

TEST(Trainer, BadInputFailsBeforeWritingAnything) {
  require_data();
  TrainOptions o;
  o.quiet = true;
  o.run_dir = fresh_dir("bad");
  {
    Config c = micro_config();
    c.set("data.dir", std::string("/nonexistent/data"), "test");
    expect_user_error([&] { train(c, o); }, "does not exist");
  }
  {
    Config c = micro_config();
    c.set("model.vocab_size", int64_t{100}, "test");  // tokenizer has 512
    expect_user_error([&] { train(c, o); }, "smaller than the tokenizer's vocabulary 512");
  }
  {
    Config c = micro_config();
    c.set("precision.recipe", std::string("fp3"), "test");
    expect_user_error([&] { train(c, o); }, "unknown recipe 'fp3'");
  }
  {
    Config c = micro_config();
    c.set("model.num_key_value_heads", int64_t{3}, "test");
    expect_user_error([&] { train(c, o); }, "num_attention_heads (4) must be divisible by model.num_key_value_heads (3)");
  }
  {
    Config c = micro_config();
    TrainOptions r = o;
    r.resume = true;
    expect_user_error([&] { train(c, r); }, "no complete checkpoint");
  }
  EXPECT_FALSE(fs::exists(o.run_dir)) << "a failed start created the run directory";
  {
    Config c = micro_config();
    TrainOptions u = o;
    u.run_dir = "/proc/snip-cannot-write-here";
    expect_user_error([&] { train(c, u); }, "not writable");
  }
}

TEST(Trainer, SecondTrainerOnOneRunFolderIsRefused) {
  require_data();
  Config c = micro_config();
  c.set("train.max_steps", int64_t{2}, "test");
  TrainOptions o;
  o.quiet = true;
  o.run_dir = fresh_dir("locked");
  {
    io::DirLock other(o.run_dir, "run directory");  // another trainer holds the folder
    expect_user_error([&] { train(c, o); }, "is in use by process " + std::to_string(getpid()));
    EXPECT_FALSE(fs::exists(o.run_dir + "/metrics.jsonl"));
  }
  train(c, o);  // released: the folder is free again
  EXPECT_EQ(read_metrics(o.run_dir).size(), 2u);
  fs::remove_all(o.run_dir);
}

TEST(Trainer, FailedMetricsWriteStopsTheRunAndKeepsTheCheckpoint) {
  require_data();
  Config c = micro_config();
  c.set("train.max_steps", int64_t{8}, "test");
  TrainOptions o;
  o.quiet = true;
  o.run_dir = fresh_dir("diskfull");
  train(c, o);  // checkpoint at step 8
  const std::string ckpt = o.run_dir + "/checkpoints/step-8";
  // Disk full, as the run sees it: no file may grow beyond a few KiB more than
  // the config it rewrites (RLIMIT_FSIZE; writes then fail with EFBIG).
  const auto limit = rlim_t(fs::file_size(o.run_dir + "/config.toml") + 4096);
  c.set("train.max_steps", int64_t{1000}, "test");
  c.set("train.checkpoint_interval", int64_t{0}, "test");
  o.resume = true;
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  auto* old_handler = signal(SIGXFSZ, SIG_IGN);
  rlimit small = old;
  small.rlim_cur = limit;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  const std::string m = test::error_of([&] { train(c, o); });
  setrlimit(RLIMIT_FSIZE, &old);
  signal(SIGXFSZ, old_handler);
  EXPECT_NE(m.find("cannot write " + o.run_dir + "/metrics.jsonl: File too large"), std::string::npos) << m;
  EXPECT_NE(m.find("its last checkpoint is intact"), std::string::npos) << m;
  // It stopped at the failed write, long before step 1000 (the file holds
  // what fit under the limit: the limit grows with config.toml, so count
  // bytes, not rows), and step 8 is intact.
  const auto rows = read_metrics(o.run_dir);
  EXPECT_GT(rows.size(), 8u);
  EXPECT_LE(fs::file_size(o.run_dir + "/metrics.jsonl"), limit);
  EXPECT_LT(rows.size(), 500u);
  EXPECT_EQ(latest_checkpoint(o.run_dir), ckpt);
  EXPECT_EQ(verify_checkpoint(ckpt)["step"], 8);
  fs::remove_all(o.run_dir);
}

TEST(Trainer, RunStoppedBeforeItsFirstCheckpointResumesFromStepZero) {
  require_data();
  Config c = micro_config();
  c.set("train.max_steps", int64_t{6}, "test");
  c.set("train.checkpoint_interval", int64_t{0}, "test");
  TrainOptions o;
  o.quiet = true;
  o.run_dir = fresh_dir("straight6");
  train(c, o);
  const auto straight = read_metrics(o.run_dir);

  TrainOptions r = o;
  r.run_dir = fresh_dir("early-kill");
  r.stop_after = 3;  // killed at step 3: no checkpoint yet
  train(c, r);
  EXPECT_EQ(latest_checkpoint(r.run_dir), "");
  r.stop_after = 0;
  expect_user_error([&] { train(c, r); }, "already holds a run; continue it with --resume");
  r.resume = true;
  train(c, r);  // from step 0, same data order: the straight run, bit for bit
  const auto resumed = read_metrics(r.run_dir);
  ASSERT_EQ(resumed.size(), straight.size());
  for (size_t i = 0; i < straight.size(); ++i)
    EXPECT_EQ(resumed[i]["loss"].get<double>(), straight[i]["loss"].get<double>()) << i;
  fs::remove_all(o.run_dir);
  fs::remove_all(r.run_dir);
}

TEST(Trainer, RecipeIsTheUniformPolicyOnEveryLayerAndStep) {
  require_data();
  auto run = [&](const std::string& name, const std::vector<std::pair<std::string, OptionValue>>& sets) {
    Config c = micro_config();
    c.set("train.max_steps", int64_t{5}, "test");
    for (const auto& [k, v] : sets) c.set(k, v, "test");
    TrainOptions o;
    o.quiet = true;
    o.run_dir = fresh_dir(name);
    train(c, o);
    auto m = read_metrics(o.run_dir);
    fs::remove_all(o.run_dir);
    return m;
  };
  const auto alias = run("alias", {{"precision.recipe", std::string("fp4")}});
  const auto policy = run("uniform", {{"precision.policy", std::string("uniform-fp4")},
                                      {"precision.warmup_steps", int64_t{0}},
                                      {"precision.final_high_precision_fraction", 0.0}});
  ASSERT_EQ(alias.size(), 5u);
  ASSERT_EQ(policy.size(), 5u);
  for (size_t i = 0; i < alias.size(); ++i) {
    EXPECT_EQ(alias[i]["loss"].get<double>(), policy[i]["loss"].get<double>()) << i;
    EXPECT_EQ(alias[i]["fp4_share"].get<double>(), 1.0) << i;
  }
  // Every 4-bit recipe runs 100% of the GEMM FLOPs in 4 bits, whatever
  // precision.low_option names; an 8-bit one none.
  for (const auto& [recipe, share] : std::vector<std::pair<std::string, double>>{
           {"nvfp4", 1.0}, {"mxfp4", 1.0}, {"fp8", 0.0}}) {
    SCOPED_TRACE(recipe);
    const auto m = run("share-" + recipe, {{"precision.recipe", recipe}});
    for (const auto& r : m) EXPECT_EQ(r["fp4_share"].get<double>(), share);
  }
  const auto mx = run("uniform-mxfp4", {{"precision.policy", std::string("uniform-mxfp4")},
                                        {"precision.warmup_steps", int64_t{2}},
                                        {"precision.final_high_precision_fraction", 0.0}});
  EXPECT_EQ(mx[0]["fp4_share"].get<double>(), 0.0);  // warmup: BF16
  EXPECT_EQ(mx[2]["fp4_share"].get<double>(), 1.0);  // planned: every layer MXFP4
}

TEST(Trainer, RunKilledBetweenLastCheckpointAndSummaryIsFinishedOnResume) {
  require_data();
  Config c = micro_config();
  c.set("train.max_steps", int64_t{4}, "test");
  c.set("train.eval_interval", int64_t{2}, "test");
  TrainOptions o;
  o.quiet = true;
  o.run_dir = fresh_dir("nosummary");
  const TrainSummary first = train(c, o);
  fs::remove(o.run_dir + "/summary.json");  // killed right after the step-4 checkpoint
  o.resume = true;
  const TrainSummary again = train(c, o);
  EXPECT_EQ(again.steps, 4);
  EXPECT_EQ(again.invocation_steps, 0);
  EXPECT_EQ(again.final_val_loss, first.final_val_loss);  // from metrics.jsonl, step 4
  EXPECT_EQ(again.best_val_loss, first.best_val_loss);
  EXPECT_EQ(read_metrics(o.run_dir).size(), 4u);
  EXPECT_TRUE(fs::exists(o.run_dir + "/summary.json"));
  // With its summary written, a further resume has nothing to do.
  expect_user_error([&] { train(c, o); }, "nothing to do");
  fs::remove_all(o.run_dir);
}

TEST(Trainer, ResumeRefusesAnotherDataOrderOrStepSize) {
  require_data();
  Config c = micro_config();
  c.set("train.max_steps", int64_t{4}, "test");
  c.set("train.checkpoint_interval", int64_t{2}, "test");
  TrainOptions o;
  o.quiet = true;
  o.run_dir = fresh_dir("reshape");
  o.stop_after = 2;
  train(c, o);
  o.stop_after = 0;
  o.resume = true;
  for (const auto& [key, v] : std::vector<std::pair<std::string, int64_t>>{
           {"train.batch_size", 4}, {"train.seq_len", 32}, {"train.grad_accum", 2}, {"train.seed", 99}}) {
    Config changed = c;
    changed.set(key, v, "test");
    expect_user_error([&] { train(changed, o); }, "--resume: " + key + " is " + std::to_string(v));
  }
  EXPECT_EQ(read_metrics(o.run_dir).size(), 2u);  // nothing written by the refused attempts
  c.set("train.max_steps", int64_t{6}, "test");    // a longer run is fine
  EXPECT_EQ(train(c, o).steps, 6);
  fs::remove_all(o.run_dir);
}
