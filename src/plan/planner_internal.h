// planner_internal.h: what solve(), sweep() and the heuristics share
// (validation, pin resolution, feasibility messages, result assembly).
// Not a public header.
#pragma once

#include <string>
#include <vector>

#include "snip/plan/planner.h"

namespace snip::plan::detail {

/// A validated problem with the allowed-option filter applied and pins
/// resolved.
struct Prepared {
  PlanProblem problem;             // items with q restricted to allowed options
  PinResolution pins;              // [n_items]
  double total_flops = 0;          // Σ F_i
  int n_stages = 0;                // 1 + max stage, 0 when items have none
  std::vector<double> stage_flops; // [n_stages] Σ F_i over the stage
  // Time budgets only (0 / empty otherwise): Σ_i t_i(ref), seconds, over
  // all items and per stage (the denominators of the time rows).
  double total_ref_seconds = 0;
  std::vector<double> stage_ref_seconds;  // [n_stages]
};

/// Whether options.budget is a time budget (Budget::Kind::time).
inline bool timed(const PlanOptions& o) { return o.budget.kind == Budget::Kind::time; }

/// Time budgets: item i's use of the time row of scope `stage` (-1: all
/// items) at `option`: t_i(option) / Σ_scope t(ref), a fraction. prepare()
/// checked the entry exists.
double time_use(const Prepared& p, size_t i, const std::string& option, int stage);

/// Validates problem and options (UserError on bad input), applies
/// options.allowed_options and resolves pins.
Prepared prepare(const PlanProblem& problem, const PlanOptions& options);

/// Throws the infeasibility UserError when no plan can meet the budget
/// (globally, or in some stage with per_stage_budget). Exact: for a share
/// budget every row is maximised at once by sending every free item that
/// offers the low option low; for a cost budget minimised at once by the
/// cheapest offered option.
void check_feasible(const Prepared& p, const PlanOptions& options);

/// Largest low share (scope: stage >= 0, or all items for -1).
double max_share(const Prepared& p, const PlanOptions& options, int stage);

/// Cost per FLOP of `option`; UserError if missing under a cost budget.
double option_cost(const PlanOptions& options, const std::string& option);

/// Fills objective, shares, cost, stage shares of a result from choices.
PlanResult assemble(const Prepared& p, const PlanOptions& options,
                    const std::vector<std::string>& choice, const std::string& method);

/// Whether the budget holds for `choice` (within kBudgetTolerance), in
/// `stage` (>= 0) or globally (-1).
bool budget_holds(const Prepared& p, const PlanOptions& options,
                  const std::vector<std::string>& choice, int stage);

/// "FP4" for "fp4": the low option's display name.
std::string upper(const std::string& s);

}  // namespace snip::plan::detail

namespace snip::plan::detail {

// ---------------------------------------------------------------------------
// The multiple-choice knapsack path (mckp.cpp; planner.h, "Methods").
//
// Every budget row is written as a "use" row Σ u_{i,p} x_{i,p} <= U per
// scope, in fractions of the scope's FLOPs f_i = F_i / F_scope:
//   share budget: u = -f_i for the low option, 0 otherwise; U = -b
//   cost budget:  u = cost_p f_i;                          U = C
//   time budget:  u = t_i(p) / Σ_scope t(ref) (not f-based); U = T
// A scope is one pipeline stage (per-stage budgets; the global row is then
// implied: it is the FLOPs-weighted mean of the stage rows) or all items.

/// One undominated option of a free item.
struct McOption {
  double use = 0;  // u_{i,p}, fraction of the scope's FLOPs (x cost)
  double q = 0;    // Q_i(p)
  int name = 0;    // index into Mckp::names
};

/// One edge of an item's lower convex hull in the (use, Q) plane.
struct McSegment {
  double eff = 0;  // -dq / du: Q saved per unit of use, > 0
  double du = 0;   // > 0
  double dq = 0;   // < 0
  int item = 0;    // problem index
  int from = 0;    // local option index (into the item's options)
  int to = 0;
};

struct McScope {
  int stage = -1;              // -1: all items
  double pinned_use = 0;       // Σ use of pinned items
  double base_use = 0;         // Σ use of free items at their first option
  std::vector<int> items;      // free items of the scope, problem order
  std::vector<McSegment> segs; // hull edges, eff descending (then item, from)
};

/// The problem in compact form, built once per (problem, options) and
/// reused for every budget value of the same kind (sweep()).
struct Mckp {
  bool share = true;
  std::vector<std::string> names;  // option names, name order
  std::vector<double> rate;        // [names] use per unit of f
  std::vector<int> pinned;         // [n] option name index, -1 free
  std::vector<int> scope;          // [n] scope index
  std::vector<double> f;           // [n] F_i / F_scope
  std::vector<int> first;          // [n+1] offsets into opts (free items)
  std::vector<McOption> opts;      // undominated options, use ascending
  std::vector<int> hull_first;     // [n+1] offsets into hull (free items)
  std::vector<int> hull;           // local option indices on the lower hull
  std::vector<McScope> scopes;
  bool timed = false;              // time budget: uses from PlanItem::seconds
  double qscale = 1;               // largest Q spread of a free item (> 0)
};

/// Builds the compact problem (dominance as in the MILP path, hulls, sorted
/// hull edges). Validation is prepare()'s.
Mckp build_mckp(const Prepared& p, const PlanOptions& options);

/// The result of the mckp method at one budget value.
struct MckpSolution {
  std::vector<std::string> choice;  // [n] option per item
  std::string status;               // "optimal", "time_limit_feasible", "feasible"
  std::string algorithm;            // "mckp" or "mckp+cbc"
  bool proven = false;
  double gap = 0;                   // Q units, >= 0 (0 when proven)
  size_t core_vars = 0;             // option variables handed to CBC
};

/// Solves at budget value `value` (b or C; the kind is options.budget's)
/// with a wall-clock limit for CBC on the core.
MckpSolution solve_mckp(const Prepared& p, const PlanOptions& options, const Mckp& m,
                        double value, double time_limit_s);

/// The Lagrangian (LP-relaxation) gap of a plan: objective minus the LP
/// bound at budget value `value`, >= 0, Q units. `choice` must meet the
/// budget.
double lp_gap(const Prepared& p, const Mckp& m, double value,
              const std::vector<std::string>& choice);

}  // namespace snip::plan::detail
