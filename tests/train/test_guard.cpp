// The guard (train/guard.h): its conditions on hand-made numbers at their
// boundaries (exactly 5%, two steps then a drop, three steps), the
// checkpoint and metrics files a rollback leaves, and forced
// divergences in micro-model runs (an injected Inf, a learning-rate spike):
// caught within the step, rolled back, precision raised, a finite end, and
// no non-finite checkpoint.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>

#include "snip/config/config.h"
#include "snip/io/atomic_file.h"
#include "snip/io/safetensors.h"
#include "snip/train/checkpoint.h"
#include "train/guard.h"  // beside its .cpp in src/
#include "train/metrics.h"  // beside its .cpp in src/
#include "snip/train/trainer.h"
#include "snip/core/error.h"
#include "micro.h"

using namespace snip;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

GuardConfig small_windows() {
  GuardConfig g;
  g.spike_window = 4;
  g.spike_ratio = 0.5;
  g.throughput_drop = 0.5;
  g.quant_error_threshold = 0.05;
  g.quant_error_steps = 3;
  return g;
}

GuardObservation obs(int64_t step, double loss, double gnorm = 1.0, double tps = 0) {
  GuardObservation o;
  o.step = step;
  o.loss = loss;
  o.grad_norm = gnorm;
  o.tokens_per_s = tps;
  return o;
}

// One whole-layer measurement of `layer` (operand ""), or of an operand.
GuardObservation::QuantError qe(const std::string& layer, double err, const std::string& format = "",
                                const std::string& operand = "") {
  return {layer, operand, format, err};
}

std::vector<std::string> conditions(const std::vector<GuardEvent>& ev) {
  std::vector<std::string> out;
  for (const auto& e : ev) out.push_back(e.condition);
  return out;
}

}  // namespace

TEST(Guard, NonFiniteLossOrGradientFiresAtOnce) {
  Guard g(small_windows());
  // No window is needed: the first step can be non-finite.
  auto ev = g.observe(obs(1, std::nan("")));
  ASSERT_EQ(conditions(ev), std::vector<std::string>{"nonfinite"});
  EXPECT_EQ(ev[0].action, GuardAction::kRollback);  // the default
  EXPECT_NE(ev[0].reason.find("loss is nan"), std::string::npos) << ev[0].reason;
  ev = g.observe(obs(2, 3.0, kInf));
  ASSERT_EQ(conditions(ev), std::vector<std::string>{"nonfinite"});
  EXPECT_NE(ev[0].reason.find("gradient norm is inf"), std::string::npos) << ev[0].reason;
  EXPECT_TRUE(g.observe(obs(3, 3.0, 1.0)).empty());
}

TEST(Guard, LossSpikeIsStrictlyAboveOneAndAHalfTimesTheWindowMean) {
  Guard g(small_windows());
  // The window (4 steps) fills first: a jump before that is not judged.
  for (int s = 1; s <= 3; ++s) EXPECT_TRUE(g.observe(obs(s, 2.0)).empty());
  EXPECT_TRUE(g.observe(obs(4, 2.0)).empty());  // 4 losses of 2.0: mean 2.0
  // 1.5 x 2.0 = 3.0 exactly: not above.
  EXPECT_TRUE(g.observe(obs(5, 3.0)).empty());
  // The window is now 2, 2, 2, 3: mean 2.25, threshold 3.375.
  EXPECT_TRUE(g.observe(obs(6, 3.375)).empty());
  // Window 2, 2, 3, 3.375: mean 2.59375, threshold 3.890625.
  const auto ev = g.observe(obs(7, 3.9));
  ASSERT_EQ(conditions(ev), std::vector<std::string>{"loss_spike"});
  EXPECT_EQ(ev[0].step, 7);
  EXPECT_NE(ev[0].reason.find("mean 2.5938"), std::string::npos) << ev[0].reason;
  // After a spike the window refills: the next 4 steps are not judged.
  for (int s = 8; s <= 11; ++s) EXPECT_TRUE(g.observe(obs(s, 10.0)).empty()) << s;
  EXPECT_TRUE(g.observe(obs(12, 15.0)).empty());  // 1.5 x 10 exactly
  // Window 10, 10, 10, 15: mean 11.25, threshold 16.875.
  EXPECT_TRUE(g.observe(obs(13, 16.875)).empty());
  // Window 10, 10, 15, 16.875: mean 12.96875, threshold 19.453125.
  EXPECT_TRUE(g.observe(obs(14, 19.453125)).empty());
  // Window 10, 15, 16.875, 19.453125: mean 15.33203125, threshold 22.998046875.
  EXPECT_EQ(conditions(g.observe(obs(15, 23.0))), std::vector<std::string>{"loss_spike"});
}

