// Posit codec (2022 Standard for Posit Arithmetic), n <= 16 bits, es <= 4.
// See include/snip/formats/posit.h for the layout and the rounding rule.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "snip/formats/posit.h"
#include "snip/formats/rounding.h"

namespace snip::formats {

double posit_decode(uint32_t code, int nbits, int es) {
  const uint32_t mask = (1u << nbits) - 1;
  const uint32_t sign_bit = 1u << (nbits - 1);
  code &= mask;
  if (code == 0) return 0.0;
  if (code == sign_bit) return std::numeric_limits<double>::quiet_NaN();
  const bool neg = (code & sign_bit) != 0;
  const uint32_t p = neg ? ((~code + 1) & mask) : code;  // two's complement magnitude
  // Bits after the sign, MSB first: positions nbits-2 .. 0.
  int pos = nbits - 2;
  const uint32_t r0 = (p >> pos) & 1u;
  int run = 0;
  while (pos >= 0 && ((p >> pos) & 1u) == r0) {
    ++run;
    --pos;
  }
  const int k = r0 ? run - 1 : -run;
  if (pos >= 0) --pos;  // skip the regime terminator
  // Exponent: up to es bits; bits cut off by the end of the word are 0.
  int e = 0;
  for (int i = 0; i < es; ++i) {
    e <<= 1;
    if (pos >= 0) {
      e |= int((p >> pos) & 1u);
      --pos;
    }
  }
  // Fraction: the remaining pos+1 bits.
  const int fbits = pos + 1;
  const uint32_t f = fbits > 0 ? p & ((1u << fbits) - 1) : 0u;
  const double v = std::ldexp(1.0 + std::ldexp(double(f), -fbits), k * (1 << es) + e);
  return neg ? -v : v;
}

uint32_t posit_encode(double x, int nbits, int es, Rounding rounding, uint32_t random_bits) {
  const uint32_t mask = (1u << nbits) - 1;
  const uint32_t sign_bit = 1u << (nbits - 1);
  if (std::isnan(x) || std::isinf(x)) return sign_bit;  // NaR
  if (x == 0.0) return 0;
  const bool neg = x < 0;
  const double a = std::fabs(x);
  const uint32_t maxpos_code = sign_bit - 1, minpos_code = 1;
  const int useed_log2 = 1 << es;                  // useed = 2^(2^es)
  const int max_scale = (nbits - 2) * useed_log2;  // maxpos = 2^max_scale
  uint32_t p;
  if (a >= std::ldexp(1.0, max_scale)) {
    p = maxpos_code;
  } else if (a <= std::ldexp(1.0, -max_scale)) {
    p = minpos_code;  // never rounds to zero
  } else {
    // a = 2^scale * (1 + f), scale = k * useed_log2 + e, 0 <= e < useed_log2.
    int e2 = 0;
    const double fr = std::frexp(a, &e2);  // fr in [0.5, 1)
    const int scale = e2 - 1;
    const int k = scale >= 0 ? scale / useed_log2 : -((-scale + useed_log2 - 1) / useed_log2);
    const int e = scale - k * useed_log2;
    // Fraction bits: a comes from a float (24 significant bits), but keep 52.
    const uint64_t frac52 = uint64_t(std::ldexp(fr * 2.0 - 1.0, 52));  // exact
    // Unbounded bit string, MSB first: regime | exponent (es) | fraction (52).
    // Regime: k >= 0 -> (k+1) ones then a zero; k < 0 -> (-k) zeros then a one.
    const int rlen = k >= 0 ? k + 2 : -k + 1;  // <= nbits - 1 inside (minpos, maxpos)
    const uint64_t regime = k >= 0 ? ((uint64_t(1) << (k + 1)) - 1) << 1 : uint64_t(1);
    // Keep the string within 63 bits: the fraction is truncated to `fkeep`
    // bits, and the rest only matters as a sticky bit.
    const int fkeep = std::min(52, 63 - rlen - es);  // >= 63 - 15 - 4 = 44
    const uint64_t ftop = frac52 >> (52 - fkeep);
    const bool fsticky = (frac52 & ((uint64_t(1) << (52 - fkeep)) - 1)) != 0;
    const int len = rlen + es + fkeep;
    const uint64_t str = (regime << (es + fkeep)) | (uint64_t(e) << fkeep) | ftop;
    const int drop = len - (nbits - 1);
    p = uint32_t(str >> drop);
    const uint64_t rem = str & ((uint64_t(1) << drop) - 1);
    const uint64_t half = uint64_t(1) << (drop - 1);
    if (rounding == Rounding::kRNE) {
      if (rem > half || (rem == half && (fsticky || (p & 1u)))) ++p;
    } else if (rem != 0 || fsticky) {
      // Stochastic: between lo = p and hi = p + 1 in value.
      const double lo = posit_decode(p, nbits, es);
      const double hi = posit_decode(p + 1, nbits, es);
      if (double(uniform_from_bits(random_bits)) < (a - lo) / (hi - lo)) ++p;
    }
    if (p > maxpos_code) p = maxpos_code;
    if (p < minpos_code) p = minpos_code;
  }
  return neg ? ((~p + 1) & mask) : p;
}

}  // namespace snip::formats
