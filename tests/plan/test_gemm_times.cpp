// The time budget (precision.budget_unit = time; planner.h Budget::Kind::time)
// and the GEMM-times table (plan/gemm_times.h).
//
// Optimality is checked against a brute force written here from the
// documented model alone: every assignment of ≤ 12 items enumerated,
// minimise Σ Q subject to Σ_i t_i(p_i) <= T·Σ_i t_i(bf16) (+ kBudgetTolerance
// in fraction units). The expected plans of the hand-made tables are known
// without running the planner (worked out in the comments).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "snip/core/error.h"
#include "snip/plan/gemm_times.h"
#include "snip/plan/planner.h"

using namespace snip;
using namespace snip::plan;

namespace {

const std::vector<std::string> kOpts = {"bf16", "fp4", "fp8"};

// Brute force: the minimum Σ Q over plans meeting the time row, +inf when
// none does. `allowed` restricts the options.
double brute_force(const PlanProblem& p, double budget, const std::vector<std::string>& allowed) {
  const size_t n = p.items.size(), k = allowed.size();
  double ref = 0;
  for (const PlanItem& it : p.items) ref += it.seconds.at("bf16");
  double best = std::numeric_limits<double>::infinity();
  std::vector<size_t> a(n, 0);
  while (true) {
    double q = 0, t = 0;
    bool ok = true;
    for (size_t i = 0; i < n && ok; ++i) {
      auto it = p.items[i].q.find(allowed[a[i]]);
      if (it == p.items[i].q.end()) ok = false;
      else q += it->second, t += p.items[i].seconds.at(allowed[a[i]]);
    }
    if (ok && t / ref <= budget + kBudgetTolerance) best = std::min(best, q);
    size_t j = 0;
    while (j < n && ++a[j] == k) a[j++] = 0;
    if (j == n) break;
  }
  return best;
}

PlanItem item(const std::string& name, double flops, std::map<std::string, double> q,
              std::map<std::string, double> t) {
  PlanItem it;
  it.name = it.layer = name;
  it.flops = flops;
  it.q = std::move(q);
  it.seconds = std::move(t);
  return it;
}

// Hand-made: 4 small layers where FP4 is SLOWER than FP8 (small GEMMs:
// quantization overhead dominates) and 2 large ones where FP4 is fastest.
//   small: t bf16 1.0, fp8 0.8, fp4 0.9;  Q bf16 0, fp8 0.1, fp4 0.3
//   large: t bf16 10,  fp8 6,   fp4 3;    Q bf16 0, fp8 0.2, fp4 0.5
// Σ t(bf16) = 4 + 20 = 24. At T = 0.5 (12 s): both large at fp4 (6 s) and
// the small ones at bf16 (4 s) = 10 s <= 12, Q = 1.0 — optimal: any plan
// with a large layer above fp4 takes >= 3 + 6 + 4·0.8 = 12.2 s > 12. The
// small ones never run fp4: fp8 is faster AND better (fp4 is dominated).
PlanProblem hand_made() {
  PlanProblem p;
  for (int i = 0; i < 4; ++i)
    p.items.push_back(item("model.layers.0.small" + std::to_string(i), 1e6, {{"bf16", 0}, {"fp8", 0.1}, {"fp4", 0.3}},
                           {{"bf16", 1.0}, {"fp8", 0.8}, {"fp4", 0.9}}));
  for (int i = 0; i < 2; ++i)
    p.items.push_back(item("model.layers.0.large" + std::to_string(i), 1e9, {{"bf16", 0}, {"fp8", 0.2}, {"fp4", 0.5}},
                           {{"bf16", 10.0}, {"fp8", 6.0}, {"fp4", 3.0}}));
  return p;
}

}  // namespace

