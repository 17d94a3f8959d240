// snip/io/tensor_values.h: what the elements of a safetensors tensor are,
// and their values as FP32, dtype by dtype (the table is also in
// docs/formats.md, "safetensors dtypes").
//
// Value rules (code c of `bits` bits; S sign, E exponent field, M mantissa
// field; "sub" = subnormal, E = 0):
//
//   F32          IEEE binary32, copied bit for bit
//   F64          IEEE binary64, rounded to the nearest FP32 (ties to even);
//                the one inexact conversion. A finite value beyond FP32's
//                range is refused (it would become Inf).
//   F16          IEEE binary16: bias 15, Inf/NaN at E = 31; max 65504
//   BF16         upper half of binary32: bias 127; bits << 16 is the FP32
//   F8_E4M3      OCP FP8 E4M3 ("fn"): bias 7, no Inf, NaN = S.1111.111;
//                max 448 (0x7E), min sub 2^-9 (formats::kE4M3)
//   F8_E5M2      OCP FP8 E5M2: bias 15, Inf S.11111.00, NaN S.11111.{01,10,11};
//                max 57344 (formats::kE5M2)
//   F8_E4M3FNUZ  bias 8, no Inf, no -0: 0x80 is the only NaN; max 240 (0x7F),
//                min sub 2^-10 (arXiv 2206.02915; PyTorch float8_e4m3fnuz)
//   F8_E5M2FNUZ  bias 16, no Inf, no -0: 0x80 is the only NaN; max 57344
//                (0x7F), min sub 2^-17 (PyTorch float8_e5m2fnuz)
//   F8_E8M0      OCP MX v1.0 section 5.4 scale: 2^(c - 127), c = 0..254;
//                0xFF = NaN; no sign, no zero (formats::e8m0_decode)
//   F4           OCP MX FP4 = E2M1: bias 1, no Inf/NaN; codes 0..7 are
//                0, 0.5, 1, 1.5, 2, 3, 4, 6 (formats::kE2M1). Two per byte:
//                element 2k in the low nibble (bits 3..0), element 2k+1 in
//                the high nibble, as PyTorch's float4_e2m1fn_x2
//                (torch/headeronly/util/Float4_e2m1fn_x2.h: "val1 : val0",
//                bits 7654 : 3210), which the reference's Python binding
//                maps F4 to.
//   F6_E2M3, F6_E3M2  OCP MX FP6. The format fixes their size (6 bits, 4
//                elements in 3 bytes) but neither it nor any framework
//                dtype fixes the order of the bits inside the bytes, so
//                snip does not guess: they are read and written as bytes,
//                never decoded (decode_to_f32 refuses them).
//   C64          complex: real then imaginary part, each an F32. Not a real
//                value: never decoded.
//   BOOL, U8..U64, I8..I64: not floating point; never decoded.
//
// Plain C++17 on snip_formats' codecs (every float rule above that has a
// codec there is decoded by it, through a table of all its codes).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "snip/io/safetensors.h"

namespace snip::io {

/// What the elements of a dtype are.
enum class DTypeKind {
  kBool,     ///< BOOL
  kInteger,  ///< U8, U16, U32, U64, I8, I16, I32, I64
  kFloat,    ///< F64, F32, F16, BF16, F8_*, F4, F6_*
  kComplex,  ///< C64
};
/// The kind of `dtype`.
DTypeKind dtype_kind(DType dtype);

/// How the values of a floating dtype become FP32.
enum class F32Conversion {
  kExact,     ///< every code has its exact FP32 value (F32, F16, BF16, F8_*, F4)
  kRounded,   ///< F64: round to nearest, ties to even
  kNone,      ///< not decoded: F6_* (bit order in bytes undefined), C64, BOOL, integers
};
/// The conversion of `dtype` (table above).
F32Conversion f32_conversion(DType dtype);

/// The values of `r` as FP32, row-major: [r.numel()] floats, by the value
/// rules above (NaN codes become a quiet NaN of the code's sign). Throws
/// UserError, one line naming `what` and the tensor, when r.dtype has
/// F32Conversion::kNone ("tensor 'w': F6_E2M3 is not decoded: ...") or, for
/// F64, when a finite value lies beyond FP32's range (|x| rounds past
/// FLT_MAX). Checks (SNIP_CHECK) that r.data.size() == r.nbytes().
std::vector<float> decode_to_f32(const TensorRecord& r, const std::string& what);

}  // namespace snip::io
