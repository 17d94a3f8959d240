// snip/formats/bf16.h: rounding FP32 to BF16 precision, the result held in
// FP32 (the operand of an emulated BF16 GEMM, model/matmul.h).
#pragma once

#include <cstdint>

namespace snip::formats {

/// y[i] = x[i] rounded to the nearest BF16 value (round to nearest, ties to
/// even; E8M7 with FP32's exponent range, subnormals kept), as an FP32 value:
/// the FP32 bit pattern u becomes (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000,
/// so overflow past BF16's largest finite value (0x7F7F) gives +-Inf, Inf
/// stays Inf, and every NaN becomes the canonical quiet NaN 0x7FC00000. This
/// is bit for bit what LibTorch's (c10::BFloat16) FP32 -> BF16 -> FP32 cast
/// gives, in one pass instead of two and without the BF16 temporary.
///
/// x, y: n FP32 values each (n >= 0); y may equal x (in place); partial
/// overlap is undefined. OpenMP over elements, with AVX-512/AVX2 clones on
/// x86-64; the result does not depend on the thread count.
void round_to_bf16(const float* x, float* y, int64_t n);

}  // namespace snip::formats