TEST(TimeBudget, FasterFp8KeepsSmallLayersOffFp4) {
  const PlanProblem p = hand_made();
  for (PlanMethod m : {PlanMethod::milp, PlanMethod::mckp}) {
    PlanOptions o;
    o.budget = Budget::time(0.5);
    o.method = m;
    const PlanResult r = solve(p, o);
    EXPECT_NEAR(r.objective, 1.0, 1e-12) << to_string(m);
    EXPECT_TRUE(r.proven_optimal);
    for (const PlanChoice& c : r.items) {
      if (c.name.find("small") != std::string::npos) EXPECT_NE(c.option, "fp4") << c.name;
      else EXPECT_EQ(c.option, "fp4") << c.name;
    }
    EXPECT_NEAR(r.seconds, 10.0, 1e-12);
    EXPECT_NEAR(r.reference_seconds, 24.0, 1e-12);
    EXPECT_NEAR(r.time_ratio, 10.0 / 24.0, 1e-12);
  }
  // A tighter budget, T = 0.45 (10.8 s): 6 s of large fp4 leaves 4.8 s for
  // four small layers: fp8 everywhere (3.2 s) is feasible; with Q, three at
  // bf16 and one at fp8 is 3.8 s -> Q 1.1 is best (all four need >= 4 x 0.8
  // = 3.2; bf16 x4 = 4.0 > 4.8? no, 4.0 <= 4.8 feasible, Q 1.0). So Q = 1.0
  // again; T = 0.40 (9.6 s): 3.6 s left: 2 fp8 + 2 bf16 = 3.6 -> Q 1.2.
  PlanOptions o;
  o.budget = Budget::time(0.40);
  const PlanResult r = solve(p, o);
  EXPECT_NEAR(r.objective, 1.2, 1e-12);
  int fp8 = 0;
  for (const PlanChoice& c : r.items)
    if (c.name.find("small") != std::string::npos) {
      EXPECT_NE(c.option, "fp4");
      fp8 += c.option == "fp8";
    }
  EXPECT_EQ(fp8, 2);
  // The FLOPs-share budget of the paper sends them to FP4 instead (what the
  // time unit is for): share 1.0 needs every item at fp4.
  PlanOptions share;
  share.budget = Budget::share(1.0);
  for (const PlanChoice& c : solve(p, share).items) EXPECT_EQ(c.option, "fp4");
}

TEST(TimeBudget, MatchesBruteForceOnRandomTables) {
  std::mt19937_64 g(12345);
  auto u = [&](double a, double b) { return std::uniform_real_distribution<double>(a, b)(g); };
  int checked = 0, infeasible = 0;
  for (int trial = 0; trial < 300; ++trial) {
    PlanProblem p;
    const int n = 1 + int(g() % 8);  // 3^8 = 6561 assignments at most
    const bool ties = trial % 3 == 0;
    for (int i = 0; i < n; ++i) {
      const double tb = ties ? 1.0 + double(g() % 3) : u(0.1, 10);
      // FP4 faster or slower than FP8, either may be slower than BF16.
      const double t8 = tb * (ties ? 0.5 * double(1 + g() % 3) : u(0.3, 1.3));
      const double t4 = tb * (ties ? 0.5 * double(1 + g() % 3) : u(0.2, 1.5));
      const double q8 = ties ? 0.25 * double(g() % 3) : u(0, 1), q4 = ties ? 0.25 * double(g() % 5) : u(0, 2);
      std::map<std::string, double> q = {{"bf16", 0.0}, {"fp8", q8}, {"fp4", q4}};
      if (g() % 5 == 0) q.erase("bf16");
      p.items.push_back(item("model.layers." + std::to_string(i) + ".mlp.up_proj", u(1, 100), q,
                             {{"bf16", tb}, {"fp8", t8}, {"fp4", t4}}));
    }
    const double budget = u(0.3, 1.1) > 1.0 ? 1.0 : u(0.3, 1.0);
    for (PlanMethod m : {PlanMethod::milp, PlanMethod::mckp}) {
      PlanOptions o;
      o.budget = Budget::time(budget);
      o.method = m;
      const double want = brute_force(p, budget, kOpts);
      if (!std::isfinite(want)) {
        EXPECT_THROW(solve(p, o), UserError);
        ++infeasible;
        continue;
      }
      const PlanResult r = solve(p, o);
      EXPECT_TRUE(r.proven_optimal) << "trial " << trial;
      EXPECT_NEAR(r.objective, want, 1e-9 * std::max(1.0, want)) << "trial " << trial << " " << to_string(m);
      EXPECT_LE(r.time_ratio, budget + 1e-9) << "trial " << trial;
      ++checked;
    }
  }
  EXPECT_GT(checked, 300);
  EXPECT_GT(infeasible, 0);  // some budgets below the fastest plan
}

