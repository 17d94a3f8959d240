// Heuristic baselines (METHOD.md section 6) on hand-derived cases.
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "snip/plan/planner.h"
#include "snip/core/error.h"

using namespace snip::plan;

namespace {

PlanItem item(const std::string& name, double flops, double q4, double q8, double rel4 = -1) {
  PlanItem it;
  it.name = it.layer = name;
  it.flops = flops;
  it.q = {{"fp4", q4}, {"fp8", q8}};
  if (rel4 >= 0) it.rel_err["fp4"] = rel4;
  return it;
}

std::vector<std::string> options_of(const PlanResult& r) {
  std::vector<std::string> v;
  for (const PlanChoice& c : r.items) v.push_back(c.option);
  return v;
}

// 4 layers in 4 blocks, FLOPs 1,2,3,4 (total 10), rel_err(fp4) .3 .1 .2 .4.
PlanProblem four_layers() {
  PlanProblem p;
  const double rel[4] = {0.3, 0.1, 0.2, 0.4};
  for (int b = 0; b < 4; ++b)
    p.items.push_back(item("model.layers." + std::to_string(b) + ".mlp.up_proj", b + 1.0,
                           0.4 - 0.1 * b, 0.01 * (b + 1), rel[b]));
  return p;
}

PlanOptions share(double b) {
  PlanOptions o;
  o.budget = Budget::share(b);
  return o;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const snip::UserError& e) {
    return e.what();
  }
  return "(no UserError)";
}

using V = std::vector<std::string>;

}  // namespace

TEST(Heuristics, MinRelErrFillsInOrderUntilTheBudgetHolds) {
  const PlanProblem p = four_layers();
  // Order by rel_err: L1 (2 FLOPs), L2 (3), L0 (1), L3 (4).
  PlanResult r = heuristic_min_rel_err(p, share(0.5));  // L1+L2 = 5/10
  EXPECT_EQ(options_of(r), (V{"fp8", "fp4", "fp4", "fp8"}));
  EXPECT_DOUBLE_EQ(r.fp4_share, 0.5);
  EXPECT_DOUBLE_EQ(r.objective, 0.01 + 0.3 + 0.2 + 0.04);
  EXPECT_EQ(r.status, "heuristic");
  EXPECT_EQ(r.method, "min-rel-err");
  EXPECT_FALSE(r.proven_optimal);
  r = heuristic_min_rel_err(p, share(0.55));  // needs L0 too: 6/10
  EXPECT_EQ(options_of(r), (V{"fp4", "fp4", "fp4", "fp8"}));
  EXPECT_DOUBLE_EQ(r.fp4_share, 0.6);
  r = heuristic_min_rel_err(p, share(0.0));
  EXPECT_EQ(options_of(r), (V{"fp8", "fp8", "fp8", "fp8"}));
  r = heuristic_min_rel_err(p, share(1.0));
  EXPECT_EQ(options_of(r), (V{"fp4", "fp4", "fp4", "fp4"}));
  // Cost per FLOP reported with the default costs (fp4 1, fp8 2).
  r = heuristic_min_rel_err(p, share(0.5));
  EXPECT_DOUBLE_EQ(r.cost_per_flop, (5 * 1.0 + 5 * 2.0) / 10);
}

TEST(Heuristics, PinsAreKeptAndSkipped) {
  const PlanProblem p = four_layers();
  PlanOptions o = share(0.5);
  o.pins = {{"layers.1.*", "fp8"}};
  // L1 pinned: L2 (3/10), L0 (4/10), L3 (8/10).
  const PlanResult r = heuristic_min_rel_err(p, o);
  EXPECT_EQ(options_of(r), (V{"fp4", "fp8", "fp4", "fp4"}));
  EXPECT_DOUBLE_EQ(r.fp4_share, 0.8);
}

TEST(Heuristics, MissingRelErrIsAUserError) {
  PlanProblem p = four_layers();
  p.items[2].rel_err.clear();
  EXPECT_EQ(error_of([&] { heuristic_min_rel_err(p, share(0.5)); }),
            "heuristic min-rel-err: item 'model.layers.2.mlp.up_proj' has no rel_err.fp4 "
            "(the cost table's \"rel_err\" field)");
}

