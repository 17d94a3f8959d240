// snip/train/faults.h: test-only faults that tests install in a run
// (TrainOptions::faults), to prove the guard and the ranks' weight checks
// act. The trainer never reads the environment for them; `snip train`
// (src/cli/cmd_train.cpp) builds them from SNIP_TEST_FAULT and
// SNIP_TEST_PERTURB_RANK/STEP, which the CLI tests set.
#pragma once

#include <cstdint>
#include <string>

namespace snip {

struct FaultInjector {
  /// "grad-inf@N": +Inf in the first gradient element at step N (the
  /// step's record number, 1-based); -1 = never. Fires once per process (a
  /// rollback does not re-arm it).
  int64_t grad_inf_step = -1;
  /// "lr-spike@N:F": step N's learning rate multiplied by `lr_factor`; -1 = never. Fires once.
  int64_t lr_spike_step = -1;
  double lr_factor = 1;
  /// Adds 1e-3 to the first element of the last parameter on rank
  /// `perturb_rank` after step `perturb_step` (several ranks only); -1 = never.
  int perturb_rank = -1;
  int64_t perturb_step = 1;

  /// Parses SNIP_TEST_FAULT's value: "grad-inf@N" or "lr-spike@N:F" with N a
  /// step >= 1 and F a finite factor > 0 ("" = none). Throws UserError
  /// naming the variable for anything else.
  static FaultInjector parse(const std::string& spec);
  /// SNIP_TEST_FAULT, SNIP_TEST_PERTURB_RANK and SNIP_TEST_PERTURB_STEP
  /// (default 1) from the environment.
  static FaultInjector from_env();

  bool grad_inf_fired = false, lr_spike_fired = false;
};

}  // namespace snip
