// heuristics.cpp: the baselines of docs/method.md section 6 (min-rel-err,
// layer-type, first-last-fp8, random, uniform), at the same budget and pins
// as the ILP. See planner.h for the shared fill rule.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "planner_internal.h"
#include "snip/plan/planner.h"
#include "snip/core/error.h"

namespace snip::plan {

namespace {

using Clock = std::chrono::steady_clock;

// The option a free item takes when it does not go low.
std::string high_of(const PlanOptions& o, const PlanItem& item) {
  if (o.high_option != o.low_option && item.q.count(o.high_option)) return o.high_option;
  std::string best;
  double bq = std::numeric_limits<double>::infinity();
  for (const auto& [opt, q] : item.q)  // name order, so ties go to the first name
    if (opt != o.low_option && q < bq) {
      bq = q;
      best = opt;
    }
  return best.empty() ? o.low_option : best;
}

// Shared fill: free items start high and go low in `order` until the budget
// holds (planner.h, "Heuristic baselines"). `switched`, when given, gets one
// flag per item: 1 where the fill sent a free item low (not a pin, not an
// item whose only option is the low one).
PlanResult fill(const PlanProblem& problem, const PlanOptions& options,
                const std::vector<int>& order, const std::string& method,
                std::vector<char>* switched = nullptr) {
  const auto t0 = Clock::now();
  const detail::Prepared p = detail::prepare(problem, options);
  detail::check_feasible(p, options);
  const auto& items = p.problem.items;
  const size_t n = items.size();
  std::vector<std::string> choice(n);
  for (size_t i = 0; i < n; ++i)
    choice[i] = p.pins.option[i].empty() ? high_of(options, items[i]) : p.pins.option[i];

  const bool share = options.budget.kind == Budget::Kind::fp4_share;
  std::vector<int> scopes;
  if (options.per_stage_budget)
    for (int s = 0; s < p.n_stages; ++s) scopes.push_back(s);
  else
    scopes.push_back(-1);
  auto scope_ok = [&](int s) { return detail::budget_holds(p, options, choice, s); };
  auto all_ok = [&] {
    for (int s : scopes)
      if (!scope_ok(s)) return false;
    return true;
  };
  // Running sums would be faster; budgets are checked per switch only on
  // the item's own scope, which keeps this O(n^2) worst case for n items,
  // fine for thousands of items.
  bool ok = all_ok();
  if (switched) switched->assign(n, 0);
  for (int i : order) {
    if (ok) break;
    if (!p.pins.option[i].empty() || !items[i].q.count(options.low_option)) continue;
    if (choice[i] == options.low_option) continue;
    if (detail::timed(options)) {
      if (items[i].seconds.at(options.low_option) >= items[i].seconds.at(choice[i]))
        continue;  // going low would not save measured time
    } else if (!share && detail::option_cost(options, options.low_option) >=
                             detail::option_cost(options, choice[i]))
      continue;  // going low would not lower the cost
    const int scope = options.per_stage_budget ? items[i].stage : -1;
    if (scope_ok(scope)) continue;
    choice[i] = options.low_option;
    if (switched) (*switched)[i] = 1;
    ok = all_ok();
  }
  if (!ok)
    fail("heuristic ", method, " cannot meet the ", detail::timed(options) ? "time" : "cost", " budget ",
         options.budget.value, detail::timed(options) ? " of the reference GEMM time" : " per FLOP",
         " by sending items to '", options.low_option,
         "' (some items' cheapest option is another one); use the ILP planner");
  PlanResult r = detail::assemble(p, options, choice, method);
  r.status = "heuristic";
  r.solve_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

std::vector<int> identity(size_t n) {
  std::vector<int> v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

std::string layer_type(const std::string& layer) {
  const size_t dot = layer.rfind('.');
  return dot == std::string::npos ? layer : layer.substr(dot + 1);
}

}  // namespace

PlanResult heuristic_min_rel_err(const PlanProblem& problem, const PlanOptions& options) {
  std::vector<double> key(problem.items.size());
  for (size_t i = 0; i < problem.items.size(); ++i) {
    const PlanItem& item = problem.items[i];
    auto it = item.rel_err.find(options.low_option);
    if (it == item.rel_err.end())
      fail("heuristic min-rel-err: item '", item.name, "' has no rel_err.",
           options.low_option, " (the cost table's \"rel_err\" field)");
    key[i] = it->second;
  }
  std::vector<int> order = identity(problem.items.size());
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return key[a] < key[b]; });
  return fill(problem, options, order, "min-rel-err");
}

PlanResult heuristic_layer_type(const PlanProblem& problem, const PlanOptions& options,
                                const std::vector<std::string>& type_order) {
  std::vector<size_t> rank(problem.items.size());
  for (size_t i = 0; i < problem.items.size(); ++i) {
    const std::string t = layer_type(problem.items[i].layer.empty() ? problem.items[i].name
                                                                    : problem.items[i].layer);
    rank[i] = std::find(type_order.begin(), type_order.end(), t) - type_order.begin();
  }
  std::vector<int> order = identity(problem.items.size());
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return rank[a] < rank[b]; });
  return fill(problem, options, order, "layer-type");
}

