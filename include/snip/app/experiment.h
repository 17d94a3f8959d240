// snip/app/experiment.h: `snip experiment`, the comparison of docs/method.md
// section 7 and docs/results.md: one model trained under several precision
// policies (the arms) with the same seed and data order, then tabulated.
//
// Each arm (or each arm x seed) is one child `snip train` in OUT/<arm>/ (or
// OUT/<arm>/seed-<s>/), its output appended to OUT/<arm>.log; its progress
// on stderr comes from the arm's own metrics.jsonl. An arm already trained
// is reused, one interrupted after a checkpoint is resumed, one trained with
// other options is refused. The results: OUT/results.{md,json,csv} (final
// validation loss, gap to the first arm, FP4 share, time, tokens/s; with
// seeds: mean, sd, paired 95% intervals) and OUT/val_loss.svg.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace snip {

/// The arms `snip experiment` trains when --arms is not given.
extern const char* const kDefaultArms;

/// What `snip experiment` was asked (src/cli/cmd_experiment.cpp).
struct ExperimentOptions {
  std::string config;                  ///< --config: TOML shared by every arm ("" with no_train)
  std::string out = "runs/experiment"; ///< --out: the experiment folder
  std::string arms = kDefaultArms;     ///< --arms: comma-separated <policy>[-gemm][-<budget>][+fprop][+time]
  bool arms_given = false;             ///< --arms was given (with no_train: else the arms found in OUT)
  std::vector<std::string> sets;       ///< --set section.key=value for every arm
  bool no_train = false;               ///< --no-train: tabulate what OUT holds
  double progress_s = 15;              ///< --progress-interval, seconds (stderr not a terminal)
  int64_t seeds = 0;                   ///< --seeds N; 0 = one run per arm
};

/// Trains the arms still to train and writes the results (header comment).
/// Throws UserError for a bad arm, a config missing, an arm folder holding
/// another arm's run, or an arm whose `snip train` failed (naming its log).
void run_experiment(const ExperimentOptions& options);

}  // namespace snip