TEST(Heuristics, InfeasibleBudgetSameErrorAsThePlanner) {
  const PlanProblem p = four_layers();
  PlanOptions o = share(0.9);
  o.pins = {{"layers.3.*", "fp8"}};  // 4/10 of FLOPs
  const std::string h = error_of([&] { heuristic_layer_type(p, o); });
  EXPECT_EQ(h, error_of([&] { solve(p, o); }));
  EXPECT_EQ(h,
            "budget 0.9 is infeasible: pin 'layers.3.*=fp8' (1 layer, 40.0% of FLOPs) caps the "
            "FP4 share at 0.600");
}

TEST(Heuristics, LayerTypeOrder) {
  // One block, 7 types, equal FLOPs: b = 3/7 takes the first three types of
  // the default order: gate_proj, up_proj, q_proj.
  PlanProblem p;
  for (const char* t : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                        "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"})
    p.items.push_back(item(std::string("model.layers.0.") + t, 1, 1, 0));
  PlanResult r = heuristic_layer_type(p, share(3.0 / 7.0));
  EXPECT_EQ(options_of(r), (V{"fp4", "fp8", "fp8", "fp8", "fp4", "fp4", "fp8"}));
  // b = 6/7: everything but down_proj (last in the default order).
  r = heuristic_layer_type(p, share(6.0 / 7.0));
  EXPECT_EQ(options_of(r), (V{"fp4", "fp4", "fp4", "fp4", "fp4", "fp4", "fp8"}));
  // A custom order; unlisted types follow in problem order.
  r = heuristic_layer_type(p, share(2.0 / 7.0), {"down_proj"});
  EXPECT_EQ(options_of(r), (V{"fp4", "fp8", "fp8", "fp8", "fp8", "fp8", "fp4"}));
}

TEST(Heuristics, FirstLastFp8) {
  PlanProblem p;
  for (int b = 0; b < 4; ++b)
    p.items.push_back(item("model.layers." + std::to_string(b) + ".mlp.up_proj", 1, 1, 0));
  p.items.push_back(item("lm_head", 1, 1, 0));
  // Inner blocks first (1, 2), then the first block, the last block, lm_head.
  EXPECT_EQ(options_of(heuristic_first_last_fp8(p, share(0.4))),
            (V{"fp8", "fp4", "fp4", "fp8", "fp8"}));
  EXPECT_EQ(options_of(heuristic_first_last_fp8(p, share(0.6))),
            (V{"fp4", "fp4", "fp4", "fp8", "fp8"}));
  EXPECT_EQ(options_of(heuristic_first_last_fp8(p, share(0.8))),
            (V{"fp4", "fp4", "fp4", "fp4", "fp8"}));
  EXPECT_EQ(options_of(heuristic_first_last_fp8(p, share(1.0))),
            (V{"fp4", "fp4", "fp4", "fp4", "fp4"}));
}

// The heuristic's promise is "first and last blocks stay high". Blocks 0..3
// with 1 FLOP each: the inner blocks 1 and 2 hold half the FLOPs, so b = 0.5
// keeps the promise silently; b = 0.75 needs block 0 too, b = 1 both ends:
// the result says so instead of quietly running them in FP4.
TEST(Heuristics, FirstLastFp8WarnsWhenTheBudgetForcesTheEndsLow) {
  PlanProblem p;
  for (int b = 0; b < 4; ++b)
    p.items.push_back(item("model.layers." + std::to_string(b) + ".mlp.up_proj", 1, 1, 0));
  PlanResult r = heuristic_first_last_fp8(p, share(0.5));
  EXPECT_EQ(options_of(r), (V{"fp8", "fp4", "fp4", "fp8"}));
  EXPECT_TRUE(r.warnings.empty());
  r = heuristic_first_last_fp8(p, share(0.75));
  EXPECT_EQ(options_of(r), (V{"fp4", "fp4", "fp4", "fp8"}));
  EXPECT_EQ(r.warnings, (V{"first-last-fp8: budget 0.75 cannot be met by the inner blocks alone: it "
                           "forced 1 of the 2 items in the first and last blocks (0 and 3) to fp4"}));
  r = heuristic_first_last_fp8(p, share(1.0));
  EXPECT_EQ(options_of(r), (V{"fp4", "fp4", "fp4", "fp4"}));
  EXPECT_EQ(r.warnings, (V{"first-last-fp8: budget 1 cannot be met by the inner blocks alone: it "
                           "forced 2 of the 2 items in the first and last blocks (0 and 3) to fp4"}));
  // An end pinned to fp4 by the user is no broken promise: at b = 0.75 the
  // pin supplies the FLOPs block 0 would have, nothing is forced.
  PlanOptions o = share(0.75);
  o.pins = {parse_pin("layers.3.*=fp4")};
  r = heuristic_first_last_fp8(p, o);
  EXPECT_EQ(options_of(r), (V{"fp8", "fp4", "fp4", "fp4"}));
  EXPECT_TRUE(r.warnings.empty());
  // The other heuristics and the ILP never warn about this.
  EXPECT_TRUE(heuristic_layer_type(p, share(1.0)).warnings.empty());
  EXPECT_TRUE(solve(p, share(1.0)).warnings.empty());
}

