// src/train/pipeline_step.h: one optimizer step under pipeline stages
// (dist.pipeline_stages > 1; dist/pipeline.h has the layout and schedules,
// docs/distributed.md "Pipeline stages" the whole story).
//
// Dimensions: S stages, D data-parallel replicas, M micro-batches per step
// and replica of B sequences of T tokens, C hidden size.
//
// A step on the rank of stage s, replica d (train_step's order, step.h):
//   1. lr set, stochastic-rounding key (seed, step), the stage's gradients zeroed;
//   2. the step's M·D micro-batches read from the loader (micro-batch
//      m·D + d is this replica's m-th, as data parallelism reads them), so
//      every rank's loader stands where a one-process step leaves it;
//   3. the controller's step boundary (stats step and plan, when due) on
//      micro-batch 0: its passes run forward and backward through all stages
//      (PrecisionController::set_stats_pass);
//   4. the schedule (dist.pipeline_schedule): forward F(m) = the stage's
//      blocks on the previous stage's activation [B, T, C] (stage 0: on the
//      ids), sent on to stage s+1, or on the last stage the loss; backward
//      B(m) = backward of loss/(M·D) (last stage) or of the activation with
//      the gradient [B, T, C] stage s+1 sent back, then the gradient of this
//      stage's input sent to stage s-1. Sends never block (they are waited
//      for at the end), receives do;
//   5. a tied lm_head: stages 0 and S-1 sum embed_tokens.weight's gradient
//      (all-reduce over the pipeline); D > 1: the stage's gradients summed
//      over its data-parallel group (dist::allreduce_gradients);
//   6. the loss summed over the world (the last stages' sums), the global
//      gradient norm from each stage's per-parameter norms (the arithmetic
//      of clip_grad_norm_, as dist::zero_clip_grad_norm) and clipping;
//   7. each stage's AdamW updates its parameters (skipped, as train_step,
//      for a non-finite loss or norm under the guard).
// With one replica, untied embeddings and dist.boundary_comm = fp32 the
// step is bit for bit the one-process step with grad_accum = M: every
// stage runs the same operations on the same values, the gradients
// accumulate in micro-batch order, and the norm is built from the same [P]
// per-parameter norms.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "snip/dist/pipeline.h"
#include "snip/train/step.h"

namespace snip {

/// One rank's place in the pipeline and its communicators. References, not owners.
struct PipelineContext {
  dist::PipelineLayout layout;
  int stage = 0, replica = 0;          ///< this rank's
  PipelineSchedule schedule = PipelineSchedule::k1F1B;  ///< dist.pipeline_schedule
  int64_t micro_batches = 1;           ///< M
  bool fp8_boundary = false;           ///< dist.boundary_comm = fp8
  dist::Communicator* pipe = nullptr;  ///< this replica's pipeline: group rank = stage
  dist::Communicator* dp = nullptr;    ///< this stage's data-parallel group; nullptr when D = 1
  dist::Communicator* world = nullptr; ///< every rank
  /// Every distinct parameter, owner = the stage that updates it (group
  /// ranks of `pipe`): the norm's [P] vector (model order).
  dist::ZeroPartition norm_part;
  /// The parameters this stage updates (its optimizer's), model order; a
  /// tied embed_tokens.weight on the first and the last stage.
  std::vector<torch::Tensor> stage_params;
  bool tied = false;  ///< lm_head is tied to embed_tokens and S > 1
};

/// Runs optimizer step `step` at learning rate `lr` under pipeline stages
/// (header comment). `ctx.optimizer` holds p.stage_params; ctx.grad_accum
/// is ignored (M = p.micro_batches); ctx.comm, grad_comm and zero must be
/// unset. Collective over the world. Throws UserError like train_step, and
/// when a neighbour stage stops (dist.timeout_s, or at once when its
/// process is gone), naming the rank.
StepResult pipeline_step(StepContext& ctx, PipelineContext& p, int64_t step, double lr);

}  // namespace snip