// Each operand counts against its element format's threshold
// (GuardConfig::threshold_for; defaults E2M1 0.3, E5M2 0.15, E4M3 0.08,
// config.cpp's): E2M1's healthy ~0.1-0.25 never fires, 0.31 does; E5M2's
// 0.12 does not, E4M3's 0.09 does; an unknown format counts against
// quant_error_threshold.
TEST(Guard, QuantErrorThresholdPerElementFormat) {
  GuardConfig c;  // the defaults
  EXPECT_EQ(c.quant_error_threshold_fp4, 0.3);
  EXPECT_EQ(c.quant_error_threshold_e5m2, 0.15);
  EXPECT_EQ(c.quant_error_threshold, 0.08);
  EXPECT_EQ(c.quant_error_steps, 3);
  EXPECT_EQ(c.threshold_for("e2m1"), 0.3);
  EXPECT_EQ(c.threshold_for("int4"), 0.3);  // 4 bits, not a float
  EXPECT_EQ(c.threshold_for("e1m2"), 0.3);  // 4 bits, though 2 mantissa bits
  EXPECT_EQ(c.threshold_for("e5m2"), 0.15);
  EXPECT_EQ(c.threshold_for("e3m2"), 0.15);  // FP6 with 2 mantissa bits
  EXPECT_EQ(c.threshold_for("e4m3"), 0.08);
  EXPECT_EQ(c.threshold_for("int8"), 0.08);
  EXPECT_EQ(c.threshold_for("bf16"), 0.08);
  EXPECT_EQ(c.threshold_for(""), 0.08);
  EXPECT_EQ(c.threshold_for("no-such-format"), 0.08);
  Guard g(c);
  std::vector<GuardEvent> ev;
  for (int64_t s = 1; s <= 3; ++s) {
    GuardObservation o = obs(s, 2.0);
    o.quant_error = {qe("l1", 0.25, "e2m1", "fprop.x"), qe("l1", 0.31, "e2m1", "fprop.w"),
                     qe("l2", 0.12, "e5m2", "dgrad.dy"), qe("l2", 0.09, "e4m3", "fprop.x"),
                     qe("l3", 0.3, "e2m1", "fprop.x"), qe("l4", 0.09)};
    ev = g.observe(o);
  }
  EXPECT_EQ(g.streak("l1 fprop.x e2m1"), 0);
  EXPECT_EQ(g.streak("l1 fprop.w e2m1"), 3);
  EXPECT_EQ(g.streak("l2 dgrad.dy e5m2"), 0);
  EXPECT_EQ(g.streak("l3 fprop.x e2m1"), 0);  // exactly the threshold does not count
  ASSERT_EQ(conditions(ev), std::vector<std::string>{"quant_error"});
  EXPECT_EQ(ev[0].layers, (std::vector<std::string>{"l1", "l2", "l4"}));  // each layer once
  EXPECT_NE(ev[0].reason.find("l1 fprop.w 0.3100 (> 0.3, e2m1), l2 fprop.x 0.0900 (> 0.08, e4m3), "
                               "l4 0.0900 (> 0.08, format unknown)"),
            std::string::npos)
      << ev[0].reason;
  // Per layer its worst operand (error / threshold) and how many more are
  // over; at most 6 layers named in the reason, every one in `layers`.
  Guard h(c);
  for (int64_t s = 1; s <= 3; ++s) {
    GuardObservation o = obs(s, 2.0);
    o.quant_error = {qe("a", 0.31, "e2m1", "fprop.x"), qe("a", 0.16, "e5m2", "dgrad.dy"),
                     qe("a", 0.5, "e2m1", "wgrad.dy")};
    for (int l = 0; l < 7; ++l) o.quant_error.push_back(qe("m" + std::to_string(l), 0.1, "e4m3", "fprop.x"));
    ev = h.observe(o);
  }
  ASSERT_EQ(conditions(ev), std::vector<std::string>{"quant_error"});
  EXPECT_EQ(ev[0].layers.size(), 8u);
  EXPECT_NE(ev[0].reason.find(": a wgrad.dy 0.5000 (> 0.3, e2m1) and 2 more operands, m0 fprop.x 0.1000"),
            std::string::npos)
      << ev[0].reason;
  EXPECT_NE(ev[0].reason.find("m4 fprop.x 0.1000 (> 0.08, e4m3), and 2 more layers"), std::string::npos)
      << ev[0].reason;
}

