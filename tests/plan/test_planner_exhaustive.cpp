// solve() against exhaustive search on random instances.
//
// The reference below re-implements the documented semantics (planner.h)
// from scratch: pins with fnmatch(3) as the glob engine, stage boundaries,
// every 0/1 assignment enumerated, budget rows checked with the documented
// tolerance kBudgetTolerance. It shares no code with the planner.
#include <fnmatch.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "snip/plan/planner.h"
#include "snip/core/error.h"

using namespace snip::plan;

namespace {

const char* kTypes[7] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                         "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                         "mlp.down_proj"};
const char* kShort[7] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                         "down_proj"};

enum class Mode { layer2, layer3_share, layer3_cost, gemm };

struct Inst {
  PlanProblem problem;
  PlanOptions options;
};

struct Rng {
  std::mt19937_64 g;
  explicit Rng(uint64_t seed) : g(seed) {}
  double u(double a, double b) { return std::uniform_real_distribution<double>(a, b)(g); }
  int i(int a, int b) { return std::uniform_int_distribution<int>(a, b)(g); }
  bool p(double prob) { return u(0, 1) < prob; }
};

Inst make_instance(Rng& r, Mode mode) {
  Inst in;
  const bool gemm = mode == Mode::gemm;
  const bool three = mode != Mode::layer2 && (mode != Mode::gemm || r.p(0.5));
  int n_layers;
  if (mode == Mode::layer2) n_layers = r.i(1, 16);
  else if (gemm) n_layers = three ? r.i(1, 3) : r.i(1, 4);
  else n_layers = r.i(1, 10);
  const int per_block = r.i(1, 4);
  const bool tie_flops = r.p(0.5), tie_q = r.p(0.3);
  auto qv = [&](double hi) { return tie_q ? 0.125 * r.i(0, static_cast<int>(hi * 8)) : r.u(0, hi); };
  in.problem.granularity = gemm ? Granularity::gemm : Granularity::layer;
  const int n_blocks = (n_layers + per_block - 1) / per_block;
  const int n_stages = r.p(0.4) ? r.i(1, std::min(3, n_blocks)) : 0;
  for (int k = 0; k < n_layers; ++k) {
    const int block = k / per_block;
    const std::string layer =
        "model.layers." + std::to_string(block) + "." + kTypes[k % per_block];
    const double layer_flops = tie_flops ? 1e9 * r.i(1, 3) : r.u(0.5e9, 5e9);
    for (int g = 0; g < (gemm ? 3 : 1); ++g) {
      PlanItem it;
      it.layer = layer;
      it.gemm = gemm ? snip::gemm_name(snip::Gemm(g)) : "";
      it.name = gemm ? layer + ":" + it.gemm : layer;
      it.flops = gemm && r.p(0.3) ? r.u(0.5e9, 5e9) : layer_flops;
      it.q["fp8"] = qv(0.5);
      if (!r.p(0.1)) it.q["fp4"] = qv(1.0);
      if (three && !r.p(0.05)) it.q["bf16"] = qv(0.2);
      it.stage = n_stages ? block * n_stages / n_blocks : -1;
      in.problem.items.push_back(it);
    }
  }
  PlanOptions& o = in.options;
  if (mode == Mode::layer3_cost) {
    o.budget = Budget::cost(r.u(1.0, 4.0));
  } else {
    const double pick = r.u(0, 1);
    o.budget = Budget::share(pick < 0.1 ? 0.0 : pick < 0.2 ? 1.0 : r.u(0, 1));
  }
  if (three && r.p(0.1)) o.allowed_options = {"fp4", "fp8"};
  if (r.p(0.35)) {
    const int npins = r.i(1, 2);
    for (int k = 0; k < npins; ++k) {
      const char* opts[3] = {"fp4", "fp8", "bf16"};
      const std::string opt = r.p(0.6) ? "fp8" : opts[r.i(0, three ? 2 : 1)];
      std::string pat;
      switch (r.i(0, gemm ? 4 : 2)) {
        case 0: pat = std::string("*.") + kShort[r.i(0, 6)]; break;
        case 1: pat = "layers." + std::to_string(r.i(0, n_blocks - 1)) + ".*"; break;
        case 2: pat = in.problem.items[r.i(0, static_cast<int>(in.problem.items.size()) - 1)].layer; break;
        case 3: pat = "*:wgrad"; break;
        default: pat = "layers.0.*:[fd]*"; break;
      }
      o.pins.push_back(Pin{pat, opt});
    }
  }
  if (n_stages) {
    o.per_stage_budget = r.p(0.7);
    if (r.p(0.5)) o.stage_boundary_option = "fp8";
  }
  return in;
}

