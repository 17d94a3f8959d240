// Element formats: every code of every format of <= 8 bits (and all of
// BF16) against an independent formula-based decoder and pinned tables;
// round trips; RNE at every midpoint and its float neighbours; saturation vs
// NaN/Inf per format; pinned limits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "snip/formats/element_format.h"
#include "snip/formats/integer.h"
#include "snip/formats/minifloat.h"
#include "snip/formats/posit.h"
#include "snip/core/error.h"
#include "test_util.h"

namespace snip::formats {
namespace {

const double kInf = std::numeric_limits<double>::infinity();

// ---------------------------------------------------------------------------
// Independent decoders (written from the specs, not from ElementFormat).
// ---------------------------------------------------------------------------
enum class Special { kNone, kFn, kIeee };
struct RefFloat {
  const ElementFormat* fmt;
  int e, m, bias;
  Special sp;
};

const std::vector<RefFloat>& ref_floats() {
  static const std::vector<RefFloat> v = {
      {&kE2M1, 2, 1, 1, Special::kNone}, {&kE1M2, 1, 2, 1, Special::kNone},
      {&kE2M3, 2, 3, 1, Special::kNone}, {&kE3M2, 3, 2, 3, Special::kNone},
      {&kE4M3, 4, 3, 7, Special::kFn},   {&kE5M2, 5, 2, 15, Special::kIeee},
      {&kBF16, 8, 7, 127, Special::kIeee}};
  return v;
}

double ref_float_decode(const RefFloat& f, uint32_t code) {
  const int s = int(code >> (f.e + f.m)) & 1;
  const int E = int(code >> f.m) & ((1 << f.e) - 1);
  const int M = int(code) & ((1 << f.m) - 1);
  const double sign = s ? -1.0 : 1.0;
  if (f.sp == Special::kIeee && E == (1 << f.e) - 1) return M == 0 ? sign * kInf : NAN;
  if (f.sp == Special::kFn && E == (1 << f.e) - 1 && M == (1 << f.m) - 1) return NAN;
  if (E == 0) return sign * std::pow(2.0, 1 - f.bias) * (M / std::pow(2.0, f.m));
  return sign * std::pow(2.0, E - f.bias) * (1.0 + M / std::pow(2.0, f.m));
}

// Posit decoder working on the bit string as text.
double ref_posit_decode(uint32_t code, int n, int es) {
  if (code == 0) return 0.0;
  if (code == (1u << (n - 1))) return NAN;
  const bool neg = (code >> (n - 1)) & 1u;
  if (neg) code = (1u << n) - code;
  std::string s;
  for (int i = n - 2; i >= 0; --i) s += ((code >> i) & 1u) ? '1' : '0';
  size_t run = s.find_first_not_of(s[0]);
  if (run == std::string::npos) run = s.size();
  const int k = s[0] == '1' ? int(run) - 1 : -int(run);
  const std::string rest = run + 1 <= s.size() ? s.substr(run + 1) : "";
  std::string ebits = rest.substr(0, std::min<size_t>(rest.size(), size_t(es)));
  while (int(ebits.size()) < es) ebits += '0';
  const int e = es ? std::stoi(ebits, nullptr, 2) : 0;
  double f = 0.0;
  for (size_t i = size_t(es); i < rest.size(); ++i)
    if (rest[i] == '1') f += std::pow(2.0, -double(i - size_t(es) + 1));
  return (neg ? -1.0 : 1.0) * std::pow(2.0, k * (1 << es) + e) * (1.0 + f);
}

double ref_int_decode(uint32_t code, int bits) {
  const int v = int(code);
  return (v & (1 << (bits - 1))) ? v - (1 << bits) : v;
}

bool same_value(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && std::signbit(a) == std::signbit(b);
}

// ---------------------------------------------------------------------------
// Decoding
// ---------------------------------------------------------------------------
TEST(ElementFormat, EveryCodeDecodesLikeTheIndependentDecoder) {
  for (const RefFloat& rf : ref_floats())
    for (uint32_t c = 0; c < rf.fmt->num_codes(); ++c)
      ASSERT_TRUE(same_value(decode(*rf.fmt, c), ref_float_decode(rf, c)))
          << rf.fmt->name << " code 0x" << std::hex << c;
  for (uint32_t c = 0; c < 256; ++c)
    ASSERT_TRUE(same_value(decode(kPosit8, c), ref_posit_decode(c, 8, 2))) << "posit8 " << c;
  for (uint32_t c = 0; c < 256; ++c) ASSERT_EQ(decode(kInt8, c), ref_int_decode(c, 8)) << c;
  for (uint32_t c = 0; c < 16; ++c) ASSERT_EQ(decode(kInt4, c), ref_int_decode(c, 4)) << c;
}

TEST(ElementFormat, PinnedTables) {
  const std::map<const ElementFormat*, std::vector<double>> positives = {
      {&kE2M1, {0, 0.5, 1, 1.5, 2, 3, 4, 6}},
      {&kE1M2, {0, 0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75}},
      {&kE2M3, {0,    0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1,   1.125, 1.25,
                1.375, 1.5,  1.625, 1.75, 1.875, 2, 2.25, 2.5,  2.75,  3,   3.25,
                3.5,  3.75, 4,     4.5,  5,     5.5, 6,    6.5,  7,     7.5}},
      {&kE3M2, {0,     0.0625, 0.125, 0.1875, 0.25, 0.3125, 0.375, 0.4375, 0.5, 0.625, 0.75,
                0.875, 1,      1.25,  1.5,    1.75, 2,      2.5,   3,      3.5, 4,     5,
                6,     7,      8,     10,     12,   14,     16,    20,     24,  28}},
  };
  for (const auto& [fmt, vals] : positives) {
    ASSERT_EQ(vals.size(), fmt->num_codes() / 2) << fmt->name;
    for (uint32_t c = 0; c < vals.size(); ++c) {
      EXPECT_EQ(decode(*fmt, c), vals[c]) << fmt->name << " code " << c;
      EXPECT_EQ(decode(*fmt, c | fmt->sign_mask()), -vals[c]) << fmt->name << " code " << c;
    }
  }
  struct Pin {
    const ElementFormat* f;
    uint32_t code;
    double value;
  };
  const std::vector<Pin> pins = {
      {&kE4M3, 0x00, 0.0},         {&kE4M3, 0x01, std::ldexp(1, -9)}, {&kE4M3, 0x07, 7 * std::ldexp(1, -9)},
      {&kE4M3, 0x08, std::ldexp(1, -6)}, {&kE4M3, 0x38, 1.0},        {&kE4M3, 0x40, 2.0},
      {&kE4M3, 0x7E, 448.0},       {&kE4M3, 0xFE, -448.0},           {&kE4M3, 0x77, 240.0},
      {&kE5M2, 0x3C, 1.0},         {&kE5M2, 0x01, std::ldexp(1, -16)}, {&kE5M2, 0x04, std::ldexp(1, -14)},
      {&kE5M2, 0x7B, 57344.0},     {&kE5M2, 0x7C, kInf},             {&kE5M2, 0xFC, -kInf},
      {&kBF16, 0x3F80, 1.0},       {&kBF16, 0x0001, std::ldexp(1, -133)}, {&kBF16, 0x7F80, kInf},
      {&kBF16, 0x7F7F, std::ldexp(255.0, 120)}, {&kBF16, 0xC040, -3.0},
      {&kPosit8, 0x40, 1.0},       {&kPosit8, 0x44, 1.5},            {&kPosit8, 0x48, 2.0},
      {&kPosit8, 0x50, 4.0},       {&kPosit8, 0x60, 16.0},           {&kPosit8, 0x20, 1.0 / 16},
      {&kPosit8, 0x7C, 65536.0},   {&kPosit8, 0x7D, 262144.0},       {&kPosit8, 0x7E, std::ldexp(1, 20)},
      {&kPosit8, 0x7F, std::ldexp(1, 24)}, {&kPosit8, 0x01, std::ldexp(1, -24)}, {&kPosit8, 0xC0, -1.0},
      {&kPosit8, 0xFF, -std::ldexp(1, -24)},
      {&kInt8, 0x7F, 127},         {&kInt8, 0x81, -127},             {&kInt8, 0x80, -128},
      {&kInt8, 0xFF, -1},          {&kInt4, 0x7, 7},                 {&kInt4, 0x9, -7},
      {&kInt4, 0xF, -1},
  };
  for (const Pin& p : pins)
    EXPECT_EQ(decode(*p.f, p.code), p.value) << p.f->name << " 0x" << std::hex << p.code;
  // NaN codes and negative zero.
  for (uint32_t c : {0x7Fu, 0xFFu}) EXPECT_TRUE(std::isnan(decode(kE4M3, c)) && is_nan_code(kE4M3, c));
  for (uint32_t c : {0x7Du, 0x7Eu, 0x7Fu, 0xFDu}) EXPECT_TRUE(is_nan_code(kE5M2, c));
  EXPECT_TRUE(is_inf_code(kE5M2, 0x7C) && is_inf_code(kE5M2, 0xFC) && !is_nan_code(kE5M2, 0x7C));
  EXPECT_TRUE(std::isnan(decode(kPosit8, 0x80)) && is_nan_code(kPosit8, 0x80));
  for (const ElementFormat* f : {&kE2M1, &kE1M2, &kE2M3, &kE3M2, &kE4M3, &kE5M2}) {
    const float nz = decode(*f, f->sign_mask());
    EXPECT_TRUE(nz == 0.0f && std::signbit(nz)) << f->name;
  }
  int nan_count = 0;
  for (uint32_t c = 0; c < 256; ++c) nan_count += is_nan_code(kE4M3, c);
  EXPECT_EQ(nan_count, 2);  // only S.1111.111
}

TEST(ElementFormat, PinnedLimits) {
  struct Lim {
    const ElementFormat* f;
    double max, min_normal, min_sub;
    bool inf, nan;
  };
  const std::vector<Lim> lims = {
      {&kE2M1, 6, 1, 0.5, false, false},
      {&kE1M2, 1.75, 1, 0.25, false, false},
      {&kE2M3, 7.5, 1, 0.125, false, false},
      {&kE3M2, 28, 0.25, 0.0625, false, false},
      {&kE4M3, 448, std::ldexp(1, -6), std::ldexp(1, -9), false, true},
      {&kE5M2, 57344, std::ldexp(1, -14), std::ldexp(1, -16), true, true},
      {&kBF16, std::ldexp(255.0, 120), std::ldexp(1, -126), std::ldexp(1, -133), true, true},
      {&kPosit8, std::ldexp(1, 24), std::ldexp(1, -24), std::ldexp(1, -24), false, true},
      {&kInt8, 127, 1, 1, false, false},
      {&kInt4, 7, 1, 1, false, false},
  };
  for (const Lim& l : lims) {
    EXPECT_EQ(l.f->max_value(), l.max) << l.f->name;
    EXPECT_EQ(l.f->min_normal(), l.min_normal) << l.f->name;
    EXPECT_EQ(l.f->min_subnormal(), l.min_sub) << l.f->name;
    EXPECT_EQ(l.f->has_inf, l.inf) << l.f->name;
    EXPECT_EQ(l.f->has_nan(), l.nan) << l.f->name;
    // The largest / smallest codes really decode to these limits.
    EXPECT_EQ(decode(*l.f, l.f->max_code()), l.max) << l.f->name;
    float largest = 0, smallest_pos = INFINITY;
    for (uint32_t c = 0; c < l.f->num_codes(); ++c) {
      const float v = decode(*l.f, c);
      if (std::isfinite(v)) largest = std::max(largest, v);
      if (v > 0) smallest_pos = std::min(smallest_pos, v);
    }
    EXPECT_EQ(largest, l.max) << l.f->name;
    EXPECT_EQ(smallest_pos, l.min_sub) << l.f->name;
  }
  EXPECT_EQ(kE4M3.mantissa_mask(), 0x7u);
  EXPECT_EQ(kE4M3.exponent_mask(), 0x78u);
  EXPECT_EQ(kE5M2.exponent_mask(), 0x7Cu);
  EXPECT_EQ(kE2M1.sign_mask(), 0x8u);
}

// ---------------------------------------------------------------------------
// Encoding
// ---------------------------------------------------------------------------
std::vector<const ElementFormat*> all_formats() {
  return {&kE2M1, &kE1M2, &kE2M3, &kE3M2, &kE4M3, &kE5M2, &kBF16, &kPosit8, &kInt8, &kInt4};
}

TEST(ElementFormat, EveryCodeRoundTrips) {
  for (const ElementFormat* f : all_formats())
    for (uint32_t c = 0; c < f->num_codes(); ++c) {
      const float v = decode(*f, c);
      const uint32_t back = encode(*f, v);
      if (is_nan_code(*f, c)) {
        EXPECT_TRUE(is_nan_code(*f, back)) << f->name << " " << c;
      } else if (f->kind == ElementKind::kInt && c == f->sign_mask()) {
        EXPECT_EQ(back, f->sign_mask() | 1u) << "most negative INT saturates to -max";
      } else {
        EXPECT_EQ(back, c) << f->name << " code 0x" << std::hex << c;
      }
    }
}

// Sorted finite non-negative (value, code) pairs of a format.
std::vector<std::pair<double, uint32_t>> grid(const ElementFormat& f) {
  std::vector<std::pair<double, uint32_t>> g;
  for (uint32_t c = 0; c < f.num_codes(); ++c) {
    const double v = decode(f, c);
    if (std::isfinite(v) && v >= 0 && !(v == 0 && std::signbit(v))) g.push_back({v, c});
  }
  std::sort(g.begin(), g.end());
  return g;
}

TEST(ElementFormat, RneAtEveryMidpointAndNeighbours) {
  for (const ElementFormat* f : all_formats()) {
    const auto g = grid(*f);
    for (size_t i = 0; i + 1 < g.size(); ++i) {
      const auto [lo, clo] = g[i];
      const auto [hi, chi] = g[i + 1];
      // Posits never round a nonzero value to 0: no tie between 0 and minpos.
      if (f->kind == ElementKind::kPosit && lo == 0.0) continue;
      float mid;
      if (f->kind == ElementKind::kPosit) {
        // The standard rounds on the bit string: the tie is the (n+1)-bit
        // posit between the two codes.
        mid = float(ref_posit_decode((clo << 1) | 1u, 9, 2));
      } else {
        mid = float((lo + hi) / 2);
        ASSERT_EQ(double(mid), (lo + hi) / 2) << "midpoint not exact in FP32";
      }
      ASSERT_GT(mid, lo);
      ASSERT_LT(mid, hi);
      const uint32_t even = (clo & 1u) == 0 ? clo : chi;
      ASSERT_EQ(chi & 1u, even == clo ? 1u : 0u) << f->name << ": neighbours of equal parity";
      EXPECT_EQ(encode(*f, mid), even) << f->name << " tie at " << mid;
      EXPECT_EQ(encode(*f, std::nextafter(mid, 0.0f)), clo) << f->name << " below " << mid;
      EXPECT_EQ(encode(*f, std::nextafter(mid, INFINITY)), chi) << f->name << " above " << mid;
      // Negative side mirrors (float/posit sign symmetry; INT two's complement).
      const uint32_t neg_even = encode(*f, -mid);
      EXPECT_EQ(decode(*f, neg_even), -decode(*f, even)) << f->name << " tie at " << -mid;
    }
  }
}

TEST(ElementFormat, PositStandardRoundingExample) {
  // 144179.2 lies between 65536 (0x7C) and 262144 (0x7D); the 9-bit
  // midpoint is 131072, so the standard rounds it up (arithmetic nearest
  // would give 65536).
  EXPECT_EQ(encode(kPosit8, 144179.2f), 0x7Du);
  EXPECT_EQ(encode(kPosit8, 131072.0f), 0x7Cu);  // the tie: even code
  EXPECT_EQ(encode(kPosit8, std::ldexp(1.0f, 22)), 0x7Eu);  // 2^22: tie between 2^20 and 2^24
  EXPECT_EQ(encode(kPosit8, std::ldexp(1.0f, 23)), 0x7Fu);
  // Never to zero, never to NaR.
  EXPECT_EQ(encode(kPosit8, 1e-30f), 0x01u);
  EXPECT_EQ(encode(kPosit8, -1e-30f), 0xFFu);
  EXPECT_EQ(encode(kPosit8, 1e30f), 0x7Fu);
  EXPECT_EQ(encode(kPosit8, -1e30f), 0x81u);
  EXPECT_EQ(encode(kPosit8, 0.0f), 0x00u);
  EXPECT_EQ(encode(kPosit8, -0.0f), 0x00u);
}

TEST(ElementFormat, SaturationVersusInfNan) {
  const float inf = INFINITY, nan = NAN;
  struct Case {
    const ElementFormat* f;
    float x;
    bool saturate;
    uint32_t code;
  };
  const std::vector<Case> cases = {
      // E4M3: no Inf. Saturating -> +-448; IEEE-style -> NaN.
      {&kE4M3, 1e6f, true, 0x7E},  {&kE4M3, -1e6f, true, 0xFE}, {&kE4M3, inf, true, 0x7E},
      {&kE4M3, -inf, true, 0xFE},  {&kE4M3, 1e6f, false, 0x7F}, {&kE4M3, inf, false, 0x7F},
      {&kE4M3, nan, true, 0x7F},   {&kE4M3, -nan, true, 0xFF},
      {&kE4M3, 464.0f, false, 0x7E},  // tie 448|480: even mantissa 110 -> 448
      {&kE4M3, std::nextafter(464.0f, inf), false, 0x7F},
      {&kE4M3, std::nextafter(464.0f, inf), true, 0x7E},
      // E5M2: Inf kept; saturating clamps finite overflow only.
      {&kE5M2, 1e6f, true, 0x7B},  {&kE5M2, inf, true, 0x7C},   {&kE5M2, -inf, true, 0xFC},
      {&kE5M2, 1e6f, false, 0x7C}, {&kE5M2, nan, true, 0x7E},
      {&kE5M2, 61440.0f, false, 0x7C},  // tie 57344|65536: odd mantissa 11 -> up -> Inf
      {&kE5M2, std::nextafter(61440.0f, 0.0f), false, 0x7B},
      {&kE5M2, 61440.0f, true, 0x7B},
      // FP4/FP6: no Inf/NaN: always the max; NaN -> negative zero (ml_dtypes).
      {&kE2M1, 100.0f, true, 0x7},   {&kE2M1, 100.0f, false, 0x7}, {&kE2M1, -inf, true, 0xF},
      {&kE2M1, 7.0f, true, 0x7},     {&kE2M1, nan, true, 0x8},     {&kE1M2, 1.9f, true, 0x7},
      {&kE2M3, 1e9f, false, 0x1F},   {&kE3M2, -inf, false, 0x3F},
      // BF16: FLT_MAX rounds past the BF16 max.
      {&kBF16, 3.4028235e38f, false, 0x7F80}, {&kBF16, 3.4028235e38f, true, 0x7F7F},
      {&kBF16, inf, true, 0x7F80},            {&kBF16, nan, false, 0x7FC0},
      // Integers.
      {&kInt8, 1000.0f, true, 0x7F}, {&kInt8, -1000.0f, true, 0x81}, {&kInt8, inf, true, 0x7F},
      {&kInt8, nan, true, 0x00},     {&kInt8, 2.5f, true, 0x02},     {&kInt8, -2.5f, true, 0xFE},
      {&kInt4, 7.5f, true, 0x7},     {&kInt4, -9.0f, true, 0x9},
      // Posit: NaN and Inf -> NaR.
      {&kPosit8, inf, true, 0x80},   {&kPosit8, nan, true, 0x80},
  };
  for (const Case& c : cases)
    EXPECT_EQ(encode(*c.f, c.x, Rounding::kRNE, 0, c.saturate), c.code)
        << c.f->name << " x=" << c.x << " saturate=" << c.saturate;
}

TEST(ElementFormat, SubnormalsAndSignedZero) {
  // E4M3: 2^-10 is the tie between 0 and 2^-9 -> 0 (even); just above -> 2^-9.
  EXPECT_EQ(encode(kE4M3, std::ldexp(1.0f, -10)), 0x00u);
  EXPECT_EQ(encode(kE4M3, std::nextafter(std::ldexp(1.0f, -10), 1.0f)), 0x01u);
  EXPECT_EQ(encode(kE4M3, 3 * std::ldexp(1.0f, -10)), 0x02u);  // 1.5 * 2^-9: tie -> 2 * 2^-9
  EXPECT_EQ(encode(kE4M3, -std::ldexp(1.0f, -12)), 0x80u);     // -0
  EXPECT_EQ(encode(kE4M3, 7.5f * std::ldexp(1.0f, -9)), 0x08u); // rounds up into the normals
  EXPECT_EQ(encode(kE5M2, std::ldexp(1.0f, -16)), 0x01u);
  // BF16 keeps FP32 subnormals: 2^-133 exactly, 2^-134 ties to 0.
  EXPECT_EQ(encode(kBF16, std::ldexp(1.0f, -133)), 0x0001u);
  EXPECT_EQ(encode(kBF16, std::ldexp(1.0f, -134)), 0x0000u);
  EXPECT_EQ(encode(kBF16, std::ldexp(3.0f, -134)), 0x0002u);
  EXPECT_EQ(encode(kInt8, -0.3f), 0x00u);  // a single zero
}

TEST(ElementFormat, StochasticRoundingDecisionRule) {
  // E2M1: 2.5 lies halfway between 2 and 3: frac = 0.5; rounds up iff u < 0.5
  // with u = (bits >> 8) * 2^-24.
  EXPECT_EQ(encode(kE2M1, 2.5f, Rounding::kStochastic, 0x7FFFFF00u), 0x5u);  // u just below 1/2
  EXPECT_EQ(encode(kE2M1, 2.5f, Rounding::kStochastic, 0x80000000u), 0x4u);  // u = 1/2
  // Exact values never move.
  for (uint32_t r : {0u, 0xFFFFFFFFu, 0x12345678u}) EXPECT_EQ(encode(kE4M3, 3.0f, Rounding::kStochastic, r), 0x44u);
  // INT: floor(-2.25) = -3, frac 0.75.
  EXPECT_EQ(decode(kInt8, encode(kInt8, -2.25f, Rounding::kStochastic, 0xBFFFFF00u)), -2.0f);
  EXPECT_EQ(decode(kInt8, encode(kInt8, -2.25f, Rounding::kStochastic, 0xC0000000u)), -3.0f);
}

TEST(ElementFormat, Registry) {
  EXPECT_EQ(find_element_format("E4M3"), kE4M3);
  EXPECT_EQ(find_element_format("posit8"), kPosit8);
  ASSERT_TRUE(lookup_element_format("E5M2").has_value());
  EXPECT_EQ(*lookup_element_format("E5M2"), kE5M2);
  EXPECT_FALSE(lookup_element_format("fp5").has_value());  // no error: the caller decides
  const auto names = element_format_names();
  for (const char* n : {"bf16", "e1m2", "e2m1", "e2m3", "e3m2", "e4m3", "e5m2", "int4", "int8", "posit8"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  try {
    find_element_format("fp5");
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown element format 'fp5'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("e4m3"), std::string::npos);
  }
  // A new format plugs in by registering its traits: E3M4 (bias 3, "fn" style).
  const ElementFormat e3m4{"e3m4", ElementKind::kFloat, 8, 3, 4, 3, false, NanEncoding::kAllOnes};
  register_element_format(e3m4);
  const ElementFormat got = find_element_format("e3m4");
  EXPECT_EQ(got.max_value(), 30.0);  // 2^(7-3) * (1 + 14/16)
  EXPECT_EQ(decode(got, encode(got, 15.0f)), 15.0f);
  register_element_format(e3m4);  // same traits again: fine
  const ElementFormat clash{"e3m4", ElementKind::kFloat, 8, 4, 3, 7, false, NanEncoding::kAllOnes};
  EXPECT_THROW(register_element_format(clash), UserError);
  const ElementFormat bad{"bad", ElementKind::kFloat, 8, 4, 4, 7, false, NanEncoding::kNone};
  EXPECT_THROW(register_element_format(bad), UserError);  // bits != 1 + e + m
}

}  // namespace
}  // namespace snip::formats
