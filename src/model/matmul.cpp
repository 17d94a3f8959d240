// GEMMs in BF16 with FP32 accumulation (see matmul.h).
#include "snip/model/matmul.h"

#include <spdlog/spdlog.h>

#include "snip/hw/capabilities.h"
#include "snip/model/blas.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>

#include "snip/formats/bf16.h"
#include "snip/core/error.h"

namespace snip {

namespace {

bool narrower(const torch::Tensor& t, at::ScalarType dtype) {
  return dtype != at::ScalarType::Undefined && dtype != t.scalar_type();
}

bool probe_native_bf16() {
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

// Dense host memory: what formats::round_to_bf16's pointer pass reads (a
// CUDA tensor takes the casts, which round the same way: RNE).
bool dense(const torch::Tensor& t) { return t.device().is_cpu() && t.is_non_overlapping_and_dense(); }

// The rounding as an autograd function with the derivative of the cast pair
// it replaces: .to(BF16).to(FP32) passes the gradient back through the same
// two casts, so the gradient is rounded to BF16 too.
struct RoundBf16Function : public torch::autograd::Function<RoundBf16Function> {
  // t: dense FP32 (round_bf16 sends nothing else).
  static torch::Tensor forward(torch::autograd::AutogradContext*, torch::Tensor t) { return round_bf16_raw(t); }
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

namespace {

// round_bf16 of a tensor the caller owns alone (a GEMM's output, a
// quantizer's buffer): outside autograd, rounded in place.
torch::Tensor round_bf16_fresh(const torch::Tensor& t) {
  if (t.scalar_type() != at::kFloat || !dense(t) || (t.requires_grad() && torch::GradMode::is_enabled()))
    return round_bf16(t);
  formats::round_to_bf16(t.data_ptr<float>(), t.data_ptr<float>(), t.numel());
  return t;
}

bool emulated_bf16(at::ScalarType dtype) { return dtype == at::kBFloat16 && !native_bf16_gemm(); }

}  // namespace

bool libtorch_bf16_gemm_accumulates_fp32() {
  static const bool fp32 = probe_native_bf16();
  return fp32;
}

namespace {

struct BackendChoice {
  bool native = false;
  std::string reason;
};

BackendChoice resolve(GemmBackend b) {
  if (b == GemmBackend::kNative) return {true, "train.gemm_backend = native"};
  if (b == GemmBackend::kEmulated) return {false, "train.gemm_backend = emulated"};
  if (const char* e = std::getenv("SNIP_BF16_GEMM"); e && *e) {
    if (std::strcmp(e, "native") == 0) return {true, "SNIP_BF16_GEMM=native"};
    if (std::strcmp(e, "emulated") == 0) return {false, "SNIP_BF16_GEMM=emulated"};
    fail("environment variable SNIP_BF16_GEMM=", e, ": expected native or emulated (or unset for auto)");
  }
  if (!libtorch_bf16_gemm_accumulates_fp32())
    return {false, "auto: LibTorch's BF16 matmul accumulates in BF16 here (no AVX512-BF16/AMX path)"};
  // LibTorch 2.x's oneDNN also accumulates BF16 GEMMs in FP32 on CPUs
  // without BF16 units (AVX2, AVX-512 without AVX512_BF16), widening BF16
  // to FP32 in registers: exact, but ~8x slower than the FP32 GEMM of the
  // emulation (snip doctor, AMD EPYC Zen 3, LibTorch 2.11). Native only
  // where the CPU has BF16 dot products.
  const hw::CpuInfo& cpu = hw::capabilities().cpu;
  if (cpu.avx512_bf16 || cpu.amx_bf16 || cpu.arm_bf16)
    return {true, "auto: LibTorch's BF16 matmul accumulates in FP32 on this CPU's BF16 units"};
  return {false, "auto: LibTorch's BF16 matmul accumulates in FP32 but this CPU has no BF16 units "
                 "(AVX512_BF16/AMX-BF16): the emulation's FP32 GEMMs are faster"};
}

std::mutex g_backend_mu;
std::atomic<int> g_native{-1};  // -1 = not chosen yet, else 0/1
std::string g_reason;

}  // namespace

void set_bf16_gemm_backend(GemmBackend b, bool on_cuda) {
  BackendChoice c;
  if (on_cuda) {
    // cuBLAS's BF16 GEMMs accumulate in FP32; LibTorch lets them reduce
    // split-K partial sums in BF16 unless told not to (PyTorch's
    // allow_bf16_reduced_precision_reduction): off, so one rounding per output.
    at::globalContext().setAllowBF16ReductionCuBLAS(false);
    if (b == GemmBackend::kEmulated)
      c = {false, "train.gemm_backend = emulated (FP32 GEMMs on BF16-rounded operands, on the GPU)"};
    else
      c = {true, b == GemmBackend::kNative ? "train.gemm_backend = native"
                                            : "auto: train.device = cuda: cuBLAS BF16 GEMMs with FP32 accumulation "
                                              "(reduced-precision reductions off)"};
  } else {
    c = resolve(b);
  }
  std::lock_guard<std::mutex> lk(g_backend_mu);
  g_reason = c.reason;
  g_native.store(c.native ? 1 : 0);
}

bool native_bf16_gemm() {
  int v = g_native.load(std::memory_order_relaxed);
  if (v < 0) {
    BackendChoice c = resolve(GemmBackend::kAuto);
    std::lock_guard<std::mutex> lk(g_backend_mu);
    if (g_native.load() < 0) {
      g_reason = c.reason;
      g_native.store(c.native ? 1 : 0);
    }
    v = g_native.load();
  }
  return v == 1;
}

std::string bf16_gemm_reason() {
  native_bf16_gemm();
  std::lock_guard<std::mutex> lk(g_backend_mu);
  return g_reason;
}

namespace {
std::atomic<int> g_fp8_gemm{int(Fp8Gemm::kAuto)};
std::atomic<bool> g_fp8_refused{false};
}  // namespace

Fp8Gemm parse_fp8_gemm(const std::string& s) {
  if (s == "auto") return Fp8Gemm::kAuto;
  if (s == "native") return Fp8Gemm::kNative;
  if (s == "emulated") return Fp8Gemm::kEmulated;
  fail("train.fp8_gemm: expected auto, native or emulated, got '", s, "'");
}

void set_fp8_gemm(Fp8Gemm m) {
  g_fp8_gemm.store(int(m));
  g_fp8_refused.store(false);
}

bool native_fp8_gemm(const torch::Device& device) {
  switch (Fp8Gemm(g_fp8_gemm.load())) {
    case Fp8Gemm::kNative: return true;
    case Fp8Gemm::kEmulated: return false;
    case Fp8Gemm::kAuto: return device.is_cuda() && !g_fp8_refused.load();
  }
  return false;
}

namespace {
std::atomic<int64_t> g_fp8_native_calls{0};
}  // namespace

int64_t native_fp8_gemm_count() { return g_fp8_native_calls.load(); }
void count_native_fp8_gemm() { g_fp8_native_calls.fetch_add(1, std::memory_order_relaxed); }

void native_fp8_gemm_refused(const std::string& why) {
  if (Fp8Gemm(g_fp8_gemm.load()) == Fp8Gemm::kNative)
    fail("train.fp8_gemm = native: the device refused an FP8 GEMM (", why, "); use train.fp8_gemm = auto or emulated");
  if (!g_fp8_refused.exchange(true))
    spdlog::warn("train.fp8_gemm = auto: the device refused a native FP8 GEMM ({}): FP8 GEMMs run emulated from "
                 "now on (fake-quantized operands, the same products)", why);
}

torch::Tensor gemm_operand(const torch::Tensor& t, at::ScalarType dtype) {
  if (!narrower(t, dtype)) return t;
  if (emulated_bf16(dtype))
    return t.scalar_type() == at::kFloat ? round_bf16(t) : t.to(at::kBFloat16).to(at::kFloat);
  return t.to(dtype);
}

torch::Tensor gemm_operand_fresh(const torch::Tensor& t, at::ScalarType dtype) {
  if (narrower(t, dtype) && emulated_bf16(dtype) && t.scalar_type() == at::kFloat) return round_bf16_fresh(t);
  return gemm_operand(t, dtype);
}

torch::Tensor gemm_result(const torch::Tensor& y, at::ScalarType dtype, at::ScalarType out) {
  if (emulated_bf16(dtype) && y.scalar_type() == at::kFloat) return round_bf16_fresh(y).to(out);
  return y.to(out);
}

torch::Tensor matmul_in(const torch::Tensor& a, const torch::Tensor& b, at::ScalarType dtype) {
  // A 2-D b (the tied lm_head) takes snip/model/blas.h's FP32 GEMM.
  auto mm = [&](const torch::Tensor& x, const torch::Tensor& y) {
    return y.dim() == 2 ? fp32_mm_autograd(x, y) : torch::matmul(x, y);
  };
  if (!narrower(a, dtype)) return mm(a, b);
  return gemm_result(mm(gemm_operand(a, dtype), gemm_operand(b, dtype)), dtype, a.scalar_type());
}

}  // namespace snip
