// snip/method/gemm_calibrate.h: measures the seconds of every distinct GEMM
// of a model under each precision option on this machine, for a time budget
// (precision.budget_unit = time; the table is plan/gemm_times.h).
//
// Each GEMM runs the trainer's own path (model/linear.h linear_fprop and
// linear_backward, the arithmetic of QuantLinear): both operands
// fake-quantized by the option's recipe quantizer (or, for bf16, cast to
// train.gemm_dtype), then the GEMM in train.gemm_dtype; quantization is part
// of the time. Operands are random ([T, IN] X, [OUT, IN] W, [T, OUT] dY,
// FP32 on the device). Per (layer shape, option, GEMM): `warmup` untimed
// calls, then `repeats` timed ones (the device synchronized around each on
// CUDA); the median is kept. Quantizer state (delayed-scaling amax histories)
// is frozen while timing (QuantStateFreeze).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

#include "snip/config/config.h"
#include "snip/plan/gemm_times.h"
#include "snip/recipes/recipe.h"

namespace snip {

struct CalibrateOptions {
  std::vector<std::string> options;  // options to time; "bf16" = no quantizer (the reference)
  at::ScalarType gemm_dtype = at::kBFloat16;  // train.gemm_dtype (Undefined: the input's, FP32)
  torch::Device device = torch::kCPU;
  int64_t tokens = 0;                // T: rows of a micro-batch (batch_size x seq_len), >= 1
  int warmup = 1;                    // untimed calls per GEMM, >= 0
  int repeats = 5;                   // timed calls per GEMM, >= 1 (median kept)
  // Target wall-clock cap of the whole calibration, seconds (> 0). Once the
  // time is spent, the remaining GEMMs are still measured (a table with
  // holes is useless) but with one warm-up and one timed call each, and a
  // progress line says so.
  double max_seconds = 60.0;
  // Called with one line per layer shape ("calibrate: shape 2/5 ..."); may be empty.
  std::function<void(const std::string&)> progress;
};

/// Times every distinct (IN, OUT) of `layers` x options x {fprop, dgrad,
/// wgrad} at `o.tokens` rows (shapes: plan/gemm_times.h). `recipes` resolves
/// option names. Returns the table with device, machine (host name, threads,
/// the calibration's wall time) and gemm_dtype filled; source "calibration".
/// Throws UserError for an unknown option, tokens < 1, repeats < 1 or
/// max_seconds <= 0.
plan::GemmTimes calibrate_gemm_times(const std::vector<plan::TimedLayer>& layers,
                                     const recipes::RecipeSet& recipes, const CalibrateOptions& o);

/// The table a run plans with: the file precision.gemm_times names when
/// set, checked against the run (its "device" must be of `device`'s kind,
/// cpu or cuda, and its "gemm_dtype" the run's: UserError naming the file
/// and the field), else a fresh calibration of `options` on `device` capped
/// at precision.calibrate_seconds. Entries the run needs are checked when
/// the controller applies the table (PrecisionController::set_gemm_times).
plan::GemmTimes gemm_times_for_run(const PrecisionConfig& pc, const recipes::RecipeSet& recipes,
                                   const std::vector<plan::TimedLayer>& layers,
                                   const std::vector<std::string>& options, at::ScalarType gemm_dtype,
                                   const torch::Device& device, int64_t tokens,
                                   const std::function<void(const std::string&)>& progress);

/// "bf16" / "fp32" for a GEMM dtype as train.gemm_dtype names it
/// (Undefined and kFloat: "fp32").
std::string gemm_dtype_name(at::ScalarType t);

}  // namespace snip
