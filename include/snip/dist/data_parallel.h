// snip/dist/data_parallel.h: what data parallelism adds to a training step
// (docs/distributed.md): the gradient all-reduce in buckets, and the
// parameter checksums that prove every rank holds the same weights.
//
// Dimensions: R = world size, P = parameters (tensors), n_p = elements of
// parameter p.
//
// Gradients: flattened into buckets walking the parameters in reverse order
// (the order backward produces them), the first bucket capped at 1 MiB and
// every other at 25 MiB (DDP's caps), each bucket summed over the ranks (one
// all-reduce per bucket) and copied back. The average needs no division
// here: the step scales each micro-batch's loss by 1/(A·R) before its
// backward (A = micro-batches per rank), as the one-process accumulation
// scales it by 1/A. Overlap with backward (GradSync, dist.overlap): during
// the backward of the last micro-batch, a post hook on each parameter's
// gradient accumulator marks it final, and a bucket's all-reduce starts as
// soon as all its parameters are final and every earlier bucket has started
// (DDP's Reducer, which LibTorch does not ship, does the same); the rest
// start after backward. The buckets and their sums are the same either way:
// bit for bit the same gradients.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "snip/dist/world.h"
#include "snip/formats/quant_spec.h"
#include "snip/formats/rounding.h"
#include "snip/recipes/recipe.h"

namespace torch::autograd {
struct Node;
}

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
/// layout). FP32 CPU gradients. Equal to GradSync without arm().
void allreduce_gradients(Communicator& comm, const std::vector<torch::Tensor>& params);

/// The bucketed FP32 all-reduce of allreduce_gradients, started from
/// autograd hooks while backward runs (header comment). Use:
///   GradSync s(comm, params);   // layout: grad_buckets(distinct_params(params))
///   s.arm();                    // just before the last micro-batch's backward
///   loss.backward();            // full buckets start, in bucket order
///   s.finish();                 // the others start; waits; .grad = the sums
/// A parameter whose hook never runs (no gradient this step, or
/// requires_grad false) holds its bucket and every later one until
/// finish(), which gives a missing .grad zeros (as allreduce_gradients).
/// Every rank must arm the same parameters and run the same backward graph.
/// The destructor removes the hooks (an exception mid-backward leaves none).
/// Hooks run on the autograd engine's thread: CPU backward only (the engine
/// runs it on the calling thread).
class GradSync {
 public:
  GradSync(Communicator& comm, const std::vector<torch::Tensor>& params);
  ~GradSync();
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;
  /// Registers one post hook on each distinct parameter's gradient accumulator.
  void arm();
  /// Removes the hooks, starts the buckets not started yet (in order), waits
  /// for every bucket and copies the sums into .grad.
  void finish();
  /// Called by the hooks: parameter k (distinct_params order) is final.
  void ready(size_t k);
  /// Buckets started from hooks during backward (the rest started in finish()).
  size_t launched_in_backward() const { return launched_in_backward_; }
  size_t buckets() const { return buckets_.size(); }