PlanResult heuristic_first_last_fp8(const PlanProblem& problem, const PlanOptions& options) {
  int first = std::numeric_limits<int>::max(), last = -1;
  std::vector<int> block(problem.items.size());
  for (size_t i = 0; i < problem.items.size(); ++i) {
    const PlanItem& item = problem.items[i];
    block[i] = block_index(item.layer.empty() ? item.name : item.layer);
    if (block[i] >= 0) {
      first = std::min(first, block[i]);
      last = std::max(last, block[i]);
    }
  }
  auto group = [&](int i) {
    if (block[i] < 0) return 3;
    if (block[i] == last) return 2;
    if (block[i] == first) return 1;
    return 0;
  };
  std::vector<int> order = identity(problem.items.size());
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return group(a) < group(b); });
  std::vector<char> switched;
  PlanResult r = fill(problem, options, order, "first-last-fp8", &switched);
  // The heuristic's promise is "first and last blocks stay high"; when the
  // inner blocks cannot meet the budget, the fill breaks it: say so.
  int ends = 0, forced = 0;
  for (size_t i = 0; i < problem.items.size(); ++i)
    if (group(static_cast<int>(i)) == 1 || group(static_cast<int>(i)) == 2) {
      ++ends;
      forced += switched[i];
    }
  if (forced > 0) {
    char budget[64];
    std::snprintf(budget, sizeof budget, "%.10g", options.budget.value);
    const std::string what = options.budget.kind == Budget::Kind::fp4_share
                                 ? str_cat("budget ", budget)
                                 : str_cat("cost budget ", budget, " per FLOP");
    const std::string blocks =
        first == last ? str_cat("(", first, ")") : str_cat("(", first, " and ", last, ")");
    r.warnings.push_back(str_cat("first-last-fp8: ", what,
                                 " cannot be met by the inner blocks alone: it forced ", forced,
                                 " of the ", ends, " items in the first and last blocks ", blocks,
                                 " to ", options.low_option));
  }
  return r;
}

PlanResult heuristic_random(const PlanProblem& problem, const PlanOptions& options,
                            uint64_t seed) {
  std::vector<int> order = identity(problem.items.size());
  std::mt19937_64 rng(seed);  // the engine's sequence is fixed by the standard
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng() % i]);
  return fill(problem, options, order, "random");
}

