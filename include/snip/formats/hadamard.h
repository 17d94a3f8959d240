// snip/formats/hadamard.h: the random Hadamard transform (RHT) applied to a
// GEMM operand before quantization, to spread outliers over a block.
//
// Source: NVIDIA, "Pretraining Large Language Models with NVFP4" (2025,
// arXiv:2509.25149), section 4.2, and TransformerEngine's NVFP4BlockScaling
// recipe (pytorch/tensor/nvfp4_tensor.py: get_wgrad_sign_vector,
// get_hadamard_matrix, get_rht_matrix), which applies it to both operands
// of the wgrad GEMM.
//
// For a block size n (a power of 4: 4, 16, 64, 256, so that 1/sqrt(n) is a
// power of two and the scaling is exact, unless a result is an FP32
// subnormal) and a sign vector s in {+1, -1}^n:
//
//   R = diag(s) · H_n / sqrt(n),   H_n[i][j] = (-1)^popcount(i & j)  (Sylvester)
//
// R is orthonormal (R·Rᵀ = I, since H_n·H_nᵀ = n·I), so for operands A
// [M, K] and B [N, K] transformed along K block by block,
// (A·R_K)·(B·R_K)ᵀ = A·Bᵀ in exact arithmetic: a GEMM whose two operands are
// both transformed needs no inverse. The transform runs along each row of a
// row-major [rows, cols] operand (cols = the GEMM's K) in consecutive
// blocks of n; a tail of cols % n columns is left as it is (identity on
// those columns, still orthonormal overall).
//
// Sign vectors: seed kHadamardTeSigns (-1) is TransformerEngine's fixed
// 16-sign vector (n = 16 only); a seed >= 0 draws each sign from bit 63 of
// SplitMix64(seed + i) (Steele, Lea, Flood 2014), i = 0 .. n-1.
#pragma once

#include <cstdint>
#include <vector>

namespace snip::formats {

/// Seed value that selects TransformerEngine's hard-coded sign vector.
inline constexpr int64_t kHadamardTeSigns = -1;

/// True for the supported block sizes 4, 16, 64, 256.
bool valid_hadamard_size(int n);

/// The n signs (+1.0f / -1.0f) for `seed` (see the file comment). Throws
/// snip::UserError for an invalid n, or for seed kHadamardTeSigns with n != 16.
std::vector<float> hadamard_signs(int n, int64_t seed);

/// In place, for every row of the row-major x [rows, cols] and every whole
/// block of n columns: x_blk <- x_blk · R = ((x_blk ∘ s) · H_n) / sqrt(n),
/// computed as a fast Walsh-Hadamard transform in FP32 (n·log2(n) adds per
/// block, then an exact power-of-two scaling). `signs` has n entries.
/// Columns past the last whole block are not changed. |x·R| can exceed
/// max|x| by up to sqrt(n): a block of finite values whose FP32 sums
/// overflow is recomputed in double and saturated to +-FLT_MAX, so finite
/// input never becomes Inf or NaN; Inf and NaN inputs spread through their
/// block as IEEE arithmetic makes them. Throws snip::UserError for an n that
/// valid_hadamard_size refuses or a negative size.
void hadamard_rows(float* x, int64_t rows, int64_t cols, int n, const float* signs);

/// The inverse, x_blk <- x_blk · Rᵀ = ((x_blk · H_n) / sqrt(n)) ∘ s.
void hadamard_rows_inverse(float* x, int64_t rows, int64_t cols, int n, const float* signs);

}  // namespace snip::formats
