// The recipe quantizers on CUDA tensors (model/quantizers.cpp, docs/gpu.md):
// every built-in recipe and operand gives the CPU's bits, whether the CUDA
// kernels run it or it goes through the host codec (delayed scaling, error
// feedback, Hadamard, BF16/int/posit elements), and the per-step error
// agrees with the CPU's up to summation order. Skipped, with the reason,
// without a GPU (SNIP_REQUIRE_CUDA=1 makes that a failure). The CPU case
// runs everywhere: a device other than CPU/CUDA is not taken silently.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "snip/core/error.h"
#include "snip/model/device.h"
#include "snip/model/linear.h"
#include "snip/model/quantizers.h"
#include "snip/recipes/recipe.h"

namespace snip {
namespace {

bool cuda_or_skip(std::string* why) {
  *why = cuda_unavailable_reason();
  return why->empty();
}

#define SKIP_WITHOUT_CUDA()                                                     \
  do {                                                                          \
    std::string why_;                                                           \
    if (!cuda_or_skip(&why_)) {                                                 \
      const char* req = std::getenv("SNIP_REQUIRE_CUDA");                       \
      if (req && std::strcmp(req, "1") == 0) FAIL() << "SNIP_REQUIRE_CUDA=1: " << why_; \
      GTEST_SKIP() << why_;                                                     \
    }                                                                           \
  } while (0)

// [rows, K] FP32: rows of very different magnitudes (1e-3 .. 1e3), a few
// outliers, deterministic.
torch::Tensor operand_data(int64_t rows, int64_t k) {
  torch::manual_seed(7);
  torch::Tensor x = torch::randn({rows, k});
  x *= torch::pow(10.0, torch::linspace(-3, 3, rows)).unsqueeze(1);
  x.index_put_({0, 5}, 3e4);
  x.index_put_({rows - 1, k - 1}, -7e-6);
  return x;
}

// Bits of an FP32 tensor on the host, as int32 (NaN payloads included).
torch::Tensor bits(const torch::Tensor& t) { return t.to(torch::kCPU).contiguous().view(torch::kInt); }

TEST(CudaQuantizers, EveryRecipeAndOperandEqualsTheCpu) {
  SKIP_WITHOUT_CUDA();
  const recipes::RecipeSet set;
  const torch::Tensor x = operand_data(48, 256);
  for (const std::string& name : set.names()) {
    // One quantizer per device: delayed scaling and error feedback keep
    // state per quantizer; both see the same calls in the same order.
    const auto cpu = make_recipe_quantizer(set, name), gpu = make_recipe_quantizer(set, name);
    if (!cpu) continue;
    for (int64_t step = 0; step < 3; ++step)
      for (int o = 0; o < kNumOperands; ++o) {
        OperandErrors ec, eg;
        QuantKey kc{42, step, 3, Operand(o), &ec}, kg{42, step, 3, Operand(o), &eg};
        const torch::Tensor in = x * double(1 + step);
        const torch::Tensor qc = cpu->quantize(in, kc);
        const torch::Tensor qg = gpu->quantize(in.to(torch::kCUDA), kg);
        ASSERT_TRUE(qg.is_cuda()) << name;
        EXPECT_TRUE(torch::equal(bits(qc), bits(qg))) << name << " " << operand_name(Operand(o)) << " step " << step;
        const auto nc = ec.take()[size_t(o)], ng = eg.take()[size_t(o)];
        EXPECT_EQ(nc.calls, ng.calls) << name;
        EXPECT_NEAR(ng.rel_error(), nc.rel_error(), 1e-12 + 1e-5 * nc.rel_error())  // FP32 lanes vs FP64
            << name << " " << operand_name(Operand(o));
      }
  }
}

TEST(CudaQuantizers, Bf16InputsKeepTheirDtype) {
  SKIP_WITHOUT_CUDA();
  const auto q = make_recipe_quantizer(recipes::RecipeSet(), "fp4");
  const torch::Tensor x = operand_data(16, 64).to(torch::kBFloat16);
  const torch::Tensor qc = q->quantize(x, {1, 0, 0, Operand::kFpropX, nullptr});
  const torch::Tensor qg = q->quantize(x.to(torch::kCUDA), {1, 0, 0, Operand::kFpropX, nullptr});
  EXPECT_EQ(qg.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(qc, qg.to(torch::kCPU)));
}

TEST(CudaQuantizers, ResolveDevice) {
  // Every machine: the words and the refusals.
  EXPECT_TRUE(resolve_train_device("cpu", 1, 0, 1).device.is_cpu());
  EXPECT_EQ(resolve_train_device("auto", 1, 0, 1).reason.rfind("train.device = auto: ", 0), 0u);
  EXPECT_THROW(resolve_train_device("gpu", 1, 0, 1), std::exception);
  const bool has = cuda_unavailable_reason().empty();
  EXPECT_EQ(resolve_train_device("auto", 1, 0, 1).device.is_cuda(), has);
  EXPECT_TRUE(resolve_train_device("cpu", 2, 1, 2).device.is_cpu());
  if (!has) {
    EXPECT_TRUE(resolve_train_device("auto", 2, 1, 2).device.is_cpu());
    try {
      resolve_train_device("cuda", 1, 0, 1);
      ADD_FAILURE() << "cuda without a device was taken";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("train.device = cuda"), std::string::npos) << e.what();
    }
  } else {
    const int n = int(torch::cuda::device_count());
    EXPECT_TRUE(resolve_train_device("cuda", 1, 0, 1).device.is_cuda());
    // Several ranks: device LOCAL_RANK, one per local rank; more local ranks than devices are refused (cuda) or
    // train on the CPU (auto).
    const DeviceChoice last = resolve_train_device("cuda", 2 * n, n - 1, n);
    EXPECT_EQ(last.device, torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(n - 1))) << last.reason;
    EXPECT_EQ(resolve_train_device("auto", 2 * n, n - 1, n).device, last.device);
    EXPECT_THROW(resolve_train_device("cuda", n + 1, 0, n + 1), std::exception);
    EXPECT_TRUE(resolve_train_device("auto", n + 1, 0, n + 1).device.is_cpu());
  }
}