TEST(Heuristics, RandomIsSeededAndMeetsTheBudgetMinimally) {
  PlanProblem p;
  for (int b = 0; b < 10; ++b)
    p.items.push_back(item("model.layers." + std::to_string(b) + ".mlp.up_proj", 1, 1, 0));
  std::set<V> seen;
  std::vector<int> times_low(10, 0);
  for (uint64_t seed = 0; seed < 200; ++seed) {
    const PlanResult r = heuristic_random(p, share(0.35), seed);
    EXPECT_EQ(options_of(r), options_of(heuristic_random(p, share(0.35), seed)));
    int low = 0;
    for (int i = 0; i < 10; ++i)
      if (r.items[i].option == "fp4") {
        ++low;
        ++times_low[i];
      }
    EXPECT_EQ(low, 4);  // ceil(3.5): the fill stops as soon as the budget holds
    seen.insert(options_of(r));
  }
  EXPECT_GT(seen.size(), 50u);  // 210 possible subsets of 4
  // Each item goes low 80 times in expectation (200 * 4/10); a 6-sigma band.
  for (int i = 0; i < 10; ++i) {
    EXPECT_GT(times_low[i], 40) << i;
    EXPECT_LT(times_low[i], 120) << i;
  }
}

TEST(Heuristics, Uniform) {
  const PlanProblem p = four_layers();
  PlanResult r = heuristic_uniform(p, share(0.75), "fp8");  // the budget is not enforced
  EXPECT_EQ(options_of(r), (V{"fp8", "fp8", "fp8", "fp8"}));
  EXPECT_DOUBLE_EQ(r.fp4_share, 0.0);
  EXPECT_DOUBLE_EQ(r.objective, 0.01 + 0.02 + 0.03 + 0.04);
  EXPECT_EQ(r.method, "uniform-fp8");
  r = run_heuristic("uniform-fp4", p, share(0));
  EXPECT_DOUBLE_EQ(r.fp4_share, 1.0);
  EXPECT_DOUBLE_EQ(r.cost_per_flop, 1.0);
  PlanOptions o = share(0);
  o.pins = {{"layers.0.*", "fp4"}};
  EXPECT_EQ(options_of(heuristic_uniform(p, o, "fp8")), (V{"fp4", "fp8", "fp8", "fp8"}));
  EXPECT_NE(error_of([&] { heuristic_uniform(p, share(0), "bf16"); })
                .find("does not offer 'bf16'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { run_heuristic("greedy", p, share(0)); })
                .find("expected one of min-rel-err"),
            std::string::npos);
}

TEST(Heuristics, PerStageBudget) {
  PlanProblem p;
  for (int b = 0; b < 4; ++b) {
    PlanItem it = item("model.layers." + std::to_string(b) + ".mlp.up_proj", 1, 1, 0,
                       0.1 * (b + 1));
    it.stage = b / 2;
    p.items.push_back(it);
  }
  PlanOptions o = share(0.5);
  // Globally L0, L1 would do; per stage L1 is skipped (stage 0 already at
  // 0.5) and L2 covers stage 1.
  EXPECT_EQ(options_of(heuristic_min_rel_err(p, o)), (V{"fp4", "fp4", "fp8", "fp8"}));
  o.per_stage_budget = true;
  const PlanResult r = heuristic_min_rel_err(p, o);
  EXPECT_EQ(options_of(r), (V{"fp4", "fp8", "fp4", "fp8"}));
  EXPECT_EQ(r.stage_fp4_share, (std::vector<double>{0.5, 0.5}));
}

TEST(Heuristics, CostBudgetAndHighOptionFallback) {
  PlanProblem p = four_layers();
  for (PlanItem& it : p.items) it.flops = 1;
  // fp4 costs 1, fp8 2: mean cost <= 1.5 needs two items low: L1, L2.
  PlanOptions o;
  o.budget = Budget::cost(1.5);
  EXPECT_EQ(options_of(heuristic_min_rel_err(p, o)), (V{"fp8", "fp4", "fp4", "fp8"}));
  // An item without fp8 falls back to its lowest-Q other option (bf16).
  p.items[3].q = {{"fp4", 1.0}, {"bf16", 0.0}};
  const PlanResult r = heuristic_min_rel_err(p, share(0.5));
  EXPECT_EQ(options_of(r), (V{"fp8", "fp4", "fp4", "bf16"}));
}

TEST(Heuristics, NeverBeatTheOptimalPlan) {
  // Property: at the same budget and pins, the ILP's objective is <= every
  // heuristic's (they are feasible plans of the same program).
  std::mt19937_64 rng(9);
  std::uniform_real_distribution<double> u(0, 1);
  for (int rep = 0; rep < 30; ++rep) {
    PlanProblem p;
    for (int b = 0; b < 6; ++b)
      for (const char* t : {"self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj"})
        p.items.push_back(item("model.layers." + std::to_string(b) + "." + t, 1 + 3 * u(rng),
                               u(rng), 0.1 * u(rng), u(rng)));
    const PlanOptions o = share(u(rng));
    const double best = solve(p, o).objective;
    for (const char* h : {"min-rel-err", "layer-type", "first-last-fp8", "random"})
      EXPECT_LE(best, run_heuristic(h, p, o, rep).objective + 1e-12) << h << " #" << rep;
  }
}

// ------------------------------------------------------------- the rivals --
namespace {

const char* const kTypes[7] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};

// `blocks` Llama blocks of 7 linear layers, model order, every layer FLOPs 1;
// per GEMM: three items of FLOPs 1/3 each.
PlanProblem llama_layers(int blocks, bool per_gemm = false) {
  PlanProblem p;
  p.granularity = per_gemm ? Granularity::gemm : Granularity::layer;
  for (int b = 0; b < blocks; ++b)
    for (const char* t : kTypes) {
      PlanItem it = item("model.layers." + std::to_string(b) + "." + t, 1.0, 1.0, 0.0);
      if (!per_gemm) {
        p.items.push_back(it);
        continue;
      }
      for (const char* g : {"fprop", "dgrad", "wgrad"}) {
        PlanItem gi = it;
        gi.name = it.name + ":" + g;
        gi.gemm = g;
        gi.flops = 1.0 / 3.0;
        p.items.push_back(gi);
      }
    }
  return p;
}

// The names of the items the plan keeps off the low option.
std::set<std::string> high_items(const PlanResult& r) {
  std::set<std::string> s;
  for (const PlanChoice& c : r.items)
    if (c.option != "fp4") s.insert(c.name);
  return s;
}

}  // namespace

