// The precision controller inside `snip train` (METHOD.md sections 3-6, per
// layer): the schedule by hand, snip plans on the micro model, uniform FP4,
// exact resume across plan boundaries, infeasible pins rejected up front.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <set>
#include <fstream>

#include "snip/config/config.h"
#include "snip/method/controller.h"
#include "snip/plan/plan_file.h"
#include "snip/model/llama.h"
#include "snip/model/quantizers.h"
#include "snip/train/trainer.h"
#include "snip/io/atomic_file.h"
#include "snip/plan/cost_table.h"
#include "snip/core/error.h"
#include "micro.h"

using namespace snip;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using test::fresh_dir;
using test::micro_config;
using test::read_metrics;
const std::string& kData = test::kKjv512;

json read_json(const std::string& path) { return json::parse(io::read_file(path)); }

#define REQUIRE_DATA() \
  if (!fs::exists(kData + "/train.bin")) GTEST_SKIP() << "no prepared KJV data at " << kData

// The micro config with a policy and an explicit schedule in steps.
Config policy_config(const std::string& policy, int64_t max_steps, int64_t warmup, int64_t interval) {
  Config c = micro_config();
  c.set("train.max_steps", max_steps, "test");
  c.set("precision.policy", policy, "test");
  c.set("precision.warmup_steps", warmup, "test");
  c.set("precision.initial_interval", interval, "test");
  c.set("precision.final_interval", interval, "test");
  return c;
}

// The micro model (seed 0), an AdamW over it and a loss on one random
// batch: what a controller's plan step needs.
struct MicroPlanning {
  LlamaForCausalLM model{nullptr};
  std::unique_ptr<torch::optim::AdamW> opt;
  torch::Tensor ids;
  torch::Tensor loss() { return LlamaForCausalLMImpl::loss(model(ids), ids); }
  MicroPlanning() {
    torch::manual_seed(0);
    model = LlamaForCausalLM(LlamaConfig::from_run_config(policy_config("snip", 20, 0, 10), 512));
    opt = std::make_unique<torch::optim::AdamW>(model->parameters(), torch::optim::AdamWOptions(1e-3));
    ids = torch::randint(512, {2, 32}, torch::kLong);
  }
};

}  // namespace

TEST(ControllerSchedule, StepsByHand) {
  {  // explicit steps: warmup 10, interval 10, 40 steps, last 10% FP8 -> F = 36
    Config c = policy_config("snip", 40, 10, 10);
    const PrecisionSchedule s = PrecisionSchedule::from_config(c);
    EXPECT_EQ(s.warmup_end, 10);
    EXPECT_EQ(s.final_start, 36);
    EXPECT_EQ(s.plan_steps(), (std::vector<int64_t>{10, 20, 30}));
    EXPECT_STREQ(to_string(s.phase_at(0)), "warmup");
    EXPECT_STREQ(to_string(s.phase_at(9)), "warmup");
    EXPECT_STREQ(to_string(s.phase_at(10)), "plan");
    EXPECT_STREQ(to_string(s.phase_at(35)), "plan");
    EXPECT_STREQ(to_string(s.phase_at(36)), "final");
  }
  {  // the defaults as fractions, METHOD.md's 100k run: W = 5k, I0 = 20k -> I1 = 100k, F = 90k
    Config c;
    c.set("train.max_steps", int64_t{100000}, "test");
    const PrecisionSchedule s = PrecisionSchedule::from_config(c);
    EXPECT_EQ(s.warmup_end, 5000);
    EXPECT_EQ(s.final_start, 90000);
    // intervals: 20k + 80k·5k/100k = 24k; 20k + 80k·29k/100k = 43.2k; next would be 72.2k + 77.76k > 90k
    EXPECT_EQ(s.interval_at(5000), 24000);
    EXPECT_EQ(s.interval_at(29000), 43200);
    EXPECT_EQ(s.plan_steps(), (std::vector<int64_t>{5000, 29000, 72200}));
  }
  {  // 100 steps, fractions: W = 5, I = 20 + 80·s/100; F = 90
    Config c;
    c.set("train.max_steps", int64_t{100}, "test");
    EXPECT_EQ(PrecisionSchedule::from_config(c).plan_steps(), (std::vector<int64_t>{5, 29, 72}));
  }
  {  // no warmup, no final phase
    Config c = policy_config("snip", 10, 0, 4);
    c.set("precision.final_high_precision_fraction", 0.0, "test");
    const PrecisionSchedule s = PrecisionSchedule::from_config(c);
    EXPECT_EQ(s.plan_steps(), (std::vector<int64_t>{0, 4, 8}));
    EXPECT_STREQ(to_string(s.phase_at(9)), "plan");
  }
}