// ---- the reference ---------------------------------------------------------

bool ref_layer_match(const std::string& pat, const std::string& name) {
  if (fnmatch(pat.c_str(), name.c_str(), 0) == 0) return true;
  for (size_t i = 0; i < name.size(); ++i)
    if (name[i] == '.' && fnmatch(pat.c_str(), name.c_str() + i + 1, 0) == 0) return true;
  return false;
}

bool ref_pin_match(const Pin& pin, const PlanItem& it) {
  const size_t c = pin.pattern.find(':');
  if (c != std::string::npos &&
      fnmatch(pin.pattern.substr(c + 1).c_str(), it.gemm.c_str(), 0) != 0)
    return false;
  return ref_layer_match(pin.pattern.substr(0, c), it.layer);
}

struct Ref {
  bool pin_error = false;
  bool feasible = false;
  double best = std::numeric_limits<double>::infinity();
  double max_share = 0;                 // global, ignoring the budget
  std::vector<double> stage_max_share;  // per stage
  double min_cost = 0;
  std::vector<double> stage_min_cost;
  std::vector<std::string> pinned;      // per item, "" = free
  std::vector<int> credit;              // first matching user pin, -1 none
};

Ref reference(const Inst& in) {
  Ref ref;
  const auto& items = in.problem.items;
  const PlanOptions& o = in.options;
  const size_t n = items.size();
  std::vector<std::map<std::string, double>> q(n);
  for (size_t i = 0; i < n; ++i)
    for (const auto& kv : items[i].q)
      if (o.allowed_options.empty() || std::count(o.allowed_options.begin(),
                                                  o.allowed_options.end(), kv.first))
        q[i][kv.first] = kv.second;
  ref.pinned.assign(n, "");
  ref.credit.assign(n, -1);
  for (size_t k = 0; k < o.pins.size(); ++k) {
    bool any = false;
    for (size_t i = 0; i < n; ++i) {
      if (!ref_pin_match(o.pins[k], items[i])) continue;
      any = true;
      if (ref.pinned[i].empty()) {
        ref.pinned[i] = o.pins[k].option;
        ref.credit[i] = static_cast<int>(k);
      } else if (ref.pinned[i] != o.pins[k].option) {
        ref.pin_error = true;
      }
    }
    if (!any) ref.pin_error = true;
  }
  for (size_t i = 0; i < n; ++i)
    if (!ref.pinned[i].empty() && !q[i].count(ref.pinned[i])) ref.pin_error = true;
  int n_stages = 0;
  for (const PlanItem& it : items) n_stages = std::max(n_stages, it.stage + 1);
  if (!o.stage_boundary_option.empty()) {
    for (int s = 0; s < n_stages; ++s) {
      std::string first, last;
      for (const PlanItem& it : items)
        if (it.stage == s) {
          if (first.empty()) first = it.layer;
          last = it.layer;
        }
      for (size_t i = 0; i < n; ++i)
        if (items[i].stage == s && (items[i].layer == first || items[i].layer == last) &&
            ref.pinned[i].empty()) {
          if (!q[i].count(o.stage_boundary_option)) ref.pin_error = true;
          ref.pinned[i] = o.stage_boundary_option;
        }
    }
  }
  if (ref.pin_error) return ref;

  std::vector<std::vector<std::string>> allowed(n);
  for (size_t i = 0; i < n; ++i) {
    if (!ref.pinned[i].empty()) allowed[i] = {ref.pinned[i]};
    else for (const auto& kv : q[i]) allowed[i].push_back(kv.first);
  }
  const bool share = o.budget.kind == Budget::Kind::fp4_share;
  double total = 0;
  std::vector<double> stage_total(n_stages, 0);
  for (const PlanItem& it : items) {
    total += it.flops;
    if (it.stage >= 0) stage_total[it.stage] += it.flops;
  }
  ref.stage_max_share.assign(n_stages, 0);
  ref.min_cost = std::numeric_limits<double>::infinity();
  ref.stage_min_cost.assign(n_stages, std::numeric_limits<double>::infinity());
  std::vector<size_t> digit(n, 0);
  while (true) {
    double low = 0, cost = 0, obj = 0;
    std::vector<double> slow(n_stages, 0), scost(n_stages, 0);
    for (size_t i = 0; i < n; ++i) {
      const std::string& opt = allowed[i][digit[i]];
      obj += q[i].at(opt);
      const bool is_low = opt == o.low_option;
      const double c = o.budget.cost_per_flop.count(opt) ? o.budget.cost_per_flop.at(opt) : 0;
      low += is_low ? items[i].flops : 0;
      cost += c * items[i].flops;
      if (items[i].stage >= 0) {
        slow[items[i].stage] += is_low ? items[i].flops : 0;
        scost[items[i].stage] += c * items[i].flops;
      }
    }
    ref.max_share = std::max(ref.max_share, low / total);
    ref.min_cost = std::min(ref.min_cost, cost / total);
    bool ok = share ? low / total >= o.budget.value - kBudgetTolerance
                    : cost / total <= o.budget.value + kBudgetTolerance;
    for (int s = 0; s < n_stages; ++s) {
      ref.stage_max_share[s] = std::max(ref.stage_max_share[s], slow[s] / stage_total[s]);
      ref.stage_min_cost[s] = std::min(ref.stage_min_cost[s], scost[s] / stage_total[s]);
      if (o.per_stage_budget)
        ok = ok && (share ? slow[s] / stage_total[s] >= o.budget.value - kBudgetTolerance
                          : scost[s] / stage_total[s] <= o.budget.value + kBudgetTolerance);
    }
    if (ok) {
      ref.feasible = true;
      ref.best = std::min(ref.best, obj);
    }
    size_t k = 0;
    while (k < n && ++digit[k] == allowed[k].size()) digit[k++] = 0;
    if (k == n) break;
  }
  return ref;
}

