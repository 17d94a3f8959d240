// snip/plan/planner.h: the precision planner (docs/method.md sections 2, 4, 6).
//
// Vocabulary
//   item      what receives one precision option: a layer (per-layer
//             granularity, the paper's) or one GEMM of a layer (per-GEMM
//             granularity: fprop, dgrad, wgrad; docs/method.md section 2).
//   option    a precision recipe name ("fp4", "fp8", "bf16", or any other).
//   low       the option whose FLOPs the share budget counts ("fp4" default).
//   F_i       FLOPs per training step of item i (a GEMM: 2*T*in*out).
//   Q_i(p)    quality loss of item i at option p (dimensionless, >= 0).
//   share     Σ_i F_i·[i runs low] / Σ_i F_i, a fraction in [0,1].
//
// The integer linear program (docs/method.md section 4), x_{i,p} binary:
//   minimise    Σ_i Σ_p Q_i(p) x_{i,p}
//   subject to  Σ_p x_{i,p} = 1                             every item i
//               share budget:  Σ_i F_i x_{i,low} >= b Σ_i F_i
//            or cost budget:   Σ_i Σ_p cost_p F_i x_{i,p} <= C Σ_i F_i
//            or time budget:   Σ_i Σ_p t_i(p) x_{i,p} <= T Σ_i t_i(ref)
//                 (t_i(p): measured GEMM seconds per step of item i at
//                 option p, PlanItem::seconds; ref = Budget::time_reference)
//               x_{i,p} = 1 for pinned (i, p)
//               per stage s (optional): the same budget row over the items
//               of stage s alone.
// Budget rows hold to an absolute tolerance of kBudgetTolerance (1e-9) in
// share units (resp. cost per FLOP): a plan with share 0.7499999999995 meets
// b = 0.75.
//
// Exactness: before the solver sees the model, the planner (1) fixes pinned
// items, (2) drops options dominated within an item (another option has
// Q <= and a resource use at least as good, e.g. in a share budget only the
// best non-low option can be optimal), and (3) for two-option items that are
// interchangeable (same FLOPs, same stage, same two options A and B) adds
// ordering rows y_a >= y_b when Δ_a <= Δ_b, where y = 1 selects B and
// Δ = Q(B) - Q(A): swapping a and b keeps every budget row unchanged and does
// not raise the objective, so some optimal plan has this form. None of these
// changes the optimum. The ordering rows also make near-ties exact: without
// them, items whose Q differ by less than the LP tolerances could be chosen
// in a slightly wrong order. The objective handed to the solver is scaled to
// max |coefficient| = 1; plans are optimal to ~1e-9 of the largest per-item
// Q difference (tests/plan checks 1e-9 relative against enumeration).
//
// Methods (PlanOptions::method; PlanResult::algorithm says which ran):
//   milp  the whole model above on CBC (milp.h). Proven optimal as described
//         under "Exactness"; CBC needs seconds at ~3,000 items and did not
//         finish 10,000 in 30 s. The default up to kMilpMaxFreeItems (2000)
//         free items.
//   mckp  for larger problems (the default above 2000 free items; sweep()
//         always). The program is a multiple-choice knapsack (MCKP): one
//         option per item, one budget row per scope (a scope is a pipeline
//         stage with per-stage budgets, whose rows then imply the global
//         one; otherwise all items). Per scope, with u_{i,p} the option's
//         use of the row (share: -F_i/F_scope for the low option; cost:
//         cost_p F_i/F_scope) and U the row's bound (-b, resp. C):
//     1. LP relaxation: options dominated within an item are dropped and
//        the rest reduced to their lower convex hull in the (u, Q) plane;
//        taking hull edges in order of decreasing efficiency -ΔQ/Δu until
//        the row is full solves the LP exactly, with at most one fractional
//        item (Sinha & Zoltners, "The multiple-choice knapsack problem",
//        Oper. Res. 27(3):503-515, 1979; Kellerer, Pferschy & Pisinger,
//        "Knapsack Problems", Springer 2004, ch. 11). λ, the efficiency of
//        the edge that does not fit, is the LP dual of the row.
//     2. Rounding: the same walk keeping only edges that fit whole, then an
//        exchange search (one hull step down on one item and up on another)
//        that fills the room left.
//     3. Bound: L(λ) = Σ_i min_p (Q_i(p) + λ u_{i,p}) - λ U is the LP optimum
//        and, by Lagrangian duality (Geoffrion, Math. Prog. Study 2, 1974),
//        a lower bound on every plan meeting the row; for the rounded plan
//        x, Q(x) - L(λ) = Σ_i rc_i(x_i) + λ·slack(x) with reduced costs
//        rc_i(p) = Q_i(p) + λ u_{i,p} - min_p' (Q_i(p') + λ u_{i,p'}) >= 0.
//     4. Reduced-cost fixing: an option with rc_i(p) > Q(x) - L(λ) is in no
//        plan better than x (Nemhauser & Wolsey, "Integer and Combinatorial
//        Optimization", 1988; the MCKP core of Pisinger, EJOR 83(2), 1995).
//        The items left with two or more options (the core; tens to a few
//        thousand of 10^5) go to CBC as a MILP of their own, one scope at a
//        time, with the ordering rows above; CBC's proven optimum there is
//        optimal for the whole problem. CBC stops at core_time_limit_s (3 s
//        default); a core above max_core_vars is not attempted.
//   The gap (PlanResult::gap) is objective - lower_bound, where lower_bound
//   is the best proven bound: Σ_scope L(λ_s) (with the pinned Q), or CBC's
//   bound on the core where it is higher (every plan better than the
//   rounded one lies in the core). relative_gap = gap / objective (0 when
//   objective is 0), as MILP solvers report it. proven_optimal holds, and
//   gap is 0, only when gap <= 1e-9 of the largest per-item Q difference
//   or CBC proved the core optimal. tests/plan/test_planner_exhaustive.cpp
//   checks both methods against enumeration (stated gap >= true gap).
//
// Pins (glob patterns, see glob_match and pin_matches):
//   * A pin "GLOB=OPTION" forces OPTION on every item GLOB matches.
//   * Conflicting pins are an error: if two pins with DIFFERENT options match
//     one item, solve() throws naming both. Pins with the same option may
//     overlap (the first one is credited in messages).
//   * A pin that matches no item is an error (it is almost always a typo).
//   * A pin whose option an item does not offer (no Q for it) is an error.
//   * Stage-boundary pins (PlanOptions::stage_boundary_option) apply to the
//     first and last layer of every stage that no user pin covers: user pins
//     take precedence over them, never conflict with them.
//
// Errors: every input problem is a snip::UserError with one line (bad
// budget, unknown option, bad pin, infeasible budget with the pins that cap
// the share and the maximum achievable share, solver time-out without a
// plan). Broken internal invariants throw std::logic_error.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "snip/recipes/gemm.h"

