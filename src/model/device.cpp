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

DeviceChoice resolve_train_device(const std::string& option, int world_size, int local_rank, int local_size) {
  if (option == "cpu") return {torch::kCPU, "train.device = cpu"};
  const std::string head = "train.device = " + option;
  if (option == "cuda" || option == "auto") {
    const std::string missing = cuda_unavailable_reason();
    if (!missing.empty()) {
      if (option == "auto") return {torch::kCPU, head + ": " + missing};
      fail("train.device = cuda: ", missing, "; use train.device = cpu (or auto)");
    }
    const int n = int(torch::cuda::device_count());
    if (world_size <= 1) return {torch::Device(torch::kCUDA, 0), str_cat(head, ": CUDA device 0 of ", n)};
    // Several ranks: one device per rank of this machine (LOCAL_RANK).
    SNIP_CHECK(local_size >= 1 && local_rank >= 0 && local_rank < local_size, "resolve_train_device: local rank ",
               local_rank, " of ", local_size);
    if (n < local_size) {
      const std::string why = str_cat(local_size, " ranks on this machine (LOCAL_WORLD_SIZE) but LibTorch sees ", n,
                                      " CUDA device", n == 1 ? "" : "s", " (one device per rank)");
      if (option == "auto") return {torch::kCPU, str_cat(head, ": ", why, ": the CPU")};
      fail("train.device = cuda: ", why, "; start at most ", n, " rank", n == 1 ? "" : "s",
           " per machine, or use train.device = cpu");
    }
    return {torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(local_rank)),
            str_cat(head, ": CUDA device ", local_rank, " of ", n, " (LOCAL_RANK ", local_rank, " of ", local_size,
                    ")")};
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
