// snip/model/device.h: where training runs (train.device = auto|cpu|cuda).
//
// One device per process: the model's parameters, the optimizer state and
// every batch live on it; the quantizer hooks (model/quantizers.h) run the
// CUDA kernels (formats/fake_quant_cuda.h) on CUDA tensors and the CPU codec
// on host tensors, with the same bits. Control values (loss sums, step
// records, collectives' scalars) live on the host; under dist.backend = nccl
// a collective copies them to the device and back (dist/world.h).
#pragma once

#include <torch/torch.h>

#include <string>

namespace snip {

/// A resolved train.device: the device and one line saying why.
struct DeviceChoice {
  torch::Device device = torch::kCPU;
  std::string reason;  ///< e.g. "train.device = auto: CUDA device 0 of 1" or "auto: no CUDA device (...)"
};

/// Why LibTorch sees no CUDA device here, in one line ("" when it sees
/// one): "no CUDA device: <the driver's or runtime's reason>" as
/// formats::cuda::device_count words it, else LibTorch's count.
std::string cuda_unavailable_reason();

/// Resolves train.device ("auto", "cpu" or "cuda") for a process that is
/// rank `local_rank` of the `local_size` ranks on its machine (LOCAL_RANK,
/// LOCAL_WORLD_SIZE; dist/world.h World) in a world of `world_size` ranks:
///   auto  one process: CUDA device 0 when LibTorch sees one, else the CPU;
///         several ranks: CUDA device `local_rank` when LibTorch sees at
///         least `local_size` devices (one per local rank); CUDA device 0
///         when it sees exactly one (each rank bound to its own GPU:
///         Slurm's --gpus-per-task=1, CUDA_VISIBLE_DEVICES per rank; ranks
///         that truly share one GPU are refused by NCCL); else the CPU; the
///         reason line says which and why.
///   cpu   the CPU.
///   cuda  as auto, but refused where auto picks the CPU.
/// Throws snip::UserError naming train.device for cuda without a device
/// (with cuda_unavailable_reason), for cuda with more than one but fewer
/// devices than `local_size`, and for another word. Which c10d backend goes with the
/// device (nccl on CUDA, gloo on the CPU) is dist::place_rank's
/// (dist/world.h), which calls this.
DeviceChoice resolve_train_device(const std::string& option, int world_size, int local_rank, int local_size);

/// resolve_train_device's decision for a machine where LibTorch sees `n`
/// CUDA devices (`missing`: cuda_unavailable_reason(), the words for n = 0).
DeviceChoice resolve_train_device_for(const std::string& option, int world_size, int local_rank, int local_size,
                                      int n, const std::string& missing);

/// The device batches are made on (to_ids in train/step.h): set once by the
/// trainer (set_compute_device), the CPU until then.
void set_compute_device(const torch::Device& d);
torch::Device compute_device();

}  // namespace snip
