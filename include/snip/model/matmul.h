// snip/model/matmul.h: GEMMs "in BF16" as BF16 hardware runs them (NVIDIA
// tensor cores, Intel AMX/AVX512-BF16 through oneDNN): operands rounded to
// BF16 (round to nearest even), products summed in FP32, the result rounded
// to BF16 once (METHOD.md section 1: "GEMMs accumulate in FP32, outputs are
// stored BF16").
//
// LibTorch 1.13's BF16 matmul does that only where oneDNN takes BF16 GEMMs
// (CPUs with AVX512-BW/VL/DQ); elsewhere (AVX2-only CPUs such as AMD Zen 2/3)
// its fallback kernel accumulates in BF16: a K = 4096 product then has ~7%
// relative error instead of ~0.1%, training loses ~0.36 nats on the micro
// model, and it is ~18x slower than FP32. There the BF16 GEMM is emulated
// exactly: BF16-rounded operands held in FP32 (every BF16 value is an FP32
// value, every product of two is exact in FP32), an FP32 GEMM, one rounding
// of the result to BF16. Equal to the hardware's result up to summation order.
#pragma once

#include <torch/torch.h>

namespace snip {

/// True when LibTorch's own BF16 matmul accumulates in FP32 on this machine.
/// Decided once per process by a probe (a [16, 4096] x [4096, 16] product of
/// fixed values, compared with the FP32 product of the same BF16 operands:
/// relative error <= 4e-3, Frobenius); SNIP_BF16_GEMM=native|emulated
/// overrides it. The probe uses no random numbers.
bool native_bf16_gemm();

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

/// The output of a GEMM whose operands came from gemm_operand(.., dtype), as
/// `out` (the activation dtype): rounded to dtype first when the GEMM ran
/// emulated in FP32. Any shape. y must be the GEMM's own fresh output: outside
/// autograd it is rounded in place (and returned when out is FP32).
torch::Tensor gemm_result(const torch::Tensor& y, at::ScalarType dtype, at::ScalarType out);

/// a [.., M, K] · b [.., K, N] in `dtype` (Undefined = a's dtype), returned
/// in a's dtype: gemm_result(matmul(gemm_operand(a), gemm_operand(b))).
torch::Tensor matmul_in(const torch::Tensor& a, const torch::Tensor& b, at::ScalarType dtype);

}  // namespace snip