// The number after the last occurrence of `key` in `msg`.
double number_after(const std::string& msg, const std::string& key) {
  const size_t pos = msg.rfind(key);
  if (pos == std::string::npos) return std::nan("");
  return std::strtod(msg.c_str() + pos + key.size(), nullptr);
}

// The instance and the plan, for failure messages.
std::string describe(const Inst& in, const PlanResult& r) {
  std::string s = std::string("budget ") +
                  (in.options.budget.kind == Budget::Kind::fp4_share ? "share " : "cost ") +
                  std::to_string(in.options.budget.value) +
                  (in.options.per_stage_budget ? " per-stage" : "") + "\n";
  for (const Pin& p : in.options.pins) s += "pin " + p.text() + "\n";
  for (size_t i = 0; i < in.problem.items.size(); ++i) {
    const PlanItem& it = in.problem.items[i];
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s flops=%.17g stage=%d ->%s :", it.name.c_str(), it.flops,
                  it.stage, i < r.items.size() ? r.items[i].option.c_str() : "?");
    s += buf;
    for (const auto& kv : it.q) {
      std::snprintf(buf, sizeof buf, " %s=%.17g", kv.first.c_str(), kv.second);
      s += buf;
    }
    s += "\n";
  }
  return s;
}

struct Tally {
  int solved = 0, infeasible = 0, pin_errors = 0;
  int proven = 0;          // mckp runs: plans proven optimal
  double max_rel_gap = 0;  // mckp runs: largest stated relative gap
};

// Which path of solve() an instance runs.
//  milp       the default (automatic: the whole model on CBC at these sizes)
//  mckp       LP hull bound, rounding, reduced-cost fixing, CBC on the core
//  mckp_lp    the same without CBC: the rounded plan and its stated gap
enum class Path { milp, mckp, mckp_lp };

