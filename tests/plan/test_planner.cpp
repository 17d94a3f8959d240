// solve(): input validation, error messages, time limits, model-size runs.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>

#include "snip/plan/cost_table.h"
#include "snip/plan/planner.h"
#include "snip/core/error.h"

using namespace snip::plan;

namespace {

const PlanOptions kDefault;  // share budget 0.75, no pins
const PlanProblem kEmpty;

PlanItem item(const std::string& name, double flops, double q4, double q8, int stage = -1) {
  PlanItem it;
  it.name = it.layer = name;
  it.flops = flops;
  it.q = {{"fp4", q4}, {"fp8", q8}};
  it.stage = stage;
  return it;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const snip::UserError& e) {
    return e.what();
  }
  return "(no UserError)";
}

PlanProblem two() {
  PlanProblem p;
  p.items = {item("model.layers.0.mlp.up_proj", 1, 0.5, 0, 0),
             item("model.layers.1.mlp.up_proj", 3, 0.2, 0, 1)};
  return p;
}

}  // namespace

TEST(Planner, ValidationErrors) {
  PlanOptions o;
  EXPECT_EQ(error_of([&] { solve(kEmpty, o); }),
            "plan: expected at least one item (layer), got an empty problem");
  PlanProblem p = two();
  p.items[1].flops = 0;
  EXPECT_EQ(error_of([&] { solve(p, o); }),
            "item 'model.layers.1.mlp.up_proj': expected FLOPs > 0, got 0");
  p = two();
  p.items[0].q["fp4"] = -1;
  EXPECT_EQ(error_of([&] { solve(p, o); }),
            "item 'model.layers.0.mlp.up_proj': q.fp4: expected a finite number >= 0, got -1");
  p = two();
  p.items[1].name = p.items[0].name;
  EXPECT_EQ(error_of([&] { solve(p, o); }),
            "item 'model.layers.0.mlp.up_proj': expected unique item names, got it twice");
  p = two();
  p.items[0].q.clear();
  EXPECT_EQ(error_of([&] { solve(p, o); }),
            "item 'model.layers.0.mlp.up_proj': expected at least one option in q, got none");
  p = two();
  o.budget = Budget::share(1.5);
  EXPECT_EQ(error_of([&] { solve(p, o); }), "budget: expected an FP4 FLOPs share in [0, 1], got 1.5");
  o.budget = Budget::cost(0);
  EXPECT_EQ(error_of([&] { solve(p, o); }), "cost budget: expected a positive cost per FLOP, got 0");
  o.budget = Budget::cost(2);
  p.items[0].q["int4"] = 0.9;
  EXPECT_EQ(error_of([&] { solve(p, o); }),
            "cost budget: expected a cost per FLOP for option 'int4' (e.g. --cost int4=3), got none");
  p = two();
  o = kDefault;
  o.allowed_options = {"bf16"};
  EXPECT_EQ(error_of([&] { solve(p, o); }),
            "item 'model.layers.0.mlp.up_proj': offers none of the allowed options (it offers "
            "fp4, fp8)");
  o = kDefault;
  o.time_limit_s = 0;
  EXPECT_EQ(error_of([&] { solve(p, o); }),
            "time limit: expected a positive number of seconds, got 0");
  o = kDefault;
  o.solver = "highs";
  EXPECT_EQ(error_of([&] { solve(p, o); }), "MILP solver: expected one of {cbc}, got 'highs'");
  o = kDefault;
  o.per_stage_budget = true;
  p.items[1].stage = -1;
  EXPECT_EQ(error_of([&] { solve(p, o); }),
            "per-stage planning needs a pipeline stage on every item; "
            "'model.layers.1.mlp.up_proj' has none (give --stages or \"stage\" in the cost table)");
}

// Items built in code (not from a cost table) whose FLOPs sum overflows:
// every entry is finite, the total 2e308 is not. solve(), the heuristics
// and max_fp4_share all validate through the same step.
TEST(Planner, TotalFlopsOverflowIsAnError) {
  PlanProblem p;
  p.items = {item("model.layers.0.mlp.up_proj", 1e308, 0.5, 0),
             item("model.layers.1.mlp.up_proj", 1e308, 0.2, 0)};
  const std::string expected =
      "plan: total FLOPs overflow (sum of item flops is not finite; "
      "give FLOPs in a smaller unit)";
  PlanOptions o;
  o.budget = Budget::share(0.5);
  EXPECT_EQ(error_of([&] { solve(p, o); }), expected);
  EXPECT_EQ(error_of([&] { heuristic_first_last_fp8(p, o); }), expected);
  EXPECT_EQ(error_of([&] { max_fp4_share(p, o); }), expected);
  // 8e307 each: the total 1.6e308 is finite, the plan is the hand-derived
  // one (Q: layer 1 is cheaper in FP4, and half the FLOPs meets b = 0.5).
  p.items[0].flops = p.items[1].flops = 8e307;
  const PlanResult r = solve(p, o);
  EXPECT_EQ(r.items[0].option, "fp8");
  EXPECT_EQ(r.items[1].option, "fp4");
  EXPECT_DOUBLE_EQ(r.fp4_share, 0.5);
}

