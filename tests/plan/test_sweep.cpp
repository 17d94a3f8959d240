// The Pareto sweep: hand-derived front, dedup, capping, and random
// instances against an exhaustive Pareto front.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "snip/plan/planner.h"
#include "snip/core/error.h"

using namespace snip::plan;

namespace {

const PlanOptions kDefault;  // share budget, no pins

PlanItem item(const std::string& name, double flops, double q4, double q8) {
  PlanItem it;
  it.name = it.layer = name;
  it.flops = flops;
  it.q = {{"fp4", q4}, {"fp8", q8}};
  return it;
}

// FLOPs 1, 1, 2 (total 4); Q(fp4) .1 .3 .2; Q(fp8) 0.
PlanProblem three() {
  PlanProblem p;
  p.items = {item("model.layers.0.mlp.up_proj", 1, 0.1, 0),
             item("model.layers.1.mlp.up_proj", 1, 0.3, 0),
             item("model.layers.2.mlp.up_proj", 2, 0.2, 0)};
  return p;
}

}  // namespace

TEST(Sweep, HandDerivedFront) {
  // b=0: nothing (0, 0); .25: L0 (.25, .1); .5: L2 (.5, .2) beats L0+L1
  // (.4); .75: L0+L2 (.75, .3); 1: all (1, .6).
  const auto front = sweep(three(), kDefault, budget_steps(4));
  ASSERT_EQ(front.size(), 5u);
  const double share[5] = {0, 0.25, 0.5, 0.75, 1};
  const double q[5] = {0, 0.1, 0.2, 0.3, 0.6};
  for (int k = 0; k < 5; ++k) {
    EXPECT_DOUBLE_EQ(front[k].budget, share[k]);
    EXPECT_DOUBLE_EQ(front[k].plan.fp4_share, share[k]);
    EXPECT_NEAR(front[k].plan.objective, q[k], 1e-15);
    EXPECT_TRUE(front[k].plan.proven_optimal);
  }
  EXPECT_EQ(front[2].plan.assignments().at("model.layers.2.mlp.up_proj"), "fp4");
  EXPECT_EQ(front[2].plan.assignments().at("model.layers.0.mlp.up_proj"), "fp8");
}

TEST(Sweep, DuplicatesAndCapping) {
  // 0.26 and 0.5 give the same plan (L2): one point, with the smallest budget.
  auto front = sweep(three(), kDefault, {0.26, 0.5});
  ASSERT_EQ(front.size(), 1u);
  EXPECT_DOUBLE_EQ(front[0].budget, 0.26);
  EXPECT_DOUBLE_EQ(front[0].plan.fp4_share, 0.5);
  // A pin caps the share at 0.5: budgets above are replaced by the cap, once.
  PlanOptions o;
  o.pins = {{"layers.2.*", "fp8"}};
  front = sweep(three(), o, {0.0, 0.25, 0.75, 1.0});
  ASSERT_EQ(front.size(), 3u);
  EXPECT_DOUBLE_EQ(front[2].budget, 0.5);
  EXPECT_DOUBLE_EQ(front[2].plan.fp4_share, 0.5);
  EXPECT_NEAR(front[2].plan.objective, 0.4, 1e-15);
  // A zero-Q FP4 item: every plan runs it low (share >= .25 at b = 0), and
  // b = 0 and b = .25 give the same point.
  PlanProblem p = three();
  p.items[0].q["fp4"] = 0;
  front = sweep(p, kDefault, {0.0, 0.25});
  ASSERT_EQ(front.size(), 1u);
  EXPECT_DOUBLE_EQ(front[0].plan.fp4_share, 0.25);
}

TEST(Sweep, Errors) {
  PlanOptions o;
  o.budget = Budget::cost(2);
  EXPECT_THROW(sweep(three(), o, {0.5}), snip::UserError);
  EXPECT_THROW(sweep(three(), kDefault, {1.5}), snip::UserError);
  EXPECT_THROW(sweep(three(), kDefault, {}), snip::UserError);
  EXPECT_THROW(budget_steps(0), snip::UserError);
  EXPECT_EQ(budget_steps(2), (std::vector<double>{0, 0.5, 1}));
}

TEST(Sweep, RandomInstancesMatchTheExhaustiveFront) {
  std::mt19937_64 rng(31);
  std::uniform_real_distribution<double> u(0, 1);
  for (int rep = 0; rep < 25; ++rep) {
    PlanProblem p;
    const int n = 4 + rep % 9;
    for (int k = 0; k < n; ++k)
      p.items.push_back(item("model.layers." + std::to_string(k) + ".mlp.up_proj",
                             1 + std::floor(3 * u(rng)), u(rng), 0.2 * u(rng)));
    PlanOptions o;
    if (rep % 3 == 0) o.pins = {{"layers.0.*", "fp8"}};
    const std::vector<double> budgets = budget_steps(10);
    const auto front = sweep(p, o, budgets);
    ASSERT_FALSE(front.empty());
    // Monotone and non-dominated among themselves.
    for (size_t k = 1; k < front.size(); ++k) {
      EXPECT_GT(front[k].plan.fp4_share, front[k - 1].plan.fp4_share) << rep;
      EXPECT_GT(front[k].plan.objective, front[k - 1].plan.objective) << rep;
    }
    // Exhaustive: all assignments (layers.0 pinned to fp8 when rep % 3 == 0).
    double total = 0;
    for (const PlanItem& it : p.items) total += it.flops;
    std::vector<std::pair<double, double>> all;  // (share, Q)
    for (uint32_t mask = 0; mask < (1u << n); ++mask) {
      if (rep % 3 == 0 && (mask & 1u)) continue;
      double low = 0, q = 0;
      for (int k = 0; k < n; ++k) {
        const bool is_low = mask >> k & 1u;
        low += is_low ? p.items[k].flops : 0;
        q += p.items[k].q.at(is_low ? "fp4" : "fp8");
      }
      all.push_back({low / total, q});
    }
    // Each front point is Pareto-optimal among all assignments.
    for (const ParetoPoint& pt : front)
      for (const auto& [s, q] : all)
        EXPECT_FALSE(s >= pt.plan.fp4_share - 1e-12 && q < pt.plan.objective - 1e-9)
            << rep << ": (" << s << ", " << q << ") dominates (" << pt.plan.fp4_share << ", "
            << pt.plan.objective << ")";
    // For every reachable budget the front holds its optimum.
    double max_share = 0;
    for (const auto& sq : all) max_share = std::max(max_share, sq.first);
    for (double b : budgets) {
      const double bb = std::min(b, max_share);
      double best = INFINITY;
      for (const auto& [s, q] : all)
        if (s >= bb - kBudgetTolerance) best = std::min(best, q);
      bool found = false;
      for (const ParetoPoint& pt : front)
        found |= pt.plan.fp4_share >= bb - kBudgetTolerance &&
                 std::fabs(pt.plan.objective - best) <= 1e-9;
      EXPECT_TRUE(found) << rep << ": no front point with share >= " << bb << " and Q " << best;
    }
  }
}