// The controller on a model in memory: each layer runs the planned quantizer.
TEST(Controller, LayersRunThePlannedQuantizer) {
  Config c = policy_config("snip", 40, 2, 10);
  c.set("precision.budget", 0.75, "test");
  torch::manual_seed(0);
  LlamaConfig mc = LlamaConfig::from_run_config(c, 512);
  LlamaForCausalLM model(mc);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3));
  const torch::Tensor ids = torch::randint(512, {2, 32}, torch::kLong);
  const torch::Tensor tg = torch::randint(512, {2, 32}, torch::kLong);
  auto loss_fn = [&] { return LlamaForCausalLMImpl::loss(model(ids), tg); };
  PrecisionController ctl(c, model->linear_layers(), at::kBFloat16);
  ASSERT_TRUE(ctl.active());

  EXPECT_TRUE(ctl.begin_step(0, loss_fn, opt).decided);  // warmup: all bf16 (no quantizer)
  // The controller decides a value and writes no layer (assignment.h): the
  // layers keep the precision they were built with until it is installed.
  for (const auto& l : model->linear_layers()) EXPECT_EQ(l->precision.gemm_dtype, at::ScalarType::Undefined);
  ASSERT_EQ(ctl.assignment().precision.size(), model->linear_layers().size());
  EXPECT_EQ(ctl.assignment().precision[0].gemm_dtype, at::kBFloat16);
  install_precision(model->linear_layers(), ctl.assignment());
  for (const auto& l : model->linear_layers()) {
    EXPECT_EQ(l->precision.quantizer, nullptr) << l->name;
    EXPECT_EQ(l->precision.gemm_dtype, at::kBFloat16);
  }
  EXPECT_EQ(ctl.fp4_share(), 0.0);
  EXPECT_FALSE(ctl.begin_step(1, loss_fn, opt).decided);

  const PrecisionEvent ev = ctl.begin_step(2, loss_fn, opt);  // stats + ILP
  ASSERT_TRUE(ev.decided);
  for (const auto& l : model->linear_layers()) EXPECT_EQ(l->precision.quantizer, nullptr) << "not installed yet";
  install_precision(model->linear_layers(), ctl.assignment());
  EXPECT_GE(ctl.fp4_share(), 0.75 - 1e-9);
  EXPECT_LT(ctl.fp4_share(), 1.0);  // the budget leaves room for FP8 and Q prefers it somewhere
  int n4 = 0, n8 = 0;
  for (const auto& l : model->linear_layers()) {
    const std::string& opt_name = ctl.assignment().options.at(PlanKey{l->name, std::nullopt});
    ASSERT_NE(l->precision.quantizer, nullptr) << l->name;
    EXPECT_EQ(l->precision.quantizer->name(), opt_name) << l->name;
    EXPECT_EQ(ev.metrics["precision"][l->name], opt_name);
    EXPECT_TRUE(ev.metrics["rel_err_fprop"].contains(l->name));
    (opt_name == "fp4" ? n4 : n8)++;
  }
  EXPECT_GT(n4, 0);
  EXPECT_GT(n8, 0);
  EXPECT_EQ(ctl.smoothed().layers.size(), model->linear_layers().size());

  // The state round-trips exactly (smoothed stats included) and re-applies the plan.
  const json st = ctl.state();
  PrecisionController other(c, model->linear_layers(), at::kBFloat16);
  for (auto& l : model->linear_layers()) l->precision = LinearPrecision{};
  other.restore(json::parse(st.dump()), "state");
  install_precision(model->linear_layers(), other.assignment());
  EXPECT_EQ(other.state(), st);
  EXPECT_EQ(to_json(other.smoothed()), to_json(ctl.smoothed()));
  for (const auto& l : model->linear_layers())
    EXPECT_EQ(l->precision.quantizer->name(), ctl.assignment().options.at(PlanKey{l->name, std::nullopt}));

  EXPECT_TRUE(ctl.begin_step(36, loss_fn, opt).decided);  // final phase: all fp8
  install_precision(model->linear_layers(), ctl.assignment());
  for (const auto& l : model->linear_layers()) EXPECT_EQ(l->precision.quantizer->name(), "fp8");
  EXPECT_EQ(ctl.fp4_share(), 0.0);
}

