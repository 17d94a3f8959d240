// snip/dist/pipeline.h: pipeline parallelism (dist.pipeline_stages;
// docs/distributed.md "Pipeline stages"), after GPipe (Huang et al. 2019)
// and PipeDream-Flush's 1F1B schedule (Narayanan et al. 2021, "Efficient
// Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
// section 2.2.1).
//
// Dimensions: S = stages, D = data-parallel replicas, R = S·D ranks, M =
// micro-batches per step and replica, L = decoder blocks, P = parameters.
//
// Layout (Megatron-LM's order with tensor parallelism 1): world rank
// r = s·D + d for stage s and replica d. Stage s holds decoder blocks
// [bounds[s], bounds[s+1]); stage 0 also the embedding, stage S-1 the final
// norm and lm_head (a tied lm_head: stage S-1 uses embed_tokens.weight too,
// and the two stages sum its gradient). Process groups: one pipeline per
// replica d (ranks d, D+d, ..., (S-1)·D+d; group rank = stage) and one
// data-parallel group per stage s (ranks s·D .. s·D+D-1).
//
// Activations [B, T, C] cross a boundary forward (stage s -> s+1) and their
// gradients backward; with dist.boundary_comm = fp8 the activation is
// quantized to E4M3 and the gradient to E5M2 (one FP32 per-tensor scale,
// current scaling, RNE; OCP FP8 formats) before it is sent.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "snip/config/config.h"
#include "snip/dist/zero.h"
#include "snip/recipes/recipe.h"

namespace snip::dist {

/// Where every rank and every block sits (header comment).
struct PipelineLayout {
  int stages = 1;                ///< S
  int replicas = 1;              ///< D
  std::vector<int64_t> bounds;   ///< [S+1] first block of each stage, then L

  int stage_of(int rank) const { return rank / replicas; }
  int replica_of(int rank) const { return rank % replicas; }
  int rank_of(int stage, int replica) const { return stage * replicas + replica; }
  /// World ranks of replica d's pipeline, stage order: [S].
  std::vector<int> pipeline_ranks(int replica) const;
  /// World ranks of stage s's data-parallel group: [D].
  std::vector<int> replica_ranks(int stage) const;
  /// Stage of decoder block `block` (0-based).
  int stage_of_block(int64_t block) const;
  /// Stage of a parameter by its Hugging Face name: model.layers.{i}.* the
  /// block's, model.embed_tokens.weight 0, model.norm.weight and
  /// lm_head.weight S-1. Throws UserError for another name.
  int stage_of_param(const std::string& name) const;
  /// "0-2 | 3-4" (blocks per stage, inclusive).
  std::string describe() const;
};

/// The decoder block of a Hugging Face name "model.layers.{i}.…" (i), or -1
/// for a name outside the blocks.
int64_t block_of(const std::string& name);

/// `split` (dist.stage_split) for L blocks and S stages: "even" (the first
/// L mod S stages one block more, as plan::assign_stages), "balanced"
/// (balanced_split of `block_cost`, with `first_extra` and `last_extra`
/// added to the first and last stage), or S positive block counts "3,2"
/// summing to L. Returns bounds [S+1]. Throws UserError naming
/// dist.stage_split / dist.pipeline_stages (S > L, bad counts).
std::vector<int64_t> stage_bounds(const std::string& split, int64_t L, int S, const std::vector<double>& block_cost,
                                  double first_extra, double last_extra);

/// The contiguous split of blocks with costs `block_cost` [L] (seconds or
/// any unit) into S non-empty stages that minimises the largest stage cost
/// (first stage + first_extra, last + last_extra); among the optimal
/// splits, each stage from the first takes as many blocks as the optimum
/// allows (equal costs: the even split, extra blocks first).
/// Exact (dynamic programme, O(S·L²)). Returns bounds [S+1].
std::vector<int64_t> balanced_split(const std::vector<double>& block_cost, int S, double first_extra = 0,
                                    double last_extra = 0);

/// Cost of each stage under `bounds`: [S], the sums of block_cost plus the extras.
std::vector<double> stage_costs(const std::vector<int64_t>& bounds, const std::vector<double>& block_cost,
                                double first_extra, double last_extra);
/// max(stage cost) / mean(stage cost), >= 1 (1 = balanced; 1 when every cost is 0).
double imbalance(const std::vector<double>& costs);

/// Relative GEMM time of a precision option (dist.stage_cost): "bits" =
/// the fewest element bits among the option's operands / 16 (fp4 0.25, fp8
/// 0.5, bf16 1; an option with no quantizer 1), or a list
/// "name=factor,..." (factors > 0; options it does not name fall back to
/// "bits"). Recipe names are looked up in `recipes` (the run's). Throws
/// UserError naming dist.stage_cost for a malformed list.
std::map<std::string, double> stage_cost_factors(const recipes::RecipeSet& recipes, const std::string& spec,
                                                 const std::vector<std::string>& options);

/// One stage's order of work for M micro-batches: (true, m) = forward of
/// micro-batch m, (false, m) = its backward. GPipe: F0..F(M-1), B0..B(M-1).
/// 1F1B (stage s of S): min(S-s-1, M) warm-up forwards, then alternating
/// one forward and one backward, then the remaining backwards. Backwards run
/// in micro-batch order in both, so gradients accumulate in the order of a
/// one-process step with M accumulation steps.
std::vector<std::pair<bool, int>> schedule_ops(PipelineSchedule schedule, int S, int s, int M);

/// (S-1)/(M+S-1): the idle fraction of GPipe and 1F1B with equal stages and
/// a backward of twice the forward (Narayanan et al. 2021, section 2.2.1).
double ideal_bubble(int S, int M);

/// A partition whose owner of each parameter is given (pipeline stages:
/// owner[p] = the rank holding p's stage), with offsets and element counts
/// as zero_partition computes them. Distinct tensors only (a tied weight
/// once, first name). `world` >= every owner + 1.
ZeroPartition owner_partition(const std::vector<std::string>& names, const std::vector<torch::Tensor>& params,
                              const std::vector<int>& owner, int world);

/// dist.boundary_comm = fp8: `t` quantized in place to `e5m2` ? E5M2 : E4M3
/// with one FP32 per-tensor scale (current scaling: amax / max normal,
/// RNE, saturating; formats/quant_spec.h), i.e. the values the receiver
/// decodes. Returns the bytes that carry it: one per element + 4.
int64_t boundary_quantize(torch::Tensor& t, bool e5m2);

/// What travels for dist.boundary_comm = fp8: `t` (FP32, contiguous, any
/// shape, n elements) quantized as boundary_quantize does, as bytes: a
/// uint8 tensor [n + 4] = the n E4M3 (or E5M2) codes, one byte each, then
/// the 4 bytes of the FP32 decode scale, little-endian
/// (formats::quantize_packed, the reference codec).
torch::Tensor boundary_encode(const torch::Tensor& t, bool e5m2);
/// Inverse of boundary_encode into `out` (FP32, contiguous, n elements, the
/// sender's shape): bit for bit what boundary_quantize leaves in the
/// sender's tensor (fake_quant.h: the packed and fake-quantized paths agree
/// but for NaN inputs). Throws UserError when `bytes` is not n + 4 long.
void boundary_decode(const torch::Tensor& bytes, bool e5m2, torch::Tensor& out);

}  // namespace snip::dist