// A finite total whose cost sum would overflow: cost 4 x 1.5e308 FLOPs is
// inf, but the cost per FLOP (a fraction-weighted mean of costs) is not.
// Hand-derived plan under cost budget 3: the big item cannot run bf16
// (cost ~4 > 3), so fp8 (Q 0.1); the tiny one (6.7e-9 of the FLOPs) takes
// bf16 (Q 0): cost per FLOP 2 + 2 x 6.7e-9.
TEST(Planner, CostBudgetWithHugeFlopsDoesNotOverflow) {
  PlanProblem p;
  p.items = {item("model.layers.0.mlp.up_proj", 1.5e308, 0.5, 0.1),
             item("model.layers.1.mlp.up_proj", 1e300, 0.5, 0.1)};
  for (PlanItem& it : p.items) it.q["bf16"] = 0;
  PlanOptions o;
  o.budget = Budget::cost(3);
  for (const PlanResult& r : {solve(p, o), heuristic_first_last_fp8(p, o)}) {
    EXPECT_EQ(r.items[0].option, "fp8") << r.method;
    EXPECT_NEAR(r.cost_per_flop, 2.0, 1e-7) << r.method;
  }
  EXPECT_EQ(solve(p, o).items[1].option, "bf16");
  EXPECT_DOUBLE_EQ(solve(p, o).objective, 0.1);
}

TEST(Planner, InfeasibilityMessages) {
  // Cost budget: both layers pinned to fp8 (cost 2 per FLOP).
  PlanOptions o;
  o.budget = Budget::cost(1.5);
  o.pins = {{"*", "fp8"}};
  EXPECT_EQ(error_of([&] { solve(two(), o); }),
            "cost budget 1.5 per FLOP is infeasible: pin '*=fp8' (2 layers, 100.0% of FLOPs) "
            "keeps the cost at or above 2.000 per FLOP");
  // Per stage: stage 1 is all pinned; globally 1/4 would be reachable... at
  // b = 0.2 only the stage rows fail.
  o = kDefault;
  o.budget = Budget::share(0.2);
  o.per_stage_budget = true;
  o.pins = {{"layers.1.*", "fp8"}};
  EXPECT_EQ(error_of([&] { solve(two(), o); }),
            "budget 0.2 is infeasible in stage 1: pin 'layers.1.*=fp8' (1 layer, 100.0% of "
            "FLOPs) caps stage 1's FP4 share at 0.000");
  // Items that do not offer the low option cap the share too.
  PlanProblem p = two();
  p.items[1].q.erase("fp4");
  o = kDefault;
  o.budget = Budget::share(0.5);
  EXPECT_EQ(error_of([&] { solve(p, o); }),
            "budget 0.5 is infeasible: items without a 'fp4' option (1 layer, 75.0% of FLOPs) "
            "cap the FP4 share at 0.250");
  // The printed cap stays below the budget even when they are close.
  p = two();
  p.items[0].flops = 1;
  p.items[1].flops = 2999;  // cap 0.99966..., budget 0.9997
  o.budget = Budget::share(0.9997);
  o.pins = {{"layers.0.*", "fp8"}};
  EXPECT_NE(error_of([&] { solve(p, o); }).find("caps the FP4 share at 0.99967"), std::string::npos)
      << error_of([&] { solve(p, o); });
}

TEST(Planner, ResultFields) {
  PlanOptions o;
  o.budget = Budget::share(0.7);  // needs layer 1 (3/4)
  const PlanResult r = solve(two(), o);
  EXPECT_EQ(r.method, "ilp");
  EXPECT_EQ(r.status, "optimal");
  EXPECT_TRUE(r.proven_optimal);
  EXPECT_DOUBLE_EQ(r.fp4_share, 0.75);
  EXPECT_DOUBLE_EQ(r.objective, 0.2);
  EXPECT_DOUBLE_EQ(r.cost, 1 * 2.0 + 3 * 1.0);
  EXPECT_DOUBLE_EQ(r.cost_per_flop, 5.0 / 4.0);
  EXPECT_EQ(r.stage_fp4_share, (std::vector<double>{0.0, 1.0}));
  EXPECT_GE(r.solve_seconds, 0.0);
  EXPECT_EQ(r.assignments().at("model.layers.1.mlp.up_proj"), "fp4");
  // An option without a cost makes the reported cost NaN (share budget).
  PlanProblem p = two();
  p.items[0].q = {{"fp6", 0.0}};
  EXPECT_TRUE(std::isnan(solve(p, o).cost_per_flop));
}