// A saved budget is read in its own unit: a time ratio saved by a
// budget_unit = time run means nothing to a flops run (the configured budget
// stands, the larger smoothing is kept); a state written before the unit was
// saved is a time ratio when above 1 (no FP4 share is), else in the
// configured unit as before.
TEST(Controller, RestoredBudgetKeepsItsUnit) {
  Config c = policy_config("snip", 40, 2, 10);
  c.set("precision.budget", 0.75, "test");
  torch::manual_seed(0);
  LlamaForCausalLM model(LlamaConfig::from_run_config(c, 512));
  PrecisionController ctl(c, model->linear_layers(), at::kBFloat16);
  const json st = ctl.state();
  EXPECT_EQ(st.at("budget_unit"), "flops");
  auto restored = [&](const json& budget, const json& unit, double smoothing) {
    json s = st;
    s["budget"] = budget;
    s["smoothing"] = smoothing;
    if (unit.is_null()) s.erase("budget_unit");
    else s["budget_unit"] = unit;
    PrecisionController other(c, model->linear_layers(), at::kBFloat16);
    other.restore(s, "state");
    return std::make_pair(other.budget(), other.smoothing());
  };
  EXPECT_EQ(restored(0.5, "flops", 0.3), std::make_pair(0.5, 0.3));  // the guard's lower share
  EXPECT_EQ(restored(0.5, "time", 0.3), std::make_pair(0.75, 0.3));  // a time ratio: the configured share
  EXPECT_EQ(restored(2.4, nullptr, 0.3), std::make_pair(0.75, 0.3));  // old state, above 1: a time ratio
  EXPECT_EQ(restored(0.5, nullptr, 0.3), std::make_pair(0.5, 0.3));  // old state, below 1: a share as before
  EXPECT_NE(test::error_of([&] { restored(0.5, "time", 1.5); }).find("precision.smoothing: expected a fraction"),
            std::string::npos);
}

// Every heuristic policy plans at the budget; min-rel-err takes its order from a stats step.
TEST(Controller, HeuristicPolicies) {
  MicroPlanning m;
  LlamaForCausalLM& model = m.model;
  torch::optim::AdamW& opt = *m.opt;
  auto loss_fn = [&] { return m.loss(); };
  for (const std::string p : {"min-rel-err", "layer-type", "first-last-fp8", "random", "uniform-fp8"}) {
    SCOPED_TRACE(p);
    Config c = policy_config(p, 20, 0, 10);
    c.set("precision.budget", 0.6, "test");
    PrecisionController ctl(c, model->linear_layers(), at::kBFloat16);
    const PrecisionEvent ev = ctl.begin_step(0, loss_fn, opt);
    ASSERT_TRUE(ev.decided);
    install_precision(model->linear_layers(), ctl.assignment());
    EXPECT_EQ(ev.metrics.contains("rel_err_fprop"), p == "min-rel-err");  // only it needs stats
    if (p == "uniform-fp8") EXPECT_EQ(ctl.fp4_share(), 0.0);
    else EXPECT_GE(ctl.fp4_share(), 0.6 - 1e-9);
    for (const auto& l : model->linear_layers())
      EXPECT_EQ(l->precision.quantizer->name(), ctl.assignment().options.at(PlanKey{l->name, std::nullopt}));
  }
}

TEST(Controller, SnipPlansDuringTraining) {
  REQUIRE_DATA();
  Config c = policy_config("snip", 40, 10, 10);
  c.set("precision.budget", 0.75, "test");
  TrainOptions o;
  o.quiet = true;
  o.run_dir = fresh_dir("snip");
  train(c, o);
  const std::string run = o.run_dir;
  // warmup decision at 0, plans at 10, 20, 30, final FP8 at 36
  for (int64_t s : {0, 10, 20, 30, 36}) {
    SCOPED_TRACE(s);
    const std::string p = run + "/plans/step-" + std::to_string(s) + ".json";
    ASSERT_TRUE(fs::exists(p));
    const json pj = read_json(p);
    EXPECT_EQ(pj["step"], s);
    EXPECT_EQ(pj["policy"], "snip");
    const std::string phase = s == 0 ? "warmup" : s == 36 ? "final" : "plan";
    EXPECT_EQ(pj["phase"], phase);
    if (phase == "plan") {
      EXPECT_GE(pj["fp4_share"].get<double>(), 0.75 - 1e-9);
      EXPECT_EQ(pj["status"], "optimal");
      EXPECT_EQ(pj["method"], "ilp");
      // the stats file is a cost table the planner CLI can read
      const std::string sp = run + "/stats/step-" + std::to_string(s) + ".json";
      ASSERT_TRUE(fs::exists(sp));
      const json sj = read_json(sp);
      const plan::CostTable t = plan::parse_cost_table(sj, sp);
      const plan::PlanProblem prob = plan::make_problem(t, plan::Granularity::layer);
      EXPECT_EQ(prob.items.size(), 14u);
      // and a stats step: from_json gives back what was written
      EXPECT_EQ(to_json(stats_from_json(sj, sp))["layers"], sj["layers"]);
      EXPECT_EQ(to_json(stats_from_json(sj["measured"], sp))["details"], sj["measured"]["details"]);
      // the plan table mentions every layer and the achieved share
      const std::string table = format_plan_table(pj);
      EXPECT_NE(table.find("model.layers.1.mlp.down_proj"), std::string::npos);
      EXPECT_NE(table.find("achieved:  FP4 share"), std::string::npos);
      EXPECT_NE(table.find("solver:    cbc optimal (proven)"), std::string::npos) << table;
    } else {
      EXPECT_EQ(pj["fp4_share"].get<double>(), 0.0);
      EXPECT_FALSE(fs::exists(run + "/stats/step-" + std::to_string(s) + ".json"));
    }
  }
  EXPECT_EQ(find_plan_file(run), run + "/plans/step-30.json");  // the newest plan-phase decision, not the final FP8
  const auto m = read_metrics(run);
  ASSERT_EQ(m.size(), 40u);
  for (const json& r : m) {
    const int64_t step = r["step"].get<int64_t>();  // record of the step run after boundary step-1
    SCOPED_TRACE(step);
    const double share = r["fp4_share"].get<double>();
    if (step <= 10 || step > 36) EXPECT_EQ(share, 0.0);
    else EXPECT_GE(share, 0.75 - 1e-9);
    const bool decided = step == 1 || step == 11 || step == 21 || step == 31 || step == 37;
    EXPECT_EQ(r.contains("precision"), decided);
    if (decided) {
      const json pj = read_json(run + "/plans/step-" + std::to_string(step - 1) + ".json");
      EXPECT_EQ(r["precision"], pj["assignments"]);
      EXPECT_EQ(r["plan_step"], step - 1);
      EXPECT_EQ(r.contains("rel_err_fprop"), pj["phase"] == "plan");
    }
  }
  fs::remove_all(run);
}

