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
  bool calibrate = false;     ///< --calibrate: time the config's GEMMs per option (needs --config, --run)
  std::string run;            ///< --run RUN: where --calibrate writes RUN/gemm_times.json
  int repeats = 5;            ///< --repeats: timed calls per GEMM (median kept)
  double max_seconds = 120;   ///< --max-seconds: wall-clock cap of --calibrate
  std::string calibration;    ///< --calibration: in_step | isolated; "" = the config's precision.calibration
};

/// `snip doctor --calibrate --config FILE --run RUN`: the config's model
/// shapes (model.*, B·T = train.batch_size x train.seq_len rows) timed under
/// every option the run can choose (precision.options, warmup, final,
/// uniform and guard options, bf16) on train.device (method/gemm_calibrate.h):
/// inside forward and backward passes of the config's model (in_step: its
/// vocabulary model.vocab_size, or 32000 when unset; --repeats timed steps
/// per option) or GEMM by GEMM (isolated); progress lines on stderr; writes
/// RUN/gemm_times.json atomically (plan/gemm_times.h) and prints its path
/// and the BF16 vs low-option totals. Throws UserError for a bad config or
/// missing --config / --run; nothing is written then.
void run_calibrate(const DoctorOpts& o);

/// Measures and prints the report (text or JSON on stdout; progress on
/// stderr when it is a terminal). Throws UserError "<the main job> cannot run
/// here: <reasons>" when a check fails, and the config's one-line error for
/// a bad --config.
void run_doctor(const DoctorOpts& o);

}  // namespace snip::app
