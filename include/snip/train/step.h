// snip/train/step.h: one optimizer step, the single definition every driver
// calls (`snip train`, the correlation study; `snip experiment` runs
// `snip train`).
//
// Dimensions (the glossary is in model/llama.h): B sequences of T tokens per
// micro-batch, `grad_accum` micro-batches per step.
//
// A step, in order (llm.c's loop: next batch, forward, zero_grad, backward,
// update):
//   1. lr set on every parameter group; the model's stochastic-rounding key
//      set to (seed, step);
//   2. gradients zeroed;
//   3. per micro-batch: next batch from the loader; on the first one, the
//      precision controller's step-boundary hook (a stats step and a re-plan
//      when due, method/controller.h); forward, loss, backward of
//      loss / (grad_accum·R) (gradients accumulate);
//   3b. R > 1 data-parallel ranks (`comm`): gradients summed over the ranks
//      by the run's `reducer` (dist/grad_reducer.h: FP32 buckets, started
//      from autograd hooks during the last micro-batch's backward when
//      overlapped, or a quantized format, or ZeRO-2's reduce to owners), the
//      loss sum too (float64);
//   4. the mean loss must be finite (else UserError "training diverged"),
//      unless `skip_nonfinite` (the guard, train/guard.h);
//   5. global gradient L2 norm computed and clipped to grad_clip (times
//      clip_low_precision while a layer runs below FP8)
//      (torch::nn::utils::clip_grad_norm_);
//   6. optimizer update (AdamW, train/optimizer.h) -- skipped with
//      `skip_nonfinite` when the loss or the norm is not finite (the step's
//      result says `skipped`; weights and AdamW state are untouched, so no
//      non-finite value reaches them or a checkpoint).
//   ZeRO (`zero` set, dist/zero.h): 2. zeroes every gradient of the model
//   (the optimizer holds only this rank's share); 3b. stage 2 sums each
//   gradient to its owner only; 5. the norm from the owners' per-parameter
//   norms, the same bits as clip_grad_norm_; 6. each owner updates its
//   parameters, then every parameter is broadcast from its owner.
//
// Data parallel (R ranks, `comm` set): the step's R·grad_accum micro-batches
// are the ones a one-process run with grad_accum·R reads, in the same loader
// order; micro-batch j = m·R + r of the step is rank r's m-th (every rank's
// loader walks the whole sequence and keeps its own, so the loader position
// is the same on every rank and equals the one-process run's). With R = 2
// and grad_accum = 1 the step is bit for bit the one-process step with
// grad_accum = 2: each rank's gradient is 0 + g_r/2, the one-process
// accumulation is (0 + g_0/2) + g_1/2, and the all-reduce of two ranks adds
// the two once (IEEE addition commutes). docs/distributed.md says when else
// it is exact.
#pragma once

#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "snip/data/loader.h"
#include "snip/dist/world.h"
#include "snip/method/controller.h"
#include "snip/model/llama.h"

namespace snip::dist {
class GradReducer;     // snip/dist/grad_reducer.h
struct ZeroPartition;  // snip/dist/zero.h
}

