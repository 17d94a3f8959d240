// snip/train/memory.h: the memory a model and batch need, checked before any
// of it is allocated (a model allowed by the config caps but far too large
// for memory would otherwise run a long time before failing, or die in the
// allocator).
#pragma once

#include <cstdint>
#include <string>

#include "snip/model/llama.h"

namespace snip {

/// A lower bound on the memory of one training or evaluation process, in
/// bytes (double: the products overflow int64 for absurd shapes). Every term
/// is memory LibTorch certainly holds at the step's peak, all FP32 (4 bytes):
///   weights       4·P                 P = LlamaConfig::num_parameters()
///   gradients     4·P                 (training only)
///   adamw         8·P                 exp_avg and exp_avg_sq (training only)
///   activations   4·B·T·L·(3·C + 3·F + H·T) saved for backward: the inputs of
///                 the q/k/v, o, gate/up and down GEMMs and the attention
///                 probabilities [B, H, T, T] (training only)
///   logits        8·B·T·V             the logits [B·T, V] and their log-softmax
///                                     (training: their gradient instead)
/// with B the micro-batch, T the sequence length, L layers, C hidden size, F
/// intermediate size, H attention heads, V vocabulary. Several ranks on one
/// machine (training_memory's `layout`) share its memory: every term counts
/// once per local rank, but under ZeRO (dist/zero.h) a rank holds AdamW's
/// moments (stage >= 1) and the gradients (stage 2) of its own parameters
/// only, about 1/R of them, so those terms count local/R times (exact for
/// the ranks of one machine, R = local, up to the shards' balance). Temporaries, the
/// allocator's slack and the program itself come on top, so the real peak is
/// higher (a micro run measured in tests/train/test_memory.cpp).
struct MemoryEstimate {
  double weights = 0, gradients = 0, adamw = 0, activations = 0, logits = 0;  ///< bytes
  /// Sum of the terms, bytes.
  double total() const { return weights + gradients + adamw + activations + logits; }
};

/// How the ranks of a run share a machine: `ranks` R in all, `local_ranks`
/// of them on this machine, train.zero_stage in force (0, 1, 2).
struct RankLayout {
  int ranks = 1, local_ranks = 1, zero_stage = 0;
};

/// The estimate for training `cfg` on micro-batches of `batch` x `seq_len`,
/// for the ranks of this machine (one process by default).
MemoryEstimate training_memory(const LlamaConfig& cfg, int64_t batch, int64_t seq_len, const RankLayout& layout = {});

/// The estimate for evaluating (no gradients) `cfg` on `batch` x `seq_len`
/// (0 x 0: the weights alone).
MemoryEstimate inference_memory(const LlamaConfig& cfg, int64_t batch, int64_t seq_len);

/// Throws UserError "<what>: the model and batch need at least X GiB (...
/// the terms ...) but Y GiB are available (hw::available_memory_bytes);
/// lower ..." when est.total() exceeds `available_bytes`. Does nothing when
/// `available_bytes` is 0 (unknown).
void check_memory(const MemoryEstimate& est, long long available_bytes, const std::string& what);

}  // namespace snip
