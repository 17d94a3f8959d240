// snip/formats/scale_format.h: the number formats a scale is stored in.
//
// A block of elements shares one decode scale d: element values are
// x ~= e * d. The scale formats:
//
// E8M0 (OCP MX v1.0 section 5.4, "UE8M0" in NVIDIA's terms), unsigned
// exponent only:
//   bit 7 ............ 0
//       E (8 bits)            value = 2^(E - 127), E = 0..254
//                             E = 255 (0xFF) = NaN; no zero, no sign, no Inf
// Range 2^-127 (code 0x00) .. 2^127 (code 0xFE); 1.0 = 0x7F.
//
// E4M3 (the OCP FP8 element format, minifloat.h), used as NVFP4's block
// scale: positive values 2^-9 .. 448, encoded with RNE and saturation.
//
// FP32: an IEEE binary32 value. Clamped below to 2^-126 (the smallest normal
// float) so that 1/d stays finite and no block with a nonzero amax gets a
// zero scale.
//
// FP32 restricted to powers of two ("FP32-pow2"): d = 2^k, k in [-126, 127],
// so that x * (1/d) and e * d are exact: the fake-quantized value equals what
// a GEMM with FP32 accumulation computes from codes and scales (docs/method.md 1).
#pragma once

#include <cstdint>
#include <string>

namespace snip::formats {

/// The format a block's decode scale is stored in.
enum class ScaleFormat : uint8_t {
  kFP32,      ///< any positive FP32 value >= 2^-126
  kFP32Pow2,  ///< 2^k, k in [-126, 127]
  kE8M0,      ///< 2^k, k in [-127, 127] (OCP MX), code k + 127
  kE4M3,      ///< an E4M3 value (NVFP4 block scale)
};

/// Lower-case name: "fp32", "fp32_pow2", "e8m0", "e4m3".
const char* scale_format_name(ScaleFormat f);
/// Inverse of scale_format_name; throws snip::UserError "<where>: unknown
/// scale format 'x' (expected fp32, fp32_pow2, e8m0 or e4m3)".
ScaleFormat parse_scale_format(const std::string& name, const std::string& where);

/// E8M0 code of the NaN scale.
inline constexpr uint8_t kE8M0NaN = 0xFF;
/// Smallest and largest E8M0 exponents (codes 0x00 and 0xFE).
inline constexpr int kE8M0MinExp = -127, kE8M0MaxExp = 127;
/// Smallest and largest exponents of an FP32-pow2 scale.
inline constexpr int kPow2MinExp = -126, kPow2MaxExp = 127;

/// Value of an E8M0 code: 2^(code - 127); 0xFF -> NaN. Exact.
float e8m0_decode(uint8_t code);
/// E8M0 code of 2^k, k clamped to [-127, 127].
uint8_t e8m0_from_exponent(int k);

}  // namespace snip::formats