TEST(Guard, QuantErrorAboveFivePercentForThreeMeasurements) {
  Guard g(small_windows());
  auto q = [&](int64_t step, double a, double b) {
    GuardObservation o = obs(step, 2.0);
    o.quant_error = {qe("a", a), qe("b", b)};
    return g.observe(o);
  };
  // Exactly 5% never counts; "a" above twice then a drop; "b" three times.
  EXPECT_TRUE(q(1, 0.06, 0.05).empty());
  EXPECT_TRUE(q(2, 0.07, 0.051).empty());
  EXPECT_EQ(g.streak("a"), 2);
  EXPECT_EQ(g.streak("b"), 1);
  EXPECT_TRUE(q(3, 0.05, 0.06).empty());  // a drops to exactly 5%: reset
  EXPECT_EQ(g.streak("a"), 0);
  EXPECT_EQ(g.streak("b"), 2);
  const auto ev = q(4, 0.04, 0.08);  // b's third in a row
  ASSERT_EQ(conditions(ev), std::vector<std::string>{"quant_error"});
  EXPECT_EQ(ev[0].layers, std::vector<std::string>{"b"});
  EXPECT_EQ(ev[0].action, GuardAction::kWarn);  // the default
  // Once per streak: b's fourth step above is no new event.
  EXPECT_TRUE(q(5, 0.04, 0.09).empty());
  EXPECT_EQ(g.streak("b"), 4);
  // A step without a measurement breaks every streak (measured every step,
  // an operand not measured was not quantized).
  EXPECT_TRUE(g.observe(obs(6, 2.0)).empty());
  EXPECT_EQ(g.streak("b"), 0);
  // A NaN measurement counts as above (a broken measurement is not a good one).
  EXPECT_EQ(conditions(q(7, std::nan(""), 0.0)), std::vector<std::string>{});
  EXPECT_EQ(g.streak("a"), 1);
  // b builds up again: a new streak fires again at its third step.
  EXPECT_TRUE(q(8, 0.0, 0.06).empty());
  EXPECT_TRUE(q(9, 0.0, 0.06).empty());
  EXPECT_EQ(conditions(q(10, 0.0, 0.06)), std::vector<std::string>{"quant_error"});
  // The format is part of the key: a count made under e2m1 does not carry
  // over when the operand runs e4m3 (a plan change).
  Guard h(small_windows());
  GuardObservation o1 = obs(1, 2.0), o2 = obs(2, 2.0), o3 = obs(3, 2.0);
  o1.quant_error = {qe("l", 0.4, "e2m1", "fprop.x")};
  o2.quant_error = {qe("l", 0.4, "e2m1", "fprop.x")};
  o3.quant_error = {qe("l", 0.4, "e4m3", "fprop.x")};
  EXPECT_TRUE(h.observe(o1).empty());
  EXPECT_TRUE(h.observe(o2).empty());
  EXPECT_TRUE(h.observe(o3).empty());
  EXPECT_EQ(h.streak("l fprop.x e4m3"), 1);
  EXPECT_EQ(h.streak("l fprop.x e2m1"), 0);
}

TEST(Guard, ThroughputBelowHalfTheWindowMeanForThreeSteps) {
  Guard g(small_windows());
  for (int s = 1; s <= 4; ++s) EXPECT_TRUE(g.observe(obs(s, 2.0, 1.0, 100.0)).empty());
  EXPECT_TRUE(g.observe(obs(5, 2.0, 1.0, 50.0)).empty());  // exactly 0.5 x 100: not slow, enters the window
  // Window 100, 100, 100, 50: mean 87.5, threshold 43.75. Two slow steps,
  // then one at the threshold: no event (slow steps stay out of the window).
  EXPECT_TRUE(g.observe(obs(6, 2.0, 1.0, 43.0)).empty());
  EXPECT_TRUE(g.observe(obs(7, 2.0, 1.0, 43.0)).empty());
  EXPECT_TRUE(g.observe(obs(8, 2.0, 1.0, 43.75)).empty());
  // Window 100, 100, 50, 43.75: mean 73.4375, threshold 36.71875: three slow steps.
  EXPECT_TRUE(g.observe(obs(9, 2.0, 1.0, 36.7)).empty());
  EXPECT_TRUE(g.observe(obs(10, 2.0, 1.0, 0.0)).empty());  // not measured (0): not judged, no reset
  EXPECT_TRUE(g.observe(obs(11, 2.0, 1.0, 30.0)).empty());
  const auto ev = g.observe(obs(12, 2.0, 1.0, 20.0));
  ASSERT_EQ(conditions(ev), std::vector<std::string>{"throughput_drop"});
  EXPECT_EQ(ev[0].action, GuardAction::kWarn);
  // The window refills at the new level.
  for (int s = 13; s <= 17; ++s) EXPECT_TRUE(g.observe(obs(s, 2.0, 1.0, 20.0)).empty()) << s;
}

TEST(Guard, StrongestActionWinsAndActionsParse) {
  GuardConfig c = small_windows();
  c.on_nonfinite = GuardAction::kStop;
  c.on_quant_error = GuardAction::kReplan;
  Guard g(c);
  GuardObservation o = obs(1, kInf);
  o.quant_error = {qe("x", 0.5)};
  g.observe(o);
  g.observe(o);
  const auto ev = g.observe(o);
  ASSERT_EQ(conditions(ev), (std::vector<std::string>{"nonfinite", "quant_error"}));
  EXPECT_EQ(Guard::strongest(ev), GuardAction::kStop);
  EXPECT_EQ(Guard::strongest({}), GuardAction::kWarn);
  for (const char* a : {"warn", "fp8-layer", "replan", "rollback", "stop"})
    EXPECT_STREQ(to_string(parse_guard_action(a, "x")), a);
  EXPECT_NE(test::error_of([] { parse_guard_action("explode", "guard.on_nonfinite"); })
                .find("guard.on_nonfinite: expected warn, fp8-layer, replan, rollback or stop, got 'explode'"),
            std::string::npos);
}

TEST(Guard, ConfigRefusesBadActionsWithOneLine) {
  Config c;
  c.set("guard.on_loss_spike", std::string("explode"), "test");
  const std::string m = test::error_of([&] { RunConfig::from(c); });
  EXPECT_NE(m.find("guard.on_loss_spike"), std::string::npos) << m;
  EXPECT_NE(m.find("explode"), std::string::npos) << m;
  // Throughput is per rank: only actions that need no agreement.
  Config t;
  t.set("guard.on_throughput_drop", std::string("rollback"), "test");
  EXPECT_NE(test::error_of([&] { RunConfig::from(t); }).find("guard.on_throughput_drop"), std::string::npos);
  Config r;
  r.set("train.clip_low_precision", 0.0, "test");
  EXPECT_NE(test::error_of([&] { RunConfig::from(r); }).find("train.clip_low_precision"), std::string::npos);
}

