// snip/train/model_session.h: a model, its optimizer and a data loader
// opened in one process for a command that measures a model instead of
// training a run: `snip correlate` (from a run's checkpoint) and `snip plan
// --init-from` (from a Hugging Face folder). It opens them with the parts
// `snip train`'s TrainSession uses (set_threads, check_memory,
// prepare_model, make_optimizer, TokenLoader, load_checkpoint_weights and
// load_checkpoint_optimizer), takes no lock and writes nothing.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "snip/config/config.h"
#include "snip/data/loader.h"
#include "snip/model/llama.h"
#include "snip/run/trainer_state.h"

namespace snip {

/// What a ModelSession holds once opened.
struct ModelSession {
  RunConfig rc;                        ///< the run's configuration (its recipes included)
  int64_t B = 0, T = 0;                ///< micro-batch: B sequences of T tokens
  int64_t accum = 1;                   ///< micro-batches per optimizer step (one process)
  LlamaForCausalLM model{nullptr};     ///< prepared (prepare_model): FP32 master weights
  at::ScalarType gemm = at::kFloat;    ///< the GEMM dtype prepare_model chose (train.gemm_dtype)
  std::unique_ptr<torch::optim::AdamW> optimizer;  ///< make_optimizer; the checkpoint's state when opened from one
  std::unique_ptr<data::TokenLoader> loader;       ///< train.bin; at the checkpoint's position when opened from one
  // ---- opened from a checkpoint ("" / nullopt otherwise)
  std::string checkpoint;                 ///< RUN/checkpoints/step-N
  nlohmann::json state;                   ///< its verified trainer_state.json
  std::optional<TrainerState> trainer_state;  ///< the same, typed
  int64_t step = 0;                       ///< optimizer steps the weights have had

  /// Back to the weights, optimizer state and loader position as opened,
  /// every layer unquantized (LinearPrecision{nullptr, gemm}): each arm of
  /// a study starts from the same point. Sessions opened from a checkpoint
  /// only: a Hugging Face folder's session keeps no copy of its weights (it
  /// would double a large model's memory); UserError there.
  void reset();

  std::vector<torch::Tensor> weights0;  ///< the weights as opened (reset; empty for a Hugging Face folder)
  data::LoaderState loader0;            ///< the loader position as opened
};

/// Opens checkpoint `checkpoint` (verified: verify_checkpoint) of a run
/// configured by `rc` for one process that runs the micro-batches of every
/// rank of the run, which is the same step bit for bit
/// (docs/distributed.md): accum = the run's micro-batches per step
/// (train.grad_accum, or dist.micro_batches under pipeline stages) x its
/// loader ranks (TrainerState::loader_ranks), the loader at the
/// checkpoint's position, the weights and the optimizer state (optimizer.pt
/// or ZeRO shards). The memory check names `what` (e.g. "snip correlate").
/// Throws UserError for a missing data.dir/train.bin, a corrupt checkpoint,
/// too little memory or a position that does not fit the data.
ModelSession open_checkpoint_session(const RunConfig& rc, const std::string& checkpoint, const std::string& what);

/// Opens the Hugging Face folder `hf_dir` (import_hf) with a fresh optimizer
/// at train.lr and a loader at the start of `train_bin`, micro-batches of
/// `batch` x train.seq_len. The memory check names `what`. Throws UserError
/// as import_hf and TokenLoader, or for too little memory.
ModelSession open_hf_session(const RunConfig& rc, const std::string& hf_dir, const std::string& train_bin,
                             int64_t batch, const std::string& what);

}  // namespace snip