namespace snip::plan {

/// Absolute tolerance on budget rows (share fraction, or cost per FLOP).
inline constexpr double kBudgetTolerance = 1e-9;

/// How solve() solves the program (see the header comment, "Methods").
///  automatic  milp up to kMilpMaxFreeItems free items, mckp above
///  milp       CBC on the whole model (exact, proven; seconds at 3,000 items)
///  mckp       LP relaxation by the convex-hull greedy, greedy rounding,
///             reduced-cost fixing, CBC on the remaining core; states its gap
enum class PlanMethod { automatic, milp, mckp };
/// "auto", "milp" or "mckp".
const char* to_string(PlanMethod m);
/// Parses "auto", "milp" or "mckp"; UserError for anything else.
PlanMethod parse_plan_method(const std::string& name);

/// PlanMethod::automatic uses the whole-model MILP up to this many free
/// (unpinned) items: up to here CBC proves optimality in well under a second
/// on the benchmark shapes (docs/planner.md, "Benchmarks").
inline constexpr size_t kMilpMaxFreeItems = 2000;

/// Default of PlanOptions::max_core_vars.
inline constexpr size_t kMckpMaxCoreVars = 20000;

/// Granularity of the choice (docs/method.md section 2).
enum class Granularity { layer, gemm };
/// "layer" or "gemm".
const char* to_string(Granularity g);

/// One thing that receives a precision option.
struct PlanItem {
  std::string name;   // layer: HF name "model.layers.3.self_attn.q_proj";
                      // gemm: "<layer>:fprop" | ":dgrad" | ":wgrad"
  std::string layer;  // the layer's HF name (== name at layer granularity)
  std::string gemm;   // "" at layer granularity, else "fprop"/"dgrad"/"wgrad"
  double flops = 0.0;                  // FLOPs per training step, > 0
  std::map<std::string, double> q;     // option -> Q (>= 0); absent = not offered
  int stage = -1;                      // pipeline stage index, -1 = none
  std::map<std::string, double> rel_err;  // option -> relative quantisation
                                          // error (fraction); optional, used by
                                          // the min-rel-err heuristic only
  // option -> the autoswitch rule's measures of the item at that option
  // (stats.h OptionStats::mse / underflow; a layer item: the largest of its
  // three GEMMs'); optional, used by heuristic_autoswitch only.
  std::map<std::string, double> mse;        // output units squared
  std::map<std::string, double> underflow;  // fraction of non-zero operand elements
  // option -> predicted seconds per training step of the item's GEMMs at
  // that option (measured, plan/gemm_times.h; >= 0, finite). Required by a
  // time budget for every offered option and for Budget::time_reference;
  // otherwise optional (then the plan reports its predicted time when every
  // item has an entry for its chosen option and the reference).
  std::map<std::string, double> seconds;
};

/// A planning problem: the items in model order (block order; the order
/// defines "first" and "last" layers of a stage).
struct PlanProblem {
  Granularity granularity = Granularity::layer;
  std::vector<PlanItem> items;
};

/// The budget: an FP4 (low-option) FLOPs share, a cost budget, or a time
/// budget in measured seconds.
struct Budget {
  enum class Kind { fp4_share, cost, time };
  Kind kind = Kind::fp4_share;
  // fp4_share: b in [0,1], the fraction of FLOPs that must run the low
  //            option.  cost: C, the mean cost per FLOP allowed, i.e.
  //            Σ cost_p·F_i·x_{i,p} <= C·Σ F_i (C = 2 means "as fast as
  //            uniform FP8" with the default costs).
  //            time: T > 0, the plan's GEMM seconds per step as a fraction
  //            of every item at time_reference: Σ_i t_i(p_i) <= T·Σ_i t_i(ref)
  //            (T = 0.8: "at most 0.8x the BF16 GEMM time").
  double value = 0.75;
  // time budgets: the option whose seconds are the 100% (need not be among
  // the options offered; every item must carry its seconds).
  std::string time_reference = "bf16";
  // Relative cost of one FLOP at each option (dimensionless). Used by cost
  // budgets and to report plan cost; defaults after docs/method.md section 4.
  std::map<std::string, double> cost_per_flop = {
      {"fp4", 1.0}, {"fp8", 2.0}, {"bf16", 4.0}};

