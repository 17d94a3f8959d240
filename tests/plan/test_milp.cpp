// MilpSolver (CBC) on hand-solved binary programs.
#include <gtest/gtest.h>

#include <limits>
#include <stdexcept>

#include "plan/milp.h"  // beside its .cpp in src/
#include "snip/core/error.h"

using namespace snip::plan;

namespace {
const double kInf = std::numeric_limits<double>::infinity();

MilpSolution solve(const MilpModel& m) {
  auto s = make_milp_solver("cbc");
  return s->solve(m, MilpSolveOptions{});
}
}  // namespace

TEST(Milp, KnapsackByHand) {
  // max 3a+4b+5c+6d s.t. 2a+3b+4c+5d <= 5: the feasible sets are {}, {a},
  // {b}, {c}, {d}, {a,b}; the best is {a,b} with value 7.
  MilpModel m;
  for (double v : {3.0, 4.0, 5.0, 6.0}) m.add_binary(-v);
  m.add_row({0, 1, 2, 3}, {2, 3, 4, 5}, -kInf, 5);
  const MilpSolution s = solve(m);
  ASSERT_EQ(s.status, MilpStatus::optimal);
  EXPECT_EQ(s.x, (std::vector<int>{1, 1, 0, 0}));
  EXPECT_DOUBLE_EQ(s.objective, -7.0);
}

TEST(Milp, ChooseOneOfThree) {
  // x0+x1+x2 = 1, minimise 3x0 + x1 + 2x2 -> x1.
  MilpModel m;
  for (double c : {3.0, 1.0, 2.0}) m.add_binary(c);
  m.add_row({0, 1, 2}, {1, 1, 1}, 1, 1);
  const MilpSolution s = solve(m);
  ASSERT_EQ(s.status, MilpStatus::optimal);
  EXPECT_EQ(s.x, (std::vector<int>{0, 1, 0}));
  EXPECT_DOUBLE_EQ(s.objective, 1.0);
}

TEST(Milp, TinyObjectiveDifferencesAreResolved) {
  // CBC's default cutoff increment (1e-5) would accept either; we need the
  // exact optimum. Two exclusive choices whose costs differ by 1e-9.
  MilpModel m;
  m.add_binary(1.0);
  m.add_binary(1.0 - 1e-9);
  m.add_binary(0.5);
  m.add_binary(0.5 + 1e-9);
  m.add_row({0, 1}, {1, 1}, 1, 1);
  m.add_row({2, 3}, {1, 1}, 1, 1);
  const MilpSolution s = solve(m);
  ASSERT_EQ(s.status, MilpStatus::optimal);
  EXPECT_EQ(s.x, (std::vector<int>{0, 1, 1, 0}));
}

TEST(Milp, InfeasibleIsReported) {
  MilpModel m;
  m.add_binary(1);
  m.add_binary(1);
  m.add_row({0, 1}, {1, 1}, 3, kInf);  // two binaries cannot sum to 3
  const MilpSolution s = solve(m);
  EXPECT_EQ(s.status, MilpStatus::infeasible);
  EXPECT_TRUE(s.x.empty());
}

TEST(Milp, EmptyModel) {
  MilpModel m;
  EXPECT_EQ(solve(m).status, MilpStatus::optimal);
  m.add_row({}, {}, 1, kInf);  // 0 >= 1
  EXPECT_EQ(solve(m).status, MilpStatus::infeasible);
}

TEST(Milp, FeasibilityToleranceIsHonoured) {
  // 0.3a + 0.3b >= 0.6 - 1e-12 holds at a=b=1 only; tolerance 1e-9.
  MilpModel m;
  m.add_binary(1);
  m.add_binary(1);
  m.add_row({0, 1}, {0.3, 0.3}, 0.6 + 1e-12, kInf);
  const MilpSolution s = solve(m);
  ASSERT_EQ(s.status, MilpStatus::optimal);
  EXPECT_EQ(s.x, (std::vector<int>{1, 1}));
  // A violation of 1e-6 is not within tolerance: infeasible.
  MilpModel m2;
  m2.add_binary(1);
  m2.add_row({0}, {1.0}, 1.0 + 1e-6, kInf);
  EXPECT_EQ(solve(m2).status, MilpStatus::infeasible);
}

TEST(Milp, MalformedModelIsAnInternalError) {
  MilpModel m;
  m.add_binary(1);
  m.add_row({0, 1}, {1, 1}, 0, 1);  // index 1 does not exist
  EXPECT_THROW(solve(m), std::logic_error);
  MilpModel m2;
  m2.add_binary(std::numeric_limits<double>::quiet_NaN());
  EXPECT_THROW(solve(m2), std::logic_error);
}

TEST(Milp, UnknownSolverIsAUserError) {
  try {
    make_milp_solver("highs");
    FAIL() << "expected UserError";
  } catch (const snip::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("'highs'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(make_milp_solver("cbc")->name(), "cbc");
}

TEST(Milp, StatusNames) {
  EXPECT_STREQ(to_string(MilpStatus::optimal), "optimal");
  EXPECT_STREQ(to_string(MilpStatus::infeasible), "infeasible");
  EXPECT_STREQ(to_string(MilpStatus::time_limit_feasible), "time_limit_feasible");
  EXPECT_STREQ(to_string(MilpStatus::time_limit_no_solution), "time_limit_no_solution");
  EXPECT_STREQ(to_string(MilpStatus::error), "error");
}