void check_instance(const Inst& in_, const std::string& tag, Tally& t, Path path = Path::milp) {
  Inst in = in_;
  if (path != Path::milp) in.options.method = PlanMethod::mckp;
  if (path == Path::mckp_lp) in.options.max_core_vars = 0;
  const Ref ref = reference(in);
  const PlanOptions& o = in.options;
  if (ref.pin_error) {
    EXPECT_THROW(solve(in.problem, o), snip::UserError) << tag;
    ++t.pin_errors;
    return;
  }
  // max_fp4_share against the enumeration (budget ignored).
  EXPECT_NEAR(max_fp4_share(in.problem, o), ref.max_share, 1e-12) << tag;
  if (!ref.feasible) {
    ++t.infeasible;
    try {
      solve(in.problem, o);
      ADD_FAILURE() << tag << ": expected the infeasibility error";
    } catch (const snip::UserError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("infeasible"), std::string::npos) << tag << ": " << msg;
      // Which scope the message names: global first, then stages in order.
      const bool share = o.budget.kind == Budget::Kind::fp4_share;
      const bool global_bad = share ? ref.max_share < o.budget.value - kBudgetTolerance
                                    : ref.min_cost > o.budget.value + kBudgetTolerance;
      int stage = -1;
      if (!global_bad)
        for (size_t s = 0; s < ref.stage_max_share.size() && stage < 0; ++s)
          if (share ? ref.stage_max_share[s] < o.budget.value - kBudgetTolerance
                    : ref.stage_min_cost[s] > o.budget.value + kBudgetTolerance)
            stage = static_cast<int>(s);
      ASSERT_TRUE(global_bad || stage >= 0) << tag;
      if (stage >= 0) {
        EXPECT_NE(msg.find("in stage " + std::to_string(stage) + ":"), std::string::npos)
            << tag << ": " << msg;
      }
      const double expect = share ? (stage < 0 ? ref.max_share : ref.stage_max_share[stage])
                                  : (stage < 0 ? ref.min_cost : ref.stage_min_cost[stage]);
      const double got = number_after(msg, share ? " share at " : " at or above ");
      EXPECT_NEAR(got, expect, 5.01e-4) << tag << ": " << msg;
      // Every user pin that holds an item away from the low option is named.
      if (share) {
        for (size_t i = 0; i < in.problem.items.size(); ++i) {
          if (ref.credit[i] >= 0 && ref.pinned[i] != o.low_option &&
              (stage < 0 || in.problem.items[i].stage == stage)) {
            EXPECT_NE(msg.find("'" + o.pins[ref.credit[i]].text() + "'"), std::string::npos)
                << tag << ": " << msg;
          }
        }
      }
    }
    return;
  }
  ++t.solved;
  PlanResult r;
  try {
    r = solve(in.problem, o);
  } catch (const std::exception& e) {
    ADD_FAILURE() << tag << ": unexpected error: " << e.what();
    return;
  }
  const double tol = 1e-9 * std::max(1.0, std::fabs(ref.best));
  if (path == Path::milp) {
    EXPECT_EQ(r.status, "optimal") << tag;
    EXPECT_TRUE(r.proven_optimal) << tag;
  }
  if (r.proven_optimal) {
    ++t.proven;
    EXPECT_EQ(r.status, "optimal") << tag;
    EXPECT_NEAR(r.objective, ref.best, tol) << tag << "\n" << describe(in, r);
    EXPECT_EQ(r.gap, 0.0) << tag;
    EXPECT_EQ(r.lower_bound, r.objective) << tag;
  } else {
    EXPECT_NE(r.status, "optimal") << tag;
    if (path == Path::mckp_lp) {
      EXPECT_EQ(r.status, "feasible") << tag;
    }
  }
  // The stated gap: the bound is a true lower bound (<= the optimum, so the
  // stated gap >= the true gap), and consistent.
  EXPECT_LE(r.lower_bound, ref.best + tol) << tag << "\n" << describe(in, r);
  EXPECT_GE(r.objective, ref.best - tol) << tag;
  EXPECT_GE(r.gap, r.objective - ref.best - tol) << tag;
  EXPECT_GE(r.gap, 0.0) << tag;
  EXPECT_NEAR(r.gap, r.objective - r.lower_bound, 1e-15 * std::max(1.0, r.objective)) << tag;
  EXPECT_NEAR(r.relative_gap, r.objective > 0 ? r.gap / r.objective : 0.0, 1e-15) << tag;
  t.max_rel_gap = std::max(t.max_rel_gap, r.relative_gap);
  // The plan itself: pins kept, options offered, budget met, objective sum.
  ASSERT_EQ(r.items.size(), in.problem.items.size()) << tag;
  double low = 0, total = 0, obj = 0, cost = 0;
  for (size_t i = 0; i < r.items.size(); ++i) {
    const PlanItem& it = in.problem.items[i];
    const std::string& opt = r.items[i].option;
    EXPECT_EQ(r.items[i].name, it.name) << tag;
    ASSERT_TRUE(it.q.count(opt)) << tag << ": " << it.name << " got " << opt;
    if (!o.allowed_options.empty()) {
      EXPECT_TRUE(std::count(o.allowed_options.begin(), o.allowed_options.end(), opt)) << tag;
    }
    if (!ref.pinned[i].empty()) {
      EXPECT_EQ(opt, ref.pinned[i]) << tag << ": " << it.name;
    }
    obj += it.q.at(opt);
    total += it.flops;
    low += opt == o.low_option ? it.flops : 0;
    cost += o.budget.cost_per_flop.at(opt) * it.flops;
  }
  EXPECT_NEAR(r.objective, obj, 1e-12 * std::max(1.0, obj)) << tag;
  EXPECT_NEAR(r.fp4_share, low / total, 1e-12) << tag;
  if (o.budget.kind == Budget::Kind::fp4_share) {
    EXPECT_GE(low / total, o.budget.value - kBudgetTolerance) << tag;
  } else {
    EXPECT_LE(cost / total, o.budget.value + kBudgetTolerance) << tag;
  }
}

