// GEMMs in BF16 with FP32 accumulation (see matmul.h).
#include "snip/model/matmul.h"

#include <cstdlib>
#include <cstring>

namespace snip {

namespace {

bool narrower(const torch::Tensor& t, at::ScalarType dtype) {
  return dtype != at::ScalarType::Undefined && dtype != t.scalar_type();
}

bool probe_native_bf16() {
  if (const char* e = std::getenv("SNIP_BF16_GEMM")) {
    if (std::strcmp(e, "native") == 0) return true;
    if (std::strcmp(e, "emulated") == 0) return false;
  }
  torch::NoGradGuard ng;
  // Fixed values in [-0.5, 0.5): frac(i·φ) (no random numbers, so nothing
  // of the run's generator is used).
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat);
  const torch::Tensor a = torch::arange(16 * 4096, f32).mul(0.6180339887).frac().sub(0.5).reshape({16, 4096});
  const torch::Tensor b = torch::arange(4096 * 16, f32).mul(0.7548776662).frac().sub(0.5).reshape({4096, 16});
  const torch::Tensor ab = a.to(torch::kBFloat16), bb = b.to(torch::kBFloat16);
  const torch::Tensor ref = torch::mm(ab.to(torch::kFloat), bb.to(torch::kFloat));
  const torch::Tensor got = torch::mm(ab, bb).to(torch::kFloat);
  return (got - ref).norm().item<double>() <= 4e-3 * ref.norm().item<double>();
}

}  // namespace

bool native_bf16_gemm() {
  static const bool native = probe_native_bf16();
  return native;
}

torch::Tensor gemm_operand(const torch::Tensor& t, at::ScalarType dtype) {
  if (!narrower(t, dtype)) return t;
  if (dtype == at::kBFloat16 && !native_bf16_gemm()) return t.to(at::kBFloat16).to(at::kFloat);
  return t.to(dtype);
}

torch::Tensor gemm_result(const torch::Tensor& y, at::ScalarType dtype, at::ScalarType out) {
  if (dtype == at::kBFloat16 && y.scalar_type() == at::kFloat && !native_bf16_gemm())
    return y.to(at::kBFloat16).to(out);
  return y.to(out);
}

torch::Tensor matmul_in(const torch::Tensor& a, const torch::Tensor& b, at::ScalarType dtype) {
  if (!narrower(a, dtype)) return torch::matmul(a, b);
  return gemm_result(torch::matmul(gemm_operand(a, dtype), gemm_operand(b, dtype)), dtype, a.scalar_type());
}

}  // namespace snip