// The options the plan chose among (after --options), in name order: what a
// plan table shows Q columns for. Items offering bf16 (Q 0) with
// allowed_options {fp4, fp8} do not make bf16 one of them.
TEST(Planner, ResultListsTheOptionsItChoseAmong) {
  PlanProblem p = two();
  for (PlanItem& it : p.items) it.q["bf16"] = 0;
  p.items[1].q["fp6"] = 0.1;  // offered by one item only: still an option of the plan
  PlanOptions o;
  o.budget = Budget::share(0.7);
  EXPECT_EQ(solve(p, o).options, (std::vector<std::string>{"bf16", "fp4", "fp6", "fp8"}));
  o.allowed_options = {"fp8", "fp4"};
  EXPECT_EQ(solve(p, o).options, (std::vector<std::string>{"fp4", "fp8"}));
  EXPECT_EQ(heuristic_layer_type(p, o).options, (std::vector<std::string>{"fp4", "fp8"}));
}

TEST(Planner, TimeLimitGivesAFeasiblePlanOrProvenOptimum) {
  // A hard knapsack (distinct FLOPs, Q(fp4) - Q(fp8) proportional to FLOPs
  // up to 1e-6) with a 1 s limit: either CBC finishes, or it reports the
  // best plan found as time_limit_feasible. Both must meet the budget.
  std::mt19937_64 rng(4);
  std::uniform_real_distribution<double> u(0, 1);
  PlanProblem p;
  for (int k = 0; k < 400; ++k) {
    const double f = 1 + u(rng);
    p.items.push_back(item("model.layers." + std::to_string(k) + ".mlp.up_proj", f,
                           f * (1 + 1e-6 * u(rng)), 0));
  }
  PlanOptions o;
  o.budget = Budget::share(0.6180339);
  o.time_limit_s = 1.0;  // 0.02 s found no plan at all on a loaded 2-core machine
  const PlanResult r = solve(p, o);
  EXPECT_TRUE(r.status == "optimal" || r.status == "time_limit_feasible") << r.status;
  EXPECT_EQ(r.proven_optimal, r.status == "optimal");
  EXPECT_GE(r.fp4_share, 0.6180339 - kBudgetTolerance);
}

TEST(Planner, Llama70BPerGemmWithPinsAndStages) {
  // 1680 GEMM items: the plan is proven optimal, meets every stage's budget
  // and keeps every pin.
  std::mt19937_64 rng(8);
  std::lognormal_distribution<double> ln(0, 0.5);
  PlanProblem p;
  p.granularity = Granularity::gemm;
  for (const LinearLayerShape& l : llama_linear_layers(80, 8192, 28672, 64, 8, 4096))
    for (snip::Gemm gemm : snip::kAllGemms) {
      const char* g = snip::gemm_name(gemm);
      PlanItem it;
      it.layer = l.name;
      it.gemm = g;
      it.name = l.name + ":" + g;
      it.flops = l.gemm_flops;
      it.q = {{"fp4", 1e-3 * ln(rng)}, {"fp8", 3e-5 * ln(rng)}, {"bf16", 0}};
      p.items.push_back(it);
    }
  assign_stages(p, 8);
  PlanOptions o;
  o.budget = Budget::share(0.6);
  o.per_stage_budget = true;
  o.stage_boundary_option = "fp8";
  o.allowed_options = {"fp4", "fp8"};
  o.pins = {{"*.down_proj:wgrad", "fp8"}};
  const PlanResult r = solve(p, o);
  EXPECT_EQ(r.status, "optimal");
  ASSERT_EQ(r.stage_fp4_share.size(), 8u);
  for (double s : r.stage_fp4_share) EXPECT_GE(s, 0.6 - kBudgetTolerance);
  for (const PlanChoice& c : r.items) {
    const std::string suffix = ".down_proj:wgrad";
    if (c.name.size() > suffix.size() &&
        c.name.compare(c.name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      EXPECT_EQ(c.option, "fp8") << c.name;
    }
    EXPECT_NE(c.option, "bf16") << c.name;
  }
  // Stage 0 starts at block 0 and ends at block 9: their q_proj / down_proj
  // GEMMs are boundary-pinned.
  const auto a = r.assignments();
  EXPECT_EQ(a.at("model.layers.0.self_attn.q_proj:fprop"), "fp8");
  EXPECT_EQ(a.at("model.layers.9.mlp.down_proj:dgrad"), "fp8");
}