void run_mode(Mode mode, int count, uint64_t seed, const char* name, int min_solved,
              int min_infeasible, Path path = Path::milp) {
  // Stress knobs (not used by CTest): SNIP_STRESS_MULT=10 runs ten times the
  // instances, SNIP_STRESS_SEED=k shifts the seeds.
  const char* mult = std::getenv("SNIP_STRESS_MULT");
  const char* shift = std::getenv("SNIP_STRESS_SEED");
  Rng r(seed + (shift ? std::strtoull(shift, nullptr, 10) : 0));
  Tally t;
  if (mult) count *= std::max(1, std::atoi(mult));
  for (int k = 0; k < count; ++k) {
    const Inst in = make_instance(r, mode);
    check_instance(in, std::string(name) + " #" + std::to_string(k), t, path);
  }
  // The generator must exercise every outcome, or the test proves little.
  EXPECT_GE(t.solved, min_solved) << name;
  EXPECT_GE(t.infeasible, min_infeasible) << name;
  EXPECT_GE(t.pin_errors, 1) << name;
  std::printf("[%s] %d instances: %d solved, %d infeasible, %d pin errors", name, count,
              t.solved, t.infeasible, t.pin_errors);
  if (path != Path::milp)
    std::printf("; %d proven optimal, largest stated relative gap %.3g", t.proven, t.max_rel_gap);
  std::printf("\n");
  // With CBC on the core, the mckp method proves every plan here.
  if (path == Path::mckp) {
    EXPECT_EQ(t.proven, t.solved) << name;
  }
}

}  // namespace

TEST(PlannerExhaustive, PerLayerTwoOptionsShareBudget) {
  run_mode(Mode::layer2, 160, 11, "layer/2 options/share", 90, 5);
}

TEST(PlannerExhaustive, PerLayerThreeOptionsShareBudget) {
  run_mode(Mode::layer3_share, 110, 12, "layer/3 options/share", 60, 5);
}

TEST(PlannerExhaustive, PerLayerThreeOptionsCostBudget) {
  run_mode(Mode::layer3_cost, 110, 13, "layer/3 options/cost", 50, 5);
}

