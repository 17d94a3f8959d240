// FP32 GEMMs through OpenBLAS's cblas_sgemm (snip/model/blas.h).
#include "snip/model/blas.h"

#include <cblas.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

#include "snip/hw/capabilities.h"
#include "snip/core/error.h"

extern "C" void openblas_set_num_threads(int);

namespace snip {
namespace {

struct Choice {
  bool openblas = false;
  std::string reason;
};

Choice choose() {
  if (const char* e = std::getenv("SNIP_FP32_GEMM"); e && *e) {
    if (std::strcmp(e, "openblas") == 0) return {true, "SNIP_FP32_GEMM=openblas"};
    if (std::strcmp(e, "libtorch") == 0) return {false, "SNIP_FP32_GEMM=libtorch"};
    fail("environment variable SNIP_FP32_GEMM=", e, ": expected openblas or libtorch (or unset for auto)");
  }
  if (hw::capabilities().cpu.vendor == "AuthenticAMD") return {true, "auto: AMD CPU, OpenBLAS"};
  return {false, "auto: not an AMD CPU, LibTorch's MKL"};
}

const Choice& choice() {
  static const Choice c = choose();
  return c;
}

// CBLAS transpose flag and leading dimension of a row-major [rows, cols]
// operand stored as itself or as a transposed row-major; false otherwise.
bool layout(const torch::Tensor& t, CBLAS_TRANSPOSE& trans, int& ld) {
  const int64_t r = t.size(0), c = t.size(1);
  if (t.stride(1) == 1 && (t.stride(0) == c || r == 1) && c >= 1) {
    trans = CblasNoTrans;
    ld = int(std::max<int64_t>(c, 1));
    return true;
  }
  if (t.stride(0) == 1 && (t.stride(1) == r || c == 1) && r >= 1) {
    trans = CblasTrans;
    ld = int(std::max<int64_t>(r, 1));
    return true;
  }
  return false;
}

struct Fp32MmFunction : public torch::autograd::Function<Fp32MmFunction> {
  // a [M, K], b [K, N] -> [M, N]
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor a, torch::Tensor b) {
    ctx->save_for_backward({a, b});
    return fp32_mm(a, b);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const torch::Tensor& g = grads[0];  // [M, N]
    torch::Tensor da, db;
    if (ctx->needs_input_grad(0)) da = fp32_mm(g, s[1].t());  // [M, K]
    if (ctx->needs_input_grad(1)) db = fp32_mm(s[0].t(), g);  // [K, N]
    return {da, db};
  }
};

}  // namespace

bool openblas_fp32_gemm() { return choice().openblas; }
std::string fp32_gemm_reason() { return choice().reason; }

void set_openblas_threads(int threads) { openblas_set_num_threads(std::max(1, threads)); }

torch::Tensor fp32_mm(const torch::Tensor& a, const torch::Tensor& b) {
  CBLAS_TRANSPOSE ta, tb;
  int lda = 0, ldb = 0;
  if (!openblas_fp32_gemm() || a.dim() != 2 || b.dim() != 2 || a.scalar_type() != at::kFloat ||
      b.scalar_type() != at::kFloat || !a.device().is_cpu() || !b.device().is_cpu() || a.size(1) != b.size(0) ||
      a.numel() == 0 || b.numel() == 0 || !layout(a, ta, lda) || !layout(b, tb, ldb))
    return torch::mm(a, b);
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  torch::Tensor c = torch::empty({M, N}, a.options());
  cblas_sgemm(CblasRowMajor, ta, tb, int(M), int(N), int(K), 1.0f, a.data_ptr<float>(), lda, b.data_ptr<float>(),
              ldb, 0.0f, c.data_ptr<float>(), int(N));
  return c;
}

torch::Tensor fp32_mm_autograd(const torch::Tensor& a, const torch::Tensor& b) {
  if (!openblas_fp32_gemm() || a.scalar_type() != at::kFloat || b.scalar_type() != at::kFloat || b.dim() != 2 ||
      a.dim() < 2 || !a.is_contiguous())
    return torch::matmul(a, b);
  auto sizes = a.sizes().vec();
  const torch::Tensor y = Fp32MmFunction::apply(a.reshape({-1, sizes.back()}), b);  // [M, N]
  sizes.back() = b.size(1);
  return y.view(sizes);
}

}  // namespace snip