namespace snip {

/// Token ids [B*T] (int32, row-major) -> [B, T] int64 tensor (a copy) on
/// compute_device() (train.device; model/device.h).
torch::Tensor to_ids(const std::vector<int32_t>& ids, int64_t B, int64_t T);

/// What one step reads and changes. References, not owners.
struct StepContext {
  LlamaForCausalLM& model;
  torch::optim::AdamW& optimizer;
  data::TokenLoader& loader;       ///< yields this rank's [B, T] batches
  int64_t B = 0, T = 0;            ///< micro-batch shape: sequences, tokens per sequence
  int64_t grad_accum = 1;          ///< micro-batches per step, >= 1
  double grad_clip = 0;            ///< max global gradient L2 norm; 0 = no clipping
  uint64_t seed = 0;               ///< run seed (stochastic-rounding keys)
  PrecisionController* controller = nullptr;  ///< adaptive precision; nullptr or inactive = none
  dist::Communicator* comm = nullptr;  ///< data-parallel ranks; nullptr = one process
  /// How the ranks' gradients meet (with comm; dist/grad_reducer.h): chosen
  /// once per run (make_grad_reducer), run at every step. Required with comm.
  dist::GradReducer* reducer = nullptr;
  /// ZeRO (train.zero_stage >= 1, dist/zero.h): who owns which parameter;
  /// `optimizer` then holds this rank's parameters only. nullptr = stage 0.
  const dist::ZeroPartition* zero = nullptr;
  /// The guard is on (guard.enabled): a non-finite loss or gradient norm
  /// skips the update instead of throwing.
  bool skip_nonfinite = false;
  /// train.clip_low_precision: grad_clip is multiplied by this while the
  /// controller runs some layer below FP8 (PrecisionController::layers_below_fp8).
  double clip_low_precision = 1.0;
  /// Called after the controller's step-boundary hook (LoRA: the frozen base
  /// re-packed for the precisions now in force, model/lora.h FrozenBase::sync).
  std::function<void()> after_boundary = nullptr;
  /// Test-only fault injection (tests of the guard): called with `step` after
  /// the gradients are reduced, before their norm. nullptr = none.
  std::function<void(int64_t)> fault = nullptr;
};

/// What one step produced.
struct StepResult {
  double loss = 0;       ///< mean training loss over the micro-batches (of every rank), nats/token
  double grad_norm = 0;  ///< global gradient L2 norm before clipping (of the reduced gradient)
  PrecisionEvent precision;  ///< the controller's decision at this step's boundary (if any)
  int64_t grad_comm_bytes = -1;  ///< bytes the gradient format would send per rank (dist.grad_comm); -1 = one process
  int64_t grad_comm_sent_bytes = -1;  ///< bytes this rank handed to the gradient collectives (GradComm::sent_bytes); -1 = one process
  double grad_clip = 0;  ///< the clipping threshold this step used (grad_clip, x clip_low_precision below FP8)
  bool skipped = false;
  /// The stats step at this step's boundary met non-finite statistics (its
  /// message; skip_nonfinite only): nothing of the step ran, loss and
  /// grad_norm are NaN. "" otherwise.
  std::string nonfinite_stats;  ///< the update was skipped: loss or gradient norm not finite (skip_nonfinite)
  double comm_s = -1;  ///< seconds blocked in collectives from the last backward to the summed gradient (exposed communication); -1 = one process
  /// Pipeline stages (train/pipeline_step.h): the fraction of the schedule's
  /// wall time the stages spent waiting for a neighbour's activation or
  /// gradient, mean over ranks (the measured bubble); -1 = no pipeline.
  double pipe_bubble = -1;
  /// Pipeline stages: bytes that crossed stage boundaries this step, summed
  /// over ranks (activations and their gradients, in dist.boundary_comm's
  /// format: 4 per element for fp32, 1 per element + 4 per message for fp8); -1 = no pipeline.
  int64_t boundary_bytes = -1;
  /// The per-step quantization error (docs/operations.md "Per-step
  /// quantization error"): per linear layer (LlamaForCausalLMImpl::
  /// linear_layers order) and operand, the ErrorNorms of the step's
  /// training passes, summed over micro-batches and ranks (every rank holds
  /// the same sums); calls = 0 where the operand was not quantized. Empty
  /// when the step did not run (non-finite statistics).
  std::vector<std::array<formats::ErrorNorms, kNumOperands>> operand_errors;
};

/// Drops what the layers' OperandErrors hold (the boundary's stats passes,
/// an evaluation): the step's training passes start from zero.
void clear_operand_errors(const std::vector<QuantLinear>& layers);
/// Takes every layer's OperandErrors as [L][6][3] doubles (err, ref, calls),
/// flattened, for one all-reduce with the step's other sums.
std::vector<double> take_operand_errors(const std::vector<QuantLinear>& layers);
/// r.operand_errors as the metrics record's "quant_err" (StepRecord::
/// quant_err): layer name (from `layers`, the same order) -> operand name ->
/// relative error to 4 significant digits (a 7B model's 224 layers x 6
/// operands stay ~20 KB a line), operands with calls > 0 only; nullopt when
/// nothing was quantized (or the step did not run). The guard judges the
/// unrounded values.
std::optional<std::map<std::string, std::map<std::string, double>>> quant_error_record(
    const std::vector<QuantLinear>& layers, const StepResult& r);
/// Inverse of take_operand_errors' layout: L layers' [6][3] doubles at `v`.
std::vector<std::array<formats::ErrorNorms, kNumOperands>> operand_errors_from(const double* v, size_t layers);

/// The part of a step between the summed gradients and their norm, shared by
/// train_step and pipeline_step: throws UserError "training diverged" for a
/// non-finite r.loss (unless ctx.skip_nonfinite), runs ctx.fault, and sets
/// r.grad_clip (ctx.grad_clip, x clip_low_precision while a layer runs below
/// FP8). Returns the clipping threshold to use: r.grad_clip, or infinity
/// when it is 0 (no clipping).
double check_loss_and_clip_threshold(StepContext& ctx, StepResult& r, int64_t step);

/// Runs optimizer step `step` (0-based: the number of steps completed before
/// it) at learning rate `lr`. Throws UserError when the loss is not finite
/// and !skip_nonfinite (nothing is updated then), or when the controller's
/// re-plan fails.
StepResult train_step(StepContext& ctx, int64_t step, double lr);

}  // namespace snip
