// formats::round_to_bf16 against a rounding derived independently: the two
// BF16 neighbours of x (x truncated to its top 16 bits, and the next BF16
// value away from zero), the nearer one by exact double arithmetic, ties to
// the even mantissa.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "snip/formats/bf16.h"

using snip::formats::round_to_bf16;

namespace {

float f_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t u_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// The expected result, without the bias trick of the implementation.
uint32_t expected(uint32_t u) {
  const float x = f_of(u);
  if (std::isnan(x)) return 0x7FC00000u;
  if (std::isinf(x)) return u;
  const uint32_t lo = u & 0xFFFF0000u;  // toward zero
  const uint32_t hi = lo + 0x10000u;    // next BF16 magnitude (may be Inf)
  const double dx = std::fabs(double(x)), dlo = std::fabs(double(f_of(lo)));
  // BF16's next value above the largest finite one (0x7F7F) would be 2^128:
  // the rounding boundary for overflow is its midpoint, as in IEEE.
  const double dhi = (hi & 0x7FFFFFFFu) == 0x7F800000u ? std::ldexp(1.0, 128) : std::fabs(double(f_of(hi)));
  const double below = dx - dlo, above = dhi - dx;
  if (below < above) return lo;
  if (above < below) return hi;
  return (lo & 0x10000u) ? hi : lo;  // tie: even mantissa
}

}  // namespace

TEST(RoundToBf16, EveryTopHalfWithTheDecidingLowHalves) {
  // For every one of the 65536 top halves (every sign, exponent and BF16
  // mantissa, including subnormals, Inf and NaN), the low halves that decide
  // the rounding: exact, just above, just below, at and just above the
  // midpoint, and the largest.
  const uint32_t lows[] = {0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x4000, 0xC000};
  std::vector<float> x;
  for (uint32_t top = 0; top < 65536; ++top)
    for (uint32_t low : lows) x.push_back(f_of((top << 16) | low));
  std::vector<float> y(x.size());
  round_to_bf16(x.data(), y.data(), int64_t(x.size()));
  int64_t bad = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (u_of(y[i]) != expected(u_of(x[i])) && bad++ < 5)
      ADD_FAILURE() << std::hex << "x " << u_of(x[i]) << ": got " << u_of(y[i]) << ", expected " << expected(u_of(x[i]));
  }
  EXPECT_EQ(bad, 0);
}

TEST(RoundToBf16, HandDerivedValues) {
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even give 1;
  // 1 + 3·2^-8 goes to 1 + 2^-6 (even); the largest FP32 overflows to Inf;
  // BF16's largest finite value 0x7F7F0000 stays.
  const float in[] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -(1.0f + 0x1p-8f + 0x1p-20f),
                      std::numeric_limits<float>::max(), f_of(0x7F7F0000u), 0x1p-149f, -0.0f};
  const float want[] = {1.0f, 1.0f + 0x1p-6f, -(1.0f + 0x1p-7f), std::numeric_limits<float>::infinity(),
                        f_of(0x7F7F0000u), 0x1p-149f * 0, -0.0f};
  float out[7];
  round_to_bf16(in, out, 7);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(u_of(out[i]), u_of(want[i])) << i;
}

TEST(RoundToBf16, InPlaceAndLongArraysMatchElementwise) {
  // Longer than the parallel threshold (2^16), odd length, in place.
  std::vector<float> x(300007);
  uint32_t s = 12345;
  for (auto& v : x) {
    s = s * 1664525u + 1013904223u;
    v = f_of((s & 0x807FFFFFu) | (0x30000000u + (s >> 9 & 0x1F800000u)));  // wide exponent range
  }
  std::vector<float> y = x;
  round_to_bf16(y.data(), y.data(), int64_t(y.size()));
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(u_of(y[i]), expected(u_of(x[i]))) << i;
}
