// snip/dist/data_parallel.h: what data parallelism adds to a training step
// (docs/distributed.md): the gradient all-reduce in buckets, and the
// parameter checksums that prove every rank holds the same weights.
//
// Dimensions: R = world size, P = parameters (tensors), n_p = elements of
// parameter p.
//
// Gradients (this phase): after the backward of every micro-batch, the
// gradients are flattened into buckets walking the parameters in reverse
// order (the order backward produces them: a later overlap with backward
// keeps the same layout), the first bucket capped at 1 MiB and every other at
// 25 MiB (DDP's caps), each bucket summed over the ranks (one all-reduce per
// bucket, all in flight together) and copied back. The average needs no
// division here: the step scales each micro-batch's loss by 1/(A·R) before
// its backward (A = micro-batches per rank), as the one-process accumulation
// scales it by 1/A. Not yet overlapped with backward (autograd hooks).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "snip/dist/world.h"
#include "snip/formats/quant_spec.h"
#include "snip/formats/rounding.h"

namespace snip::dist {

/// Bucket caps, bytes (FP32 gradients).
constexpr int64_t kFirstBucketBytes = int64_t{1} << 20;
constexpr int64_t kBucketBytes = int64_t{25} << 20;

/// Bucket layout for `params` (in model order): each bucket is a list of
/// parameter indices, buckets in reverse parameter order. Buckets never
/// split a tensor (a tensor larger than the cap is a bucket alone).
std::vector<std::vector<size_t>> grad_buckets(const std::vector<torch::Tensor>& params,
                                              int64_t first_cap = kFirstBucketBytes, int64_t cap = kBucketBytes);

/// Sums every parameter's .grad over the ranks in place (header comment).
/// A parameter with no gradient gets zeros (every rank must send the same
/// layout). FP32 CPU gradients.
void allreduce_gradients(Communicator& comm, const std::vector<torch::Tensor>& params);

// ---------------------------------------------------------------------------
// Quantized gradient communication with error feedback (dist.grad_comm,
// dist.error_feedback; docs/distributed.md "Quantized gradient communication").
//
// Per parameter p (gradient g_p viewed as [rows, K]: a 2-D weight as it is,
// [out, in]; a 1-D one as [1, n]; more dims as [-1, last]) and step t, each
// rank r (error feedback: Karimireddy et al. 2019, "Error Feedback Fixes
// SignSGD", Algorithm 2):
//   v = fl(g + e)                  (FP32; e = 0 without error feedback)
//   a = MAX over ranks of max|v|   (one MAX all-reduce of [P] FP32, only when
//                                   the spec has a per-tensor scale level)
//   q = Q(v; a)                    (the recipe's fprop.w QuantSpec, decoded back
//                                   to FP32: exactly representable values)
//   e <- fl(v - q)                 (error feedback; e stays 0 without it)
// and the gradient becomes sum_r q_r through the plain FP32 all-reduce
// (allreduce_gradients). "Exact-numerics path": the decoded values travel as
// FP32, so the bytes on the wire are still 4 per element; wire_bytes() counts
// what the format WOULD send (packed codes + scales). The bandwidth-faithful
// path (all-gather of packed codes and scales, summed in rank order) is not
// built yet.
//
// Shared scale: where the spec has a per-tensor level (kTwoLevel's FP32
// tensor scale, kCurrent with a per-tensor block), every rank quantizes with
// the scale of the shared amax a, so every rank's q lies on the same grid.
// It is done with the unmodified kernel (formats::fake_quantize): v is
// quantized with one extra block row appended whose first element is a (rows
// padded with zeros to a multiple of the block rows first), so the tensor amax
// the kernel sees is a and every original block keeps its own data (zero
// padding = a partial block, quant_spec.h). Per-block-only rules (MX, 1x128
// and 128x128 tiles) have no tensor level: each rank's block scales come from
// its own data.
// ---------------------------------------------------------------------------

/// One gradient-communication format: "fp32" (no quantization: q = v) or a
/// recipe's fprop.w spec, with two changes: kDelayed (amax history) becomes
/// kCurrent with a per-tensor block (a per-step shared amax needs no history),
/// and specs with a Hadamard transform are refused (q would approximate
/// v·H, not v).
class GradCompressor {
 public:
  /// `format`: "fp32" or a recipe name (quant/recipe.h). Throws UserError
  /// "dist.grad_comm: unknown recipe 'x' (known: ...)" or "dist.grad_comm:
  /// recipe 'x' ... Hadamard transform ... not supported".
  explicit GradCompressor(const std::string& format = "fp32", bool error_feedback = true);