  static Budget share(double b) { Budget r; r.kind = Kind::fp4_share; r.value = b; return r; }
  static Budget cost(double c) { Budget r; r.kind = Kind::cost; r.value = c; return r; }
  static Budget time(double t) { Budget r; r.kind = Kind::time; r.value = t; return r; }
};

/// A pin: every item matched by `pattern` runs `option`.
struct Pin {
  std::string pattern;  // "LAYERGLOB" or, per GEMM, "LAYERGLOB:GEMMGLOB"
  std::string option;
  /// "pattern=option", as written on the command line.
  std::string text() const { return pattern + "=" + option; }
};

/// Parses "GLOB=OPTION" (split at the last '='). Throws UserError if either
/// side is empty or there is no '='.
Pin parse_pin(const std::string& spec);

/// Shell-style glob, matched against the WHOLE text (fnmatch(3) with no
/// flags): '*' any run of characters (dots included), '?' one character,
/// '[abc]' '[a-z]' '[!abc]' one character of/not of a set (']' first in the
/// set is literal; a '[' without a closing ']' is a literal '['), '\x' the
/// literal x.
bool glob_match(const std::string& pattern, const std::string& text);

/// Whether `pin` matches `item`. The layer part of the pattern (before the
/// first ':') is matched with glob_match against the item's layer name and
/// against every suffix of it that starts after a '.', so "layers.21.mlp.*"
/// and "down_proj" match "model.layers.21.mlp.down_proj" while "layers.1.*"
/// does not match "model.layers.11.mlp.up_proj". A GEMM part (after ':')
/// is matched against the item's GEMM name; a pattern without one matches
/// all three GEMMs of a matching layer. Throws UserError for a GEMM part at
/// layer granularity.
bool pin_matches(const Pin& pin, const PlanItem& item, Granularity g);

/// All the knobs of solve(), sweep() and the heuristics.
struct PlanOptions {
  Budget budget;
  std::string low_option = "fp4";  // the option the share budget counts
  // Restrict every item to these options (empty: all options an item
  // offers). Note that with a share budget only Q decides among the
  // non-low options: a table with "bf16": 0 sends every non-FP4 item to
  // BF16 unless bf16 is left out here. UserError if an item offers none.
  std::vector<std::string> allowed_options;
  std::vector<Pin> pins;           // user pins (see the header comment)
  // Each stage meets the budget on its own (needs item.stage >= 0 on every
  // item). With a share budget: stage share >= b; cost: stage cost <= C.
  bool per_stage_budget = false;
  // Non-empty: pin the first and last layer of every stage to this option
  // (docs/method.md section 4 uses "fp8"). Needs item.stage >= 0 on every item.
  std::string stage_boundary_option;
  // The rivals' rules (heuristic_bf16_tail, heuristic_first_last_n,
  // heuristic_autoswitch); the other planners ignore them.
  double tail_fraction = 0.15;        // bf16-tail: fraction of layers kept high, counted from the last
  int first_last_n = 1;               // first-last-n: blocks kept high at each end
  double autoswitch_mse = 1e-4;       // autoswitch: an item goes high when mse[low] > this ...
  double autoswitch_underflow = 0.05; // ... or underflow[low] > this (fraction)
  std::string solver = "cbc";   // make_milp_solver name
  PlanMethod method = PlanMethod::automatic;  // see PlanMethod
  // mckp: the largest core (option variables left after reduced-cost
  // fixing) handed to CBC; a larger core keeps the rounded plan and its
  // stated gap (status "feasible"). 0: never call CBC.
  size_t max_core_vars = kMckpMaxCoreVars;
  // mckp: wall-clock limit of CBC on the core, seconds (also capped by
  // time_limit_s; in sweep(), the total over all points). At the limit the best plan found stays, with its stated
  // gap (status time_limit_feasible): proving the last 1e-8 of a
  // 10^5-item knapsack can take CBC far longer than finding it.
  double core_time_limit_s = 3.0;
  double time_limit_s = 60.0;   // solver wall-clock limit, seconds
  int verbosity = 0;            // 0 silent, 1 summary line, 2 solver log
  // Heuristics: the option non-low items get when they offer it; otherwise
  // the non-low option with the smallest Q (ties: name order).
  std::string high_option = "fp8";
};

/// The option one item ended up with.
struct PlanChoice {
  std::string name;    // item name
  std::string option;  // chosen option
  double flops = 0;    // item FLOPs per step
  double q = 0;        // Q of the chosen option
  int stage = -1;
  double seconds = std::numeric_limits<double>::quiet_NaN();  // item.seconds of the chosen option, s/step; NaN if absent
};

/// Result of solve(), a heuristic, or one sweep point.
struct PlanResult {
  Granularity granularity = Granularity::layer;
  std::string method;       // "ilp", or the heuristic name
  Budget budget;            // the budget asked for
  std::string low_option = "fp4";
  std::vector<std::string> options;  // the options the items offered after
                                     // allowed_options, name order: what the
                                     // plan chose among
  std::vector<PlanChoice> items;  // [n_items], problem order
  double objective = 0;     // Σ_i Q_i(chosen), dimensionless
  double fp4_share = 0;     // achieved low-option FLOPs share, fraction
  double cost = 0;          // Σ_i cost·F_i, cost units x FLOPs; NaN if an
                            // option has no cost_per_flop entry; inf past
                            // DBL_MAX (reporting only)
  double cost_per_flop = 0; // cost / Σ F_i, summed as Σ_i cost·(F_i/Σ F) so
                            // it stays finite; NaN likewise
  // Predicted GEMM seconds per step (Σ_i t_i(chosen)) and the same items all
  // at budget.time_reference (Σ_i t_i(ref)); NaN unless every item carries
  // both (PlanItem::seconds). time_ratio = seconds / reference_seconds.
  double seconds = std::numeric_limits<double>::quiet_NaN();
  double reference_seconds = std::numeric_limits<double>::quiet_NaN();
  double time_ratio = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> stage_fp4_share;  // [n_stages] when items have stages
  std::string status;       // MilpStatus name ("optimal", ...), "feasible"
                            // (mckp: core too large for CBC, gap stated) or
                            // "heuristic"
  // How the ILP was solved: "cbc" (whole model), "mckp" (LP hull greedy and
  // rounding proved the plan), "mckp+cbc" (with CBC on the core); "" for a
  // heuristic.
  std::string algorithm;
  double solve_seconds = 0; // wall-clock seconds of the whole solve() call
  // True only when the plan is proven optimal: gap <= 1e-9 of the largest
  // per-item Q difference (the solver tolerance, planner.h "Exactness").
  bool proven_optimal = false;
  // Optimality gap (ILP results; heuristics leave 0/0/NaN, see below).
  // lower_bound: a proven lower bound on Σ Q over every plan that meets the
  //   budget (Q units, dimensionless): the LP-relaxation (Lagrangian) bound,
  //   or the solver's bound, whichever is higher; == objective when proven.
  // gap: objective - lower_bound >= 0 (Q units); an upper bound on how far
  //   the plan is from the optimum.
  // relative_gap: gap / objective, a fraction (0 when objective is 0), the
  //   definition MILP solvers report (|primal - bound| / |primal|).
  // Heuristics: lower_bound and relative_gap NaN, gap NaN (not computed).
  double lower_bound = 0;
  double gap = 0;
  double relative_gap = 0;
  // Things the user should hear about the plan, one line each (no trailing
  // period), e.g. a heuristic that could not keep its promise. `snip plan`
  // prints them as "snip: warning: ...", the trainer logs them; plan_to_json
  // writes them as "warnings" when there are any.
  std::vector<std::string> warnings;