TEST(Controller, UniformFp4EveryLayer) {
  REQUIRE_DATA();
  Config c = policy_config("uniform-fp4", 6, 0, 3);
  c.set("precision.final_high_precision_fraction", 0.0, "test");
  TrainOptions o;
  o.quiet = true;
  o.run_dir = fresh_dir("u4");
  train(c, o);
  for (const json& r : read_metrics(o.run_dir)) EXPECT_EQ(r["fp4_share"].get<double>(), 1.0);
  const json pj = read_json(find_plan_file(o.run_dir));
  EXPECT_EQ(pj["step"], 3);
  EXPECT_EQ(pj["fp4_share"].get<double>(), 1.0);
  ASSERT_EQ(pj["assignments"].size(), 14u);
  for (const auto& [k, v] : pj["assignments"].items()) EXPECT_EQ(v, "fp4") << k;
  fs::remove_all(o.run_dir);
}

TEST(Controller, ResumeAcrossPlanBoundariesIsExact) {
  REQUIRE_DATA();
  // plans at 4, 10, 16; final FP8 from 22; checkpoints at 8, 16, 24
  Config c = policy_config("snip", 24, 4, 6);
  c.set("train.checkpoint_interval", int64_t{8}, "test");
  c.set("train.grad_accum", int64_t{2}, "test");
  c.set("train.keep_checkpoints", int64_t{0}, "test");
  TrainOptions o;
  o.quiet = true;
  o.run_dir = fresh_dir("straight");
  train(c, o);
  const auto straight = read_metrics(o.run_dir);

  TrainOptions r = o;
  r.run_dir = fresh_dir("resumed");
  r.stop_after = 13;  // killed after step 13: resume from 8, across the plan at 10
  train(c, r);
  r.resume = true;
  r.stop_after = 10;  // killed after step 18: resume from 16, the checkpoint that is a plan step
  train(c, r);
  r.stop_after = 0;
  train(c, r);
  const auto resumed = read_metrics(r.run_dir);
  ASSERT_EQ(resumed.size(), straight.size());
  for (size_t i = 0; i < straight.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(resumed[i]["step"], straight[i]["step"]);
    EXPECT_EQ(resumed[i]["loss"].get<double>(), straight[i]["loss"].get<double>());
    EXPECT_EQ(resumed[i]["grad_norm"].get<double>(), straight[i]["grad_norm"].get<double>());
    EXPECT_EQ(resumed[i]["fp4_share"].get<double>(), straight[i]["fp4_share"].get<double>());
    EXPECT_EQ(resumed[i].value("precision", json()), straight[i].value("precision", json()));
  }
  for (int s : {4, 10, 16})
    EXPECT_EQ(read_json(r.run_dir + "/stats/step-" + std::to_string(s) + ".json"),
              read_json(o.run_dir + "/stats/step-" + std::to_string(s) + ".json"))
        << s;
  EXPECT_TRUE(io::read_file(o.run_dir + "/checkpoints/step-24/model.safetensors") ==
              io::read_file(r.run_dir + "/checkpoints/step-24/model.safetensors"))
      << "final weights differ";
  // the checkpoint carries the controller state
  const json st = read_json(r.run_dir + "/checkpoints/step-16/trainer_state.json");
  EXPECT_EQ(st["precision"]["phase"], "plan");
  EXPECT_EQ(st["precision"]["decided_at"], 10);
  EXPECT_TRUE(st["precision"]["smoothed"].is_object());
  fs::remove_all(o.run_dir);
  fs::remove_all(r.run_dir);
}