TEST(Guard, StateRoundTripsThroughJson) {
  Guard g(small_windows());
  g.rollbacks = 2;
  g.skipped_steps = 3;
  g.raises = 4;
  g.state = GuardState::kRolledBack;
  GuardEvent e;
  e.step = 7;
  e.condition = "quant_error";
  e.action = GuardAction::kFp8Layer;
  e.reason = "r";
  e.layers = {"model.layers.0.mlp.up_proj"};
  e.outcome = "moved";
  g.remember(e);
  // Windows that decide the next steps: 4 losses of 2.0, a streak of 2.
  for (int s = 1; s <= 4; ++s) {
    GuardObservation o = obs(s, 2.0);
    if (s >= 3) o.quant_error = {qe("q", 0.2)};
    g.observe(o);
  }
  Guard h(small_windows());
  h.restore(g.to_json(), "t");
  EXPECT_EQ(h.to_json(), g.to_json());
  EXPECT_EQ(h.streak("q"), 2);
  // The restored guard decides the next step as the original does.
  GuardObservation next = obs(5, 3.1);  // > 1.5 x 2.0
  next.quant_error = {qe("q", 0.2)};      // the third in a row
  EXPECT_EQ(conditions(h.observe(next)), (std::vector<std::string>{"loss_spike", "quant_error"}));
  EXPECT_EQ(conditions(g.observe(next)), (std::vector<std::string>{"loss_spike", "quant_error"}));
  json bad = g.to_json();
  bad["state"] = "sleeping";
  EXPECT_NE(test::error_of([&] { h.restore(bad, "trainer_state.json"); }).find("trainer_state.json: guard.state"),
            std::string::npos);
}

// metrics.jsonl after a rollback: steps 1..5, step 5 rolled back to 2, then
// 3, 4 again. A resume keeps the history and cuts after the last record that
// leaves the run at the checkpoint's step.
TEST(GuardMetrics, ResumeKeepsRolledBackHistory) {
  const std::string dir = test::fresh_dir("guard-metrics");
  fs::create_directories(dir);
  const std::string path = dir + "/metrics.jsonl";
  const std::string lines =
      "{\"step\":1,\"loss\":3}\n{\"step\":2,\"loss\":2.5}\n{\"step\":3,\"loss\":2.4}\n{\"step\":4,\"loss\":2.3}\n"
      "{\"step\":5,\"loss\":null,\"rollback_to\":2}\n{\"step\":3,\"loss\":2.45}\n{\"step\":4,\"loss\":2.35}\n";
  {
    io::write_file_atomic(path, lines);
    MetricsLog m(path, 4);  // the checkpoint at 4 written after the rollback
    ASSERT_EQ(m.earlier().size(), 4u);
    EXPECT_EQ(*m.earlier()[2].loss, 2.45);  // the trajectory that leads to step 4
    EXPECT_EQ(io::read_file(path), lines);
  }
  {
    io::write_file_atomic(path, lines);
    MetricsLog m(path, 2);  // killed right after the rollback: back at checkpoint 2
    ASSERT_EQ(m.earlier().size(), 2u);
    const std::string kept = io::read_file(path);
    EXPECT_EQ(kept, lines.substr(0, lines.find("{\"step\":3,\"loss\":2.45}")));
  }
  // A repeated step without a rollback record is still corrupt.
  io::write_file_atomic(path, "{\"step\":1,\"loss\":3}\n{\"step\":2,\"loss\":2.5}\n{\"step\":2,\"loss\":2.5}\n");
  EXPECT_NE(test::error_of([&] { MetricsLog m(path, 2); }).find("line 3: step 2 where step 3 was expected"),
            std::string::npos);
  // rollback_to must lie before its own step.
  io::write_file_atomic(path, "{\"step\":1,\"loss\":3}\n{\"step\":2,\"rollback_to\":2}\n");
  EXPECT_NE(test::error_of([&] { MetricsLog m(path, 1); }).find("rollback_to"), std::string::npos);
  fs::remove_all(dir);
}

namespace {

void require_data() {
  if (!fs::exists(test::kKjv512 + "/train.bin")) GTEST_SKIP() << "no prepared KJV data";
}

// Every checkpoint of RUN holds finite weights.
void expect_finite_checkpoints(const std::string& run) {
  for (const auto& d : fs::directory_iterator(run + "/checkpoints")) {
    if (!d.is_directory()) continue;
    const io::SafeTensors st = io::read_safetensors((d.path() / "model.safetensors").string());
    for (const auto& t : st.tensors) {
      ASSERT_EQ(t.dtype, io::DType::F32);
      const float* v = reinterpret_cast<const float*>(t.data.data());
      for (size_t i = 0; i < t.data.size() / 4; ++i) ASSERT_TRUE(std::isfinite(v[i])) << d.path() << " " << t.name;
    }
  }
}

Config guarded_micro() {
  Config c = test::micro_config();
  c.set("train.max_steps", int64_t{16}, "test");
  c.set("train.checkpoint_interval", int64_t{4}, "test");
  c.set("train.eval_interval", int64_t{4}, "test");
  c.set("precision.policy", std::string("snip"), "test");
  c.set("precision.warmup_steps", int64_t{2}, "test");
  c.set("monitor.listen", std::string(""), "test");
  return c;
}

}  // namespace

