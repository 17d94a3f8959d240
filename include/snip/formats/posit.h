// snip/formats/posit.h: posits, 2022 Standard for Posit Arithmetic
// (Posit Working Group, 2022), which fixes es = 2 for every size.
//
// Posit8 (n = 8, es = 2), two's complement over the whole word:
//   bit 7 | 6 ............................ 0
//     S   | regime (run of r bits + terminator) | es=2 exponent | fraction
// Decoding a positive code p (a negative code is decoded as -(decode(-p))):
//   regime: a run of k' identical bits after the sign, ended by the opposite
//   bit or the end of the word; run of 1s -> k = k' - 1, run of 0s -> k = -k'.
//   Then up to es exponent bits e (missing bits are 0), then the fraction f
//   with the remaining bits:  value = 2^(k * 2^es + e) * (1 + f).
// Special codes: 0x00 = 0, 0x80 = NaR (Not a Real; also what NaN and +-Inf
// convert to). No Inf, a single zero.
// Limits: maxpos = 2^((n-2) * 2^es) = 2^24 (0x7F, regime 1111111, k = 6);
//         minpos = 2^-24 (0x01, regime 0000001, k = -6).
// Examples: 0x40 = 1, 0x44 = 1.5, 0x48 = 2, 0x50 = 4, 0x60 = 16, 0x7E = 2^20.
//
// Rounding (standard section 4.1, "round to nearest, ties to even" defined on
// the encoding): the exact value is written as an unbounded posit bit string
// and rounded to n bits by the usual guard/sticky rule, ties going to the
// even (LSB 0) code; so where exponent bits are cut off the boundary between
// two posits is their (n+1)-bit posit midpoint, not the arithmetic one (in
// Posit8, 144179.2 lies between 65536 and 262144 and rounds to 262144,
// because the 9-bit midpoint is 131072). Nonzero values never round to 0 and
// finite values never round to NaR: |x| < minpos -> minpos, |x| > maxpos ->
// maxpos. Stochastic rounding (not in the standard) picks the neighbour above
// with probability (|x| - lo) / (hi - lo), lo/hi the posits around |x|.
#pragma once

#include "snip/formats/element_format.h"

namespace snip::formats {

/// Posit8, es = 2 (2022 Posit Standard). Traits: kind kPosit, bits 8, es 2.
inline constexpr ElementFormat kPosit8{"posit8", ElementKind::kPosit, 8, 2, 0, 0, false,
                                       NanEncoding::kNaR};

static_assert(kPosit8.max_value() == 16777216.0);           // 2^24
static_assert(kPosit8.min_normal() == 1.0 / 16777216.0);    // 2^-24
static_assert(kPosit8.scale_target() == 16.0 && kPosit8.emax() == 4);

/// Decodes an n-bit posit (3 <= n <= 16, es <= 4) to its value; NaR -> NaN.
double posit_decode(uint32_t code, int nbits, int es);
/// Encodes x into an n-bit posit with the standard's rounding (kRNE) or
/// stochastic rounding; see the file comment. NaN/Inf -> NaR.
uint32_t posit_encode(double x, int nbits, int es, Rounding rounding, uint32_t random_bits);

}  // namespace snip::formats
