// Fake quantization: the fast path equals the reference path bit for bit on
// awkward shapes for every recipe operand spec and every element format x
// scaling rule; partial blocks; in-place; statistics by hand; packed storage.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "snip/formats/fake_quant.h"
#include "snip/formats/integer.h"
#include "snip/formats/minifloat.h"
#include "snip/formats/posit.h"
#include "snip/recipes/recipe.h"
#include "snip/core/error.h"
#include "test_util.h"

namespace snip::formats {
namespace {

using testing::bits_equal;
using testing::fbits;

struct Shape {
  int64_t rows, cols;
};

// Every distinct operand spec of every registered recipe (delayed ones get
// a fixed scale through DelayedScaling after one bootstrap call).
std::vector<std::pair<std::string, QuantSpec>> recipe_specs() {
  std::vector<std::pair<std::string, QuantSpec>> out;
  std::set<std::string> seen;
  for (const std::string& name : recipes::RecipeSet().names()) {
    const recipes::Recipe r = recipes::RecipeSet().find(name);
    for (int i = 0; i < kNumOperands; ++i) {
      const QuantSpec& s = r.operands[size_t(i)];
      if (seen.insert(s.describe()).second)
        out.push_back({name + " " + operand_name(Operand(i)), s});
    }
  }
  return out;
}

bool same_double(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, sizeof a) == 0;
}

void expect_paths_agree(const std::vector<float>& x, int64_t rows, int64_t cols,
                        const QuantSpec& spec, const std::string& what, const RoundingKey& key) {
  std::vector<float> y(x.size()), yr(x.size());
  QuantStats sf, sr;
  ErrorNorms nf, nr;
  if (spec.rule == ScaleRule::kDelayed) {
    DelayedScaling df(spec), dr(spec);
    // Two calls: bootstrap, then a history-based scale (from a 4x smaller tensor).
    std::vector<float> small(x);
    for (float& v : small) v *= 0.25f;
    fake_quantize(small.data(), y.data(), rows, cols, key, df);
    fake_quantize_reference(small.data(), yr.data(), rows, cols, key, dr);
    ASSERT_TRUE(bits_equal(y, yr, cols)) << what << " (bootstrap)";
    fake_quantize(x.data(), y.data(), rows, cols, key, df, &sf, &nf);
    fake_quantize_reference(x.data(), yr.data(), rows, cols, key, dr, &sr, &nr);
  } else {
    fake_quantize(x.data(), y.data(), rows, cols, spec, key, &sf, &nf);
    fake_quantize_reference(x.data(), yr.data(), rows, cols, spec, key, &sr, &nr);
  }
  // The per-step error norms: the same bits in both paths, and the sums of
  // QuantStats (plain column order, double) up to the FP32 lanes' rounding.
  EXPECT_TRUE(same_double(nf.sum_sq_err, nr.sum_sq_err)) << what << " " << nf.sum_sq_err << " vs " << nr.sum_sq_err;
  EXPECT_TRUE(same_double(nf.sum_sq_ref, nr.sum_sq_ref)) << what;
  EXPECT_EQ(nf.calls, 1);
  EXPECT_EQ(nr.calls, 1);
  EXPECT_EQ(std::isnan(nf.sum_sq_err), std::isnan(sf.sum_sq_err)) << what;
  if (std::isfinite(sf.sum_sq_err) && std::isfinite(sf.sum_sq_ref)) {
    EXPECT_NEAR(nf.sum_sq_err, sf.sum_sq_err, 1e-5 * sf.sum_sq_err + 1e-30) << what;
    EXPECT_NEAR(nf.sum_sq_ref, sf.sum_sq_ref, 1e-5 * sf.sum_sq_ref + 1e-30) << what;
  }
  ASSERT_TRUE(bits_equal(y, yr, cols)) << what << " [" << rows << ", " << cols << "]";
  EXPECT_EQ(sf.count, sr.count) << what;
  EXPECT_EQ(fbits(sf.amax), fbits(sr.amax)) << what;
  EXPECT_EQ(sf.nonfinite, sr.nonfinite) << what;
  EXPECT_EQ(sf.underflow, sr.underflow) << what;
  EXPECT_EQ(sf.saturated, sr.saturated) << what;
  // Same summation order in both paths: equal bits (NaN when an output is NaN).
  EXPECT_TRUE(same_double(sf.sum_sq_err, sr.sum_sq_err)) << what << " " << sf.sum_sq_err << " vs " << sr.sum_sq_err;
  EXPECT_TRUE(same_double(sf.sum_sq_ref, sr.sum_sq_ref)) << what;
}

TEST(FakeQuant, FastEqualsReferenceForEveryRecipeOperand) {
  const std::vector<Shape> shapes = {{993, 512}, {127, 400}, {1, 1}, {3, 17}, {130, 129}, {2, 1000}};
  uint32_t seed = 1;
  for (const auto& [what, spec] : recipe_specs())
    for (const Shape& sh : shapes) {
      // The 993x512 case (0.5M elements) for a subset of specs only, to keep
      // the reference path's time in budget; every spec runs the others.
      if (sh.rows == 993 && seed % 3 != 1) {
        ++seed;
        continue;
      }
      const auto x = testing::awkward_data(sh.rows, sh.cols, seed++);
      expect_paths_agree(x, sh.rows, sh.cols, spec, what, RoundingKey{5, seed, 2, 1});
    }
}

TEST(FakeQuant, FastEqualsReferenceForEveryFormatAndRule) {
  std::vector<QuantSpec> specs;
  const std::vector<ElementFormat> elems = {kE2M1, kE1M2, kE2M3, kE3M2, kE4M3,
                                            kE5M2, kPosit8, kInt8, kInt4};
  for (const ElementFormat& e : elems)
    for (Rounding r : {Rounding::kRNE, Rounding::kStochastic}) {
      auto add = [&](ScaleRule rule, ScaleFormat sf, BlockShape b) {
        QuantSpec s;
        s.element = e;
        s.rule = rule;
        s.scale_format = sf;
        s.block = b;
        s.rounding = r;
        specs.push_back(s);
      };
      add(ScaleRule::kCurrent, ScaleFormat::kFP32, BlockShape::tensor());
      add(ScaleRule::kCurrent, ScaleFormat::kFP32Pow2, BlockShape::row());
      add(ScaleRule::kCurrent, ScaleFormat::kE8M0, BlockShape::tile(32));
      add(ScaleRule::kCurrent, ScaleFormat::kFP32, BlockShape{3, 7});
      add(ScaleRule::kCurrent, ScaleFormat::kFP32Pow2, BlockShape{0, 1});  // per column
      add(ScaleRule::kMxFloor, ScaleFormat::kE8M0, BlockShape::tile(32));
      add(ScaleRule::kTwoLevel, ScaleFormat::kE4M3, BlockShape::tile(16));
      add(ScaleRule::kTwoLevel, ScaleFormat::kE4M3, BlockShape::square(16));
      add(ScaleRule::kNone, ScaleFormat::kFP32, BlockShape::tensor());
    }
  // Unscaled IEEE-style casts: overflow to Inf / NaN.
  for (const ElementFormat& e : {kE4M3, kE5M2, kBF16, kE2M1})
    for (Rounding r : {Rounding::kRNE, Rounding::kStochastic}) {
      QuantSpec s;
      s.element = e;
      s.rule = ScaleRule::kNone;
      s.saturate = false;
      s.rounding = r;
      specs.push_back(s);
      s.saturate = true;
      specs.push_back(s);
    }
  uint32_t seed = 100;
  for (const QuantSpec& spec : specs)
    for (const Shape& sh : std::vector<Shape>{{127, 400}, {5, 33}}) {
      auto x = testing::awkward_data(sh.rows, sh.cols, seed++);
      // Special values (only in some rows, so most blocks stay finite).
      x[7] = NAN;
      x[size_t(sh.cols + 3)] = INFINITY;
      x[size_t(2 * sh.cols + 1)] = -INFINITY;
      x[size_t(3 * sh.cols + 2)] = 1e38f;
      x[size_t(3 * sh.cols + 4)] = -3e38f;
      x[size_t(4 * sh.cols + 5)] = std::ldexp(1.0f, -149);
      expect_paths_agree(x, sh.rows, sh.cols, spec, spec.describe(), RoundingKey{3, seed, 1, 0});
    }
}

TEST(FakeQuant, PartialLastBlockUsesTheElementsPresent) {
  // cols = 40 with 1x32 tiles: the last block holds 8 elements and is scaled
  // from them alone, exactly as if quantized on its own (= zero padded).
  const auto x = testing::awkward_data(4, 40, 77);
  for (const char* recipe : {"mxfp4", "fp4", "fp8", "block_fp8"}) {
    const QuantSpec s = recipes::RecipeSet().find(recipe)[Operand::kFpropX];
    std::vector<float> y(x.size());
    fake_quantize(x.data(), y.data(), 4, 40, s, RoundingKey{});
    const int64_t bc = s.block.cols;
    const int64_t tail = 40 % bc == 0 ? bc : 40 % bc;
    for (int64_t r = 0; r < 4; ++r) {
      std::vector<float> padded(static_cast<size_t>(bc), 0.0f), yp(static_cast<size_t>(bc));
      for (int64_t c = 0; c < tail; ++c) padded[size_t(c)] = x[size_t(r * 40 + 40 - tail + c)];
      if (s.rule == ScaleRule::kTwoLevel) continue;  // tensor-level scale differs on its own
      fake_quantize(padded.data(), yp.data(), 1, bc, s, RoundingKey{});
      for (int64_t c = 0; c < tail; ++c)
        EXPECT_EQ(fbits(y[size_t(r * 40 + 40 - tail + c)]), fbits(yp[size_t(c)])) << recipe;
    }
  }
  // 2-D: 130 rows with 128x128 blocks: rows 128..129 form their own blocks.
  const QuantSpec w = recipes::RecipeSet().find("fp8")[Operand::kFpropW];
  auto x2 = testing::awkward_data(130, 130, 78);
  std::vector<float> y2(x2.size());
  fake_quantize(x2.data(), y2.data(), 130, 130, w, RoundingKey{});
  std::vector<float> bottom(x2.begin() + 128 * 130, x2.end()), yb(bottom.size());
  fake_quantize(bottom.data(), yb.data(), 2, 130, w, RoundingKey{});
  for (size_t i = 0; i < yb.size(); ++i) EXPECT_EQ(fbits(y2[128 * 130 + i]), fbits(yb[i]));
}

TEST(FakeQuant, InPlaceEqualsOutOfPlace) {
  const auto x = testing::awkward_data(37, 300, 5);
  for (const char* recipe : {"fp8", "fp4", "mxfp8", "int8", "posit8"}) {
    const QuantSpec s = recipes::RecipeSet().find(recipe)[Operand::kWgradDY];
    std::vector<float> y(x.size()), z(x), zr(x);
    QuantStats a, b, c;
    ErrorNorms na, nb, nc;
    fake_quantize(x.data(), y.data(), 37, 300, s, RoundingKey{1, 2, 3, 4}, &a, &na);
    fake_quantize(z.data(), z.data(), 37, 300, s, RoundingKey{1, 2, 3, 4}, &b, &nb);
    fake_quantize_reference(zr.data(), zr.data(), 37, 300, s, RoundingKey{1, 2, 3, 4}, &c, &nc);
    EXPECT_TRUE(bits_equal(y, z, 300)) << recipe;
    EXPECT_TRUE(bits_equal(y, zr, 300)) << recipe;
    EXPECT_EQ(a.sum_sq_err, b.sum_sq_err);
    EXPECT_EQ(a.sum_sq_err, c.sum_sq_err);
    // In place, the norms compare the output with the input as it was.
    EXPECT_EQ(na.sum_sq_err, nb.sum_sq_err) << recipe;
    EXPECT_EQ(na.sum_sq_err, nc.sum_sq_err) << recipe;
    EXPECT_EQ(na.sum_sq_ref, nb.sum_sq_ref) << recipe;
    EXPECT_GT(na.sum_sq_err, 0.0) << recipe;
    // Norms alone (no QuantStats) are the same as with them.
    ErrorNorms alone;
    fake_quantize(x.data(), y.data(), 37, 300, s, RoundingKey{1, 2, 3, 4}, nullptr, &alone);
    EXPECT_EQ(alone.sum_sq_err, na.sum_sq_err) << recipe;
  }
}

TEST(FakeQuant, StatsByHand) {
  // E2M1 without scaling: 0.2 -> 0 (underflow), 7 -> 6 (saturated),
  // -1.25 -> -1 (tie to even), 0 -> 0, NaN -> NaN (non-finite), 3 -> 3.
  QuantSpec s;
  s.element = kE2M1;
  s.rule = ScaleRule::kNone;
  const std::vector<float> x = {0.2f, 7.0f, -1.25f, 0.0f, NAN, 3.0f};
  std::vector<float> y(x.size());
  QuantStats st;
  fake_quantize(x.data(), y.data(), 2, 3, s, RoundingKey{}, &st);
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(y[1], 6.0f);
  EXPECT_EQ(y[2], -1.0f);
  EXPECT_TRUE(std::isnan(y[4]));
  EXPECT_EQ(st.count, 6);
  EXPECT_EQ(st.nonfinite, 1);
  EXPECT_EQ(st.underflow, 1);
  EXPECT_EQ(st.saturated, 1);
  EXPECT_TRUE(std::isnan(st.amax));
  const double sse = double(0.2f) * double(0.2f) + 1.0 + 0.0625;
  const double ssr = double(0.2f) * double(0.2f) + 49.0 + 1.5625 + 9.0;
  EXPECT_DOUBLE_EQ(st.sum_sq_err, sse);
  EXPECT_DOUBLE_EQ(st.sum_sq_ref, ssr);
  EXPECT_DOUBLE_EQ(st.rel_error(), std::sqrt(sse / ssr));
  EXPECT_DOUBLE_EQ(st.sqnr_db(), 10 * std::log10(ssr / sse));
  EXPECT_DOUBLE_EQ(st.underflow_fraction(), 1.0 / 6);
  // SQNR of E4M3 on Gaussian data with 1x16 FP32 scales: 3 mantissa bits give
  // a uniform error of ulp^2/12 with ulp = 2^(e-3) in the binade [2^e, 2^(e+1));
  // for mantissas spread log-uniformly (Benford) E[x^2]/E[err^2] =
  // (3 / (2 ln 2)) / (2^-6 / 12) = 1662, i.e. 32.2 dB.
  std::mt19937 gen(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> g(64 * 1024);
  for (float& v : g) v = nd(gen);
  std::vector<float> gy(g.size());
  QuantSpec e4 = recipes::RecipeSet().find("block_fp8")[Operand::kFpropX];
  fake_quantize(g.data(), gy.data(), 64, 1024, e4, RoundingKey{}, &st);
  EXPECT_NEAR(st.sqnr_db(), 10 * std::log10(3.0 / (2 * std::log(2.0)) * 768.0), 1.0);
}

// ErrorNorms by hand: StatsByHand's six values (the NaN input counts in
// neither sum), the lanes of a 19-column row, a finite input in a block
// whose scale is NaN (error NaN), a row whose FP32 squares overflow (summed
// in double), merge and the rel_error edge cases.
TEST(FakeQuant, ErrorNormsByHand) {
  QuantSpec s;
  s.element = kE2M1;
  s.rule = ScaleRule::kNone;
  const std::vector<float> x = {0.2f, 7.0f, -1.25f, 0.0f, NAN, 3.0f};
  std::vector<float> y(x.size());
  ErrorNorms n;
  fake_quantize(x.data(), y.data(), 2, 3, s, RoundingKey{}, nullptr, &n);
  // Squares in FP32 lanes: 0.2f² rounds to FP32 (the others are exact).
  const volatile float p = 0.2f * 0.2f;
  const double sse = double(p) + 1.0 + 0.0625;
  const double ssr = double(p) + 49.0 + 1.5625 + 9.0;
  EXPECT_DOUBLE_EQ(n.sum_sq_err, sse);
  EXPECT_DOUBLE_EQ(n.sum_sq_ref, ssr);
  EXPECT_DOUBLE_EQ(n.rel_error(), std::sqrt(sse / ssr));
  EXPECT_EQ(n.calls, 1);
  // 19 columns of 1.25 (-> 1 under E2M1 RNE, error 0.25 each): two full
  // lane sweeps and a tail of 3, every term exact in double.
  std::vector<float> r(19, 1.25f), ry(19);
  fake_quantize(r.data(), ry.data(), 1, 19, s, RoundingKey{}, nullptr, &n);
  EXPECT_EQ(n.sum_sq_err, 19 * 0.0625);
  EXPECT_EQ(n.sum_sq_ref, 19 * 1.5625);
  EXPECT_DOUBLE_EQ(n.rel_error(), 0.2);
  // Per-tensor current scaling with a NaN in the tensor: the scale is NaN,
  // every output NaN, so the finite inputs' error is NaN (a broken
  // measurement, which the guard counts as above its threshold).
  QuantSpec cur = recipes::RecipeSet().find("fp8")[Operand::kFpropX];
  cur.block = BlockShape::tensor();
  std::vector<float> z = {1.0f, NAN, 2.0f, 3.0f};
  std::vector<float> zy(z.size());
  fake_quantize(z.data(), zy.data(), 1, 4, cur, RoundingKey{}, nullptr, &n);
  EXPECT_TRUE(std::isnan(n.sum_sq_err));
  EXPECT_EQ(n.sum_sq_ref, 14.0);
  EXPECT_TRUE(std::isnan(n.rel_error()));
  // 1e20 and 3e20 (squares beyond FP32's 3.4e38) under BF16's cast, which
  // keeps them to 8 bits of mantissa: the sums in double are finite.
  QuantSpec bf;
  bf.element = kBF16;
  bf.rule = ScaleRule::kNone;
  bf.saturate = false;
  std::vector<float> big = {1e20f, 3e20f}, by(2);
  fake_quantize(big.data(), by.data(), 1, 2, bf, RoundingKey{}, nullptr, &n);
  const double e0 = double(by[0]) - double(big[0]), e1 = double(by[1]) - double(big[1]);
  EXPECT_DOUBLE_EQ(n.sum_sq_ref, double(big[0]) * double(big[0]) + double(big[1]) * double(big[1]));
  EXPECT_DOUBLE_EQ(n.sum_sq_err, e0 * e0 + e1 * e1);
  EXPECT_TRUE(std::isfinite(n.rel_error()));
  EXPECT_GT(n.rel_error(), 0.0);
  // 3e-25 and 5e-25 (squares below FP32's smallest normal) in a
  // 4-element row: summed in double, the same ratio as the same row x 2^80.
  QuantSpec e4 = recipes::RecipeSet().find("block_fp8")[Operand::kFpropX];
  std::vector<float> tiny = {3e-25f, 5e-25f, -4e-25f, 1e-25f}, ty(4), scaled(4), sy(4);
  for (size_t i = 0; i < 4; ++i) scaled[i] = std::ldexp(tiny[i], 80);
  ErrorNorms nt, ns;
  fake_quantize(tiny.data(), ty.data(), 1, 4, e4, RoundingKey{}, nullptr, &nt);
  fake_quantize(scaled.data(), sy.data(), 1, 4, e4, RoundingKey{}, nullptr, &ns);
  EXPECT_GT(nt.sum_sq_ref, 0.0);
  EXPECT_NEAR(nt.rel_error(), ns.rel_error(), 1e-6 * ns.rel_error());
  // merge adds sums and calls; 0/0 is 0, x/0 is +Inf.
  ErrorNorms a{1.0, 4.0, 1}, b{3.0, 12.0, 2};
  a.merge(b);
  EXPECT_EQ(a.sum_sq_err, 4.0);
  EXPECT_EQ(a.sum_sq_ref, 16.0);
  EXPECT_EQ(a.calls, 3);
  EXPECT_EQ(a.rel_error(), 0.5);
  EXPECT_EQ((ErrorNorms{0, 0, 1}).rel_error(), 0.0);
  EXPECT_TRUE(std::isinf((ErrorNorms{1, 0, 1}).rel_error()));
  // An empty tensor: one call, nothing summed.
  fake_quantize(z.data(), zy.data(), 0, 4, cur, RoundingKey{}, nullptr, &n);
  EXPECT_EQ(n.calls, 1);
  EXPECT_EQ(n.sum_sq_ref, 0.0);
}

TEST(FakeQuant, ArgumentErrors) {
  std::vector<float> x(4), y(4);
  QuantSpec s;
  EXPECT_THROW(fake_quantize(x.data(), y.data(), -1, 4, s, RoundingKey{}), std::invalid_argument);
  EXPECT_THROW(fake_quantize(nullptr, y.data(), 1, 4, s, RoundingKey{}), std::invalid_argument);
  s.rule = ScaleRule::kMxFloor;  // fp32 scale: invalid combination
  EXPECT_THROW(fake_quantize(x.data(), y.data(), 1, 4, s, RoundingKey{}), UserError);
  // Empty tensors are fine.
  QuantStats st;
  fake_quantize(x.data(), y.data(), 0, 4, QuantSpec{}, RoundingKey{}, &st);
  EXPECT_EQ(st.count, 0);
}

TEST(PackedStorage, PackUnpackLayout) {
  // Two FP4 codes per byte, even element in the low nibble.
  EXPECT_EQ(pack_codes({0x1, 0x2, 0xF}, 4), (std::vector<uint8_t>{0x21, 0x0F}));
  EXPECT_EQ(pack_codes({0x1FF, 0x0102}, 16), (std::vector<uint8_t>{0xFF, 0x01, 0x02, 0x01}));
  EXPECT_EQ(packed_bytes(7, 4), 4);
  EXPECT_EQ(packed_bytes(7, 6), 7);
  EXPECT_EQ(packed_bytes(7, 16), 14);
  for (int bits : {4, 6, 8, 16}) {
    std::vector<uint16_t> codes(101);
    for (size_t i = 0; i < codes.size(); ++i) codes[i] = uint16_t((i * 2654435761u >> 7) & ((1u << bits) - 1));
    EXPECT_EQ(unpack_codes(pack_codes(codes, bits), 101, bits), codes) << bits;
  }
  EXPECT_THROW(unpack_codes({1, 2}, 5, 4), std::invalid_argument);
}

TEST(PackedStorage, DequantizeEqualsFakeQuantize) {
  for (const auto& [what, spec] : recipe_specs()) {
    if (spec.rule == ScaleRule::kDelayed) continue;
    auto x = testing::awkward_data(19, 70, 31);
    std::vector<float> y(x.size()), yd(x.size());
    const RoundingKey key{2, 3, 4, 5};
    fake_quantize(x.data(), y.data(), 19, 70, spec, key);
    const QuantizedTensor q = quantize_packed(x.data(), 19, 70, spec, key);
    EXPECT_EQ(int64_t(q.data.size()), packed_bytes(19 * 70, spec.element.bits)) << what;
    dequantize(q, yd.data());
    EXPECT_TRUE(bits_equal(y, yd, 70)) << what;
    // Scale codes of 8-bit scale formats decode to the scales.
    for (const BlockScale& s : q.scales.blocks) {
      if (spec.scale_format == ScaleFormat::kE8M0) {
        EXPECT_EQ(e8m0_decode(uint8_t(s.code)), s.decode);
      }
      if (spec.rule == ScaleRule::kTwoLevel) {
        EXPECT_EQ(decode(kE4M3, s.code) * q.scales.tensor.decode, s.decode);
      }
    }
  }
}

}  // namespace
}  // namespace snip::formats