TEST(PlannerExhaustive, PerGemm) {
  run_mode(Mode::gemm, 110, 14, "gemm", 60, 5);
}

// The mckp method (planner.h, "Methods") on the same random instances, with
// other seeds: with CBC on the core it must prove the optimum; without
// (LP bound and rounding alone) its stated gap must hold.
TEST(PlannerExhaustive, MckpPerLayerTwoOptionsShareBudget) {
  run_mode(Mode::layer2, 160, 111, "mckp layer/2 options/share", 90, 5, Path::mckp);
  run_mode(Mode::layer2, 160, 211, "mckp-lp layer/2 options/share", 90, 5, Path::mckp_lp);
}

TEST(PlannerExhaustive, MckpPerLayerThreeOptionsShareBudget) {
  run_mode(Mode::layer3_share, 110, 112, "mckp layer/3 options/share", 60, 5, Path::mckp);
  run_mode(Mode::layer3_share, 110, 212, "mckp-lp layer/3 options/share", 60, 5, Path::mckp_lp);
}

TEST(PlannerExhaustive, MckpPerLayerThreeOptionsCostBudget) {
  run_mode(Mode::layer3_cost, 110, 113, "mckp layer/3 options/cost", 50, 5, Path::mckp);
  run_mode(Mode::layer3_cost, 110, 213, "mckp-lp layer/3 options/cost", 50, 5, Path::mckp_lp);
}

TEST(PlannerExhaustive, MckpPerGemm) {
  run_mode(Mode::gemm, 110, 114, "mckp gemm", 60, 5, Path::mckp);
  run_mode(Mode::gemm, 110, 214, "mckp-lp gemm", 60, 5, Path::mckp_lp);
}

// Distinct FLOPs (no interchangeable items, so no ordering rows) and
// quality losses whose ratios to FLOPs differ by ~1e-8: the search must
// branch, and CBC's default cutoff increment (1e-5) must not hide the
// optimum.
TEST(PlannerExhaustive, NearTiesDistinctFlops) {
  Rng r(22);
  for (int rep = 0; rep < 15; ++rep) {
    Inst in;
    const int n = 13;
    for (int k = 0; k < n; ++k) {
      PlanItem it;
      it.name = it.layer = "model.layers." + std::to_string(k / 7) + "." + kTypes[k % 7];
      it.flops = 1e9 * r.u(1.0, 2.0);
      // Q(fp4) - Q(fp8) proportional to FLOPs up to ~1e-8: every subset of
      // equal FLOPs costs almost the same.
      it.q["fp8"] = 0.01 * r.i(0, 3);
      it.q["fp4"] = it.q["fp8"] + 0.3 * it.flops / 1e9 * (1 + 1e-8 * r.u(-1, 1));
      in.problem.items.push_back(it);
    }
    in.options.budget = Budget::share(r.u(0.2, 0.9));
    Tally t;
    check_instance(in, "near-ties distinct #" + std::to_string(rep), t);
    EXPECT_EQ(t.solved, 1);
  }
}

// Many interchangeable items (equal FLOPs) with Q values that differ by
// less than CBC's default tolerances: the ordering rows and the solver
// settings must still find the exact optimum.
TEST(PlannerExhaustive, NearTiesAndEqualFlops) {
  Rng r(21);
  for (int rep = 0; rep < 30; ++rep) {
    Inst in;
    const int n = 14;
    for (int k = 0; k < n; ++k) {
      PlanItem it;
      it.name = it.layer = "model.layers." + std::to_string(k / 7) + "." + kTypes[k % 7];
      it.flops = 1e9 * (1 + k % 2);
      it.q["fp4"] = 0.5 + 1e-7 * r.i(0, 20);
      it.q["fp8"] = 0.1 + 1e-8 * r.i(0, 20);
      in.problem.items.push_back(it);
    }
    in.options.budget = Budget::share(r.u(0, 1));
    Tally t;
    check_instance(in, "near-ties #" + std::to_string(rep), t);
    EXPECT_EQ(t.solved, 1);
  }
}