TEST(Controller, BadPrecisionConfigFailsBeforeTheRunDirectory) {
  REQUIRE_DATA();
  TrainOptions o;
  o.quiet = true;
  o.run_dir = fresh_dir("bad");
  auto error_of = [&](const Config& c) -> std::string {
    try {
      train(c, o);
    } catch (const UserError& e) {
      const std::string m = e.what();
      EXPECT_EQ(m.find('\n'), std::string::npos) << m;
      return m;
    }
    return "(no error)";
  };
  {
    Config c = policy_config("snip", 20, 2, 5);
    c.set("precision.budget", 0.95, "test");
    c.set("precision.pins", std::string("*.down_proj=fp8, *.v_proj=fp8"), "test");
    const std::string m = error_of(c);
    EXPECT_NE(m.find("budget 0.95 is infeasible: pins '*.down_proj=fp8'"), std::string::npos) << m;
    EXPECT_NE(m.find("cap the FP4 share at"), std::string::npos) << m;
  }
  {
    Config c = policy_config("snip", 20, 2, 5);
    c.set("precision.pins", std::string("*.dwn_proj=fp8"), "test");
    EXPECT_NE(error_of(c).find("dwn_proj"), std::string::npos);
  }
  {
    Config c = policy_config("snipp", 20, 2, 5);
    EXPECT_NE(error_of(c).find("precision.policy: expected none (or its old name bf16)"), std::string::npos);
  }
  {
    Config c = policy_config("snip", 20, 2, 5);
    c.set("precision.recipe", std::string("fp8"), "test");
    EXPECT_NE(error_of(c).find("cannot be combined with precision.policy = 'snip'"), std::string::npos);
  }
  {
    Config c = policy_config("snip", 20, 2, 5);
    c.set("precision.options", std::string("fp4,fp3"), "test");
    EXPECT_NE(error_of(c).find("precision.options: option 'fp3'"), std::string::npos);
  }
  {
    Config c = policy_config("snip", 20, 2, 5);
    c.set("precision.granularity", std::string("tensor"), "test");
    EXPECT_NE(error_of(c).find("precision.granularity: expected layer or gemm, got 'tensor'"), std::string::npos);
  }
  {
    Config c = policy_config("snip", 20, 2, 5);
    c.set("precision.first_order", std::string("square"), "test");
    EXPECT_NE(error_of(c).find("precision.first_order: expected abs, signed or drop"), std::string::npos);
  }
  EXPECT_FALSE(fs::exists(o.run_dir)) << "a failed start created the run directory";
}

