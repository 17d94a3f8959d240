// snip/model/matmul.h: GEMMs "in BF16" as BF16 hardware runs them (NVIDIA
// tensor cores, Intel AMX/AVX512-BF16 through oneDNN): operands rounded to
// BF16 (round to nearest even), products summed in FP32, the result rounded
// to BF16 once (docs/method.md section 1: "GEMMs accumulate in FP32, outputs are
// stored BF16").
//
// LibTorch 2.11 (the PyPI wheel) takes BF16 GEMMs through oneDNN on every
// x86 CPU and accumulates in FP32, but only CPUs with BF16 dot products
// (AVX512_BF16, AMX-BF16) run them fast: on AVX2 the BF16 operands are
// widened in registers and the GEMM is ~8x slower than the FP32 one.
// (LibTorch 1.13's fallback on AVX2 even accumulated in BF16: ~7% relative
// error at K = 4096.) Without BF16 units the BF16 GEMM is emulated exactly:
// BF16-rounded operands held in FP32 (every BF16 value is an FP32 value,
// every product of two is exact in FP32), an FP32 GEMM, one rounding of the
// result to BF16. Equal to the hardware's result up to summation order.
#pragma once

#include <torch/torch.h>

#include <string>

#include "snip/config/config.h"

namespace snip {

// How BF16 GEMMs run (train.gemm_backend, GemmBackend in config/config.h):
// kNative = LibTorch's own BF16 matmul (oneDNN/AMX/AVX512-BF16 where
// present), kEmulated = FP32 GEMMs on BF16-rounded operands, result rounded
// to BF16 (the same numerics up to summation order), kAuto = native where the
// probe finds that LibTorch's BF16 matmul accumulates in FP32 and the CPU has
// BF16 units (AVX512_BF16, AMX-BF16, Arm BF16), else emulated.

/// Sets the backend for the rest of the process (the trainer calls it with
/// train.gemm_backend before the first GEMM). kAuto: the environment variable
/// SNIP_BF16_GEMM=native|emulated if set (the test suite's switch), else the
/// probe. Forcing kNative on a CPU whose BF16 matmul accumulates in BF16 is
/// allowed (it is slow and inexact there: snip doctor warns). Throws
/// snip::UserError when SNIP_BF16_GEMM is set to anything else (kAuto only;
/// native_bf16_gemm() resolves kAuto the same way on first use).
/// on_cuda (train.device = cuda): kAuto is native without a probe (cuBLAS
/// accumulates BF16 GEMMs in FP32), SNIP_BF16_GEMM is not read, and
/// LibTorch's reduced-precision BF16 split-K reductions are turned off for
/// the process (at::Context::setAllowBF16ReductionCuBLAS(false)).
void set_bf16_gemm_backend(GemmBackend b, bool on_cuda = false);

/// True when LibTorch's own BF16 matmul accumulates in FP32 on this machine:
/// a probe, run once per process (a [16, 4096] x [4096, 16] product of fixed
/// values, compared with the FP32 product of the same BF16 operands: relative
/// error <= 4e-3, Frobenius). Uses no random numbers.
bool libtorch_bf16_gemm_accumulates_fp32();

/// True when BF16 GEMMs run natively in this process (set_bf16_gemm_backend;
/// without a call, as kAuto).
bool native_bf16_gemm();

/// Why native_bf16_gemm() is what it is, for logs and snip doctor:
/// "train.gemm_backend = native", "SNIP_BF16_GEMM=emulated", or for auto
/// "auto: LibTorch's BF16 matmul accumulates in FP32 on this CPU's BF16
/// units", "... accumulates in FP32 but this CPU has no BF16 units ..." or
/// "... accumulates in BF16 here ...".
std::string bf16_gemm_reason();

/// How a GEMM whose two operands are per-tensor-scaled FP8 runs
/// (train.fp8_gemm; OperandQuantizer::scaled_operand in model/linear.h):
/// kNative = at::_scaled_mm on the FP8 codes (FP32 accumulation, the two
/// decode scales applied to the FP32 result: cuBLASLt on a GPU of compute
/// capability 8.9+, oneDNN on the CPU), kEmulated = the fake-quantized
/// values in train.gemm_dtype (the same products; the BF16 emulation also
/// rounds each dequantized operand to BF16), kAuto = native on CUDA devices,
/// emulated on the CPU.
enum class Fp8Gemm { kAuto, kNative, kEmulated };

/// Parses "auto", "native", "emulated"; throws snip::UserError naming
/// train.fp8_gemm otherwise.
Fp8Gemm parse_fp8_gemm(const std::string& s);
/// Sets the mode for the rest of the process (the trainer, from
/// train.fp8_gemm; kAuto until called).
void set_fp8_gemm(Fp8Gemm m);
/// True when a GEMM with both operands scaled on `device` runs natively now.
bool native_fp8_gemm(const torch::Device& device);
/// Native FP8 GEMMs run in this process so far (at::_scaled_mm calls that
/// returned), for logs, summaries and tests.
int64_t native_fp8_gemm_count();
void count_native_fp8_gemm();

/// A native FP8 GEMM the device refused (`why`, one line): under kAuto the
/// process runs the emulation from now on, with one warning; under kNative
/// throws snip::UserError naming train.fp8_gemm and why.
void native_fp8_gemm_refused(const std::string& why);

/// t rounded to BF16 precision (round to nearest even) and held in t's dtype:
/// bit for bit t.to(kBFloat16).to(t.dtype), including the derivative (the
/// gradient is rounded to BF16 the same way) and the layout (t's strides).
/// Dense FP32 inputs (contiguous, transposed or permuted views) take one pass
/// of formats::round_to_bf16 instead of two casts; any shape.
torch::Tensor round_bf16(const torch::Tensor& t);

/// An operand of a GEMM in `dtype`: t cast to dtype, or for BF16 without a
/// native GEMM, t rounded to BF16 and held in FP32. Undefined or t's own
/// dtype: t unchanged. Any shape.
torch::Tensor gemm_operand(const torch::Tensor& t, at::ScalarType dtype);

/// gemm_operand(t, dtype) for a tensor the caller owns alone (a quantizer's
/// fresh output): the same values and layout, but outside autograd the BF16
/// rounding of the emulated path happens in t's own memory (t is returned).
torch::Tensor gemm_operand_fresh(const torch::Tensor& t, at::ScalarType dtype);

/// The output of a GEMM whose operands came from gemm_operand(.., dtype), as
/// `out` (the activation dtype): rounded to dtype first when the GEMM ran
/// emulated in FP32. Any shape. y must be the GEMM's own fresh output: outside
/// autograd it is rounded in place (and returned when out is FP32).
torch::Tensor gemm_result(const torch::Tensor& y, at::ScalarType dtype, at::ScalarType out);

/// a [.., M, K] · b [.., K, N] in `dtype` (Undefined = a's dtype), returned
/// in a's dtype: gemm_result(matmul(gemm_operand(a), gemm_operand(b))).
torch::Tensor matmul_in(const torch::Tensor& a, const torch::Tensor& b, at::ScalarType dtype);

}  // namespace snip
