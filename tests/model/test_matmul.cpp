// BF16 GEMMs with FP32 accumulation (snip/model/matmul.h), on this machine's
// path (LibTorch's own where it accumulates in FP32, the emulation elsewhere),
// against a float64 product of the same BF16-rounded operands.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "snip/model/blas.h"
#include "snip/model/matmul.h"

using namespace snip;

namespace {

// ||got - ref||_F / ||ref||_F, ref = float64 product of the BF16-rounded operands.
double rel_err_vs_exact(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& got) {
  const torch::Tensor ref = torch::matmul(a.to(torch::kBFloat16).to(torch::kDouble), b.to(torch::kBFloat16).to(torch::kDouble));
  return (got.to(torch::kDouble) - ref).norm().item<double>() / ref.norm().item<double>();
}

}  // namespace

TEST(Bf16Gemm, AccumulatesInFp32AndRoundsTheResultOnce) {
  torch::manual_seed(0);
  const torch::Tensor a = torch::randn({64, 4096}), b = torch::randn({4096, 64});
  const torch::Tensor y = matmul_in(a, b, at::kBFloat16);
  ASSERT_EQ(y.scalar_type(), at::kFloat);
  // Every result is a BF16 value (rounded once, at the end).
  EXPECT_TRUE(torch::equal(y, y.to(torch::kBFloat16).to(torch::kFloat)));
  // FP32 accumulation over K = 4096 plus one BF16 rounding of the result:
  // relative error about 2^-9/sqrt(3) = 1.1e-3 (uniform rounding error of
  // the output), far below BF16 accumulation's ~7e-2. Bound: 2^-8.
  EXPECT_LT(rel_err_vs_exact(a, b, y), 1.0 / 256) << (native_bf16_gemm() ? "native" : "emulated");
  // Batched operands (the attention products) take the same path.
  const torch::Tensor q = torch::randn({2, 3, 16, 1024}), k = torch::randn({2, 3, 1024, 16});
  EXPECT_LT(rel_err_vs_exact(q, k, matmul_in(q, k, at::kBFloat16)), 1.0 / 256);
  // Undefined or the operand's own dtype: a plain FP32 GEMM (a 2-D b: snip's
  // FP32 GEMM of snip/model/blas.h; batched: torch::matmul).
  EXPECT_TRUE(torch::equal(matmul_in(a, b, at::ScalarType::Undefined), fp32_mm(a, b)));
  EXPECT_TRUE(torch::equal(matmul_in(a, b, at::kFloat), fp32_mm(a, b)));
  EXPECT_TRUE(torch::equal(matmul_in(q, k, at::kFloat), torch::matmul(q, k)));
}

TEST(Bf16Gemm, OperandsAreRoundedToNearestEven) {
  // 1 + 2^-8 lies halfway between the BF16 values 1 and 1 + 2^-7: ties to
  // even give 1; 1 + 3·2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6 and
  // goes to 1 + 2^-6 (even mantissa).
  const torch::Tensor t = torch::tensor({1.0f + 1.0f / 256, 1.0f + 3.0f / 256});
  const torch::Tensor r = gemm_operand(t, at::kBFloat16).to(torch::kFloat);
  EXPECT_EQ(r[0].item<float>(), 1.0f);
  EXPECT_EQ(r[1].item<float>(), 1.0f + 1.0f / 64);
}

TEST(Bf16Gemm, RoundBf16IsTheCastPairBitForBitWithLayoutAndGradient) {
  // round_bf16 replaces .to(kBFloat16).to(kFloat): same bits, same strides
  // (the GEMM after it reads the same layout, so it sums in the same order),
  // and the same derivative (the gradient rounded to BF16).
  torch::manual_seed(0);
  const torch::Tensor base = torch::randn({6, 5, 7, 4}) * 1e3;
  for (const torch::Tensor& t : {base, base.transpose(1, 2), base.permute({3, 0, 2, 1}), base.narrow(2, 1, 3)}) {
    const torch::Tensor want = t.to(torch::kBFloat16).to(torch::kFloat);
    const torch::Tensor got = round_bf16(t);
    EXPECT_TRUE(torch::equal(got, want));
    EXPECT_EQ(got.strides(), want.strides());
  }
  torch::Tensor a = (torch::randn({33, 17}) * 10).requires_grad_(true);
  torch::Tensor b = a.detach().clone().requires_grad_(true);
  const torch::Tensor g = torch::randn({17, 33});
  round_bf16(a.t()).backward(g);
  b.t().to(torch::kBFloat16).to(torch::kFloat).backward(g);
  EXPECT_TRUE(torch::equal(a.grad(), b.grad()));
  EXPECT_FALSE(torch::equal(a.grad(), g.t()));  // the gradient was rounded
}