TEST(Rivals, Bf16TailKeepsTheLastFifteenPercentOfLinearLayers) {
  // 4 blocks x 7 = 28 layers; round(0.15 x 28) = round(4.2) = 4: block 3's
  // o_proj, gate_proj, up_proj, down_proj; FP4 share 24/28 (equal FLOPs).
  PlanOptions o = share(0.75);
  const PlanResult r = heuristic_bf16_tail(llama_layers(4), o);
  EXPECT_EQ(high_items(r), (std::set<std::string>{"model.layers.3.self_attn.o_proj", "model.layers.3.mlp.gate_proj",
                                                  "model.layers.3.mlp.up_proj", "model.layers.3.mlp.down_proj"}));
  for (const PlanChoice& c : r.items)
    if (c.option != "fp4") EXPECT_EQ(c.option, "fp8");  // the high option
  EXPECT_DOUBLE_EQ(r.fp4_share, 24.0 / 28.0);
  EXPECT_EQ(r.method, "bf16-tail");
  EXPECT_EQ(r.status, "heuristic");
  // Per GEMM the same layers, all three GEMMs each: 12 items.
  const PlanResult g = heuristic_bf16_tail(llama_layers(4, true), o);
  EXPECT_EQ(high_items(g).size(), 12u);
  EXPECT_TRUE(high_items(g).count("model.layers.3.self_attn.o_proj:dgrad"));
  EXPECT_FALSE(high_items(g).count("model.layers.3.self_attn.v_proj:fprop"));
  EXPECT_NEAR(g.fp4_share, 24.0 / 28.0, 1e-12);
  o.tail_fraction = 0.0;
  EXPECT_TRUE(high_items(heuristic_bf16_tail(llama_layers(4), o)).empty());
  o.tail_fraction = 0.5;  // 14 layers: blocks 2 and 3
  EXPECT_DOUBLE_EQ(heuristic_bf16_tail(llama_layers(4), o).fp4_share, 0.5);
  o.tail_fraction = 1.5;
  EXPECT_NE(error_of([&] { heuristic_bf16_tail(llama_layers(4), o); }).find("tail_fraction"), std::string::npos);
  // By name through run_heuristic, pins winning over the rule.
  o = share(0.75);
  o.pins = {parse_pin("*.layers.0.mlp.down_proj=fp8"), parse_pin("*.layers.3.mlp.down_proj=fp4")};
  const PlanResult pr = run_heuristic("bf16-tail", llama_layers(4), o, 0);
  EXPECT_TRUE(high_items(pr).count("model.layers.0.mlp.down_proj"));
  EXPECT_FALSE(high_items(pr).count("model.layers.3.mlp.down_proj"));
  EXPECT_EQ(high_items(pr).size(), 4u);
}

