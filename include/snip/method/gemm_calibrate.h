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
// is frozen while timing (QuantStateFreeze). calibrate_gemm_times_in_step
// times the same GEMMs inside training steps of the model instead.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

#include "snip/config/config.h"
#include "snip/model/llama.h"
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
  // How an option other than bf16 quantizes; empty (the default): the
  // recipe's quantizer (make_recipe_quantizer). Tests give a quantizer of
  // known cost.
  std::function<std::shared_ptr<const OperandQuantizer>(const std::string& option)> quantizer_for;
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

/// The whole model and micro-batch an in-step calibration trains on.
struct InStepModel {
  LlamaForCausalLM model{nullptr};  // on the run's device, its linear layers' precision as the run set it
  int64_t batch = 0, seq_len = 0;   // the micro-batch [B, T] (tokens = B x T rows per GEMM)
  uint64_t seed = 0;                // the random token ids' generator (the run's RNGs are not drawn from)
};

/// The in-step calibration (precision.calibration = in_step, the default):
/// times each GEMM inside real training steps of `m.model` instead of in
/// isolation. Per option of `o.options` (o.device and o.tokens are ignored:
/// the device is the model's, tokens B x T; o.warmup and o.repeats count
/// steps), every linear layer runs that option (a fresh recipe quantizer,
/// so the run's quantizer state is untouched; bf16: no quantizer), then
/// `o.warmup` untimed and `o.repeats` timed steps of forward and backward
/// (torch::autograd::grad: no .grad is written, no optimizer step) on
/// random token ids [B, T] drawn from `m.seed` in [0, vocab), with a
/// GemmTimer (model/gemm_timer.h) installed, each pass under a step number
/// of its own above any optimizer step (QuantKey::step 2^32 - 1 down: per-step quantizer
/// work such as an error-feedback residual runs as in training, and LoRA's
/// step-keyed dropout starts afresh at the run's first step). An entry's
/// seconds = the median over the timed steps of the mean over the layers of
/// that shape that ran the GEMM; a GEMM no layer of the shape runs (wgrad of
/// a frozen LoRA base) gets 1e-9 s. Each layer's precision and key are
/// restored (on an exception too) and the calibration's per-step
/// quantization errors are discarded. Past o.max_seconds (checked between
/// steps), the current option stops after its first timed step and the
/// remaining options get one warm-up and one timed step (a progress line
/// says so). Not covered: a LoRA run's packed frozen base (lora.pack_base)
/// is timed as the quantization of the FP32 base, not the decode of its
/// packed codes (the trainer packs it after the calibration).
/// Why: the same quantized GEMMs cost 25-55% more inside a CPU step than in
/// isolated calls (operands come from L3, not L2; docs/benchmarks.md), so
/// an isolated table under-predicts the step. Same errors as
/// calibrate_gemm_times, and UserError for batch or seq_len < 1.
plan::GemmTimes calibrate_gemm_times_in_step(const InStepModel& m, const recipes::RecipeSet& recipes,
                                             const CalibrateOptions& o);

/// The table a run plans with: the file precision.gemm_times names when
/// set, checked against the run (its "device" must be of `device`'s kind,
/// cpu or cuda, and its "gemm_dtype" the run's: UserError naming the file
/// and the field), else a fresh calibration of `options` on `device` capped
/// at precision.calibrate_seconds: in training steps of `whole` when
/// precision.calibration = in_step and `whole` is given (snip train without
/// pipeline stages), else in isolation. Entries the run needs are checked
/// when the controller applies the table (PrecisionController::set_gemm_times).
plan::GemmTimes gemm_times_for_run(const PrecisionConfig& pc, const recipes::RecipeSet& recipes,
                                   const std::vector<plan::TimedLayer>& layers,
                                   const std::vector<std::string>& options, at::ScalarType gemm_dtype,
                                   const torch::Device& device, int64_t tokens,
                                   const std::function<void(const std::string&)>& progress,
                                   const InStepModel* whole = nullptr);

/// "bf16" / "fp32" for a GEMM dtype as train.gemm_dtype names it
/// (Undefined and kFloat: "fp32").
std::string gemm_dtype_name(at::ScalarType t);

}  // namespace snip
