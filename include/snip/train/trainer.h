// snip/train/trainer.h: the training loop, evaluation and checkpoints.
//
// A step: B·T tokens per micro-batch, `grad_accum` micro-batches, then global
// gradient-norm clipping, AdamW (decoupled weight decay, Loshchilov & Hutter
// 2019, as torch.optim.AdamW) with linear warmup + cosine decay to
// min_lr_ratio·lr, FP32 master weights. Linear-layer GEMMs run in
// `train.gemm_dtype` (bf16 = the BF16 baseline) after the layer's quantizer,
// which the PrecisionController (method/controller.h, [precision] options)
// sets per layer at step boundaries. The step itself is train/step.h,
// checkpoints train/checkpoint.h, the optimizer train/optimizer.h.
//
// A run on disk (README.md "A run on disk"):
//   RUN/config.toml            resolved configuration (every option)
//   RUN/metrics.jsonl          one JSON object per step (a StepRecord,
//                              run/step_record.h): step, loss, lr,
//                              grad_norm, tokens_per_s, elapsed_s, fp4_share;
//                              plus val_loss, val_ppl at evaluation steps and
//                              precision, plan_step, phase, plan_status,
//                              plan_solve_seconds (rank 0), rel_err_fprop and
//                              stats_seconds (after a stats step) on the first
//                              step after a precision decision; quant_err
//                              (layer -> operand -> relative error) at every
//                              step that quantized something
//   RUN/plans/step-N.json      precision decisions, RUN/stats/step-N.json stats
//                              steps (precision.policy != bf16; controller.h)
//   RUN/checkpoints/step-N/    model.safetensors (HF names, F32), config.json,
//                              optimizer.pt (LibTorch archive of AdamW state;
//                              under ZeRO optimizer_index.json and one
//                              optimizer-rank<r>.safetensors per rank),
//                              trainer_state.json (step, tokens trained, loader position,
//                              RNG state, file checksums, and "precision": the
//                              controller's plan, smoothed stats and phase)
//   RUN/summary.json           the end-of-run summary, over the whole run
//                              (every invocation of a resumed one): steps,
//                              tokens, seconds, tokens_per_s, final/best val
//                              loss, "resumed_at" (the steps at which sessions
//                              resumed it; [] for one session); "invocation":
//                              {start_step, steps, tokens, seconds} of the
//                              last invocation alone
//   RUN/.lock                  held (flock) by the trainer writing the run
//   RUN/report.html            the run report (report/report.h), rewritten at
//                              every checkpoint and at the end
// elapsed_s (metrics, trainer_state.json) is wall time since the run's first
// step in seconds, continued across resumes.
// Every file is written atomically; a checkpoint directory appears only
// complete (written as step-N.tmp, then renamed).
// Several ranks (torchrun or Slurm, dist/world.h, docs/distributed.md): a
// step spans every rank's micro-batches (train/step.h), and rank 0 alone
// writes RUN and prints; the other ranks read a checkpoint on --resume.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "snip/config/config.h"
#include "snip/model/llama.h"
#include "snip/train/checkpoint.h"
#include "snip/train/faults.h"
#include "snip/train/optimizer.h"

