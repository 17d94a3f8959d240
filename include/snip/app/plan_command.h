// snip/app/plan_command.h: what `snip plan` does (docs/planner.md): a plan
// from a cost table or a saved stats step, a sweep, a heuristic, or a model
// planned from its shapes (--config, with Q from --stats or measured by
// --init-from). Output on stdout (a table or JSON), warnings and notes on
// stderr; the command line is src/cli/cmd_plan.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "snip/plan/gemm_times.h"

namespace snip::app {

/// The options of `snip plan` (docs/planner.md), as src/cli/cmd_plan.cpp
/// binds them: flags and values of the command line, with whether each was given.
struct PlanArgs {
  std::string costs;
  std::string stats;
  double budget = 0;
  double cost_budget = 0;
  bool has_budget = false;       // --budget given
  bool has_cost_budget = false;  // --cost-budget given
  std::vector<std::string> cost_overrides;  // OPTION=COST
  bool per_gemm = false;
  std::vector<std::string> pins;
  bool conservative = false;
  int stages = 0;
  std::string stage_boundary = "fp8";
  std::vector<std::string> allowed;
  std::string low = "fp4";
  std::string heuristic = "ilp";
  uint64_t seed = 0;
  bool do_sweep = false;
  int steps = 20;
  bool json = false;
  std::string out;
  double time_limit = 60;
  double core_time_limit = 3;
  std::string method = "auto";
  int verbose = 0;
  // --config MODEL.toml: plan a model from its shapes (run_model_plan).
  std::string config;
  std::vector<std::string> sets;  // --set section.key=value on the config
  int64_t tokens_per_step = 0;    // 0: batch_size x seq_len x grad_accum
  std::string init_from, data;    // --init-from HF_DIR --data DIR: measure Q
  int64_t stats_batch = 1;
  std::string stats_out;          // --stats-out FILE: the measured stats (with --init-from)
  bool allow_other_tokenizer = false;
  bool low_given = false;
  bool tokens_given = false, stats_batch_given = false;
  // --time-budget T with --gemm-times FILE (or the config's precision.budget_unit
  // = time and precision.gemm_times): the budget in measured GEMM seconds
  // (docs/method.md "Budget in measured time"); only with --config.
  double time_budget = 0;
  bool has_time_budget = false;
  std::string gemm_times;
  // Filled by run_model_plan for plan_table: the layers' shapes, the rows per
  // micro-batch the table was measured at, micro-batches per step.
  std::shared_ptr<const plan::GemmTimes> timed_table;  // the --gemm-times table, read and checked
  std::vector<plan::TimedLayer> timed_layers;
  int64_t timed_rows = 0;
  double timed_micro_batches = 1;
};

/// Runs `snip plan` for `a`: prints the plan table (or JSON, or the Pareto
/// front for --sweep) on stdout and writes --out atomically. Throws
/// UserError, one line, for conflicting or missing options, a bad cost table
/// or stats file, an infeasible budget (nothing written) or a failed
/// solve.
void run_plan(const PlanArgs& a);

}  // namespace snip::app
