// src/plan/milp.h: the one small interface the planner talks to a mixed
// integer linear program solver through (docs/method.md section 4: "solve with a
// real MILP solver ... keep the solver behind one small interface").
//
// A MilpModel is a plain value: binary variables x_j in {0,1}, a linear
// objective to MINIMISE, and linear row constraints lo <= Σ_j a_j x_j <= hi.
// Only binary variables exist because the planner needs nothing else
// (x_{l,p} = 1 iff item l runs option p).
//
// The implementation behind make_milp_solver("cbc") is COIN-OR CBC 2.10
// (CbcModel + OsiClpSolverInterface with knapsack-cover, Gomory, clique and
// MIR cuts and rounding/local-search heuristics; src/plan/milp_cbc.cpp says
// why not CBC's stock driver). CBC headers never appear in public headers.
// Optimality is up to CBC's tolerances: cutoff increment 1e-9 and absolute
// gap 1e-10 in objective units, so scale the objective to max |c_j| ~ 1.
#pragma once

#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace snip::plan {

/// One linear constraint lo <= Σ_k coef[k] * x[index[k]] <= hi.
/// `index` and `coef` have equal length; use ±infinity for a one-sided row.
struct MilpRow {
  std::vector<int> index;     // [nnz] variable indices, each in [0, num_vars)
  std::vector<double> coef;   // [nnz] coefficients (any finite value)
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
};

/// A binary MILP: minimise Σ_j objective[j] * x_j subject to every row.
struct MilpModel {
  std::vector<double> objective;  // [num_vars] cost of x_j = 1 (finite)
  std::vector<MilpRow> rows;      // [num_rows]

  /// Adds a binary variable with objective coefficient c; returns its index.
  int add_binary(double c) {
    objective.push_back(c);
    return static_cast<int>(objective.size()) - 1;
  }
  /// Adds a row lo <= Σ coef·x[index] <= hi.
  void add_row(std::vector<int> index, std::vector<double> coef, double lo,
               double hi) {
    rows.push_back(MilpRow{std::move(index), std::move(coef), lo, hi});
  }
  int num_vars() const { return static_cast<int>(objective.size()); }
};

/// Outcome of a solve.
///  optimal                 proven optimal (within the solver's tolerances)
///  infeasible              proven that no 0/1 assignment satisfies the rows
///  time_limit_feasible     time limit hit; x is the best solution found
///  time_limit_no_solution  time limit hit before any feasible solution
///  error                   the solver failed (message says why)
enum class MilpStatus {
  optimal,
  infeasible,
  time_limit_feasible,
  time_limit_no_solution,
  error
};

/// "optimal", "infeasible", "time_limit_feasible", "time_limit_no_solution",
/// "error".
const char* to_string(MilpStatus s);

struct MilpSolveOptions {
  double time_limit_s = 60.0;  // wall-clock seconds, > 0
  int verbosity = 0;           // 0 silent; 1 solver summary; >=2 solver log
  // Feasibility tolerance on every row's activity, in the row's own units
  // (absolute). The planner writes its rows in fractions of total FLOPs, so
  // 1e-9 means "share met to within 1e-9".
  double feasibility_tolerance = 1e-9;
};

struct MilpSolution {
  MilpStatus status = MilpStatus::error;
  std::vector<int> x;        // [num_vars] 0/1 when status is optimal or
                             // time_limit_feasible; empty otherwise
  double objective = 0.0;    // Σ objective[j]·x[j] of x (recomputed exactly)
  // Proven lower bound on the optimum (objective units): == objective when
  // optimal; the solver's best bound (CbcModel::getBestPossibleObjValue) at
  // a time limit; -infinity when the solver gives none.
  double bound = -std::numeric_limits<double>::infinity();
  double seconds = 0.0;      // wall-clock seconds spent in the solver
  std::string message;       // solver's words on error; empty otherwise
};

/// Abstract MILP solver. Implementations are stateless between solve() calls.
class MilpSolver {
 public:
  virtual ~MilpSolver() = default;
  /// Short solver name, e.g. "cbc".
  virtual std::string name() const = 0;
  /// Solves `model`. Never throws for infeasible or timed-out models (see
  /// status); throws std::logic_error for malformed models (index out of
  /// range, index/coef length mismatch, non-finite coefficient).
  virtual MilpSolution solve(const MilpModel& model,
                             const MilpSolveOptions& options) = 0;
};

/// Returns the solver registered under `name` ("cbc" is the only one today).
/// Throws snip::UserError for an unknown name.
std::unique_ptr<MilpSolver> make_milp_solver(const std::string& name = "cbc");

}  // namespace snip::plan
