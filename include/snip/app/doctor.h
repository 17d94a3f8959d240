// snip/app/doctor.h: `snip doctor`, what this machine can do for snip,
// measured (README, "Your machine"): the capability record (snip/hw/capabilities.h),
// the LibTorch build, the runtime settings (snip/hw/platform.h), the CPU
// support matrix with a measured GEMM throughput (GFLOP/s) per precision at
// the tiny model's shape, the GPU it finds measured (src/app/doctor_gpu.h:
// devices, versions, BF16 and FP8 TFLOP/s, each recipe's path) or why none
// is usable, the GPU matrix as a reference by compute capability, warnings
// with their fix, and the checks that decide whether the main job can run
// here.
#pragma once

#include <string>

namespace snip::app {

/// The options of `snip doctor`.
struct DoctorOpts {
  bool json_out = false;      ///< --json: print JSON instead of text
  double min_time = 0.5;      ///< --min-time: seconds each GEMM throughput is measured for
  std::string config;         ///< --config FILE: also check this training config
  bool config_given = false;  ///< --config was given (an empty FILE is then an error)
};

/// Measures and prints the report (text or JSON on stdout; progress on
/// stderr when it is a terminal). Throws UserError "<the main job> cannot run
/// here: <reasons>" when a check fails, and the config's one-line error for
/// a bad --config.
void run_doctor(const DoctorOpts& o);

}  // namespace snip::app
