// snip/dist/grad_reducer.h: how a data-parallel step's gradients meet,
// chosen once per run from its options (the training step runs it,
// train/step.h; docs/distributed.md says what each costs):
//
//   reducer       chosen when                              what it runs
//   allreduce     no gradient format given                 allreduce_gradients: bucketed FP32 all-reduce after backward
//   overlapped    dist.overlap, an FP32 format on the      GradSync: the same buckets all-reduced from autograd
//                 all-reduce path, not ZeRO-2              hooks during the last backward
//   quantized     any other dist.grad_comm / grad_comm_path allreduce_gradients_quantized after backward (the
//                                                          shared amax needs the whole gradient first)
//   zero2         train.zero_stage = 2                      reduce_gradients_to_owners: each gradient to its owner
//
// ZeRO-1 reduces as stage 0 (every rank all-reduces; its optimizer updates
// only what it owns, dist/zero.h).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "snip/dist/data_parallel.h"
#include "snip/dist/world.h"
#include "snip/dist/zero.h"

namespace snip::dist {

/// Bytes one reduction moved, for the metrics record; -1 where not counted.
struct ReduceBytes {
  int64_t format = -1;  ///< bytes the gradient format would send per rank (GradCompressor::wire_bytes)
  int64_t sent = -1;    ///< bytes this rank handed to the collectives (GradComm::sent_bytes)
};

/// One rank's gradient reduction (header comment). Every rank of the
/// communicator calls the same methods at the same points of every step.
class GradReducer {
 public:
  virtual ~GradReducer() = default;
  /// "allreduce", "overlapped", "quantized" or "zero2".
  virtual const char* name() const = 0;
  /// Before the step's first micro-batch; `params` the trained parameters
  /// (model order), the same tensors until reduce().
  virtual void begin(const std::vector<torch::Tensor>& params) { (void)params; }
  /// Just before the step's last backward.
  virtual void before_last_backward() {}
  /// After the last backward: every rank's .grad becomes the sum over the
  /// ranks (the owner's only under ZeRO-2). `seed`, `step` key stochastic
  /// rounding of a quantized format.
  virtual ReduceBytes reduce(const std::vector<torch::Tensor>& params, uint64_t seed, int64_t step) = 0;
};

/// The reducer for these options (header comment's table). `comm`, `gc`
/// (nullptr = no format: plain FP32) and `zero` (nullptr unless
/// train.zero_stage >= 1) must outlive it.
std::unique_ptr<GradReducer> make_grad_reducer(Communicator& comm, GradComm* gc, const ZeroPartition* zero,
                                               int zero_stage, bool overlap);

}  // namespace snip::dist