namespace snip {

/// What `snip train` returns (also written to RUN/summary.json).
/// The whole run, every invocation of a resumed one included.
struct TrainSummary {
  int64_t steps = 0;              ///< optimizer steps completed
  int64_t tokens = 0;             ///< training tokens of those steps, counted as trained (a resume on
                                  ///< another number of ranks changes the tokens per step; a rollback
                                  ///< returns to its checkpoint's count): trainer_state.json "tokens"
  double seconds = 0;             ///< training wall time over every invocation, seconds
  double tokens_per_s = 0;        ///< tokens / seconds
  double final_train_loss = 0;    ///< mean loss of the last min(10, steps) steps, nats/token
  double final_val_loss = 0;      ///< validation loss at the end, nats/token
  double best_val_loss = 0;       ///< lowest validation loss of the run, nats/token
  /// With --init-from: the loaded model's validation loss before the first
  /// step, nats/token (NaN otherwise).
  double init_val_loss = std::numeric_limits<double>::quiet_NaN();
  int64_t eval_seq_len = 0;       ///< T of the validation windows, tokens
  int64_t train_loss_steps = 0;   ///< steps final_train_loss averages (the last 10, or fewer)
  int64_t invocation_steps = 0;   ///< steps run by this invocation (rolled-back steps included)
  int64_t start_step = 0;         ///< the step this invocation started from (0, or the checkpoint resumed)
  int64_t rollbacks = 0;          ///< rollbacks the guard made in this run (train/guard.h)
  int64_t skipped_steps = 0;      ///< steps whose update the guard skipped (non-finite loss or gradient)
  int64_t guard_events = 0;       ///< conditions the guard saw in this run (every action, warn included)
  double invocation_seconds = 0;  ///< wall time of this invocation, seconds
  std::string run_dir;
  /// SIGINT or SIGTERM when one stopped the run early: the step it was in was
  /// finished and checkpointed (`checkpoint`), no summary.json was written;
  /// 0 when the run reached train.max_steps (or TrainOptions::stop_after).
  int stopped_by_signal = 0;
  std::string checkpoint;         ///< the newest checkpoint this invocation wrote ("" if none)
  int rank = 0;                   ///< this process's rank (dist/world.h); only rank 0 writes in RUN
  int world_size = 1;             ///< ranks of this invocation
  /// Who started the ranks (dist::World::source): "single", "snip --nproc-per-node", "torchrun" or "slurm".
  std::string launcher = "single";
};

/// Options of one `snip train` invocation beyond the config.
struct TrainOptions {
  std::string run_dir;      ///< RUN; created if missing
  bool resume = false;      ///< continue from RUN's newest complete checkpoint
  std::string init_from;    ///< optional Hugging Face folder to initialise weights from
  bool quiet = false;       ///< no progress line, no samples (tests)
  /// The snip-data program that tokenizes the samples printed at evaluations
  /// (train.sample_tokens); "" = no samples.
  std::string snip_data;
  /// Stop after this many steps of this invocation (simulated interruption in
  /// tests; 0 = run to train.max_steps). The end-of-run checkpoint is still
  /// written only when max_steps is reached.
  int64_t stop_after = 0;
  /// --allow-other-tokenizer: resume although the data folder's tokenizer
  /// (its SHA-256) differs from the one the checkpoint was trained with.
  bool allow_other_tokenizer = false;
  /// Test-only faults (train/faults.h); none by default.
  FaultInjector faults;
};

/// Runs training. Validates the whole configuration and the data before
/// creating anything in RUN. With `resume`, continues from RUN's newest
/// checkpoint, or starts RUN from step 0 when it was stopped before its first
/// checkpoint (RUN/config.toml exists). Throws UserError for bad config,
/// missing or mismatched data (vocabulary of the shards vs model.vocab_size),
/// an unwritable RUN, RUN in use by another process, a missing/corrupt
/// checkpoint on resume, a failed metrics write (disk full), a non-finite loss.
TrainSummary train(const Config& cfg, const TrainOptions& opts);

/// LibTorch's intra-op threads: `threads` (train.threads), or every core when 0.
void set_threads(int64_t threads);

/// The GEMM dtype train.gemm_dtype names: at::kBFloat16 for "bf16", at::kFloat
/// for "fp32".
at::ScalarType gemm_dtype_of(const TrainConfig& t);

/// Readies `model` to run as a training run of `t` does, for train, the
/// correlation study and `snip plan --init-from` alike: the process's BF16
/// GEMM backend set from train.gemm_backend (model/matmul.h), every linear
/// layer unquantized with its GEMMs in train.gemm_dtype, the non-linear GEMMs
/// (attention, lm_head) in it too. Returns that dtype (gemm_dtype_of). Throws
/// UserError for a bad SNIP_BF16_GEMM (set_bf16_gemm_backend). The model
/// is moved to `device` first (train.device resolved: model/device.h); on a
/// CUDA device BF16 GEMMs run natively (cuBLAS, FP32 accumulation). The
/// attention path follows train.attention (resolve_attention_sdpa: fused
/// SDPA on CUDA by default, the explicit products on the CPU).
at::ScalarType prepare_model(LlamaForCausalLM& model, const TrainConfig& t,
                             const torch::Device& device = torch::kCPU);

/// How much of a validation shard an evaluate() call read.
struct EvalCoverage {
  uint64_t batches = 0, batches_total = 0;  ///< micro-batches read, and in the whole shard
  uint64_t windows = 0, windows_total = 0;  ///< windows of seq+1 tokens read, and in the shard
  uint64_t tokens = 0;                      ///< predicted tokens the loss averages over
};

/// Validation loss of `model` on the shard at `val_path`: mean cross-entropy
/// (nats/token) over the first `batches` micro-batches of B windows of T+1
/// tokens in shard order (0 = all windows). No gradients; quantizer state
/// (amax histories) is left as it was (QuantStateFreeze). What was read goes
/// to `coverage` when given.
double evaluate(LlamaForCausalLM& model, const std::string& val_path, int64_t batch, int64_t seq,
                int64_t batches, EvalCoverage* coverage = nullptr);

/// The first micro-batch evaluate() reads, and what the model makes of it:
/// `input_ids` [b, T] int64 (windows 0..b-1 of the shard, b = min(batch,
/// windows)) and `logits` [b, T, V] float32, from the same forward pass as
/// evaluate() (no gradients, quantizer state frozen). For checking snip's
/// numerics against another implementation (`snip eval --logits-out`, the
/// transformers tests in tests/clients). Throws UserError as evaluate().
struct EvalBatch {
  torch::Tensor input_ids;  ///< [b, T] int64
  torch::Tensor logits;     ///< [b, T, V] float32
};
EvalBatch first_eval_batch(LlamaForCausalLM& model, const std::string& val_path, int64_t batch, int64_t seq);


}  // namespace snip
