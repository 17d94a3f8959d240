// planner_internal.h: what plan(), sweep() and the heuristics share
// (validation, pin resolution, feasibility messages, result assembly).
// Not a public header.
#pragma once

#include <string>
#include <vector>

#include "snip/policy/planner.h"

namespace snip::policy::detail {

/// A validated problem with the allowed-option filter applied and pins
/// resolved.
struct Prepared {
  PlanProblem problem;             // items with q restricted to allowed options
  PinResolution pins;              // [n_items]
  double total_flops = 0;          // Σ F_i
  int n_stages = 0;                // 1 + max stage, 0 when items have none
  std::vector<double> stage_flops; // [n_stages] Σ F_i over the stage
};

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

}  // namespace snip::policy::detail
