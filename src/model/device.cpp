// train.device (see device.h).
#include "snip/model/device.h"

#include <mutex>

#include "snip/core/error.h"
#include "snip/formats/fake_quant_cuda.h"

namespace snip {

namespace {
std::mutex g_device_mu;
torch::Device g_device = torch::kCPU;
}  // namespace

std::string cuda_unavailable_reason() {
  if (torch::cuda::is_available()) return "";
  std::string why;
  if (formats::cuda::device_count(&why) == 0 && !why.empty()) return why;
  return "no CUDA device: LibTorch sees none (torch::cuda::device_count() = 0)";
}

DeviceChoice resolve_train_device(const std::string& option, int world_size) {
  if (option == "cpu") return {torch::kCPU, "train.device = cpu"};
  const std::string head = "train.device = " + option;
  if (option == "cuda" || option == "auto") {
    const std::string missing = cuda_unavailable_reason();
    if (option == "auto") {
      if (!missing.empty()) return {torch::kCPU, head + ": " + missing};
      if (world_size > 1)
        return {torch::kCPU, str_cat(head, ": ", world_size, " ranks train on the CPU (Gloo): NCCL data "
                                     "parallelism on CUDA is not built yet")};
    }
    if (!missing.empty()) fail("train.device = cuda: ", missing, "; use train.device = cpu (or auto)");
    if (world_size > 1)
      fail("train.device = cuda: ", world_size, " ranks: NCCL data parallelism on CUDA is not built yet; use "
           "train.device = cpu with dist.backend = gloo, or one process per run");
    return {torch::Device(torch::kCUDA, 0), str_cat(head, ": CUDA device 0 of ", torch::cuda::device_count())};
  }
  fail("train.device: expected auto, cpu or cuda, got '", option, "'");
}

void set_compute_device(const torch::Device& d) {
  std::lock_guard<std::mutex> g(g_device_mu);
  g_device = d;
}

torch::Device compute_device() {
  std::lock_guard<std::mutex> g(g_device_mu);
  return g_device;
}

}  // namespace snip
