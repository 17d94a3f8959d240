// snip/dist/zero.h: ZeRO stages 1 and 2 (train.zero_stage; docs/distributed.md
// "ZeRO"), after Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward
// Training Trillion Parameter Models" (P_os = stage 1, P_os+g = stage 2), as
// DeepSpeed's stage 1/2 and PyTorch's ZeroRedundancyOptimizer do it, but with
// whole parameters as the unit of ownership.
//
// Dimensions: R = world size, P = distinct parameters (tensors; a tied
// weight once), n_p = elements of parameter p.
//
// Ownership (zero_partition): every distinct parameter belongs to exactly one
// rank, its owner, which alone holds its AdamW state (exp_avg m, exp_avg_sq
// v, step; FP32, 8·n_p bytes) and updates it. The partition depends only on
// the shapes (numel), the model order and R: parameters sorted by numel,
// largest first (ties: model order), each given to the rank with the fewest
// elements so far (ties: the lower rank) -- the greedy "longest processing
// time" rule, so max - min elements per rank <= the largest parameter.
//
// A step under ZeRO (step.h; the plain path is stage 0):
//   stage 1  gradients all-reduced as in stage 0 (allreduce_gradients, every
//            rank holds the summed gradient of every parameter); the global
//            norm from the owners' per-parameter norms (zero_clip_grad_norm);
//            each owner's AdamW updates its parameters; every parameter is
//            broadcast from its owner (broadcast_from_owners).
//   stage 2  as stage 1, but the gradients are summed to their owner only
//            (reduce_gradients_to_owners: one c10d reduce per owner of the
//            owner's parameters flattened; Gloo 1.13 has no reduce_scatter)
//            and the non-owners drop theirs (.grad undefined) after it. The
//            reduce runs after backward, not overlapped with it.
//
// Bit for bit: AdamW (LibTorch 1.13 adamw.cpp) is element-wise per parameter,
// so an owner that updates a parameter from the same reduced and clipped
// gradient with the same state produces the same bits as stage 0. At R = 2 the
// reduce and the all-reduce both add the two ranks' gradients once (IEEE
// addition commutes); zero_clip_grad_norm reproduces clip_grad_norm_'s
// arithmetic exactly (header of that function). So stages 1 and 2 equal stage
// 0 at 2 ranks bit for bit; at R > 2 the reduce may sum in another order than
// the all-reduce (Gloo's algorithms differ), a last-bit difference.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "snip/dist/world.h"

namespace snip::dist {

/// Which rank owns which parameter (header comment).
struct ZeroPartition {
  int world = 1;                        ///< R
  std::vector<std::string> names;       ///< [P] Hugging Face names, model order (distinct tensors)
  std::vector<torch::Tensor> params;    ///< [P] the tensors themselves
  std::vector<int> owner;               ///< [P] in [0, R)
  std::vector<int64_t> offset;          ///< [P] element offset of p in its owner's shard (owner's parameters in model order)
  std::vector<int64_t> elements;        ///< [R] elements owned per rank