// The guard's acceptance test: an Inf injected into a gradient at step 6
// is caught in that step (its update skipped), the run rolls back to the
// step-4 checkpoint, re-plans with 10% less FP4 budget, and ends finite.
// The test faults a run is given (train/faults.h): the two spellings of
// SNIP_TEST_FAULT, each field as written, anything else refused naming it.
TEST(FaultInjector, ParsesBothFaultsAndRefusesOthers) {
  const FaultInjector none = FaultInjector::parse("");
  EXPECT_EQ(none.grad_inf_step, -1);
  EXPECT_EQ(none.lr_spike_step, -1);
  const FaultInjector inf = FaultInjector::parse("grad-inf@6");
  EXPECT_EQ(inf.grad_inf_step, 6);
  EXPECT_EQ(inf.lr_spike_step, -1);
  const FaultInjector lr = FaultInjector::parse("lr-spike@7:1000");
  EXPECT_EQ(lr.lr_spike_step, 7);
  EXPECT_EQ(lr.lr_factor, 1000.0);
  EXPECT_EQ(lr.grad_inf_step, -1);
  for (const char* bad : {"grad-inf", "nan@3", "lr-spike@3", "grad-inf@x", "grad-inf@", "grad-inf@0", "grad-inf@-3",
                          "grad-inf@6:2", "grad-inf@6,lr-spike@7:10", "lr-spike@7:abc", "lr-spike@7:0",
                          "lr-spike@7:nan", "lr-spike@7:1e400"})
    EXPECT_NE(test::error_of([&] { FaultInjector::parse(bad); }).find("SNIP_TEST_FAULT"), std::string::npos) << bad;
}

TEST(GuardTrain, InjectedInfIsCaughtRolledBackAndRaised) {
  require_data();
  const std::string run = test::fresh_dir("guard-inf");
  TrainOptions o;
  o.run_dir = run;
  o.quiet = true;
  o.faults = FaultInjector::parse("grad-inf@6");
  const TrainSummary s = train(guarded_micro(), o);
  EXPECT_EQ(s.steps, 16);
  EXPECT_EQ(s.rollbacks, 1);
  EXPECT_EQ(s.skipped_steps, 1);
  EXPECT_EQ(s.invocation_steps, 18);  // 1..6, then 5..16 again
  EXPECT_TRUE(std::isfinite(s.final_val_loss));
  const auto m = test::read_metrics(run);
  ASSERT_EQ(m.size(), 18u);
  // Step 6: skipped, one event, rolled back to 4.
  EXPECT_EQ(m[5]["step"], 6);
  EXPECT_TRUE(m[5]["skipped"].get<bool>());
  EXPECT_EQ(m[5]["rollback_to"], 4);
  ASSERT_EQ(m[5]["guard"].size(), 1u);
  EXPECT_EQ(m[5]["guard"][0]["condition"], "nonfinite");
  EXPECT_EQ(m[5]["guard"][0]["action"], "rollback");
  EXPECT_FALSE(m[5].contains("val_loss"));
  // Then step 5 again, with the re-plan (budget 0.75 - 0.10 = 0.65) at its boundary.
  EXPECT_EQ(m[6]["step"], 5);
  EXPECT_TRUE(m[6]["guard_replan"].get<bool>());
  EXPECT_LE(m[6]["fp4_share"].get<double>(), 0.75);
  EXPECT_GE(m[6]["fp4_share"].get<double>(), 0.65);
  const json plan = json::parse(io::read_file(run + "/plans/step-4.json"));
  EXPECT_GE(plan["fp4_share"].get<double>(), 0.65);
  EXPECT_LT(plan["fp4_share"].get<double>(), 0.75);
  // The data since the checkpoint was skipped: the replayed step 5 saw other
  // windows, so its loss differs from the first step 5's.
  EXPECT_NE(m[6]["loss"].get<double>(), m[4]["loss"].get<double>());
  for (const auto& r : m) EXPECT_TRUE(r["loss"].is_number()) << r.dump();  // grad was Inf, not the loss
  // The checkpoint state says what the guard did; nothing non-finite was saved.
  const json st = verify_checkpoint(run + "/checkpoints/step-16");
  EXPECT_EQ(st["guard"]["rollbacks"], 1);
  EXPECT_EQ(st["guard"]["state"], "rolled_back");
  EXPECT_LT(st["precision"]["budget"].get<double>(), 0.75 - 0.09);
  EXPECT_EQ(st["loader_base"]["step"], 4);
  expect_finite_checkpoints(run);
  const json sum = json::parse(io::read_file(run + "/summary.json"));
  EXPECT_EQ(sum["guard"]["rollbacks"], 1);
  // The report lists the event.
  const std::string html = io::read_file(run + "/report.html");
  EXPECT_NE(html.find("<section id=\"guard\">"), std::string::npos);
  EXPECT_NE(html.find("<td>nonfinite</td><td>rollback</td><td class=\"wrap\">"), std::string::npos);
  // Its sentences wrap, and the table scrolls rather than widening the page.
  EXPECT_NE(html.find("<div class=\"scroll\"><table class=\"guard\">"), std::string::npos);
  EXPECT_NE(html.find("td.wrap, th.wrap { text-align: left; white-space: normal;"), std::string::npos);
  fs::remove_all(run);
}