 private:
  void launch(size_t b);
  void disarm();
  Communicator& comm_;
  std::vector<torch::Tensor> params_;           // distinct, model order
  std::vector<std::vector<size_t>> buckets_;    // grad_buckets(params_)
  std::vector<size_t> bucket_of_, waiting_;     // [P] bucket of each; [buckets] parameters not yet final
  std::vector<torch::Tensor> flat_;             // [buckets] the flattened gradients in flight
  std::vector<std::unique_ptr<Pending>> work_;  // [buckets]
  std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, uintptr_t>> hooks_;
  size_t next_ = 0, launched_in_backward_ = 0;  // first bucket not started
};

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
// (allreduce_gradients): the "exact-numerics path", where the decoded values
// travel as FP32 (4 bytes per element on the wire; wire_bytes() counts what
// the format sends). The bandwidth-faithful path (GradComm::allgather) sends
// exactly wire_bytes(): packed codes and scales, all-gathered, decoded and
// summed in rank order on every rank.
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
  /// "fp32": the plain FP32 all-reduce.
  GradCompressor() : GradCompressor(recipes::RecipeSet(), "fp32") {}
  /// `format`: "fp32" or the name of a recipe of `recipes` (the run's,
  /// RunConfig::recipes). Throws UserError "dist.grad_comm: unknown recipe
  /// 'x' (known: ...)" or "dist.grad_comm: recipe 'x' ... Hadamard transform
  /// ... not supported".
  GradCompressor(const recipes::RecipeSet& recipes, const std::string& format, bool error_feedback = true);

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
  /// FP32 contiguous, on the CPU or a CUDA device (dist.backend = nccl: the
  /// CUDA kernels of formats/fake_quant_cuda.h where they cover the spec,
  /// else the host codec through copies; the same bits either way), `e` the
  /// residual of the same shape and device (updated in
  /// place when error feedback is on, left alone otherwise), `shared_amax`
  /// the MAX over ranks of max|g + e| (ignored unless shares_amax()), `key`
  /// for stochastic rounding. Returns q [rows, cols] FP32. For fp32, q = g + e
  /// and e stays 0.
  torch::Tensor compress(const torch::Tensor& g, torch::Tensor& e, float shared_amax,
                         const formats::RoundingKey& key) const;

  /// compress() for the allgather path (dist.grad_comm_path = allgather):
  /// the same update of `e` (a CUDA `g` and `e` are copied to the host
  /// codec and back), returns q on g's device, and writes the bytes (host
  /// memory) that carry q to
  /// `out` (wire_bytes(rows, cols) bytes, checked): the element codes of q
  /// packed (formats::quantize_packed / pack_codes: two E2M1 codes per byte,
  /// low nibble first; one byte per 8-bit code; two per BF16, little-endian;
  /// an odd E2M1 count leaves the last high nibble 0), then one code per
  /// scale block in row-major block order (1 byte for E8M0 / E4M3, else the
  /// 4 FP32 bytes of the decode scale, little-endian), then for kTwoLevel the
  /// 4 bytes of the FP32 tensor decode scale. fp32: the 4 bytes of every
  /// element of q = v. q is dequantize(quantize_packed(...)), equal bit for
  /// bit to compress()'s q (fake_quant.h: the two paths agree but for NaN
  /// inputs, which have no code).
  torch::Tensor compress_packed(const torch::Tensor& g, torch::Tensor& e, float shared_amax,
                                const formats::RoundingKey& key, uint8_t* out) const;
  /// Inverse of compress_packed's bytes: `in` (wire_bytes(rows, cols) bytes)
  /// -> out [rows, cols] FP32, the sender's q bit for bit (formats::dequantize
  /// with the block scales rebuilt from their codes as formats/scale.cpp
  /// derives them).
  void decode_packed(const uint8_t* in, int64_t rows, int64_t cols, float* out) const;

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
  bool allgather = false;  ///< dist.grad_comm_path = allgather: packed bytes all-gathered, summed in rank order
  int64_t sent_bytes = 0;  ///< last step: bytes this rank handed to collectives (header comment of allreduce_gradients_quantized)
};

/// allreduce_gradients with quantization (header comment): replaces every
/// distinct parameter's .grad by sum over ranks of q, updating
/// `gc.residuals` (created as zeros on the first call). `seed`, `step` key
/// stochastic rounding. Returns the bytes the format would send this step
/// (gc.compressor.wire_bytes over the distinct parameters). Two paths:
///   allreduce (gc.allgather false): q decoded to FP32 and summed by
///     allreduce_gradients (with fp32 it is allreduce_gradients exactly, bit
///     for bit). gc.sent_bytes = 4 per element (+ 4·P for the amax).
///   allgather: every rank's compress_packed bytes of every parameter, in
///     model order, concatenated into one uint8 tensor, one all-gather; each
///     rank decodes every rank's part and sums q_0 + q_1 + ... + q_{R-1} in
///     that order (FP32, left to right: the same bits on every rank; for R = 2
///     equal to the allreduce path). gc.sent_bytes = the returned bytes (the
///     all-gather input, checked) + 4·P for the amax.
/// The [P] FP32 MAX all-reduce of the shared amax (shares_amax()) precedes both.
int64_t allreduce_gradients_quantized(Communicator& comm, const std::vector<torch::Tensor>& params, GradComm& gc,
                                      uint64_t seed, int64_t step);

/// 4 x the elements of the distinct tensors of `params`: the bytes of their FP32 gradients.
int64_t fp32_bytes(const std::vector<torch::Tensor>& params);

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