PlanResult heuristic_uniform(const PlanProblem& problem, const PlanOptions& options,
                             const std::string& option) {
  const auto t0 = Clock::now();
  PlanOptions o = options;
  const detail::Prepared p = detail::prepare(problem, o);
  std::vector<std::string> choice(p.problem.items.size());
  for (size_t i = 0; i < choice.size(); ++i) {
    const PlanItem& item = p.problem.items[i];
    if (!p.pins.option[i].empty()) {
      choice[i] = p.pins.option[i];
    } else if (item.q.count(option)) {
      choice[i] = option;
    } else {
      std::string offered;
      for (const auto& kv : item.q) offered += (offered.empty() ? "" : ", ") + kv.first;
      fail("heuristic uniform-", option, ": item '", item.name, "' does not offer '", option,
           "' (it offers ", offered, ")");
    }
  }
  PlanResult r = detail::assemble(p, o, choice, "uniform-" + option);
  r.status = "heuristic";
  r.solve_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

namespace {
// The rivals' rules: `keep[i]` items at their high option, every other free
// item low where it offers the low option (else high); pins win.
PlanResult keep_high(const PlanProblem& problem, const PlanOptions& options, const std::vector<char>& keep,
                     const std::string& method) {
  const auto t0 = Clock::now();
  const detail::Prepared p = detail::prepare(problem, options);
  const auto& items = p.problem.items;
  std::vector<std::string> choice(items.size());
  for (size_t i = 0; i < items.size(); ++i)
    choice[i] = !p.pins.option[i].empty()                      ? p.pins.option[i]
                : keep[i] || !items[i].q.count(options.low_option) ? high_of(options, items[i])
                                                                   : options.low_option;
  PlanResult r = detail::assemble(p, options, choice, method);
  r.status = "heuristic";
  r.solve_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

std::string layer_of(const PlanItem& item) { return item.layer.empty() ? item.name : item.layer; }
}  // namespace

PlanResult heuristic_bf16_tail(const PlanProblem& problem, const PlanOptions& options) {
  const double f = options.tail_fraction;
  if (!(f >= 0 && f <= 1)) fail("heuristic bf16-tail: tail_fraction: expected a fraction in [0, 1], got ", f);
  std::vector<std::string> layers;  // distinct layers, problem order
  for (const PlanItem& item : problem.items)
    if (std::find(layers.begin(), layers.end(), layer_of(item)) == layers.end()) layers.push_back(layer_of(item));
  const size_t tail = size_t(std::llround(f * double(layers.size())));
  const std::vector<std::string> kept(layers.end() - ptrdiff_t(tail), layers.end());
  std::vector<char> keep(problem.items.size());
  for (size_t i = 0; i < keep.size(); ++i)
    keep[i] = std::find(kept.begin(), kept.end(), layer_of(problem.items[i])) != kept.end();
  return keep_high(problem, options, keep, "bf16-tail");
}

PlanResult heuristic_first_last_n(const PlanProblem& problem, const PlanOptions& options) {
  const int n = options.first_last_n;
  if (n < 0) fail("heuristic first-last-n: first_last_n: expected a block count >= 0, got ", n);
  int first = std::numeric_limits<int>::max(), last = -1;
  std::vector<int> block(problem.items.size());
  for (size_t i = 0; i < block.size(); ++i) {
    block[i] = block_index(layer_of(problem.items[i]));
    if (block[i] >= 0) first = std::min(first, block[i]), last = std::max(last, block[i]);
  }
  std::vector<char> keep(block.size());
  for (size_t i = 0; i < keep.size(); ++i)
    keep[i] = block[i] < 0 || block[i] < first + n || block[i] > last - n;
  return keep_high(problem, options, keep, "first-last-n");
}

PlanResult heuristic_autoswitch(const PlanProblem& problem, const PlanOptions& options) {
  const std::string& low = options.low_option;
  std::vector<char> keep(problem.items.size());
  for (size_t i = 0; i < keep.size(); ++i) {
    const PlanItem& item = problem.items[i];
    const auto m = item.mse.find(low), u = item.underflow.find(low);
    if (m == item.mse.end() || u == item.underflow.end())
      fail("heuristic autoswitch: item '", item.name, "' has no mse/underflow for '", low,
           "' (they come from a stats step: precision.policy = \"autoswitch\" in snip train)");
    keep[i] = m->second > options.autoswitch_mse || u->second > options.autoswitch_underflow;
  }
  return keep_high(problem, options, keep, "autoswitch");
}

PlanResult run_heuristic(const std::string& name, const PlanProblem& problem,
                         const PlanOptions& options, uint64_t seed) {
  if (name == "min-rel-err") return heuristic_min_rel_err(problem, options);
  if (name == "layer-type") return heuristic_layer_type(problem, options);
  if (name == "first-last-fp8") return heuristic_first_last_fp8(problem, options);
  if (name == "random") return heuristic_random(problem, options, seed);
  if (name == "bf16-tail") return heuristic_bf16_tail(problem, options);
  if (name == "first-last-n") return heuristic_first_last_n(problem, options);
  if (name == "autoswitch") return heuristic_autoswitch(problem, options);
  if (name.rfind("uniform-", 0) == 0 && name.size() > 8)
    return heuristic_uniform(problem, options, name.substr(8));
  fail("heuristic: expected one of min-rel-err, layer-type, first-last-fp8, random, bf16-tail, first-last-n, "
       "autoswitch, ",
       "uniform-<option>, got '", name, "'");
}

}  // namespace snip::plan