  /// item name -> option.
  std::map<std::string, std::string> assignments() const;
};

/// Per item, the option a pin forces ("" = free), after user pins and
/// stage-boundary pins; `source[i]` is the index of the user pin credited,
/// -2 for a stage-boundary pin, -1 for none. Throws UserError on unmatched,
/// conflicting or unavailable pins (see the header comment).
struct PinResolution {
  std::vector<std::string> option;  // [n_items]
  std::vector<int> source;          // [n_items]
};
PinResolution resolve_pins(const PlanProblem& problem, const PlanOptions& options);

/// Largest low-option FLOPs share any plan can reach given the pins (every
/// free item that offers the low option runs it). With `stage` >= 0, the
/// share within that stage. Fraction in [0,1]. Validates like solve().
double max_fp4_share(const PlanProblem& problem, const PlanOptions& options,
                     int stage = -1);

/// Block index of a HF layer name ("model.layers.12.mlp.up_proj" -> 12), the
/// integer after the first "layers." component; -1 when there is none.
int block_index(const std::string& layer_name);

/// Splits the blocks of `problem` into `n_stages` contiguous pipeline stages
/// as evenly as possible (the first stages get one block more) and sets
/// item.stage. Items without a block index join the stage of the item before
/// them (stage 0 if first). Throws UserError if n_stages < 1 or exceeds the
/// number of blocks.
void assign_stages(PlanProblem& problem, int n_stages);

/// Solves the ILP (see "Methods": whole model on CBC, or the MCKP method).
/// A time budget (Budget::Kind::time) is a cost budget whose per-item,
/// per-option use is t_i(p) / Σ_scope t_i(ref) (seconds over seconds): the
/// same methods, rows, dominance and ordering rows (items interchangeable
/// when their two options' seconds differ by the same amount). UserError
/// when an item lacks seconds for an offered option or the reference, a
/// time is negative or non-finite, or Σ t_i(ref) is not positive.
/// Returns a proven-optimal plan (status "optimal", gap 0), or a plan that
/// meets the budget with its stated gap: status "time_limit_feasible" when
/// a time limit stopped CBC, "feasible" when the mckp core was too large for
/// CBC (proven_optimal false). Throws UserError
/// when the budget is infeasible, e.g.
///   "budget 0.9 is infeasible: pins '*.down_proj=fp8' (22 layers, 35.7% of
///    FLOPs) cap the FP4 share at 0.643"
/// (with per-stage budgets the message names the stage), when the solver
/// finds no plan in time, on any malformed input (empty problem, FLOPs <= 0,
/// Q < 0 or non-finite, item without options, budget outside [0,1] or <= 0,
/// missing cost for an option under a cost budget, bad pins).
PlanResult solve(const PlanProblem& problem, const PlanOptions& options);

/// One point of the quality/FP4-share Pareto front.
struct ParetoPoint {
  double budget = 0;  // the share budget b that was solved
  PlanResult plan;    // its optimal plan (plan.fp4_share >= budget)
};

/// Budgets 0, 1/steps, ..., 1 (steps >= 1, else UserError).
std::vector<double> budget_steps(int steps);

/// The Pareto front of Σ Q against achieved share: a plan per budget in
/// `budgets` (each in [0,1]; the options' budget kind must be fp4_share,
/// its value is ignored), by the mckp method whatever options.method says:
/// hulls and their sorted edges are built once for all budgets, budgets are
/// solved in ascending order, and a plan proven optimal at b with share s
/// also answers every budget in (b, s] (it meets them and their plans are a
/// subset of b's), so those are not solved again. CBC's time on the cores
/// is options.core_time_limit_s for the whole sweep; points after it is
/// spent keep their rounded plans. Each point states its gap. Budgets above the maximum achievable share are
/// replaced by that maximum (solved once). Dominated points (another point
/// has objective <= and share >= , one strictly) and duplicates are removed;
/// the result is sorted by fp4_share ascending, with objective
/// non-decreasing. Throws like solve(); UserError for a cost budget.
std::vector<ParetoPoint> sweep(const PlanProblem& problem,
                               const PlanOptions& options,
                               const std::vector<double>& budgets);

// ---------------------------------------------------------------------------
// Heuristic baselines (docs/method.md section 6), at the same budget and pins.
//
// Every ordered heuristic starts with every free item at its "high" option
// (PlanOptions::high_option, see there) and switches free items that offer
// the low option to it, in the heuristic's order, until the budget holds
// (share >= b, or cost <= C; with per_stage_budget, items of stages already
// meeting it are skipped until every stage does). Pinned items keep their
// pin. An unreachable budget throws the same UserError as solve(). Results
// have status "heuristic", proven_optimal false.

/// Items by rel_err[low] ascending (ties: problem order). Throws UserError
/// naming the first item without a rel_err entry for the low option.
PlanResult heuristic_min_rel_err(const PlanProblem& problem, const PlanOptions& options);

/// Default layer-type order of heuristic_layer_type: MLP up-projections
/// first, then attention projections, down_proj last (the practice of
/// docs/method.md section 4: down_proj and v_proj are the sensitive ones).
inline const std::vector<std::string> kDefaultLayerTypeOrder = {
    "gate_proj", "up_proj", "q_proj", "k_proj", "o_proj", "v_proj", "down_proj"};

/// Items by the rank of their layer type (the last '.'-component of the
/// layer name) in `type_order`, then problem order; types not listed come
/// last.
PlanResult heuristic_layer_type(
    const PlanProblem& problem, const PlanOptions& options,
    const std::vector<std::string>& type_order = kDefaultLayerTypeOrder);

/// First and last blocks stay high: items of the inner blocks go low first
/// (problem order), then the first block, then the last block, then items
/// without a block index. With b <= the inner blocks' share this is exactly
/// "first and last blocks FP8, the rest filled in block order". When the
/// budget sends any free item of the first or last block low, the result
/// carries a warning saying how many (an item pinned low is not counted).
PlanResult heuristic_first_last_fp8(const PlanProblem& problem, const PlanOptions& options);

/// Items in a seeded random order (mt19937_64 + Fisher-Yates, identical on
/// every platform for a seed).
PlanResult heuristic_random(const PlanProblem& problem, const PlanOptions& options,
                            uint64_t seed);

/// Every free item runs `option` (pins still apply; the budget is not
/// enforced, the result reports the share reached). Throws UserError if an
/// item does not offer `option`.
PlanResult heuristic_uniform(const PlanProblem& problem, const PlanOptions& options,
                             const std::string& option);

// The rivals' rules (docs/method.md section 6, "Rivals"): no budget. Each
// keeps a set of items at their high option (as the ordered heuristics'
// fill starts) and sends every other free item that offers the low option
// low; pins apply. The FP4 share is whatever the rule reaches (the result
// reports it; PlanOptions::budget is not enforced). Status "heuristic".

/// NVIDIA's NVFP4 pretraining recipe / torchtitan's nvfp4_bf16_tail_fqns:
/// the last round(tail_fraction · L) of the L linear layers (problem order,
/// counted by layer: a layer's three GEMM items go together) stay high.
/// Throws UserError for tail_fraction outside [0, 1].
PlanResult heuristic_bf16_tail(const PlanProblem& problem, const PlanOptions& options);

/// Megatron-Core's --first-last-layers-bf16: items of the first and last
/// `first_last_n` decoder blocks (block index from "layers.<i>." in the
/// layer name) and items without a block index stay high. Throws UserError
/// for first_last_n < 0.
PlanResult heuristic_first_last_n(const PlanProblem& problem, const PlanOptions& options);

/// TransformerEngine's AutoswitchGemm rule: an item stays high when its
/// mse[low] > autoswitch_mse or underflow[low] > autoswitch_underflow
/// (TE's defaults 1e-4 and 5%), else goes low. Throws UserError naming the
/// first item without mse/underflow entries for the low option (they come
/// from a stats step: precision.policy = autoswitch in `snip train`).
PlanResult heuristic_autoswitch(const PlanProblem& problem, const PlanOptions& options);

/// Names accepted by run_heuristic: "min-rel-err", "layer-type",
/// "first-last-fp8", "random", "bf16-tail", "first-last-n", "autoswitch",
/// "uniform-<option>" (e.g. "uniform-fp8").
/// Throws UserError for any other name.
PlanResult run_heuristic(const std::string& name, const PlanProblem& problem,
                         const PlanOptions& options, uint64_t seed = 0);

}  // namespace snip::plan