// fp8-layer on the quantization-error condition in a real run, per step:
// every quantized operand's error is in each step's record ("quant_err");
// with E2M1's threshold lowered to 5% (guard.quant_error_threshold_fp4; its
// default 0.3 sits above healthy FP4's ~0.1-0.25) every FP4 operand is above
// it at every step it runs, so the guard fires at the third step after the
// first plan puts layers in FP4, naming exactly the layers with an operand
// above its format's threshold three steps in a row (recounted here from
// the records, with the formats of the recipes the records name), and moves
// them to fp8 until the next plan.
TEST(GuardTrain, QuantErrorStreakMovesLayersToFp8) {
  require_data();
  const std::string run = test::fresh_dir("guard-fp8");
  Config c = guarded_micro();
  c.set("train.max_steps", int64_t{12}, "test");
  c.set("precision.initial_interval", int64_t{8}, "test");
  c.set("precision.final_interval", int64_t{8}, "test");
  c.set("precision.final_high_precision_fraction", 0.0, "test");
  c.set("guard.on_quant_error", std::string("fp8-layer"), "test");
  c.set("guard.quant_error_threshold_fp4", 0.05, "test");
  const RunConfig rc = RunConfig::from(c);
  TrainOptions o;
  o.run_dir = run;
  o.quiet = true;
  train(c, o);
  const auto m = test::read_metrics(run);
  ASSERT_EQ(m.size(), 12u);
  // The streaks, recounted: per "layer operand", against the threshold of
  // the format the option in force gives it.
  std::map<std::string, std::string> in_force;  // item -> option
  std::map<std::string, int> streak;
  int64_t fired_at = -1;
  std::vector<std::string> expected;
  for (const json& r : m) {
    if (r.contains("precision"))
      for (const auto& [item, option] : r["precision"].items()) in_force[item] = option.get<std::string>();
    // The warmup runs bf16 (nothing quantized, nothing measured: the
    // streaks stay); from the first plan on every step quantizes.
    const int64_t step = r["step"].get<int64_t>();
    ASSERT_EQ(r.contains("quant_err"), step > 2) << r.dump();
    if (!r.contains("quant_err")) continue;
    std::vector<std::string> over;
    for (const auto& [layer, ops] : r["quant_err"].items()) {
      ASSERT_EQ(ops.size(), 6u) << layer;  // all six operands of every layer
      for (const auto& [op, v] : ops.items()) {
        const std::string format = rc.recipes.find(in_force.at(layer))[parse_operand(op, "test")].element.name;
        const double err = v.get<double>();
        EXPECT_GT(err, 0.0) << layer << " " << op;
        EXPECT_LT(err, 0.5) << layer << " " << op;
        int& n = streak[layer + " " + op];
        n = err > rc.guard.threshold_for(format) ? n + 1 : 0;
        if (n >= 3 && std::find(over.begin(), over.end(), layer) == over.end()) over.push_back(layer);
      }
    }
    if (fired_at < 0 && !over.empty()) {
      fired_at = step;
      expected = over;
    }
    if (fired_at >= 0) break;
  }
  // The first plan is at the boundary before step 3 (warmup 2 steps): FP4
  // from step 3, so the third FP4 step is step 5.
  ASSERT_EQ(fired_at, 5);
  const json& at = m[size_t(fired_at - 1)];
  ASSERT_TRUE(at.contains("guard")) << at.dump();
  const json& e = at["guard"][0];
  EXPECT_EQ(e["condition"], "quant_error");
  EXPECT_EQ(e["action"], "fp8-layer");
  for (size_t k = 0; k + 1 < size_t(fired_at); ++k) EXPECT_FALSE(m[k].contains("guard")) << m[k].dump();
  std::vector<std::string> got = e["layers"].get<std::vector<std::string>>();
  std::sort(got.begin(), got.end());
  std::sort(expected.begin(), expected.end());
  ASSERT_FALSE(expected.empty());
  EXPECT_EQ(got, expected);
  EXPECT_NE(e["outcome"].get<std::string>().find("moved to fp8 until the next plan"), std::string::npos) << e.dump();
  // From the next step on they run fp8: the FP4 share falls, and that
  // step's record says so (the moved layers at fp8, no plan made).
  const json& next = m[size_t(fired_at)];
  EXPECT_GT(at["fp4_share"].get<double>(), 0.5);
  EXPECT_LT(next["fp4_share"].get<double>(), at["fp4_share"].get<double>());
  ASSERT_TRUE(next.contains("precision")) << next.dump();
  EXPECT_FALSE(next.contains("plan_step"));
  for (const std::string& layer : expected) EXPECT_EQ(next["precision"][layer], "fp8") << layer;
  fs::remove_all(run);
}