TEST(TimeBudget, HeuristicFillMeetsTheTimeRow) {
  // layer-type fill sends items to fp4 in order until the time row holds;
  // the small items' fp4 is slower than their fp8, so they are skipped.
  PlanProblem p = hand_made();
  PlanOptions o;
  o.budget = Budget::time(0.5);
  o.allowed_options = {"fp4", "fp8"};
  const PlanResult r = heuristic_random(p, o, 7);
  EXPECT_LE(r.time_ratio, 0.5 + 1e-12);
  for (const PlanChoice& c : r.items) {
    if (c.name.find("small") != std::string::npos) {
      EXPECT_EQ(c.option, "fp8");
    }
  }
}

TEST(TimeBudget, ErrorsAreOneLine) {
  PlanProblem p = hand_made();
  p.items[2].seconds.erase("fp4");
  PlanOptions o;
  o.budget = Budget::time(0.5);
  try {
    solve(p, o);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.0.small2"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
  }
  p = hand_made();
  o.budget = Budget::time(0.2);  // fastest: 4 x 0.8 + 2 x 3 = 9.2 s = 0.383
  try {
    solve(p, o);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("time budget 0.2 is infeasible"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("0.38"), std::string::npos) << e.what();
  }
}

TEST(TimeBudget, FlopsBudgetsIgnoreTimes) {
  // Items carrying seconds change no flops-budget plan; they only add the
  // predicted time to the result.
  PlanProblem p = hand_made(), bare = hand_made();
  for (PlanItem& it : bare.items) it.seconds.clear();
  PlanOptions o;
  o.budget = Budget::share(0.5);
  const PlanResult a = solve(p, o), b = solve(bare, o);
  EXPECT_EQ(a.assignments(), b.assignments());
  EXPECT_EQ(a.objective, b.objective);
  EXPECT_TRUE(std::isfinite(a.seconds));
  EXPECT_TRUE(std::isnan(b.seconds));
}

namespace {

nlohmann::json good_table() {
  return nlohmann::json::parse(R"({"format": "snip-gemm-times", "version": 1, "units": "seconds",
    "device": "cpu", "machine": "test", "gemm_dtype": "bf16",
    "entries": [
      {"gemm": "fprop", "m": 8, "k": 4, "n": 6, "option": "bf16", "seconds": 1.0, "repeats": 3},
      {"gemm": "dgrad", "m": 8, "k": 6, "n": 4, "option": "bf16", "seconds": 2.0, "repeats": 3},
      {"gemm": "wgrad", "m": 6, "k": 8, "n": 4, "option": "bf16", "seconds": 4.0, "repeats": 3}]})");
}

std::string error_of(const nlohmann::json& j) {
  try {
    parse_gemm_times(j, "t.json");
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    return e.what();
  }
  return "";
}

}  // namespace

