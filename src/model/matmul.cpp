// GEMMs in BF16 with FP32 accumulation (see matmul.h).
#include "snip/model/matmul.h"

#include <cstdlib>
#include <cstring>

#include "snip/formats/bf16.h"

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

// t (FP32, non-overlapping and dense: contiguous, transposed, permuted)
// rounded to BF16 precision, held in FP32, in t's own layout (as
// .to(kBFloat16).to(kFloat) keeps it: the GEMM then reads the same strides):
// one pass over the memory (formats::round_to_bf16), bit for bit the casts.
torch::Tensor round_bf16_raw(const torch::Tensor& t) {
  torch::Tensor out = torch::empty_like(t);  // preserve_format: t's strides
  formats::round_to_bf16(t.data_ptr<float>(), out.data_ptr<float>(), t.numel());
  return out;
}

bool dense(const torch::Tensor& t) { return t.is_non_overlapping_and_dense(); }

// The rounding as an autograd function with the derivative of the cast pair
// it replaces: .to(BF16).to(FP32) passes the gradient back through the same
// two casts, so the gradient is rounded to BF16 too.
struct RoundBf16Function : public torch::autograd::Function<RoundBf16Function> {
  static torch::Tensor forward(torch::autograd::AutogradContext*, torch::Tensor t) {
    return dense(t) ? round_bf16_raw(t) : t.to(at::kBFloat16).to(at::kFloat);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    return {round_bf16(grads[0])};
  }
};

}  // namespace

torch::Tensor round_bf16(const torch::Tensor& t) {
  if (t.scalar_type() != at::kFloat || !dense(t)) return t.to(at::kBFloat16).to(t.scalar_type());
  if (t.requires_grad() && torch::GradMode::is_enabled()) return RoundBf16Function::apply(t);
  return round_bf16_raw(t);
}

bool native_bf16_gemm() {
  static const bool native = probe_native_bf16();
  return native;
}

torch::Tensor gemm_operand(const torch::Tensor& t, at::ScalarType dtype) {
  if (!narrower(t, dtype)) return t;
  if (dtype == at::kBFloat16 && !native_bf16_gemm() && t.scalar_type() == at::kFloat) return round_bf16(t);
  if (dtype == at::kBFloat16 && !native_bf16_gemm()) return t.to(at::kBFloat16).to(at::kFloat);
  return t.to(dtype);
}

torch::Tensor gemm_result(const torch::Tensor& y, at::ScalarType dtype, at::ScalarType out) {
  if (dtype == at::kBFloat16 && y.scalar_type() == at::kFloat && !native_bf16_gemm()) {
    if (!(y.requires_grad() && torch::GradMode::is_enabled()) && dense(y)) {
      // A GEMM's fresh output, outside autograd: rounded in place.
      formats::round_to_bf16(y.data_ptr<float>(), y.data_ptr<float>(), y.numel());
      return y.to(out);
    }
    return round_bf16(y).to(out);
  }
  return y.to(out);
}

torch::Tensor matmul_in(const torch::Tensor& a, const torch::Tensor& b, at::ScalarType dtype) {
  if (!narrower(a, dtype)) return torch::matmul(a, b);
  return gemm_result(torch::matmul(gemm_operand(a, dtype), gemm_operand(b, dtype)), dtype, a.scalar_type());
}

}  // namespace snip