// train.clip_low_precision: the threshold is grad_clip x factor while a layer
// runs FP4 (after the warmup), grad_clip otherwise.
TEST(GuardTrain, ClipThresholdIsLoweredWhileALayerRunsBelowFp8) {
  require_data();
  const std::string run = test::fresh_dir("guard-clip");
  Config c = guarded_micro();
  c.set("train.max_steps", int64_t{6}, "test");
  c.set("train.clip_low_precision", 0.6, "test");
  c.set("train.grad_clip", 0.5, "test");
  TrainOptions o;
  o.run_dir = run;
  o.quiet = true;
  train(c, o);
  const auto m = test::read_metrics(run);
  ASSERT_EQ(m.size(), 6u);
  EXPECT_EQ(m[0]["grad_clip"].get<double>(), 0.5);  // warmup: every layer bf16
  EXPECT_FALSE(m[1].contains("grad_clip"));         // unchanged: not repeated
  EXPECT_EQ(m[2]["grad_clip"].get<double>(), 0.5 * 0.6);  // the first plan puts layers at fp4
  EXPECT_GT(m[2]["fp4_share"].get<double>(), 0);
  fs::remove_all(run);
}

// A learning-rate spike (x 1000 at step 7) wrecks the weights; step 8's loss
// jumps and the guard rolls back to step 4's checkpoint within that step.
TEST(GuardTrain, LearningRateSpikeIsRolledBack) {
  require_data();
  const std::string run = test::fresh_dir("guard-lr");
  Config c = guarded_micro();
  c.set("guard.spike_window", int64_t{3}, "test");
  TrainOptions o;
  o.run_dir = run;
  o.quiet = true;
  o.faults = FaultInjector::parse("lr-spike@7:1000");
  const TrainSummary s = train(c, o);
  const auto m = test::read_metrics(run);
  EXPECT_EQ(s.rollbacks, 1);
  ASSERT_GE(m.size(), 8u);
  EXPECT_EQ(m[7]["step"], 8);
  ASSERT_TRUE(m[7].contains("guard"));
  EXPECT_EQ(m[7]["guard"][0]["condition"], "loss_spike");
  EXPECT_EQ(m[7]["rollback_to"], 4);  // last good: step 4 (step 8's checkpoint was never written)
  EXPECT_TRUE(std::isfinite(s.final_val_loss));
  EXPECT_LT(s.final_val_loss, std::log(512.0));
  expect_finite_checkpoints(run);
  fs::remove_all(run);
}

// A resumed run continues a rolled-back one exactly: the loader position
// (loader_base), the guard's budget and the metrics history survive, also
// when the run is killed right after the rollback (step-4 is written again
// with what the guard did).
class GuardResume : public ::testing::TestWithParam<int64_t> {};
INSTANTIATE_TEST_SUITE_P(StopAfter, GuardResume, ::testing::Values(7, 12));
TEST_P(GuardResume, ResumeAfterRollbackIsExact) {
  require_data();
  TrainOptions o;
  o.quiet = true;
  o.run_dir = test::fresh_dir("guard-straight");
  TrainOptions r = o;
  r.run_dir = test::fresh_dir("guard-resumed");
  o.faults = r.faults = FaultInjector::parse("grad-inf@6");
  train(guarded_micro(), o);
  // 7: 1..6, then step 5 (resumes from step-4 as rewritten after the
  // rollback); 12: 1..6, 5..10 (resumes from step-8).
  r.stop_after = GetParam();
  train(guarded_micro(), r);
  r.faults = FaultInjector{};
  r.stop_after = 0;
  r.resume = true;
  train(guarded_micro(), r);  // no fault: this process resumes at 8
  const auto a = test::read_metrics(o.run_dir), b = test::read_metrics(r.run_dir);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(a[i]["step"], b[i]["step"]);
    EXPECT_EQ(a[i]["loss"], b[i]["loss"]);
    EXPECT_EQ(a[i]["grad_norm"], b[i]["grad_norm"]);
  }
  EXPECT_TRUE(io::read_file(o.run_dir + "/checkpoints/step-16/model.safetensors") ==
              io::read_file(r.run_dir + "/checkpoints/step-16/model.safetensors"));
  EXPECT_EQ(verify_checkpoint(r.run_dir + "/checkpoints/step-16")["guard"]["rollbacks"], 1);
  EXPECT_EQ(verify_checkpoint(r.run_dir + "/checkpoints/step-16")["precision"]["budget"],
            verify_checkpoint(o.run_dir + "/checkpoints/step-16")["precision"]["budget"]);
  fs::remove_all(o.run_dir);
  fs::remove_all(r.run_dir);
}

