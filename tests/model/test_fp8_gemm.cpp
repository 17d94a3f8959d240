// Native FP8 GEMMs (train.fp8_gemm; model/matmul.h Fp8Gemm, model/linear.cpp
// qgemm): with both operands per-tensor FP8 (fp8_tensor: E4M3 X and W, E5M2
// dY, delayed FP32 scales), at::_scaled_mm on the codes gives the products
// of the fake-quantized operands: against the emulation in FP32 the
// fprop/dgrad/wgrad outputs agree up to summation order and FP32's rounding
// of code x scale (relative Frobenius error < 1e-5), over several steps of
// delayed scaling (the scale snapshot before each call must be the one the
// quantizer used). The CPU's oneDNN takes per-tensor scales, so this runs
// everywhere.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "snip/model/linear.h"
#include "snip/model/matmul.h"
#include "snip/model/quantizers.h"
#include "snip/recipes/recipe.h"

namespace snip {
namespace {

double rel(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).norm().item<double>() /
         b.to(torch::kDouble).norm().item<double>();
}

struct ModeGuard {
  ~ModeGuard() { set_fp8_gemm(Fp8Gemm::kAuto); }
};

TEST(Fp8Gemm, NativeEqualsTheEmulationInFp32) {
  ModeGuard restore;
  const recipes::RecipeSet set;
  // One quantizer per path: delayed scaling keeps a history per (layer, operand).
  const auto qn = make_recipe_quantizer(set, "fp8_tensor"), qe = make_recipe_quantizer(set, "fp8_tensor");
  for (Operand op : {Operand::kFpropX, Operand::kFpropW, Operand::kDgradDY, Operand::kDgradW, Operand::kWgradDY,
                     Operand::kWgradX})
    EXPECT_TRUE(qn->scaled_operand(op)) << operand_name(op);
  EXPECT_FALSE(make_recipe_quantizer(set, "fp8")->scaled_operand(Operand::kFpropX));  // 1x128 tiles
  EXPECT_FALSE(make_recipe_quantizer(set, "nvfp4")->scaled_operand(Operand::kFpropX));
  torch::manual_seed(3);
  const torch::Tensor w = torch::randn({96, 128}) * 0.05;
  const int64_t before = native_fp8_gemm_count();
  for (int64_t step = 0; step < 4; ++step) {
    const torch::Tensor x = torch::randn({64, 128}) * double(1 << step), dy = torch::randn({64, 96}) * 1e-3;
    const QuantKey key{7, step, 2, Operand::kFpropX, nullptr};
    set_fp8_gemm(Fp8Gemm::kNative);
    const LinearPrecision pn{qn, at::kFloat};
    const torch::Tensor yn = linear_fprop(x, w, pn, key);
    const auto [dxn, dwn] = linear_backward(dy, x, w, pn, key, true, true);
    set_fp8_gemm(Fp8Gemm::kEmulated);
    const LinearPrecision pe{qe, at::kFloat};
    const torch::Tensor ye = linear_fprop(x, w, pe, key);
    const auto [dxe, dwe] = linear_backward(dy, x, w, pe, key, true, true);
    EXPECT_LT(rel(yn, ye), 1e-5) << "fprop, step " << step;
    EXPECT_LT(rel(dxn, dxe), 1e-5) << "dgrad, step " << step;
    EXPECT_LT(rel(dwn, dwe), 1e-5) << "wgrad, step " << step;
    // Not the unquantized product: the operands were quantized.
    EXPECT_GT(rel(yn, torch::mm(x, w.t())), 1e-3);
  }
  EXPECT_EQ(native_fp8_gemm_count() - before, 4 * 3);  // every GEMM ran natively
  // The histories advanced identically on both paths.
  EXPECT_EQ(qn->state(), qe->state());
}

TEST(Fp8Gemm, AutoIsEmulatedOnTheCpuAndTheWordsParse) {
  ModeGuard restore;
  set_fp8_gemm(Fp8Gemm::kAuto);
  EXPECT_FALSE(native_fp8_gemm(torch::kCPU));
  EXPECT_TRUE(native_fp8_gemm(torch::Device(torch::kCUDA, 0)));
  EXPECT_EQ(parse_fp8_gemm("native"), Fp8Gemm::kNative);
  EXPECT_THROW(parse_fp8_gemm("fast"), std::exception);
  // A refusal under auto turns native off with a warning; under native it is an error.
  native_fp8_gemm_refused("test refusal");
  EXPECT_FALSE(native_fp8_gemm(torch::Device(torch::kCUDA, 0)));
  set_fp8_gemm(Fp8Gemm::kNative);
  EXPECT_THROW(native_fp8_gemm_refused("test refusal"), std::exception);
}

}  // namespace
}  // namespace snip