// Per-GEMM granularity (METHOD.md section 2): 3 plan items per layer, the
// composite quantizer applies each GEMM's option to exactly that GEMM's two
// operands, and the per-GEMM plan is never worse than the per-layer plan on
// the same statistics (every per-layer plan is a per-GEMM plan of equal Q sum
// and FP4 share: the per-GEMM Q of a layer's GEMMs sum to its layer Q).
TEST(Controller, PerGemmGranularity) {
  Config c = policy_config("snip", 40, 2, 10);
  c.set("precision.budget", 0.5, "test");
  c.set("precision.granularity", std::string("gemm"), "test");
  torch::manual_seed(0);
  LlamaForCausalLM model(LlamaConfig::from_run_config(c, 512));
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3));
  const torch::Tensor ids = torch::randint(512, {2, 32}, torch::kLong);
  auto loss_fn = [&] { return LlamaForCausalLMImpl::loss(model(ids), ids); };
  PrecisionController ctl(c, model->linear_layers(), at::kBFloat16);
  ctl.begin_step(0, loss_fn, opt);
  const PrecisionEvent ev = ctl.begin_step(2, loss_fn, opt);
  ASSERT_TRUE(ev.decided);
  const auto layers = model->linear_layers();
  ASSERT_EQ(ctl.assignment().options.size(), 3 * layers.size());
  ASSERT_EQ(ev.metrics["precision"].size(), 3 * layers.size());
  // FP4 share by hand: each GEMM is a third of its layer's in*out.
  double low = 0, total = 0;
  for (const auto& l : layers) {
    const double f = double(l->in_features * l->out_features);
    total += f;
    for (const char* g : {"fprop", "dgrad", "wgrad"}) {
      const std::string item = l->name + ":" + g;  // the plan files' key, by hand
      if (ev.metrics["precision"].at(item) == "fp4") low += f / 3;
      EXPECT_EQ(ctl.assignment().options.at(parse_plan_key(item, "test")), ev.metrics["precision"].at(item));
    }
    EXPECT_TRUE(ev.metrics["rel_err_fprop"].contains(l->name)) << l->name;
  }
  EXPECT_NEAR(ctl.fp4_share(), low / total, 1e-12);
  EXPECT_GE(ctl.fp4_share(), 0.5 - 1e-9);

  // Relaxation: per-GEMM optimum <= per-layer optimum on the same smoothed stats.
  plan::PlanOptions po;
  po.budget = plan::Budget::share(0.5);
  po.allowed_options = {"fp4", "fp8"};
  const double q_gemm = plan::solve(to_plan_problem(ctl.smoothed(), plan::Granularity::gemm), po).objective;
  const double q_layer = plan::solve(to_plan_problem(ctl.smoothed(), plan::Granularity::layer), po).objective;
  EXPECT_LE(q_gemm, q_layer + 1e-9);

  // A crafted mixed assignment through restore(): fprop fp4, dgrad bf16, wgrad fp8 on layer 0.
  json st = ctl.state();
  const std::string l0 = layers[0]->name;
  st["assignments"][l0 + ":fprop"] = "fp4";
  st["assignments"][l0 + ":dgrad"] = "bf16";
  st["assignments"][l0 + ":wgrad"] = "fp8";
  Config c2 = c;
  c2.set("precision.options", std::string("fp4,fp8,bf16"), "test");
  PrecisionController other(c2, layers, at::kBFloat16);
  other.restore(st, "crafted");
  install_precision(layers, other.assignment());
  const auto q = layers[0]->precision.quantizer;
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->name(), "fp4/bf16/fp8");
  const auto fp4 = make_recipe_quantizer(recipes::RecipeSet(), "fp4"), fp8 = make_recipe_quantizer(recipes::RecipeSet(), "fp8");
  const torch::Tensor t = torch::randn({32, 64}, torch::kFloat);
  for (int op = 0; op < kNumOperands; ++op) {
    SCOPED_TRACE(operand_name(Operand(op)));
    const QuantKey key{7, 3, 0, Operand(op)};
    const torch::Tensor got = q->quantize(t, key);
    const torch::Tensor want = op < 2 ? fp4->quantize(t, key) : op < 4 ? t : fp8->quantize(t, key);
    EXPECT_TRUE(torch::equal(got, want));
  }
  EXPECT_FALSE(torch::equal(fp4->quantize(t, {7, 3, 0, Operand::kFpropX}), t));  // the check can fail
  // A state written at layer granularity does not restore into a per-GEMM run.
  Config c3 = c;
  c3.set("precision.granularity", std::string("layer"), "test");
  PrecisionController layer_ctl(c3, layers, at::kBFloat16);
  EXPECT_NE(test::error_of([&] { layer_ctl.restore(st, "crafted"); }).find("precision.granularity changed"),
            std::string::npos);
}

// Another 4-bit format as the budgeted option (precision.low_option): the plan,
// the share and the quantizers follow it.
TEST(Controller, LowOptionMxfp4) {
  Config c = policy_config("snip", 40, 2, 10);
  c.set("precision.budget", 0.5, "test");
  c.set("precision.low_option", std::string("mxfp4"), "test");
  c.set("precision.options", std::string("mxfp4,fp8"), "test");
  torch::manual_seed(0);
  LlamaForCausalLM model(LlamaConfig::from_run_config(c, 512));
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3));
  const torch::Tensor ids = torch::randint(512, {2, 32}, torch::kLong);
  auto loss_fn = [&] { return LlamaForCausalLMImpl::loss(model(ids), ids); };
  PrecisionController ctl(c, model->linear_layers(), at::kBFloat16);
  ctl.begin_step(0, loss_fn, opt);
  ASSERT_TRUE(ctl.begin_step(2, loss_fn, opt).decided);
  install_precision(model->linear_layers(), ctl.assignment());
  EXPECT_GE(ctl.fp4_share(), 0.5 - 1e-9);
  int low = 0;
  for (const auto& l : model->linear_layers()) {
    const std::string& o = ctl.assignment().options.at(PlanKey{l->name, std::nullopt});
    EXPECT_TRUE(o == "mxfp4" || o == "fp8") << o;
    EXPECT_EQ(l->precision.quantizer->name(), o);
    low += o == "mxfp4";
  }
  EXPECT_GT(low, 0);
  Config bad = c;
  bad.set("precision.options", std::string("fp4,fp8"), "test");
  EXPECT_NE(test::error_of([&] { PrecisionController(bad, model->linear_layers(), at::kBFloat16); })
                .find("expected a list containing mxfp4 (precision.low_option"),
            std::string::npos);
}

