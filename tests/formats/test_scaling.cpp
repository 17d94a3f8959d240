// Scaling schemes: hand-derived scales from the OCP MX spec (floor rule and
// RCEIL), NVFP4 (TE formulas), FP32 and power-of-two current scaling;
// all-zero, NaN/Inf and subnormal-only blocks; fast block_scale equals the
// reference twin over a sweep; delayed scaling's history rules.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <random>
#include <vector>

#include "snip/formats/fake_quant.h"
#include "snip/formats/integer.h"
#include "snip/formats/minifloat.h"
#include "snip/formats/posit.h"
#include "snip/core/error.h"
#include "test_util.h"

namespace snip::formats {
namespace {

using testing::bits_equal;
using testing::fbits;

QuantSpec make(const ElementFormat& e, ScaleRule rule, ScaleFormat sf, BlockShape b,
               Rounding r = Rounding::kRNE) {
  QuantSpec s;
  s.element = e;
  s.rule = rule;
  s.scale_format = sf;
  s.block = b;
  s.rounding = r;
  return s;
}

const QuantSpec kMxfp4 = make(kE2M1, ScaleRule::kMxFloor, ScaleFormat::kE8M0, BlockShape::tile(32));
const QuantSpec kMxfp8 = make(kE4M3, ScaleRule::kMxFloor, ScaleFormat::kE8M0, BlockShape::tile(32));
const QuantSpec kMxfp4Rceil =
    make(kE2M1, ScaleRule::kCurrent, ScaleFormat::kE8M0, BlockShape::tile(32));
const QuantSpec kNvfp4 = make(kE2M1, ScaleRule::kTwoLevel, ScaleFormat::kE4M3, BlockShape::tile(16));
const QuantSpec kFp8Pow2 =
    make(kE4M3, ScaleRule::kCurrent, ScaleFormat::kFP32Pow2, BlockShape::tile(128));
const QuantSpec kFp8Fp32 = make(kE4M3, ScaleRule::kCurrent, ScaleFormat::kFP32, BlockShape::tile(16));

std::vector<float> fq(const std::vector<float>& x, int64_t rows, int64_t cols, const QuantSpec& s,
                      QuantStats* st = nullptr) {
  std::vector<float> y(x.size()), yr(x.size());
  fake_quantize(x.data(), y.data(), rows, cols, s, RoundingKey{}, st);
  fake_quantize_reference(x.data(), yr.data(), rows, cols, s, RoundingKey{});
  EXPECT_TRUE(bits_equal(y, yr, cols));
  return y;
}

TEST(Scaling, MxFloorRuleHandDerived) {
  // E2M1, emax_elem = 2. amax = 7.9: floor(log2 7.9) = 2 -> X = 2^(2-2) = 1,
  // E8M0 code 127. Elements: 7.9 -> 6 (saturates), 0.26 -> 0.5, -2.4 -> -2.
  const BlockScale s = block_scale(7.9f, kMxfp4);
  EXPECT_EQ(s.decode, 1.0f);
  EXPECT_EQ(s.code, 127u);
  std::vector<float> x(32, 0.0f);
  x[0] = 7.9f, x[1] = 0.26f, x[2] = -2.4f, x[3] = 0.25f, x[4] = 2.5f;
  QuantStats st;
  const auto y = fq(x, 1, 32, kMxfp4, &st);
  EXPECT_EQ(y[0], 6.0f);
  EXPECT_EQ(y[1], 0.5f);
  EXPECT_EQ(y[2], -2.0f);
  EXPECT_EQ(y[3], 0.0f);  // tie 0 | 0.5 -> 0 (even)
  EXPECT_EQ(y[4], 2.0f);  // tie 2 | 3 -> 2 (even)
  EXPECT_EQ(st.saturated, 1);
  EXPECT_EQ(st.underflow, 1);
  // E4M3, emax_elem = 8: amax = 1 -> X = 2^-8 (code 119); 0.7 * 256 = 179.2 ->
  // 176 on the E4M3 grid (step 16 in [128, 256)) -> 0.6875.
  EXPECT_EQ(block_scale(1.0f, kMxfp8).code, 119u);
  EXPECT_EQ(block_scale(1.0f, kMxfp8).decode, std::ldexp(1.0f, -8));
  std::vector<float> x8(32, 0.0f);
  x8[0] = 1.0f, x8[1] = 0.7f;
  const auto y8 = fq(x8, 1, 32, kMxfp8);
  EXPECT_EQ(y8[0], 1.0f);
  EXPECT_EQ(y8[1], 0.6875f);
  // The largest block: amax = FLT_MAX -> floor(log2) = 127 -> 2^125 (code 252).
  EXPECT_EQ(block_scale(FLT_MAX, kMxfp4).code, 252u);
}

TEST(Scaling, MxRceilRoundsTheScaleUp) {
  // amax = 7.9: ceil(log2(7.9 / 6)) = 1 -> X = 2 (code 128); 7.9/2 = 3.95 -> 4 -> 8.
  const BlockScale s = block_scale(7.9f, kMxfp4Rceil);
  EXPECT_EQ(s.code, 128u);
  EXPECT_EQ(s.decode, 2.0f);
  EXPECT_EQ(block_scale(6.0f, kMxfp4Rceil).code, 127u);  // exactly 6 * 2^0
  EXPECT_EQ(block_scale(std::nextafter(6.0f, 7.0f), kMxfp4Rceil).code, 128u);
  EXPECT_EQ(block_scale(3.0f, kMxfp4Rceil).code, 126u);  // 6 * 2^-1 = 3
  std::vector<float> x(32, 0.0f);
  x[0] = 7.9f;
  QuantStats st;
  const auto y = fq(x, 1, 32, kMxfp4Rceil, &st);
  EXPECT_EQ(y[0], 8.0f);
  EXPECT_EQ(st.saturated, 0);
}

TEST(Scaling, ZeroNanInfAndSubnormalBlocks) {
  // All-zero block: OCP floor rule uses floor(log2(2^-126)) (microxcaling):
  // E2M1 -> -128 -> clamped to -127 (code 0); E1M2 (emax 0) -> -126 (code 1).
  EXPECT_EQ(block_scale(0.0f, kMxfp4).code, 0u);
  QuantSpec mx_e1m2 = kMxfp4;
  mx_e1m2.element = kE1M2;
  EXPECT_EQ(block_scale(0.0f, mx_e1m2).code, 1u);
  EXPECT_EQ(block_scale(0.0f, kMxfp4Rceil).code, 0u);
  EXPECT_EQ(block_scale(0.0f, kFp8Pow2).decode, 1.0f);
  EXPECT_EQ(block_scale(0.0f, kFp8Fp32).decode, 1.0f);
  // NaN / Inf: NaN scale (E8M0 0xFF), the whole block NaN, neighbours intact.
  EXPECT_EQ(block_scale(NAN, kMxfp4).code, 0xFFu);
  EXPECT_EQ(block_scale(INFINITY, kMxfp4).code, 0xFFu);
  EXPECT_TRUE(std::isnan(block_scale(INFINITY, kFp8Fp32).decode));
  for (const QuantSpec& spec : {kMxfp4, kMxfp8, kMxfp4Rceil, kFp8Fp32}) {
    for (float bad : {NAN, INFINITY, -INFINITY}) {
      std::vector<float> x(64, 1.0f);
      x[5] = bad;
      const auto y = fq(x, 1, 64, spec);
      const int64_t bc = spec.block.cols;
      for (int64_t i = 0; i < 64; ++i) {
        if (i < bc) {
          EXPECT_EQ(fbits(y[size_t(i)]), 0x7FC00000u) << spec.describe() << " i=" << i;
        } else {
          EXPECT_EQ(y[size_t(i)], 1.0f) << spec.describe() << " i=" << i;
        }
      }
    }
  }
  // Zero blocks stay exactly zero (no 0 * Inf NaN), signs kept.
  std::vector<float> z(64, 0.0f);
  z[3] = -0.0f;
  for (const QuantSpec& spec : {kMxfp4, kMxfp8, kMxfp4Rceil, kFp8Fp32, kFp8Pow2, kNvfp4}) {
    const auto y = fq(z, 1, 64, spec);
    for (size_t i = 0; i < 64; ++i) EXPECT_EQ(fbits(y[i]), fbits(z[i])) << spec.describe();
  }
  // Subnormal-only block: amax = 2^-140 (FP32 subnormal). MX floor: -140-2 ->
  // clamped to 2^-127 -> elements 2^-13 -> below E2M1's 0.5: flushed to 0.
  EXPECT_EQ(block_scale(std::ldexp(1.0f, -140), kMxfp4).code, 0u);
  std::vector<float> sub(32, std::ldexp(1.0f, -140));
  QuantStats st;
  const auto ys = fq(sub, 1, 32, kMxfp4, &st);
  for (float v : ys) EXPECT_EQ(v, 0.0f);
  EXPECT_EQ(st.underflow, 32);
  // ... but E5M2 (min subnormal 2^-16) with power-of-two scales keeps 2^-130
  // exactly: 57344 / 2^-130 overflows FP32, so TE's encode scale is FLT_MAX,
  // rounded down to 2^127 (d = 2^-127): 2^-130 * 2^127 = 2^-3.
  const QuantSpec e5 = make(kE5M2, ScaleRule::kCurrent, ScaleFormat::kFP32Pow2, BlockShape::tile(32));
  EXPECT_EQ(block_scale(std::ldexp(1.0f, -130), e5).decode, std::ldexp(1.0f, -127));
  EXPECT_EQ(block_scale(std::ldexp(1.0f, -130), e5).encode, std::ldexp(1.0f, 127));
  std::vector<float> sub2(32, std::ldexp(1.0f, -130));
  sub2[1] = std::ldexp(-3.0f, -132);
  const auto y2 = fq(sub2, 1, 32, e5);
  EXPECT_EQ(y2[0], std::ldexp(1.0f, -130));
  EXPECT_EQ(y2[1], std::ldexp(-3.0f, -132));
}

TEST(Scaling, CurrentScalingFp32AndPow2) {
  // FP32 (TE compute_scale_from_amax): m = 448 / amax, d = 1 / m.
  EXPECT_EQ(block_scale(896.0f, kFp8Fp32).decode, 2.0f);
  EXPECT_EQ(block_scale(896.0f, kFp8Fp32).encode, 0.5f);
  EXPECT_EQ(block_scale(1.0f, kFp8Fp32).encode, 448.0f);
  EXPECT_EQ(block_scale(1.0f, kFp8Fp32).decode, 1.0f / 448.0f);
  // 448 / 11 = 40.72727203 (rounded), 1 / that = 0.02455357276 (rounded
  // twice), one ulp above fl(11 / 448) = 0.0245535709: the order is TE's.
  EXPECT_EQ(block_scale(11.0f, kFp8Fp32).encode, 448.0f / 11.0f);
  EXPECT_EQ(block_scale(11.0f, kFp8Fp32).decode, 1.0f / (448.0f / 11.0f));
  EXPECT_NE(block_scale(11.0f, kFp8Fp32).decode, 11.0f / 448.0f);
  // 448 / 1e-40 overflows: m = FLT_MAX, d = 1 / FLT_MAX (an FP32 subnormal).
  EXPECT_EQ(block_scale(1e-40f, kFp8Fp32).encode, FLT_MAX);
  EXPECT_EQ(block_scale(1e-40f, kFp8Fp32).decode, 1.0f / FLT_MAX);
  // Power of two rounded up: 448 -> 1, 449 -> 2, 224 -> 1/2, 225 -> 1.
  EXPECT_EQ(block_scale(448.0f, kFp8Pow2).decode, 1.0f);
  EXPECT_EQ(block_scale(449.0f, kFp8Pow2).decode, 2.0f);
  EXPECT_EQ(block_scale(224.0f, kFp8Pow2).decode, 0.5f);
  EXPECT_EQ(block_scale(225.0f, kFp8Pow2).decode, 1.0f);
  // FLT_MAX / 448 = 2^119.2 -> 2^120; with T = 1.75 (E1M2) 1.75 / FLT_MAX
  // is an FP32 subnormal (TE: undefined), taken as 2^-126: d = 2^126 (and
  // the elements saturate).
  EXPECT_EQ(block_scale(FLT_MAX, kFp8Pow2).decode, std::ldexp(1.0f, 120));
  QuantSpec e1m2_pow2 = kFp8Pow2;
  e1m2_pow2.element = kE1M2;
  EXPECT_EQ(block_scale(FLT_MAX, e1m2_pow2).decode, std::ldexp(1.0f, 126));
  // With the scale rounded up no element saturates: amax/d <= 448.
  std::mt19937 gen(7);
  for (int i = 0; i < 2000; ++i) {
    const float amax = std::ldexp(1.0f + float(gen() % 1000) / 1000.0f, int(gen() % 200) - 100);
    const BlockScale s = block_scale(amax, kFp8Pow2);
    EXPECT_LE(amax * s.encode, 448.0f);
    EXPECT_GT(amax * s.encode, 224.0f);
  }
  // Posit8 maps amax to 16 (its scale target).
  const QuantSpec p8 = make(kPosit8, ScaleRule::kCurrent, ScaleFormat::kFP32Pow2, BlockShape::tile(128));
  EXPECT_EQ(block_scale(16.0f, p8).decode, 1.0f);
  EXPECT_EQ(block_scale(17.0f, p8).decode, 2.0f);
  // INT8 per row: d = amax / 127.
  const QuantSpec i8 = make(kInt8, ScaleRule::kCurrent, ScaleFormat::kFP32, BlockShape::row());
  EXPECT_EQ(block_scale(254.0f, i8).decode, 2.0f);
}

TEST(Scaling, Nvfp4HandDerived) {
  // Tensor amax 2688 = 448 * 6 -> S_enc = 1, S_dec = 1.
  TensorScale t = two_level_tensor_scale(2688.0f, kNvfp4);
  EXPECT_EQ(t.encode, 1.0f);
  EXPECT_EQ(t.decode, 1.0f);
  // Block amax 6 -> s_b = 6/6 * 1 = 1 -> E4M3 0x38 -> d = 1.
  BlockScale b = block_scale(6.0f, kNvfp4, t);
  EXPECT_EQ(b.code, 0x38u);
  EXPECT_EQ(b.decode, 1.0f);
  // Block amax 12 -> 2 (0x40).
  EXPECT_EQ(block_scale(12.0f, kNvfp4, t).code, 0x40u);
  // Block amax 7 -> 7/6 = 1.1667 -> E4M3 grid step 1/8 -> 1.125 (0x39): the
  // scale rounds down, so 7 * (1/1.125) = 6.22 saturates to 6 -> 6.75.
  b = block_scale(7.0f, kNvfp4, t);
  EXPECT_EQ(b.code, 0x39u);
  EXPECT_EQ(b.decode, 1.125f);
  // A tensor with amax 1: S_enc = 2688, S_dec = 1/2688; block amax 1 ->
  // (1/6) * 2688 = 448.00002 -> E4M3 448 (0x7E) -> d = 448 * (1/2688).
  t = two_level_tensor_scale(1.0f, kNvfp4);
  EXPECT_EQ(t.encode, 2688.0f);
  EXPECT_EQ(t.decode, 1.0f / 2688.0f);
  b = block_scale(1.0f, kNvfp4, t);
  EXPECT_EQ(b.code, 0x7Eu);
  EXPECT_EQ(b.decode, 448.0f * (1.0f / 2688.0f));
  EXPECT_EQ(b.encode, 1.0f / (448.0f * (1.0f / 2688.0f)));
  // Tensor [2688 | 7 0 ... | zeros]: check the outputs.
  std::vector<float> x(48, 0.0f);
  x[0] = 2688.0f, x[1] = 1000.0f;
  x[16] = 7.0f, x[17] = 3.2f;
  const auto y = fq(x, 1, 48, kNvfp4);
  EXPECT_EQ(y[0], 2688.0f);   // 448 scale, element 6
  EXPECT_EQ(y[1], 896.0f);    // 1000/448 = 2.23 -> 2
  EXPECT_EQ(y[16], 6.75f);
  EXPECT_EQ(y[17], 3.375f);   // 3.2/1.125 = 2.84 -> 3 -> 3.375
  for (int i = 32; i < 48; ++i) EXPECT_EQ(y[size_t(i)], 0.0f);  // zero block: s_b = 0, d = 0
  // All-zero tensor: S_enc = 1 (TE), outputs 0.
  EXPECT_EQ(two_level_tensor_scale(0.0f, kNvfp4).encode, 1.0f);
  // A NaN or Inf anywhere: the tensor scale is NaN, the whole tensor NaN.
  EXPECT_TRUE(std::isnan(two_level_tensor_scale(INFINITY, kNvfp4).decode));
  x[40] = NAN;
  const auto yn = fq(x, 1, 48, kNvfp4);
  for (float v : yn) EXPECT_EQ(fbits(v), 0x7FC00000u);
  // A block far below the tensor amax underflows its E4M3 scale to 0:
  // amax_b * S_enc / 6 < 2^-10 -> d = 0 -> zeros.
  std::vector<float> x2(32, 0.0f);
  x2[0] = 2688.0f;
  x2[16] = 1e-4f;
  const auto y2 = fq(x2, 1, 32, kNvfp4);
  EXPECT_EQ(y2[16], 0.0f);
}

TEST(Scaling, FastEqualsReferenceOverASweep) {
  std::vector<float> amaxes = {0.0f, FLT_MIN, FLT_MAX, std::ldexp(1.0f, -149), std::ldexp(1.0f, -140),
                               1.0f, 6.0f, 448.0f, 57344.0f, 127.0f, 16.0f, 1.75f, INFINITY, NAN};
  std::mt19937 gen(3);
  for (int i = 0; i < 3000; ++i) {
    uint32_t b = gen() & 0x7FFFFFFFu;
    if (b >= 0x7F800000u) b &= 0x3FFFFFFFu;
    amaxes.push_back(testing::from_bits(b));
  }
  // Boundaries T * 2^k and their neighbours for every target.
  for (float t : {6.0f, 448.0f, 57344.0f, 127.0f, 16.0f, 1.75f, 7.5f, 28.0f})
    for (int k = -130; k < 120; k += 7) {
      const float v = std::ldexp(t, k);
      amaxes.insert(amaxes.end(), {v, std::nextafter(v, 0.0f), std::nextafter(v, INFINITY)});
    }
  std::vector<QuantSpec> specs;
  for (const ElementFormat* e : {&kE2M1, &kE1M2, &kE2M3, &kE3M2, &kE4M3, &kE5M2, &kPosit8, &kInt8, &kInt4}) {
    specs.push_back(make(*e, ScaleRule::kCurrent, ScaleFormat::kFP32, BlockShape::tile(16)));
    specs.push_back(make(*e, ScaleRule::kCurrent, ScaleFormat::kFP32Pow2, BlockShape::tile(16)));
    specs.push_back(make(*e, ScaleRule::kCurrent, ScaleFormat::kE8M0, BlockShape::tile(16)));
    specs.push_back(make(*e, ScaleRule::kMxFloor, ScaleFormat::kE8M0, BlockShape::tile(16)));
    specs.push_back(make(*e, ScaleRule::kTwoLevel, ScaleFormat::kE4M3, BlockShape::tile(16)));
  }
  for (const QuantSpec& s : specs)
    for (float tensor_amax : {2688.0f, 1.0f, 3e-30f, 0.0f}) {
      const TensorScale t = two_level_tensor_scale(tensor_amax, s);
      for (float a : amaxes) {
        if (s.rule == ScaleRule::kTwoLevel && a > tensor_amax) continue;
        const BlockScale f = block_scale(a, s, t), r = block_scale_reference(a, s, t);
        ASSERT_EQ(fbits(f.decode), fbits(r.decode)) << s.describe() << " amax=" << a;
        ASSERT_EQ(fbits(f.encode), fbits(r.encode)) << s.describe() << " amax=" << a;
        ASSERT_EQ(f.code, r.code) << s.describe() << " amax=" << a;
      }
    }
}

TEST(Scaling, DelayedScalingHistory) {
  QuantSpec s = make(kE4M3, ScaleRule::kDelayed, ScaleFormat::kFP32, BlockShape::tensor());
  s.amax_history_len = 3;
  s.scale_refresh_interval = 1;
  DelayedScaling d(s);
  EXPECT_FALSE(d.has_scale());
  d.record(448.0f);
  EXPECT_EQ(d.scale().decode, 1.0f);
  d.record(896.0f);
  EXPECT_EQ(d.scale().decode, 2.0f);
  d.record(224.0f);
  d.record(NAN);  // skipped
  EXPECT_EQ(d.skipped(), 1);
  EXPECT_EQ(d.scale().decode, 2.0f);
  d.record(100.0f);  // history {896, 224, 100}
  EXPECT_EQ(d.scale().decode, 2.0f);
  d.record(100.0f);  // {224, 100, 100}: 896 left the window
  EXPECT_EQ(d.scale().decode, 0.5f);
  EXPECT_EQ(d.history(), (std::vector<float>{224.0f, 100.0f, 100.0f}));
  // Refresh every 2 records: the scale lags.
  s.scale_refresh_interval = 2;
  DelayedScaling d2(s);
  d2.record(448.0f);  // first record sets the scale
  EXPECT_EQ(d2.scale().decode, 1.0f);
  d2.record(896.0f);  // 1 since refresh: not yet
  EXPECT_EQ(d2.scale().decode, 1.0f);
  d2.record(896.0f);  // refresh
  EXPECT_EQ(d2.scale().decode, 2.0f);
  // Wrong rule / bad fields.
  EXPECT_THROW(DelayedScaling{kFp8Pow2}, UserError);
  s.amax_history_len = 0;
  EXPECT_THROW(DelayedScaling{s}, UserError);
}

TEST(Scaling, DelayedScalingStateRestoresBitForBit) {
  // A state taken mid-run and restored into a fresh object continues exactly
  // as the original: same scales, same history, same counters, for a refresh
  // interval > 1 (the scale lags the history) and a window that slides.
  QuantSpec s = make(kE5M2, ScaleRule::kDelayed, ScaleFormat::kFP32, BlockShape::tensor());
  s.amax_history_len = 4;
  s.scale_refresh_interval = 3;
  std::mt19937 gen(9);
  std::uniform_real_distribution<float> mag(-20.0f, 20.0f);
  DelayedScaling a(s);
  for (int i = 0; i < 7; ++i) a.record(i == 3 ? NAN : std::exp2(mag(gen)));
  DelayedScaling b(s);
  b.restore(a.state(), "test");
  for (int i = 0; i < 20; ++i) {
    const float amax = i % 5 == 4 ? INFINITY : std::exp2(mag(gen));
    a.record(amax);
    b.record(amax);
    ASSERT_EQ(fbits(a.scale().decode), fbits(b.scale().decode)) << i;
    ASSERT_EQ(fbits(a.scale().encode), fbits(b.scale().encode)) << i;
    ASSERT_EQ(a.history(), b.history());
    ASSERT_EQ(a.calls(), b.calls());
    ASSERT_EQ(a.skipped(), b.skipped());
  }
  // States that cannot come from this spec are refused, naming the problem.
  DelayedScaling c(s);
  auto bad = [&](auto mutate, const char* needle) {
    DelayedScaling::State st = a.state();
    mutate(st);
    try {
      c.restore(st, "ckpt");
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  bad([](auto& st) { st.history.assign(5, 1.0f); }, "more than amax_history_len 4");
  bad([](auto& st) { st.history[0] = -1.0f; }, "amax history holds -1");
  bad([](auto& st) { st.history[1] = NAN; }, "amax history holds nan");
  bad([](auto& st) { st.skipped = st.calls + 1; }, "inconsistent counts");
  bad([](auto& st) { st.since_refresh = 3; }, "since_refresh 3 outside [0, 3)");
  bad([](auto& st) { st.history.clear(); }, "a scale without an amax history");
  bad([](auto& st) { st.scale_amax = -2.0f; }, "scale_amax -2 is not a finite value >= 0");
  bad([](auto& st) { st.scale_amax = INFINITY; }, "scale_amax inf is not a finite value >= 0");
  // Nothing changed by the refused restores.
  EXPECT_FALSE(c.has_scale());
  EXPECT_EQ(c.calls(), 0);
}

TEST(Scaling, DelayedScalingQuantizesWithThePreviousAmax) {
  QuantSpec s = make(kE4M3, ScaleRule::kDelayed, ScaleFormat::kFP32, BlockShape::tensor());
  DelayedScaling fast_state(s), ref_state(s);
  std::vector<float> x1 = {448.0f, 1.0f, -3.0f, 0.0f};
  std::vector<float> x2 = {896.0f, 500.0f, -3.0f, 0.0f};
  std::vector<float> y(4), yr(4);
  QuantStats st;
  // Call 1 bootstraps with current scaling (d = 1).
  fake_quantize(x1.data(), y.data(), 1, 4, RoundingKey{}, fast_state, &st);
  fake_quantize_reference(x1.data(), yr.data(), 1, 4, RoundingKey{}, ref_state);
  EXPECT_TRUE(bits_equal(y, yr));
  EXPECT_EQ(y, x1);
  // Call 2 uses d = 448/448 = 1 from the history: 896 and 500 saturate to 448.
  fake_quantize(x2.data(), y.data(), 1, 4, RoundingKey{}, fast_state, &st);
  fake_quantize_reference(x2.data(), yr.data(), 1, 4, RoundingKey{}, ref_state);
  EXPECT_TRUE(bits_equal(y, yr));
  EXPECT_EQ(y, (std::vector<float>{448.0f, 448.0f, -3.0f, 0.0f}));
  EXPECT_EQ(st.saturated, 2);
  EXPECT_EQ(fast_state.scale().decode, 2.0f);  // now from max(448, 896)
  // The plain overload refuses a delayed spec.
  EXPECT_THROW(fake_quantize(x1.data(), y.data(), 1, 4, s, RoundingKey{}), std::invalid_argument);
}

TEST(Scaling, SpecValidation) {
  QuantSpec s = kMxfp4;
  s.scale_format = ScaleFormat::kFP32;
  EXPECT_THROW(validate_quant_spec(s, "t"), UserError);
  s = kNvfp4;
  s.scale_format = ScaleFormat::kE8M0;
  EXPECT_THROW(validate_quant_spec(s, "t"), UserError);
  s = kFp8Fp32;
  s.scale_format = ScaleFormat::kE4M3;
  EXPECT_THROW(validate_quant_spec(s, "t"), UserError);
  s = kFp8Fp32;
  s.block = {-1, 4};
  EXPECT_THROW(validate_quant_spec(s, "t"), UserError);
  s = make(kE4M3, ScaleRule::kDelayed, ScaleFormat::kFP32, BlockShape::tile(32));
  try {
    validate_quant_spec(s, "recipe 'x' fprop.w");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()),
              "recipe 'x' fprop.w: block: delayed scaling is per tensor, expected tensor, got 1x32");
  }
}

}  // namespace
}  // namespace snip::formats
