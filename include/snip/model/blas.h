// snip/model/blas.h: FP32 GEMMs through OpenBLAS on CPUs where it is faster
// than the BLAS inside the LibTorch wheel.
//
// The PyPI torch wheel links Intel MKL (2024.2) for its FP32 GEMMs. On AMD
// EPYC it runs them well below Debian's OpenBLAS 0.3.21, which the process
// loads anyway (CBC's LAPACK): [2048, 256] x [256, 688] on a 2-core Zen 2,
// 2 threads, 2026-12-03: MKL 91 GFLOP/s, OpenBLAS 143 (numpy and torch in
// the venv, `snip doctor`'s shape). snip's quantized linear layers run
// their GEMMs on already fake-quantized (or BF16-rounded) FP32 operands, so
// those GEMMs, and the tied lm_head's, go to cblas_sgemm: the same IEEE
// FP32 arithmetic, another summation order (OpenBLAS splits M and N across
// threads, never K, so a result does not depend on the thread count).
//
// Choice (once per process): SNIP_FP32_GEMM=libtorch|openblas, else
// openblas on x86-64 AMD CPUs (vendor AuthenticAMD) and libtorch elsewhere
// (MKL is the faster one on Intel).
#pragma once

#include <torch/torch.h>

#include <string>

namespace snip {

/// True when FP32 GEMMs of fp32_mm go to OpenBLAS in this process.
bool openblas_fp32_gemm();

/// Why openblas_fp32_gemm() is what it is ("SNIP_FP32_GEMM=libtorch",
/// "auto: AMD CPU, OpenBLAS", "auto: not an AMD CPU, LibTorch's MKL").
std::string fp32_gemm_reason();

/// Sets OpenBLAS's thread count (the trainer's train.threads, as LibTorch's
/// intra-op threads); no effect when no OpenBLAS is loaded.
void set_openblas_threads(int threads);

/// a [M, K] · b [K, N] -> [M, N]. FP32 CPU operands that are row-major or a
/// transposed view of row-major (strides (K, 1) or (1, M)) go to
/// cblas_sgemm without copies when openblas_fp32_gemm(); anything else is
/// torch::mm. No autograd (the quantized linear layer's explicit fprop /
/// dgrad / wgrad call it outside the graph).
torch::Tensor fp32_mm(const torch::Tensor& a, const torch::Tensor& b);

/// fp32_mm with autograd: d/da = g·bᵀ, d/db = aᵀ·g through fp32_mm. `a` may
/// have leading batch dims ([..., K], contiguous: folded into M).
torch::Tensor fp32_mm_autograd(const torch::Tensor& a, const torch::Tensor& b);

}  // namespace snip
