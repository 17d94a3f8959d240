// snip/model/device.h: where training runs (train.device = auto|cpu|cuda).
//
// One device per process: the model's parameters, the optimizer state and
// every batch live on it; the quantizer hooks (model/quantizers.h) run the
// CUDA kernels (formats/fake_quant_cuda.h) on CUDA tensors and the CPU codec
// on host tensors, with the same bits. Control values (loss sums, step
// records, collectives' scalars) stay on the host.
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

/// Resolves train.device ("auto", "cpu" or "cuda") for a process of a world
/// of `world_size` ranks: auto = CUDA device 0 when LibTorch sees one and
/// the world is one process, else the CPU (the line says which and why);
/// cpu = the CPU; cuda = CUDA device 0. Throws snip::UserError naming
/// train.device for cuda without a device (with cuda_unavailable_reason), for
/// cuda with several ranks (NCCL data parallelism is not built yet: use
/// train.device = cpu with dist.backend = gloo), and for another word.
DeviceChoice resolve_train_device(const std::string& option, int world_size);

/// The device batches are made on (to_ids in train/step.h): set once by the
/// trainer (set_compute_device), the CPU until then.
void set_compute_device(const torch::Device& d);
torch::Device compute_device();

}  // namespace snip