TEST(Rivals, FirstLastNKeepsTheEndBlocks) {
  PlanOptions o = share(0.75);
  o.first_last_n = 1;  // blocks 0 and 3 of 4: 14 of 28 layers high
  PlanResult r = heuristic_first_last_n(llama_layers(4), o);
  EXPECT_EQ(high_items(r).size(), 14u);
  for (const std::string& n : high_items(r))
    EXPECT_TRUE(n.rfind("model.layers.0.", 0) == 0 || n.rfind("model.layers.3.", 0) == 0) << n;
  EXPECT_DOUBLE_EQ(r.fp4_share, 0.5);
  EXPECT_EQ(r.method, "first-last-n");
  o.first_last_n = 2;  // every block is within 2 of an end
  EXPECT_DOUBLE_EQ(heuristic_first_last_n(llama_layers(4), o).fp4_share, 0.0);
  o.first_last_n = 0;
  EXPECT_DOUBLE_EQ(heuristic_first_last_n(llama_layers(4), o).fp4_share, 1.0);
  o.first_last_n = 1;  // 6 blocks: 0 and 5 high, 4/6 of the FLOPs FP4
  EXPECT_DOUBLE_EQ(heuristic_first_last_n(llama_layers(6), o).fp4_share, 4.0 / 6.0);
  o.first_last_n = -1;
  EXPECT_NE(error_of([&] { heuristic_first_last_n(llama_layers(4), o); }).find("first_last_n"), std::string::npos);
}

TEST(Rivals, AutoswitchRaisesAGemmAboveTheMseOrUnderflowThreshold) {
  // TE's defaults: MSE > 1e-4 or underflow > 5% runs the GEMM high.
  PlanProblem p = llama_layers(1, true);  // 21 GEMM items
  for (PlanItem& it : p.items) it.mse["fp4"] = 5e-5, it.underflow["fp4"] = 0.01;
  p.items[0].mse["fp4"] = 2e-4;        // q_proj:fprop: MSE above
  p.items[1].mse["fp4"] = 1e-4;        // q_proj:dgrad: exactly at the threshold stays low
  p.items[5].underflow["fp4"] = 0.06;  // k_proj:wgrad: underflow above
  p.items[7].underflow["fp4"] = 0.05;  // v_proj:dgrad: at it stays low
  PlanOptions o = share(0.75);
  const PlanResult r = heuristic_autoswitch(p, o);
  EXPECT_EQ(high_items(r), (std::set<std::string>{"model.layers.0.self_attn.q_proj:fprop",
                                                  "model.layers.0.self_attn.k_proj:wgrad"}));
  EXPECT_NEAR(r.fp4_share, 19.0 / 21.0, 1e-12);
  EXPECT_EQ(r.method, "autoswitch");
  o.autoswitch_mse = 1e-5;  // every MSE above: all high
  EXPECT_EQ(heuristic_autoswitch(p, o).fp4_share, 0.0);
  o = share(0.75);
  o.autoswitch_underflow = 0.005;
  EXPECT_EQ(heuristic_autoswitch(p, o).fp4_share, 0.0);
  p.items[3].mse.clear();
  EXPECT_NE(error_of([&] { heuristic_autoswitch(p, share(0.75)); }).find("has no mse/underflow"), std::string::npos);
}