// A divergence that a stats step meets first (the step after an LR spike is a
// plan step) is the guard's, not the end of the run; with nothing to roll
// back to and no plan to raise, the run stops with one line.
TEST(GuardTrain, NonFiniteStatsStepIsCaughtAndNoTargetStops) {
  require_data();
  const std::string run = test::fresh_dir("guard-stats");
  TrainOptions o;
  o.run_dir = run;
  o.quiet = true;
  Config c = guarded_micro();
  c.set("precision.initial_interval", int64_t{1}, "test");
  c.set("precision.final_interval", int64_t{1}, "test");  // a stats step at every boundary
  o.faults = FaultInjector::parse("lr-spike@6:1e12");
  const TrainSummary s = train(c, o);
  const auto m = test::read_metrics(run);
  ASSERT_GE(m.size(), 7u);
  ASSERT_TRUE(m[6].contains("guard")) << m[6].dump();
  EXPECT_EQ(m[6]["guard"][0]["condition"], "nonfinite");
  EXPECT_NE(m[6]["guard"][0]["reason"].get<std::string>().find("stats step 6"), std::string::npos) << m[6].dump();
  EXPECT_EQ(m[6]["rollback_to"], 4);
  EXPECT_EQ(s.rollbacks, 1);
  EXPECT_TRUE(std::isfinite(s.final_val_loss));
  expect_finite_checkpoints(run);
  fs::remove_all(run);
  // policy none, no checkpoint before the divergence: stop, exit non-zero.
  Config n = guarded_micro();
  n.set("precision.policy", std::string("none"), "test");
  const std::string run2 = test::fresh_dir("guard-nothing");
  o.run_dir = run2;
  o.faults = FaultInjector::parse("lr-spike@2:1e12");
  const std::string err = test::error_of([&] { train(n, o); });
  EXPECT_NE(err.find("guard: stopped at step"), std::string::npos) << err;
  EXPECT_NE(err.find("no good checkpoint yet to roll back to and no precision plan to raise"), std::string::npos)
      << err;
  EXPECT_FALSE(fs::exists(run2 + "/checkpoints/step-4"));
  fs::remove_all(run2);
  // Skipping only (warn): the wrecked weights stay non-finite step after
  // step; the fifth such step in a row stops the run.
  n.set("guard.on_nonfinite", std::string("warn"), "test");
  const std::string run3 = test::fresh_dir("guard-skips");
  o.run_dir = run3;
  const std::string err3 = test::error_of([&] { train(n, o); });
  EXPECT_NE(err3.find("5 steps in a row were not finite"), std::string::npos) << err3;
  const auto m3 = test::read_metrics(run3);
  ASSERT_EQ(m3.size(), 7u);  // steps 1, 2 finite; 3..7 skipped
  for (size_t i = 2; i < m3.size(); ++i) EXPECT_TRUE(m3[i]["skipped"].get<bool>()) << i;
  expect_finite_checkpoints(run3);
  fs::remove_all(run3);
}

// keep_good: a checkpoint whose validation loss is more than the margin above
// the best is kept as a rolling one but is not a rollback target.
TEST(GuardTrain, KeepGoodKeepsValidatedCheckpointsApart) {
  require_data();
  const std::string run = test::fresh_dir("guard-keep");
  Config c = guarded_micro();
  c.set("train.keep_checkpoints", int64_t{1}, "test");
  c.set("checkpoint.keep_good", int64_t{2}, "test");
  c.set("train.eval_interval", int64_t{1000}, "test");  // checkpoints evaluate themselves
  TrainOptions o;
  o.run_dir = run;
  o.quiet = true;
  train(c, o);
  // Loss falls over 16 steps: every checkpoint (4, 8, 12, 16) is good; the
  // newest 2 good ones stay apart from the 1 rolling one.
  EXPECT_EQ(json::parse(io::read_file(run + "/checkpoints/good.json"))["steps"], json::array({12, 16}));
  EXPECT_FALSE(fs::exists(run + "/checkpoints/step-8"));
  EXPECT_TRUE(fs::exists(run + "/checkpoints/step-12"));
  const json st = verify_checkpoint(run + "/checkpoints/step-12");
  EXPECT_TRUE(st["validation"]["good"].get<bool>());
  EXPECT_TRUE(st["validation"]["val_loss"].is_number());
  fs::remove_all(run);
}

TEST(GuardTrain, RaiseOptionBelowFp8IsRefused) {
  require_data();
  Config c = guarded_micro();
  c.set("guard.raise_option", std::string("mxfp4"), "test");
  TrainOptions o;
  o.run_dir = test::fresh_dir("guard-raise");
  o.quiet = true;
  const std::string m = test::error_of([&] { train(c, o); });
  EXPECT_NE(m.find("guard.raise_option: expected an option of 8 bits or more"), std::string::npos) << m;
  EXPECT_FALSE(fs::exists(o.run_dir + "/metrics.jsonl"));
  fs::remove_all(o.run_dir);
}

TEST(GuardTrain, CheckpointIsNeverWrittenFromNonFiniteWeights) {
  Config c = test::micro_config();
  LlamaConfig mc = LlamaConfig::from_run_config(RunConfig::from(c).model, 512);
  LlamaForCausalLM model(mc);
  auto opt = make_optimizer(model, RunConfig::from(c).train);
  {
    torch::NoGradGuard ng;
    model->parameters().back().view(-1)[3] = std::nanf("");
  }
  const std::string run = test::fresh_dir("guard-nan-ckpt");
  const std::string m = test::error_of([&] { save_checkpoint(run, 3, model, *opt, json::object(), 0); });
  EXPECT_NE(m.find("non-finite"), std::string::npos) << m;
  EXPECT_FALSE(fs::exists(run + "/checkpoints/step-3"));
  EXPECT_FALSE(fs::exists(run + "/checkpoints/step-3.tmp"));
  fs::remove_all(run);
}
