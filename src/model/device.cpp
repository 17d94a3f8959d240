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
  if (option != "cuda" && option != "auto") return resolve_train_device_for(option, world_size, local_rank, local_size, 0, "");
  const std::string missing = cuda_unavailable_reason();
  return resolve_train_device_for(option, world_size, local_rank, local_size,
                                  missing.empty() ? int(torch::cuda::device_count()) : 0, missing);
}

DeviceChoice resolve_train_device_for(const std::string& option, int world_size, int local_rank, int local_size,
                                      int n, const std::string& missing) {
  if (option == "cpu") return {torch::kCPU, "train.device = cpu"};
  const std::string head = "train.device = " + option;
  if (option == "cuda" || option == "auto") {
    if (n <= 0) {
      const std::string why = missing.empty() ? "no CUDA device" : missing;
      if (option == "auto") return {torch::kCPU, head + ": " + why};
      fail("train.device = cuda: ", why, "; use train.device = cpu (or auto)");
    }
    if (world_size <= 1) return {torch::Device(torch::kCUDA, 0), str_cat(head, ": CUDA device 0 of ", n)};
    // Several ranks: one device per rank of this machine (LOCAL_RANK).
    SNIP_CHECK(local_size >= 1 && local_rank >= 0 && local_rank < local_size, "resolve_train_device: local rank ",
               local_rank, " of ", local_size);
    // Each rank sees one device (Slurm's --gpus-per-task=1, or CUDA_VISIBLE_DEVICES set per rank): its own, as
    // cuda:0. Ranks that truly share one GPU are refused by NCCL itself ("Duplicate GPU detected").
    if (n == 1 && local_size > 1)
      return {torch::Device(torch::kCUDA, 0),
              str_cat(head, ": CUDA device 0, the one device this rank sees (LOCAL_RANK ", local_rank, " of ",
                      local_size, ": one GPU bound per rank, e.g. srun --gpus-per-task=1)")};
    if (n < local_size) {
      const std::string why = str_cat(local_size, " ranks on this machine (LOCAL_WORLD_SIZE) but LibTorch sees ", n,
                                      " CUDA devices (one device per rank)");
      if (option == "auto") return {torch::kCPU, str_cat(head, ": ", why, ": the CPU")};
      fail("train.device = cuda: ", why, "; start at most ", n, " ranks per machine (or bind one GPU per rank), "
           "or use train.device = cpu");
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