  /// This rank's parameters (model order).
  std::vector<torch::Tensor> owned(int rank) const;
};

/// The partition of the distinct tensors of (`names`, `params`) (model order;
/// a tensor listed twice keeps its first name) over `world` ranks (header
/// comment). `world` >= 1, else std::invalid_argument.
ZeroPartition zero_partition(const std::vector<std::string>& names, const std::vector<torch::Tensor>& params,
                             int world);

/// Stage 2: sums every distinct parameter's .grad over the ranks into its
/// owner (one reduce per owner of its parameters' gradients flattened, model
/// order; an undefined .grad sends zeros), then the non-owners set their
/// .grad undefined. Collective. FP32 CPU gradients.
void reduce_gradients_to_owners(Communicator& comm, const ZeroPartition& part);

/// torch::nn::utils::clip_grad_norm_(params, max_norm) of LibTorch 1.13 for
/// the norm type 2, with each parameter's gradient on its owner only: the
/// owner computes ||g_p||_2 (FP32, Tensor::norm), the others 0; the [P]
/// vector is summed over the ranks (x + 0 = x exactly); the total is
/// norm(vector) (the kernel clip_grad_norm_ runs on torch::stack of the
/// per-parameter norms, or the one norm when P = 1); each owner multiplies its
/// gradients by clamp(max_norm / (total + 1e-6), max = 1). Returns the total
/// norm (before clipping). `comm` null = one rank (owner 0 of everything).
/// Parameters without .grad on their owner count as clip_grad_norm_ skips
/// them: the caller must give every owned parameter a gradient (the
/// reductions do). max_norm = infinity: no clipping.
double zero_clip_grad_norm(Communicator* comm, const ZeroPartition& part, double max_norm);

/// After the owners' update: every parameter's values from its owner (one
/// broadcast per owner of its parameters flattened; exact copies). Collective.
void broadcast_from_owners(Communicator& comm, const ZeroPartition& part);

// ---------------------------------------------------------------------------
// AdamW state by parameter name (checkpoints, re-sharding).

/// One parameter's AdamW state (torch::optim::AdamWParamState without amsgrad).
struct AdamEntry {
  torch::Tensor exp_avg, exp_avg_sq;  ///< [shape of p], FP32
  int64_t step = 0;                   ///< AdamW steps this parameter took, >= 1
};

/// The state `opt` holds for `param` (found by its TensorImpl, as LibTorch
/// keys it); false when it holds none (never stepped).
bool get_adam_entry(const torch::optim::AdamW& opt, const torch::Tensor& param, AdamEntry& out);
/// Sets `param`'s state in `opt` (copies of the tensors).
void set_adam_entry(torch::optim::AdamW& opt, const torch::Tensor& param, const AdamEntry& e);

/// optimizer-rank<r>.safetensors of `rank`: for each parameter it owns that
/// has state, F32 "<name>.exp_avg" and "<name>.exp_avg_sq" [shape] and I64
/// "<name>.step" [1]; metadata format "snip-optimizer-shard", rank,
/// world_size.
std::string optimizer_shard_bytes(const torch::optim::AdamW& opt, const ZeroPartition& part, int rank);
/// "optimizer-rank<r>.safetensors".
std::string optimizer_shard_name(int rank);

/// optimizer_index.json: {"format": "snip-optimizer-index", "version": 1,
/// "world_size": R, "zero_stage": s, "files": [shard names, rank order],
/// "params": {name: {"owner": r, "shape": [...], "offset": elements before it
/// in its owner's shard, "numel": n}}}.
nlohmann::json optimizer_index(const ZeroPartition& part, int zero_stage);

/// Loads into `opt` the state of every parameter of `part` that `opt` holds,
/// by name, from the checkpoint folder `dir` in the layout
/// `optimizer_index.json` + shards (re-sharding: any saved world size).
/// `crc` is trainer_state.json's "crc32" object (each file read is checked
/// against it). Checks per tensor: shape of the parameter, F32, finite,
/// exp_avg_sq >= 0, step in [1, `step`]. Throws UserError naming the file
/// for a missing or corrupt shard or index, a parameter the index does not
/// name, or a name the model lacks.
void load_optimizer_shards(const std::string& dir, const nlohmann::json& crc, torch::optim::AdamW& opt,
                           const ZeroPartition& part, int64_t step);

/// Copies by parameter the state `from` holds into `to` for every parameter
/// `to` holds (re-sharding optimizer.pt: a full AdamW loaded from it,
/// then this rank's share taken).
void copy_adam_state(const torch::optim::AdamW& from, torch::optim::AdamW& to, const ZeroPartition& part);

/// Every parameter's AdamW state on every rank, in a new AdamW holding all of
/// `part`'s parameters (groups as `make_full` makes them): each owner
/// broadcasts m, v and step of its parameters (collective). For the stats
/// step of policy snip under ZeRO, which reads m and v of every linear
/// layer's weight (method/stats.h): transient memory of 8 bytes per element.
std::unique_ptr<torch::optim::AdamW> gather_adam_state(
    Communicator& comm, const ZeroPartition& part, const torch::optim::AdamW& mine,
    const std::function<std::unique_ptr<torch::optim::AdamW>()>& make_full);

/// Bytes this rank holds now: parameters (every parameter tensor), gradients
/// (every defined .grad), optimizer state (every exp_avg, exp_avg_sq and
/// max_exp_avg_sq tensor `opt` holds), measured from the tensors (nbytes).
struct RankMemory {
  int64_t params = 0, grads = 0, optimizer = 0;
};
RankMemory rank_memory(const std::vector<torch::Tensor>& params, const torch::optim::AdamW& opt);

}  // namespace snip::dist
