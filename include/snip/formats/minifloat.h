// snip/formats/minifloat.h: the small floating-point element formats.
//
// Every format here is an ElementFormat of kind kFloat:
//   value = (-1)^S * 2^(E - bias) * (1 + M / 2^m)   for E > 0 (normal)
//   value = (-1)^S * 2^(1 - bias) * (M / 2^m)       for E = 0 (subnormal)
// Limits derived from the traits (element_format.h):
//   max        = 2^(Emax - bias) * (1 + Mmax / 2^m)
//   min normal = 2^(1 - bias),  min subnormal = 2^(1 - bias - m)
// with Emax = all ones (2^e - 1) unless the all-ones exponent is reserved for
// Inf/NaN (IEEE style: 2^e - 2), and Mmax = all ones (2^m - 1) unless
// S.1..1.1..1 is NaN (E4M3: 2^m - 2).
// Sources: OCP 8-bit Floating Point Specification (OFP8) rev 1.0 (E4M3, E5M2);
// OCP Microscaling Formats (MX) v1.0 section 5.3 (E2M1, E2M3, E3M2); E1M2 is
// the 4-bit format with bias 1 of the SNIP paper / docs/operations.md.
#pragma once

#include "snip/formats/element_format.h"

namespace snip::formats {

// ---------------------------------------------------------------------------
// E2M1 (FP4, OCP MX "FP4"):  bit 3 | 2 1 | 0
//                              S  |  E  | M      bias 1, no Inf, no NaN
// codes 0..7: 0, 0.5, 1, 1.5, 2, 3, 4, 6 (8..15 are their negatives)
// max = 2^(3-1) * 1.5 = 6; min normal = 2^0 = 1; min subnormal = 2^-1 = 0.5
// ---------------------------------------------------------------------------
inline constexpr ElementFormat kE2M1{"e2m1", ElementKind::kFloat, 4, 2, 1, 1, false,
                                     NanEncoding::kNone};

// ---------------------------------------------------------------------------
// E1M2 (FP4 variant):  bit 3 | 2 | 1 0
//                        S  | E |  M       bias 1, no Inf, no NaN
// E = 0: 0.M * 2^0 -> 0, 0.25, 0.5, 0.75; E = 1: 1.M * 2^0 -> 1 .. 1.75:
// a uniform grid 0..1.75 in steps of 0.25 (an INT4-like grid with a scale).
// max = 1.75; min normal = 1; min subnormal = 0.25
// ---------------------------------------------------------------------------
inline constexpr ElementFormat kE1M2{"e1m2", ElementKind::kFloat, 4, 1, 2, 1, false,
                                     NanEncoding::kNone};

// ---------------------------------------------------------------------------
// E2M3 (FP6, OCP MX):  bit 5 | 4 3 | 2 1 0
//                        S  |  E  |   M     bias 1, no Inf, no NaN
// max = 2^2 * 1.875 = 7.5; min normal = 1; min subnormal = 2^-3 = 0.125
// ---------------------------------------------------------------------------
inline constexpr ElementFormat kE2M3{"e2m3", ElementKind::kFloat, 6, 2, 3, 1, false,
                                     NanEncoding::kNone};

// ---------------------------------------------------------------------------
// E3M2 (FP6, OCP MX):  bit 5 | 4 3 2 | 1 0
//                        S  |   E   |  M    bias 3, no Inf, no NaN
// max = 2^(7-3) * 1.75 = 28; min normal = 2^-2; min subnormal = 2^-4
// ---------------------------------------------------------------------------
inline constexpr ElementFormat kE3M2{"e3m2", ElementKind::kFloat, 6, 3, 2, 3, false,
                                     NanEncoding::kNone};

// ---------------------------------------------------------------------------
// E4M3 (OCP FP8 "E4M3", PyTorch float8_e4m3fn):
//   bit 7 | 6 5 4 3 | 2 1 0
//     S   |    E    |   M      bias 7, no Inf, NaN = S.1111.111 (0x7F, 0xFF)
// The all-ones exponent holds normal numbers (extended range), except for
// the one NaN pattern, so Mmax at E = 15 is 110b:
// max = 2^(15-7) * 1.75 = 448 (0x7E); min normal = 2^-6 (0x08);
// min subnormal = 2^-9 (0x01)
// ---------------------------------------------------------------------------
inline constexpr ElementFormat kE4M3{"e4m3", ElementKind::kFloat, 8, 4, 3, 7, false,
                                     NanEncoding::kAllOnes};

// ---------------------------------------------------------------------------
// E5M2 (OCP FP8 "E5M2", PyTorch float8_e5m2): IEEE-754 style
//   bit 7 | 6 5 4 3 2 | 1 0
//     S   |     E     |  M     bias 15, Inf = S.11111.00, NaN = S.11111.{01,10,11}
// max = 2^(30-15) * 1.75 = 57344 (0x7B); min normal = 2^-14 (0x04);
// min subnormal = 2^-16 (0x01)
// ---------------------------------------------------------------------------
inline constexpr ElementFormat kE5M2{"e5m2", ElementKind::kFloat, 8, 5, 2, 15, true,
                                     NanEncoding::kIeee};

// ---------------------------------------------------------------------------
// BF16 (bfloat16, the upper half of an IEEE binary32):
//   bit 15 | 14 .. 7 | 6 .. 0
//      S   |    E    |   M     bias 127, IEEE Inf/NaN
// max = 2^127 * (2 - 2^-7) = 3.3895e38; min normal = 2^-126;
// min subnormal = 2^-133. Used as the `bf16` recipe's "element format" (no
// scaling, RNE, non-saturating: exactly what a cast to bfloat16 does).
// ---------------------------------------------------------------------------
inline constexpr ElementFormat kBF16{"bf16", ElementKind::kFloat, 16, 8, 7, 127, true,
                                     NanEncoding::kIeee};

// Pinned limits (the derivations above, checked by the compiler).
static_assert(kE2M1.max_value() == 6.0 && kE2M1.min_normal() == 1.0 &&
              kE2M1.min_subnormal() == 0.5 && kE2M1.emax() == 2);
static_assert(kE1M2.max_value() == 1.75 && kE1M2.min_normal() == 1.0 &&
              kE1M2.min_subnormal() == 0.25 && kE1M2.emax() == 0);
static_assert(kE2M3.max_value() == 7.5 && kE2M3.min_subnormal() == 0.125);
static_assert(kE3M2.max_value() == 28.0 && kE3M2.min_normal() == 0.25 &&
              kE3M2.min_subnormal() == 0.0625 && kE3M2.emax() == 4);
static_assert(kE4M3.max_value() == 448.0 && kE4M3.max_code() == 0x7E &&
              kE4M3.min_normal() == 1.0 / 64 && kE4M3.min_subnormal() == 1.0 / 512 &&
              kE4M3.emax() == 8);
static_assert(kE5M2.max_value() == 57344.0 && kE5M2.max_code() == 0x7B &&
              kE5M2.min_normal() == 1.0 / 16384 && kE5M2.min_subnormal() == 1.0 / 65536 &&
              kE5M2.emax() == 15);

}  // namespace snip::formats