  bool is_fp32() const { return fp32_; }
  bool error_feedback() const { return ef_; }
  const std::string& format() const { return format_; }
  const formats::QuantSpec& spec() const { return spec_; }
  /// True when the spec has a per-tensor scale level (the amax is shared).
  bool shares_amax() const;

  /// Bytes the format would send for one [rows, cols] gradient: packed codes
  /// (formats::packed_bytes(rows·cols, element bits); 4 per element for
  /// fp32, 2 for bf16) + one scale per block (4 bytes fp32 / fp32_pow2, 1
  /// byte e8m0 / e4m3) + 4 bytes for kTwoLevel's FP32 tensor scale.
  int64_t wire_bytes(int64_t rows, int64_t cols) const;
  /// Sum of wire_bytes over `params` (each viewed as grad_matrix does; a
  /// tensor listed twice counts once).
  int64_t wire_bytes(const std::vector<torch::Tensor>& params) const;

  /// One rank's send for one gradient (header comment): `g` [rows, cols]
  /// FP32 contiguous CPU, `e` the residual of the same shape (updated in
  /// place when error feedback is on, left alone otherwise), `shared_amax`
  /// the MAX over ranks of max|g + e| (ignored unless shares_amax()), `key`
  /// for stochastic rounding. Returns q [rows, cols] FP32. For fp32, q = g + e
  /// and e stays 0.
  torch::Tensor compress(const torch::Tensor& g, torch::Tensor& e, float shared_amax,
                         const formats::RoundingKey& key) const;

 private:
  std::string format_;
  bool fp32_ = true, ef_ = true;
  formats::QuantSpec spec_;
};

/// `t` (any shape, contiguous) as the [rows, K] matrix GradCompressor
/// quantizes: dim 2 as it is, dim 1 as [1, n], dim 0 as [1, 1], more dims as
/// [-1, last].
torch::Tensor grad_matrix(const torch::Tensor& t);

/// Gradient communication state of one rank: the compressor and its
/// residuals, one FP32 tensor per distinct parameter (model order, shared
/// tensors once), shaped like the parameter; empty until the first step.
struct GradComm {
  GradCompressor compressor;
  std::vector<torch::Tensor> residuals;  ///< e per distinct parameter, [shape of p]
};

/// allreduce_gradients with quantization (header comment): replaces every
/// distinct parameter's .grad by sum over ranks of q, updating
/// `gc.residuals` (created as zeros on the first call). `seed`, `step` key
/// stochastic rounding. Returns the bytes the format would send this step
/// (gc.compressor.wire_bytes over the distinct parameters). With fp32 it is
/// allreduce_gradients exactly (bit for bit) plus the byte count.
int64_t allreduce_gradients_quantized(Communicator& comm, const std::vector<torch::Tensor>& params, GradComm& gc,
                                      uint64_t seed, int64_t step);

/// The distinct tensors of `params` in order (a tied weight listed twice is kept once).
std::vector<torch::Tensor> distinct_params(const std::vector<torch::Tensor>& params);

/// FNV-1a 64 of each tensor's bytes (contiguous copy; the dtype and shape are
/// part of the name, not the hash): [P] int64, in `params` order.
torch::Tensor param_checksums(const std::vector<torch::Tensor>& params);

/// Compares param_checksums over the ranks. Throws UserError
/// "dist: weights differ across ranks at <when>: <name> on rank r differs
/// from rank 0 (N of P tensors differ)" naming the first differing tensor in
/// `names` order and every rank that differs on it.
void check_same_weights(Communicator& comm, const std::vector<std::string>& names,
                        const std::vector<torch::Tensor>& params, const std::string& when);

}  // namespace snip::dist
