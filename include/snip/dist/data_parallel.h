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