TEST(Controller, PerGemmTrainsEndToEnd) {
  REQUIRE_DATA();
  Config c = policy_config("snip", 12, 4, 4);
  c.set("precision.granularity", std::string("gemm"), "test");
  TrainOptions o;
  o.quiet = true;
  o.run_dir = fresh_dir("gemm");
  train(c, o);
  const json pj = read_json(o.run_dir + "/plans/step-4.json");
  EXPECT_EQ(pj["items"].size(), 42u);
  EXPECT_EQ(pj["granularity"], "gemm");
  EXPECT_GE(pj["fp4_share"].get<double>(), 0.75 - 1e-9);
  const json sj = read_json(o.run_dir + "/stats/step-4.json");
  EXPECT_TRUE(plan::parse_cost_table(sj, "stats").per_gemm());
  const auto m = read_metrics(o.run_dir);
  ASSERT_EQ(m.size(), 12u);
  EXPECT_TRUE(m[4]["precision"].contains("model.layers.0.self_attn.q_proj:wgrad"));
  EXPECT_NEAR(m[4]["fp4_share"].get<double>(), pj["fp4_share"].get<double>(), 1e-12);
  fs::remove_all(o.run_dir);
}

// The rivals as policies on the micro model (2 blocks, 14 layers): which
// layers each keeps high, by hand; autoswitch plans per GEMM from a stats step.
TEST(Controller, RivalPolicies) {
  MicroPlanning m;
  LlamaForCausalLM& model = m.model;
  torch::optim::AdamW& opt = *m.opt;
  auto loss_fn = [&] { return m.loss(); };
  auto high = [](const PrecisionController& ctl) {
    std::set<std::string> s;
    for (const auto& [k, v] : ctl.assignment().options)
      if (v != "fp4") s.insert(k.str());
    return s;
  };
  {  // round(0.15 x 14) = 2: block 1's up_proj and down_proj
    PrecisionController ctl(policy_config("bf16-tail", 20, 0, 10), model->linear_layers(), at::kBFloat16);
    const PrecisionEvent ev = ctl.begin_step(0, loss_fn, opt);
    EXPECT_FALSE(ev.metrics.contains("rel_err_fprop"));  // a rule on names: no stats step
    EXPECT_EQ(high(ctl), (std::set<std::string>{"model.layers.1.mlp.up_proj", "model.layers.1.mlp.down_proj"}));
  }
  {
    Config c = policy_config("first-last-n", 20, 0, 10);
    PrecisionController ctl(c, model->linear_layers(), at::kBFloat16);  // n = 1 of 2 blocks: every layer high
    ctl.begin_step(0, loss_fn, opt);
    EXPECT_EQ(ctl.fp4_share(), 0.0);
    c.set("precision.first_last_n", int64_t{0}, "test");
    PrecisionController none(c, model->linear_layers(), at::kBFloat16);
    none.begin_step(0, loss_fn, opt);
    EXPECT_EQ(none.fp4_share(), 1.0);
  }
  {  // a rule needs an option to keep layers at
    Config c = policy_config("bf16-tail", 20, 0, 10);
    c.set("precision.options", std::string("fp4"), "test");
    EXPECT_NE(test::error_of([&] { PrecisionController(c, model->linear_layers(), at::kBFloat16); })
                  .find("needs another option to keep them at"),
              std::string::npos);
  }
  for (double mse : {0.0, 1e30}) {  // every FP4 GEMM has some error: all high / none high
    Config c = policy_config("autoswitch", 20, 0, 10);
    c.set("precision.autoswitch_mse", mse, "test");
    c.set("precision.autoswitch_underflow", 1.0, "test");
    PrecisionController ctl(c, model->linear_layers(), at::kBFloat16);
    const PrecisionEvent ev = ctl.begin_step(0, loss_fn, opt);
    EXPECT_TRUE(ev.metrics.contains("rel_err_fprop"));  // it decides on a stats step
    EXPECT_EQ(ctl.assignment().options.size(), 14u * 3);  // per GEMM
    EXPECT_EQ(ctl.fp4_share(), mse == 0.0 ? 0.0 : 1.0);
  }
}