// The decision alone, for any device count (resolve_train_device_for): what
// each rank trains on under torchrun and Slurm layouts, on a machine without GPUs.
TEST(CudaQuantizers, ResolveDeviceForDeviceCounts) {
  const auto dev = [](int i) { return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(i)); };
  // No device: auto is the CPU with the reason; cuda is refused with it.
  EXPECT_TRUE(resolve_train_device_for("auto", 2, 1, 2, 0, "no CUDA device: x").device.is_cpu());
  EXPECT_NE(resolve_train_device_for("auto", 2, 1, 2, 0, "no CUDA device: x").reason.find("no CUDA device: x"),
            std::string::npos);
  EXPECT_THROW(resolve_train_device_for("cuda", 1, 0, 1, 0, "no CUDA device: x"), UserError);
  // One process: device 0.
  EXPECT_EQ(resolve_train_device_for("auto", 1, 0, 1, 3, "").device, dev(0));
  // One device per local rank: LOCAL_RANK.
  EXPECT_EQ(resolve_train_device_for("auto", 8, 3, 4, 4, "").device, dev(3));
  EXPECT_EQ(resolve_train_device_for("cuda", 8, 1, 4, 8, "").device, dev(1));
  // Slurm --gpus-per-task=1: each of 4 local tasks sees one device, SLURM_LOCALID 0..3: cuda:0 for every rank.
  for (int lr = 0; lr < 4; ++lr) {
    const DeviceChoice a = resolve_train_device_for("auto", 8, lr, 4, 1, "");
    EXPECT_EQ(a.device, dev(0)) << a.reason;
    EXPECT_NE(a.reason.find("one GPU bound per rank"), std::string::npos) << a.reason;
    EXPECT_EQ(resolve_train_device_for("cuda", 8, lr, 4, 1, "").device, dev(0));
  }
  // Between one and local_size devices: auto falls back to the CPU, cuda is refused in one line.
  EXPECT_TRUE(resolve_train_device_for("auto", 4, 3, 4, 2, "").device.is_cpu());
  try {
    resolve_train_device_for("cuda", 4, 3, 4, 2, "");
    ADD_FAILURE() << "4 local ranks on 2 devices were taken";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("4 ranks on this machine"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(resolve_train_device_for("cpu", 4, 3, 4, 4, "").device.is_cpu());
  EXPECT_THROW(resolve_train_device_for("gpu", 4, 3, 4, 4, ""), UserError);
}

}  // namespace
}  // namespace snip
