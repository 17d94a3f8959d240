// planner.cpp: validation, feasibility, the ILP (docs/method.md section 4) and the
// Pareto sweep. See planner.h for the model and the exactness argument.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "planner_internal.h"
#include "milp.h"
#include "snip/plan/planner.h"
#include "snip/core/error.h"

namespace snip::plan {

const char* to_string(Granularity g) { return g == Granularity::layer ? "layer" : "gemm"; }

const char* to_string(PlanMethod m) {
  switch (m) {
    case PlanMethod::automatic: return "auto";
    case PlanMethod::milp: return "milp";
    case PlanMethod::mckp: return "mckp";
  }
  return "auto";
}

PlanMethod parse_plan_method(const std::string& name) {
  if (name == "auto") return PlanMethod::automatic;
  if (name == "milp") return PlanMethod::milp;
  if (name == "mckp") return PlanMethod::mckp;
  fail("planner method: expected one of auto, milp, mckp, got '", name, "'");
}

std::map<std::string, std::string> PlanResult::assignments() const {
  std::map<std::string, std::string> m;
  for (const PlanChoice& c : items) m[c.name] = c.option;
  return m;
}

namespace detail {

std::string upper(const std::string& s) {
  std::string r = s;
  for (char& c : r) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return r;
}

double option_cost(const PlanOptions& options, const std::string& option) {
  auto it = options.budget.cost_per_flop.find(option);
  if (it == options.budget.cost_per_flop.end())
    fail("cost budget: expected a cost per FLOP for option '", option,
         "' (e.g. --cost ", option, "=3), got none");
  return it->second;
}

namespace {

// NaN when the option has no cost (reporting only).
double cost_or_nan(const PlanOptions& options, const std::string& option) {
  auto it = options.budget.cost_per_flop.find(option);
  return it == options.budget.cost_per_flop.end()
             ? std::numeric_limits<double>::quiet_NaN()
             : it->second;
}

}  // namespace

Prepared prepare(const PlanProblem& problem, const PlanOptions& options) {
  Prepared p;
  p.problem = problem;
  auto& items = p.problem.items;
  if (items.empty()) fail("plan: expected at least one item (layer), got an empty problem");

  const Budget& b = options.budget;
  if (b.kind == Budget::Kind::fp4_share) {
    if (!(b.value >= 0.0 && b.value <= 1.0))
      fail("budget: expected an ", upper(options.low_option),
           " FLOPs share in [0, 1], got ", b.value);
  } else if (b.kind == Budget::Kind::cost) {
    if (!(b.value > 0.0) || !std::isfinite(b.value))
      fail("cost budget: expected a positive cost per FLOP, got ", b.value);
  } else {
    if (!(b.value > 0.0) || !std::isfinite(b.value))
      fail("time budget: expected a positive fraction of the ", b.time_reference, " GEMM time, got ", b.value);
    if (b.time_reference.empty()) fail("time budget: expected a reference option (e.g. bf16), got ''");
  }
  for (const auto& kv : b.cost_per_flop)
    if (!(kv.second >= 0.0) || !std::isfinite(kv.second))
      fail("cost of option '", kv.first, "': expected a finite number >= 0, got ", kv.second);
  if (options.low_option.empty()) fail("low option: expected a name (e.g. fp4), got ''");
  if (!(options.time_limit_s > 0.0))
    fail("time limit: expected a positive number of seconds, got ", options.time_limit_s);
  if (!(options.core_time_limit_s > 0.0))
    fail("core time limit: expected a positive number of seconds, got ",
         options.core_time_limit_s);

  std::set<std::string> names;
  const std::set<std::string> allowed(options.allowed_options.begin(),
                                      options.allowed_options.end());
  for (PlanItem& item : items) {
    if (item.name.empty()) fail("plan: expected every item to have a name, got ''");
    if (item.layer.empty()) item.layer = item.name;
    if (!names.insert(item.name).second)
      fail("item '", item.name, "': expected unique item names, got it twice");
    if (!(item.flops > 0.0) || !std::isfinite(item.flops))
      fail("item '", item.name, "': expected FLOPs > 0, got ", item.flops);
    if (item.q.empty()) fail("item '", item.name, "': expected at least one option in q, got none");
    for (const auto& kv : item.q)
      if (!(kv.second >= 0.0) || !std::isfinite(kv.second))
        fail("item '", item.name, "': q.", kv.first, ": expected a finite number >= 0, got ",
             kv.second);
    if (!allowed.empty()) {
      std::string offered;
      for (const auto& kv : item.q) offered += (offered.empty() ? "" : ", ") + kv.first;
      for (auto it = item.q.begin(); it != item.q.end();)
        it = allowed.count(it->first) ? std::next(it) : item.q.erase(it);
      if (item.q.empty())
        fail("item '", item.name, "': offers none of the allowed options (it offers ",
             offered, ")");
    }
    if (b.kind == Budget::Kind::cost)
      for (const auto& kv : item.q) option_cost(options, kv.first);
    if (b.kind == Budget::Kind::time) {
      auto need = [&](const std::string& o) {
        auto it = item.seconds.find(o);
        if (it == item.seconds.end())
          fail("time budget: item '", item.name, "': expected measured GEMM seconds for option '", o,
               "', got none (give a GEMM-times table that covers it: snip doctor --calibrate)");
        if (!(it->second >= 0.0) || !std::isfinite(it->second))
          fail("time budget: item '", item.name, "': seconds.", o, ": expected a finite number >= 0, got ",
               it->second);
      };
      need(b.time_reference);
      for (const auto& kv : item.q) need(kv.first);
    }
    if ((options.per_stage_budget || !options.stage_boundary_option.empty()) && item.stage < 0)
      fail("per-stage planning needs a pipeline stage on every item; '", item.name,
           "' has none (give --stages or \"stage\" in the cost table)");
    p.total_flops += item.flops;
    p.n_stages = std::max(p.n_stages, item.stage + 1);
  }
  // Shares are fractions of this sum; items each finite can still overflow it.
  if (!std::isfinite(p.total_flops))
    fail("plan: total FLOPs overflow (sum of item flops is not finite; give FLOPs in a smaller unit)");
  p.stage_flops.assign(p.n_stages, 0.0);
  for (const PlanItem& item : items)
    if (item.stage >= 0) p.stage_flops[item.stage] += item.flops;
  if (b.kind == Budget::Kind::time) {
    p.stage_ref_seconds.assign(p.n_stages, 0.0);
    for (const PlanItem& item : items) {
      const double t = item.seconds.at(b.time_reference);
      p.total_ref_seconds += t;
      if (item.stage >= 0) p.stage_ref_seconds[item.stage] += t;
    }
    if (!(p.total_ref_seconds > 0.0) || !std::isfinite(p.total_ref_seconds))
      fail("time budget: expected a positive, finite total ", b.time_reference, " GEMM time, got ",
           p.total_ref_seconds, " s");
    if (options.per_stage_budget)
      for (int s = 0; s < p.n_stages; ++s)
        if (!(p.stage_ref_seconds[s] > 0.0))
          fail("time budget: expected a positive ", b.time_reference, " GEMM time in every stage, got 0 in stage ", s);
  }
  if (options.per_stage_budget)
    for (int s = 0; s < p.n_stages; ++s)
      if (p.stage_flops[s] == 0.0)
        fail("per-stage budget: expected items in every stage 0..", p.n_stages - 1,
             ", got none in stage ", s);
  p.pins = resolve_pins(p.problem, options);
  return p;
}

double time_use(const Prepared& p, size_t i, const std::string& option, int stage) {
  const double ref = stage < 0 ? p.total_ref_seconds : p.stage_ref_seconds[stage];
  return p.problem.items[i].seconds.at(option) / ref;
}

double max_share(const Prepared& p, const PlanOptions& options, int stage) {
  double low = 0.0, total = 0.0;
  for (size_t i = 0; i < p.problem.items.size(); ++i) {
    const PlanItem& item = p.problem.items[i];
    if (stage >= 0 && item.stage != stage) continue;
    total += item.flops;
    const std::string& pin = p.pins.option[i];
    if (pin.empty() ? item.q.count(options.low_option) > 0 : pin == options.low_option)
      low += item.flops;
  }
  return total > 0 ? low / total : 0.0;
}

namespace {

// Minimum cost per FLOP over the scope. Summed as cost x (F_i / scope FLOPs),
// like the budget rows: cost x F_i alone can overflow for F_i near DBL_MAX.
double min_cost(const Prepared& p, const PlanOptions& options, int stage) {
  const double total = stage < 0 ? p.total_flops : p.stage_flops[stage];
  double c = 0.0;
  for (size_t i = 0; i < p.problem.items.size(); ++i) {
    const PlanItem& item = p.problem.items[i];
    if (stage >= 0 && item.stage != stage) continue;
    double best;
    if (!p.pins.option[i].empty()) {
      best = option_cost(options, p.pins.option[i]);
    } else {
      best = std::numeric_limits<double>::infinity();
      for (const auto& kv : item.q) best = std::min(best, option_cost(options, kv.first));
    }
    c += best * (item.flops / total);
  }
  return c;
}

// Time budgets: the smallest time fraction any plan reaches in the scope
// (every free item at its fastest offered option, pinned ones at the pin).
double min_time(const Prepared& p, const PlanOptions& options, int stage) {
  double t = 0.0;
  for (size_t i = 0; i < p.problem.items.size(); ++i) {
    const PlanItem& item = p.problem.items[i];
    if (stage >= 0 && item.stage != stage) continue;
    double best = std::numeric_limits<double>::infinity();
    if (!p.pins.option[i].empty()) best = time_use(p, i, p.pins.option[i], stage);
    else
      for (const auto& kv : item.q) best = std::min(best, time_use(p, i, kv.first, stage));
    t += best;
  }
  return t;
}

// Shortest fixed-point rendering of v (3..10 decimals) that stays on the
// infeasible side of `bound` (below it when `below`), so the message never
// reads "caps the share at 0.750" for a budget of 0.75.
std::string fmt_side(double v, double bound, bool below) {
  char buf[64];
  for (int d = 3; d <= 10; ++d) {
    std::snprintf(buf, sizeof buf, "%.*f", d, v);
    const double r = std::strtod(buf, nullptr);
    if (below ? r < bound : r > bound) break;
  }
  return buf;
}

std::string fmt_g(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

// "pins 'a=fp8' (14 layers, 31.2% of FLOPs) and 'b=bf16' (...), stage-
// boundary pins to fp8 (...) and items without an 'fp4' option (...)".
// `capped(i)` says whether item i's constraint on the budget is the pin's
// (or the missing option's) doing.
// `singular` is set when the subject is one pin (for the verb's number).
template <typename Capped>
std::string cappers(const Prepared& p, const PlanOptions& options, int stage,
                    const std::string& missing_what, Capped capped, bool& singular) {
  const size_t npins = options.pins.size();
  std::vector<int> count(npins + 2, 0);
  std::vector<double> flops(npins + 2, 0.0);
  double total = 0.0;
  for (size_t i = 0; i < p.problem.items.size(); ++i) {
    const PlanItem& item = p.problem.items[i];
    if (stage >= 0 && item.stage != stage) continue;
    total += item.flops;
    const int src = p.pins.source[i];
    if (!capped(i)) continue;
    const size_t slot = src >= 0 ? static_cast<size_t>(src) : (src == -2 ? npins : npins + 1);
    count[slot] += 1;
    flops[slot] += item.flops;
  }
  const char* unit = p.problem.granularity == Granularity::layer ? "layer" : "GEMM";
  auto what = [&](size_t slot) {
    char pct[32];
    std::snprintf(pct, sizeof pct, "%.1f%%", 100.0 * flops[slot] / total);
    return str_cat("(", count[slot], " ", unit, count[slot] == 1 ? "" : "s", ", ", pct,
                   " of FLOPs)");
  };
  std::vector<std::string> parts;
  for (size_t k = 0; k < npins; ++k)
    if (count[k]) parts.push_back(str_cat("'", options.pins[k].text(), "' ", what(k)));
  if (!parts.empty()) parts[0] = (parts.size() == 1 ? "pin " : "pins ") + parts[0];
  if (count[npins])
    parts.push_back(str_cat("stage-boundary pins to ", options.stage_boundary_option, " ",
                            what(npins)));
  if (count[npins + 1]) parts.push_back(missing_what + " " + what(npins + 1));
  singular = parts.size() == 1 && parts[0].rfind("pin ", 0) == 0;
  std::string s;
  for (size_t k = 0; k < parts.size(); ++k)
    s += (k == 0 ? "" : (k + 1 == parts.size() ? " and " : ", ")) + parts[k];
  if (s.empty()) s = "the problem";
  return s;
}

}  // namespace

void check_feasible(const Prepared& p, const PlanOptions& options) {
  const Budget& b = options.budget;
  const std::string low = options.low_option;
  std::vector<int> scopes = {-1};
  if (options.per_stage_budget)
    for (int s = 0; s < p.n_stages; ++s) scopes.push_back(s);
  for (int stage : scopes) {
    const std::string where = stage < 0 ? "" : str_cat(" in stage ", stage);
    if (b.kind == Budget::Kind::time) {
      const double m = min_time(p, options, stage);
      if (m <= b.value + kBudgetTolerance) continue;
      size_t n_pinned = 0;
      for (size_t i = 0; i < p.problem.items.size(); ++i)
        n_pinned += (stage < 0 || p.problem.items[i].stage == stage) && !p.pins.option[i].empty();
      fail("time budget ", fmt_g(b.value), " is infeasible", where, ": the fastest plan",
           n_pinned ? str_cat(" the pins allow (", n_pinned, " pinned items)") : std::string(),
           " takes ", fmt_side(m, b.value, false), " of the ", b.time_reference,
           " GEMM time (measured; raise the time budget, precision.budget or --time-budget, or allow faster options)");
    } else if (b.kind == Budget::Kind::fp4_share) {
      const double m = max_share(p, options, stage);
      if (m >= b.value - kBudgetTolerance) continue;
      auto capped = [&](size_t i) {
        const std::string& pin = p.pins.option[i];
        return pin.empty() ? !p.problem.items[i].q.count(low) : pin != low;
      };
      bool one = false;
      const std::string who =
          cappers(p, options, stage, "items without a '" + low + "' option", capped, one);
      fail("budget ", fmt_g(b.value), " is infeasible", where, ": ", who,
           one ? " caps " : " cap ", stage < 0 ? std::string("the") : str_cat("stage ", stage, "'s"), " ",
           upper(low), " share at ", fmt_side(m, b.value, true));
    } else {
      const double m = min_cost(p, options, stage);
      if (m <= b.value + kBudgetTolerance) continue;
      // The globally cheapest option among those offered anywhere.
      std::string cheapest;
      double cmin = std::numeric_limits<double>::infinity();
      for (const PlanItem& item : p.problem.items)
        for (const auto& kv : item.q)
          if (option_cost(options, kv.first) < cmin) {
            cmin = option_cost(options, kv.first);
            cheapest = kv.first;
          }
      auto capped = [&](size_t i) {
        const std::string& pin = p.pins.option[i];
        if (!pin.empty()) return option_cost(options, pin) > cmin;
        double best = std::numeric_limits<double>::infinity();
        for (const auto& kv : p.problem.items[i].q)
          best = std::min(best, option_cost(options, kv.first));
        return best > cmin;
      };
      bool one = false;
      const std::string who =
          cappers(p, options, stage, "items without a '" + cheapest + "' option", capped, one);
      fail("cost budget ", fmt_g(b.value), " per FLOP is infeasible", where, ": ", who,
           one ? " keeps " : " keep ", stage < 0 ? std::string("the") : str_cat("stage ", stage, "'s"),
           " cost at or above ", fmt_side(m, b.value, false), " per FLOP");
    }
  }
}

bool budget_holds(const Prepared& p, const PlanOptions& options,
                  const std::vector<std::string>& choice, int stage) {
  // Fractions of the scope's FLOPs, as in the solver's rows (no overflow).
  const double total = stage < 0 ? p.total_flops : p.stage_flops[stage];
  double v = 0.0;
  for (size_t i = 0; i < p.problem.items.size(); ++i) {
    const PlanItem& item = p.problem.items[i];
    if (stage >= 0 && item.stage != stage) continue;
    if (options.budget.kind == Budget::Kind::fp4_share)
      v += choice[i] == options.low_option ? item.flops / total : 0.0;
    else if (options.budget.kind == Budget::Kind::time)
      v += time_use(p, i, choice[i], stage);
    else
      v += option_cost(options, choice[i]) * (item.flops / total);
  }
  return options.budget.kind == Budget::Kind::fp4_share
             ? v >= options.budget.value - kBudgetTolerance
             : v <= options.budget.value + kBudgetTolerance;
}

PlanResult assemble(const Prepared& p, const PlanOptions& options,
                    const std::vector<std::string>& choice, const std::string& method) {
  PlanResult r;
  r.granularity = p.problem.granularity;
  r.method = method;
  r.budget = options.budget;
  r.low_option = options.low_option;
  r.lower_bound = r.gap = r.relative_gap = std::numeric_limits<double>::quiet_NaN();
  std::set<std::string> offered;
  for (const PlanItem& item : p.problem.items)
    for (const auto& kv : item.q) offered.insert(kv.first);
  r.options.assign(offered.begin(), offered.end());
  double low = 0.0, cost_per_flop = 0.0;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  double secs = 0.0, ref_secs = 0.0;
  std::vector<double> stage_low(p.n_stages, 0.0);
  for (size_t i = 0; i < p.problem.items.size(); ++i) {
    const PlanItem& item = p.problem.items[i];
    auto q = item.q.find(choice[i]);
    SNIP_CHECK(q != item.q.end(), "item ", item.name, " got option ", choice[i],
               " it does not offer");
    auto t = item.seconds.find(choice[i]), tr = item.seconds.find(options.budget.time_reference);
    r.items.push_back(PlanChoice{item.name, choice[i], item.flops, q->second, item.stage,
                                 t == item.seconds.end() ? nan : t->second});
    secs += t == item.seconds.end() ? nan : t->second;
    ref_secs += tr == item.seconds.end() ? nan : tr->second;
    r.objective += q->second;
    if (choice[i] == options.low_option) {
      low += item.flops;
      if (item.stage >= 0) stage_low[item.stage] += item.flops;
    }
    // cost_p x F_i may overflow where the mean cost per FLOP does not.
    cost_per_flop += cost_or_nan(options, choice[i]) * (item.flops / p.total_flops);
  }
  r.fp4_share = low / p.total_flops;
  r.cost_per_flop = cost_per_flop;
  r.cost = cost_per_flop * p.total_flops;
  r.seconds = secs;
  r.reference_seconds = ref_secs;
  r.time_ratio = ref_secs > 0 ? secs / ref_secs : nan;
  for (int s = 0; s < p.n_stages; ++s)
    r.stage_fp4_share.push_back(p.stage_flops[s] > 0 ? stage_low[s] / p.stage_flops[s] : 0.0);
  return r;
}

}  // namespace detail

double max_fp4_share(const PlanProblem& problem, const PlanOptions& options, int stage) {
  const detail::Prepared p = detail::prepare(problem, options);
  return detail::max_share(p, options, stage);
}

namespace {

using Clock = std::chrono::steady_clock;

// Resource "goodness" of an option for the budget rows: larger is better
// (a time budget: the item's own seconds).
double goodness(const PlanOptions& o, const PlanItem& item, const std::string& option) {
  if (o.budget.kind == Budget::Kind::fp4_share) return option == o.low_option ? 1.0 : 0.0;
  if (o.budget.kind == Budget::Kind::time) return -item.seconds.at(option);
  return -detail::option_cost(o, option);
}

// Row coefficient per FLOP fraction of an option (share: 1 for low; cost:
// cost per FLOP).
double row_value(const PlanOptions& o, const std::string& option) {
  if (o.budget.kind == Budget::Kind::fp4_share) return option == o.low_option ? 1.0 : 0.0;
  return detail::option_cost(o, option);
}

// Tie-break among options equal in Q and goodness: cheaper first (known
// costs), then name.
bool tie_before(const PlanOptions& o, const std::string& a, const std::string& b) {
  auto ca = o.budget.cost_per_flop.find(a), cb = o.budget.cost_per_flop.find(b);
  const double xa = ca == o.budget.cost_per_flop.end() ? 1e300 : ca->second;
  const double xb = cb == o.budget.cost_per_flop.end() ? 1e300 : cb->second;
  return xa != xb ? xa < xb : a < b;
}

// Options of `item` not dominated by another (planner.h, "Exactness").
std::vector<std::string> undominated(const PlanOptions& o, const PlanItem& item) {
  std::vector<std::string> keep;
  for (const auto& [p, qp] : item.q) {
    bool dominated = false;
    for (const auto& [r, qr] : item.q) {
      if (r == p) continue;
      const double gp = goodness(o, item, p), gr = goodness(o, item, r);
      if (qr <= qp && gr >= gp && (qr < qp || gr > gp || tie_before(o, r, p))) {
        dominated = true;
        break;
      }
    }
    if (!dominated) keep.push_back(p);
  }
  return keep;
}

struct Var {
  int item;
  std::string option;
};

// The result's gap fields from an absolute gap (Q units): the lower bound
// is never below 0 (every Q is >= 0).
void set_gap(PlanResult& r, double gap) {
  r.lower_bound = std::max(0.0, r.objective - std::max(0.0, gap));
  r.gap = r.objective - r.lower_bound;
  r.relative_gap = r.objective > 0.0 ? r.gap / r.objective : 0.0;
}

std::vector<int> budget_scopes(const detail::Prepared& p, const PlanOptions& options) {
  std::vector<int> scopes = {-1};
  if (options.per_stage_budget)
    for (int s = 0; s < p.n_stages; ++s) scopes.push_back(s);
  return scopes;
}

// The mckp method (mckp.cpp) at budget value `value`; `m` built for p.
PlanResult plan_mckp(const detail::Prepared& p, const PlanOptions& options,
                     const detail::Mckp& m, double value, double time_limit_s) {
  PlanOptions o = options;
  o.budget.value = value;
  const detail::MckpSolution s = detail::solve_mckp(p, o, m, value, time_limit_s);
  for (int stage : budget_scopes(p, o))
    SNIP_CHECK(detail::budget_holds(p, o, s.choice, stage),
               "mckp plan misses the budget in scope ", stage);
  PlanResult r = detail::assemble(p, o, s.choice, "ilp");
  r.status = s.status;
  r.algorithm = s.algorithm;
  r.proven_optimal = s.proven;
  set_gap(r, s.gap);
  return r;
}

// The whole model on the MILP solver (planner.h, "Exactness").
PlanResult plan_milp(const detail::Prepared& p, const PlanOptions& options) {
  const auto& items = p.problem.items;
  const size_t n = items.size();
  const bool share = options.budget.kind == Budget::Kind::fp4_share;

  // Per item: base option (all option variables 0) and option variables.
  std::vector<std::string> base(n);
  std::vector<std::vector<int>> item_vars(n);
  std::vector<Var> vars;
  std::vector<double> obj;
  for (size_t i = 0; i < n; ++i) {
    if (!p.pins.option[i].empty()) {
      base[i] = p.pins.option[i];
      continue;
    }
    std::vector<std::string> keep = undominated(options, items[i]);
    SNIP_CHECK(!keep.empty(), "every option of ", items[i].name, " dominated");
    // Share budget, two options: the base is the non-low one so y = 1 means
    // "runs low" (the ordering rows then read naturally).
    if (keep.size() == 2 && share && keep[0] == options.low_option) std::swap(keep[0], keep[1]);
    base[i] = keep[0];
    for (size_t k = 1; k < keep.size(); ++k) {
      item_vars[i].push_back(static_cast<int>(vars.size()));
      vars.push_back(Var{static_cast<int>(i), keep[k]});
      obj.push_back(items[i].q.at(keep[k]) - items[i].q.at(keep[0]));
    }
  }

  // Objective scaled to max |coefficient| = 1 for the solver's tolerances.
  double qscale = 0.0;
  for (double c : obj) qscale = std::max(qscale, std::fabs(c));
  if (qscale == 0.0) qscale = 1.0;
  MilpModel model;
  for (double c : obj) model.add_binary(c / qscale);

  // At most one non-base option per item.
  for (size_t i = 0; i < n; ++i)
    if (item_vars[i].size() >= 2)
      model.add_row(item_vars[i], std::vector<double>(item_vars[i].size(), 1.0),
                    -std::numeric_limits<double>::infinity(), 1.0);

  // Budget rows, in fractions of the scope's FLOPs.
  const std::vector<int> scopes = budget_scopes(p, options);
  for (int stage : scopes) {
    const double scope_flops = stage < 0 ? p.total_flops : p.stage_flops[stage];
    std::vector<int> idx;
    std::vector<double> coef;
    double constant = 0.0;
    for (size_t i = 0; i < n; ++i) {
      if (stage >= 0 && items[i].stage != stage) continue;
      if (detail::timed(options)) {
        const double ub = detail::time_use(p, i, base[i], stage);
        constant += ub;
        for (int v : item_vars[i]) {
          const double c = detail::time_use(p, i, vars[v].option, stage) - ub;
          if (c != 0.0) {
            idx.push_back(v);
            coef.push_back(c);
          }
        }
        continue;
      }
      const double f = items[i].flops / scope_flops;
      const double rb = row_value(options, base[i]);
      constant += rb * f;
      for (int v : item_vars[i]) {
        const double c = (row_value(options, vars[v].option) - rb) * f;
        if (c != 0.0) {
          idx.push_back(v);
          coef.push_back(c);
        }
      }
    }
    const double inf = std::numeric_limits<double>::infinity();
    if (share)
      model.add_row(idx, coef, options.budget.value - constant, inf);
    else
      model.add_row(idx, coef, -inf, options.budget.value - constant);
  }

  // Ordering rows within classes of interchangeable two-option items.
  std::map<std::tuple<double, int, std::string, std::string>, std::vector<int>> classes;
  for (size_t i = 0; i < n; ++i)
    if (item_vars[i].size() == 1) {
      const int stage = options.per_stage_budget ? items[i].stage : -1;
      // Interchangeable: the same change of every budget row (FLOPs; for a
      // time budget the same difference in seconds, same stage).
      const std::string& other = vars[item_vars[i][0]].option;
      const double key = detail::timed(options)
                             ? items[i].seconds.at(other) - items[i].seconds.at(base[i])
                             : items[i].flops;
      classes[{key, stage, base[i], other}].push_back(item_vars[i][0]);
    }
  for (auto& [key, members] : classes) {
    std::stable_sort(members.begin(), members.end(),
                     [&](int a, int b) { return obj[a] < obj[b]; });
    for (size_t k = 0; k + 1 < members.size(); ++k)
      model.add_row({members[k], members[k + 1]}, {1.0, -1.0}, 0.0,
                    std::numeric_limits<double>::infinity());
  }

  auto solver = make_milp_solver(options.solver);
  MilpSolveOptions so;
  so.time_limit_s = options.time_limit_s;
  so.verbosity = options.verbosity;
  so.feasibility_tolerance = kBudgetTolerance;
  const MilpSolution sol = solver->solve(model, so);
  switch (sol.status) {
    case MilpStatus::optimal:
    case MilpStatus::time_limit_feasible:
      break;
    case MilpStatus::time_limit_no_solution:
      fail("the ", solver->name(), " solver found no plan within the time limit (",
           options.time_limit_s, " s); raise the time limit (--time-limit)");
    case MilpStatus::infeasible:
      SNIP_CHECK(false, "solver reports infeasible although every budget row is reachable");
    case MilpStatus::error:
      fail("the ", solver->name(), " solver failed: ", sol.message);
  }

  std::vector<std::string> choice = base;
  for (size_t v = 0; v < vars.size(); ++v)
    if (sol.x[v]) choice[vars[v].item] = vars[v].option;
  for (int stage : scopes)
    SNIP_CHECK(detail::budget_holds(p, options, choice, stage),
               "solver plan misses the budget in scope ", stage);

  PlanResult r = detail::assemble(p, options, choice, "ilp");
  r.status = to_string(sol.status);
  r.algorithm = solver->name();
  r.proven_optimal = sol.status == MilpStatus::optimal;
  if (r.proven_optimal) {
    set_gap(r, 0.0);
  } else {
    // The better of the solver's bound and the LP-relaxation bound.
    double gap = detail::lp_gap(p, detail::build_mckp(p, options), options.budget.value, choice);
    if (std::isfinite(sol.bound)) gap = std::min(gap, (sol.objective - sol.bound) * qscale);
    set_gap(r, gap);
  }
  return r;
}

}  // namespace

PlanResult solve(const PlanProblem& problem, const PlanOptions& options) {
  const auto t0 = Clock::now();
  const detail::Prepared p = detail::prepare(problem, options);
  detail::check_feasible(p, options);
  size_t n_free = 0;
  for (const std::string& pin : p.pins.option) n_free += pin.empty();
  PlanMethod method = options.method;
  if (method == PlanMethod::automatic)
    method = n_free <= kMilpMaxFreeItems ? PlanMethod::milp : PlanMethod::mckp;
  PlanResult r = method == PlanMethod::milp
                     ? plan_milp(p, options)
                     : plan_mckp(p, options, detail::build_mckp(p, options),
                                 options.budget.value, options.time_limit_s);
  r.solve_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

std::vector<double> budget_steps(int steps) {
  if (steps < 1) fail("--steps: expected a number of steps >= 1, got ", steps);
  std::vector<double> b;
  for (int k = 0; k <= steps; ++k) b.push_back(static_cast<double>(k) / steps);
  return b;
}

std::vector<ParetoPoint> sweep(const PlanProblem& problem, const PlanOptions& options,
                               const std::vector<double>& budgets) {
  if (options.budget.kind != Budget::Kind::fp4_share)
    fail("sweep: expected an ", detail::upper(options.low_option),
         " share budget, got a cost budget (the sweep varies the share)");
  if (budgets.empty()) fail("sweep: expected at least one budget, got none");
  for (double b : budgets)
    if (!(b >= 0.0 && b <= 1.0)) fail("sweep: expected budgets in [0, 1], got ", b);
  PlanOptions o = options;
  o.budget.value = 0.0;
  const detail::Prepared p = detail::prepare(problem, o);
  double cap = detail::max_share(p, o, -1);
  if (o.per_stage_budget)
    for (int s = 0; s < p.n_stages; ++s) cap = std::min(cap, detail::max_share(p, o, s));

  std::set<double> todo;
  for (double b : budgets) todo.insert(std::min(b, cap));
  // One compact problem (dominance, hulls, sorted hull edges) for every
  // budget; budgets in ascending order. A plan proven optimal at b whose
  // share (every stage's, with per-stage rows) is s >= b is also optimal
  // for every budget in [b, s] (it meets them, and their plans are a subset
  // of b's), so those budgets are not solved again.
  // CBC's time on the cores is shared by the whole sweep: core_time_limit_s
  // in all. Once it is spent, the remaining points keep their rounded plans
  // with the stated gap (a long sweep, e.g. --steps 10000, stays in seconds;
  // the default 21 budgets are all proven on the benchmark tables).
  const detail::Mckp m = detail::build_mckp(p, o);
  std::vector<ParetoPoint> front;
  double covered = -std::numeric_limits<double>::infinity();
  double cbc_left = o.core_time_limit_s;
  for (double b : todo) {
    if (b <= covered) continue;
    const auto t0 = Clock::now();
    PlanOptions ob = o;
    if (cbc_left <= 0.0) ob.max_core_vars = 0;
    ob.core_time_limit_s = std::max(1e-3, cbc_left);
    PlanResult r = plan_mckp(p, ob, m, b, o.time_limit_s);
    r.solve_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    if (r.algorithm == "mckp+cbc") cbc_left -= r.solve_seconds;
    if (r.proven_optimal) {
      covered = r.fp4_share;
      if (o.per_stage_budget)
        for (double s : r.stage_fp4_share) covered = std::min(covered, s);
    }
    // Keep non-dominated points as they come, one per (share, objective)
    // value (the earlier, i.e. smaller, budget on a tie), so that memory
    // holds the front only (each point holds a plan of every item).
    bool dominated = false;
    for (const ParetoPoint& q : front)
      if (q.plan.fp4_share >= r.fp4_share && q.plan.objective <= r.objective) {
        dominated = true;
        break;
      }
    if (dominated) continue;
    front.erase(std::remove_if(front.begin(), front.end(),
                               [&](const ParetoPoint& q) {
                                 return r.fp4_share >= q.plan.fp4_share &&
                                        r.objective <= q.plan.objective;
                               }),
                front.end());
    front.push_back(ParetoPoint{b, std::move(r)});
  }
  std::sort(front.begin(), front.end(), [](const ParetoPoint& a, const ParetoPoint& b) {
    return a.plan.fp4_share < b.plan.fp4_share;
  });
  return front;
}

}  // namespace snip::plan