// The guard's fp8-layer raise inside a forward-only final phase replaces the
// layer's three GEMM entries with one (no layer key beside GEMM keys).
TEST(Controller, GuardRaiseInAForwardOnlyFinalPhase) {
  MicroPlanning m;
  Config c = policy_config("bf16-tail", 20, 0, 10);
  c.set("precision.final_high_precision_fraction", 0.5, "test");  // final from step 10
  c.set("precision.final_phase_gemms", std::string("fprop"), "test");
  PrecisionController ctl(c, m.model->linear_layers(), at::kBFloat16);
  auto loss_fn = [&] { return m.loss(); };
  ctl.begin_step(0, loss_fn, *m.opt);
  ctl.begin_step(10, loss_fn, *m.opt);
  const std::string layer = "model.layers.0.mlp.up_proj";
  EXPECT_EQ(ctl.assignment().options.at(PlanKey{layer, Gemm::kFprop}), "fp8");
  EXPECT_EQ(ctl.assignment().options.at(PlanKey{layer, Gemm::kDgrad}), "fp4");
  EXPECT_EQ(ctl.force_option({layer}, "fp8"), std::vector<std::string>{layer});
  const auto& a = ctl.assignment().options;
  EXPECT_EQ(a.at(PlanKey{layer, std::nullopt}), "fp8");
  for (Gemm g : kAllGemms) EXPECT_FALSE(a.count(PlanKey{layer, g})) << gemm_name(g);
  EXPECT_EQ(a.size(), 13u * 3 + 1);
  EXPECT_EQ(ctl.assignment().layer_options(layer).v, (std::array<std::string, 3>{"fp8", "fp8", "fp8"}));
}

// precision.final_phase_gemms = fprop: the final phase raises fprop only,
// dgrad/wgrad keep the last plan's options, and a run resumed inside the
// final phase continues bit for bit.
TEST(Controller, ForwardOnlyFinalPhase) {
  REQUIRE_DATA();
  Config c = policy_config("bf16-tail", 12, 0, 4);  // plans at 0, 4, 8; final from 9
  c.set("precision.final_high_precision_fraction", 0.25, "test");
  c.set("precision.final_phase_gemms", std::string("fprop"), "test");
  c.set("train.checkpoint_interval", int64_t{10}, "test");
  c.set("train.keep_checkpoints", int64_t{0}, "test");
  TrainOptions o;
  o.quiet = true;
  o.run_dir = fresh_dir("fwd-final");
  train(c, o);
  const json plan = read_json(o.run_dir + "/plans/step-8.json");
  const json fin = read_json(o.run_dir + "/plans/step-9.json");
  EXPECT_EQ(fin["phase"], "final");
  EXPECT_EQ(fin["final_phase_gemms"], "fprop");
  ASSERT_EQ(fin["assignments"].size(), 14u * 3);
  for (const auto& [layer, option] : plan["assignments"].items()) {
    SCOPED_TRACE(layer);
    EXPECT_EQ(fin["assignments"][layer + ":fprop"], "fp8");
    EXPECT_EQ(fin["assignments"][layer + ":dgrad"], option);
    EXPECT_EQ(fin["assignments"][layer + ":wgrad"], option);
  }
  EXPECT_NEAR(fin["fp4_share"].get<double>(), plan["fp4_share"].get<double>() * 2.0 / 3.0, 1e-12);
  // `snip plan show` says what the forward-only final plan is (its file's
  // method names the fprop GEMMs' option: uniform-fp8).
  EXPECT_NE(snip::format_plan_table(fin).find("method:    final phase, forward only (precision.final_phase_gemms = "
                                              "fprop): every fprop GEMM at fp8, dgrad and wgrad as the last plan"),
            std::string::npos)
      << snip::format_plan_table(fin);
  const auto straight = read_metrics(o.run_dir);
  ASSERT_EQ(straight.size(), 12u);
  EXPECT_NEAR(straight[11]["fp4_share"].get<double>(), fin["fp4_share"].get<double>(), 1e-12);

  TrainOptions r = o;
  r.run_dir = fresh_dir("fwd-final-resumed");
  r.stop_after = 11;  // killed after step 11: resume from 10, inside the final phase
  train(c, r);
  r.resume = true;
  r.stop_after = 0;
  train(c, r);
  const auto resumed = read_metrics(r.run_dir);
  ASSERT_EQ(resumed.size(), straight.size());
  for (size_t i = 0; i < straight.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(resumed[i]["loss"].get<double>(), straight[i]["loss"].get<double>());
    EXPECT_EQ(resumed[i]["fp4_share"].get<double>(), straight[i]["fp4_share"].get<double>());
  }
  // The default raises every GEMM.
  c.set("precision.final_phase_gemms", std::string("all"), "test");
  TrainOptions a = o;
  a.run_dir = fresh_dir("all-final");
  train(c, a);
  const json all = read_json(a.run_dir + "/plans/step-9.json");
  EXPECT_EQ(all["final_phase_gemms"], "all");
  EXPECT_EQ(all["fp4_share"].get<double>(), 0.0);
  EXPECT_NE(snip::format_plan_table(all).find("method:    uniform-fp8 in "), std::string::npos);
  for (const auto& d : {o.run_dir, r.run_dir, a.run_dir}) fs::remove_all(d);
}