TEST(GemmTimes, RoundTripAndApply) {
  const GemmTimes t = parse_gemm_times(good_table(), "t.json");
  EXPECT_EQ(parse_gemm_times(to_json(t), "x").entries.size(), 3u);
  // Layer in = 4, out = 6 on 8 tokens: fprop {8,4,6}, dgrad {8,6,4}, wgrad {6,8,4}.
  PlanProblem p;
  p.items.push_back(item("L", 1, {{"bf16", 0}}, {}));
  apply_gemm_times(p, t, {TimedLayer{"L", 4, 6}}, 8, 2.0, {"bf16"});
  EXPECT_DOUBLE_EQ(p.items[0].seconds.at("bf16"), 2.0 * (1 + 2 + 4));
  PlanProblem pg;
  PlanItem w = item("L:wgrad", 1, {{"bf16", 0}}, {});
  w.layer = "L";
  w.gemm = "wgrad";
  pg.items.push_back(w);
  pg.granularity = Granularity::gemm;
  apply_gemm_times(pg, t, {TimedLayer{"L", 4, 6}}, 8, 1.0, {"bf16"});
  EXPECT_DOUBLE_EQ(pg.items[0].seconds.at("bf16"), 4.0);
  // A shape or option the table lacks: one line naming the file and entry.
  try {
    apply_gemm_times(p, t, {TimedLayer{"L", 4, 6}}, 8, 1.0, {"fp4"});
    FAIL();
  } catch (const UserError& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("t.json: no entry for fprop {M=8, K=4, N=6} at option fp4", 0), 0u) << m;
  }
}

TEST(GemmTimes, BadTablesNameFileAndField) {
  auto with = [](const std::function<void(nlohmann::json&)>& f) {
    nlohmann::json j = good_table();
    f(j);
    return error_of(j);
  };
  EXPECT_EQ(with([](auto& j) { j["units"] = "ms"; }), "t.json: units: expected \"seconds\", got \"ms\"");
  EXPECT_EQ(with([](auto& j) { j["entries"][1]["seconds"] = -1; }),
            "t.json: entries[1].seconds: expected seconds per call in (0, 86400], got -1");
  // A day per call is the most a measurement can say (1e300 is none; near
  // DBL_MAX the planner's sums over items would overflow to inf).
  EXPECT_EQ(with([](auto& j) { j["entries"][1]["seconds"] = 1e300; }),
            "t.json: entries[1].seconds: expected seconds per call in (0, 86400], got 1e+300");
  EXPECT_EQ(with([](auto& j) { j["entries"][1]["seconds"] = 86400.5; }),
            "t.json: entries[1].seconds: expected seconds per call in (0, 86400], got 86400.5");
  EXPECT_EQ(with([](auto& j) { j["entries"][1]["seconds"] = 86400; }), "");
  EXPECT_EQ(with([](auto& j) { j["entries"][0].erase("m"); }), "t.json: entries[0].m: expected a value, got nothing");
  EXPECT_EQ(with([](auto& j) { j["entries"][0]["gemm"] = "bprop"; }),
            "t.json: entries[0].gemm: expected fprop, dgrad or wgrad, got \"bprop\"");
  EXPECT_EQ(with([](auto& j) { j["entries"][2]["secs"] = 1; }),
            "t.json: entries[2]: expected keys gemm, m, k, n, option, seconds, repeats, got \"secs\"");
  EXPECT_EQ(with([](auto& j) { j["entries"][1] = j["entries"][0]; }),
            "t.json: entries[1]: expected each (gemm, shape, option) once, got fprop {M=8, K=4, N=6} bf16 again");
  EXPECT_EQ(with([](auto& j) { j["entries"] = nlohmann::json::array(); }),
            "t.json: entries: expected a non-empty array, got []");
  EXPECT_EQ(with([](auto& j) { j["version"] = 2; }), "t.json: version: expected 1, got 2");
  EXPECT_EQ(with([](auto& j) { j["entries"][0]["repeats"] = 0; }),
            "t.json: entries[0].repeats: expected an integer >= 1, got 0");
  // Missing file.
  try {
    load_gemm_times("/nonexistent/gemm_times.json");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/gemm_times.json"), std::string::npos) << e.what();
  }
}
