// Stochastic rounding: Philox known answers, the key -> counter layout,
// unbiasedness within a 5-sigma bound for every format, lower error of the
// mean of 50 draws than RNE, and independence from the thread count.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "snip/formats/fake_quant.h"
#include "snip/formats/integer.h"
#include "snip/formats/minifloat.h"
#include "snip/formats/posit.h"
#include "snip/recipes/recipe.h"
#include "test_util.h"

namespace snip::formats {
namespace {

using testing::bits_equal;

TEST(Rounding, PhiloxKnownAnswers) {
  // Random123 tests/kat_vectors, "philox4x32 10" lines: counter, key -> output.
  using A4 = std::array<uint32_t, 4>;
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (A4{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                          {0xffffffffu, 0xffffffffu}),
            (A4{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                          {0xa4093822u, 0x299f31d0u}),
            (A4{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(Rounding, KeyLayout) {
  const RoundingKey key{0x0123456789ABCDEFull, 77, 5, 3};
  for (uint64_t idx : {0ull, 1ull, 3ull, 4ull, 1001ull, (1ull << 40) + 6}) {
    const uint64_t b = idx / 4;
    const auto out = philox4x32_10(
        {uint32_t(b), uint32_t(b >> 32) | (3u << 24), 77u, 5u}, {0x89ABCDEFu, 0x01234567u});
    EXPECT_EQ(random_bits(key, idx), out[idx % 4]) << idx;
  }
  // Every key field changes the stream.
  RoundingKey k2 = key;
  k2.operand = 4;
  RoundingKey k3 = key;
  k3.step = 78;
  RoundingKey k4 = key;
  k4.layer = 6;
  RoundingKey k5 = key;
  k5.seed ^= 1;
  int differ[4] = {0, 0, 0, 0};
  for (uint64_t i = 0; i < 64; ++i) {
    differ[0] += random_bits(key, i) != random_bits(k2, i);
    differ[1] += random_bits(key, i) != random_bits(k3, i);
    differ[2] += random_bits(key, i) != random_bits(k4, i);
    differ[3] += random_bits(key, i) != random_bits(k5, i);
  }
  for (int d : differ) EXPECT_GE(d, 60);
  RoundingKey bad = key;
  bad.operand = 256;
  EXPECT_THROW(check_rounding_key(bad), std::invalid_argument);
}

QuantSpec unscaled(const ElementFormat& e, Rounding r) {
  QuantSpec s;
  s.element = e;
  s.rule = ScaleRule::kNone;
  s.block = BlockShape::tensor();
  s.rounding = r;
  return s;
}

TEST(Rounding, StochasticRoundingIsUnbiased) {
  // For each format and value x between two grid points lo < x < hi: N
  // independent draws land on lo or hi, and their mean is within 5 sigma of
  // x, sigma = (hi - lo) * sqrt(p (1 - p) / N), p = (x - lo) / (hi - lo),
  // plus the 2^-24 (hi - lo) resolution of u.
  const int64_t N = 20000;
  struct Case {
    const ElementFormat* f;
    std::vector<float> xs;
  };
  const std::vector<Case> cases = {
      {&kE2M1, {0.1f, 0.3f, 1.2f, 2.5f, 3.9f, 5.01f, -4.5f}},
      {&kE1M2, {0.01f, 0.6f, 1.3f, -1.7f}},
      {&kE2M3, {0.06f, 2.6f, 7.2f}},
      {&kE3M2, {0.02f, 9.0f, 27.0f}},
      {&kE4M3, {0.001f, 0.3f, 100.5f, 447.0f, -3.3f}},
      {&kE5M2, {1e-5f, 0.3f, 50000.0f}},
      {&kBF16, {0.1f, 3.14159f, -1e-3f, 1e30f}},
      {&kPosit8, {0.3f, 1.7f, 100.0f, 3e5f, -0.01f}},
      {&kInt8, {0.3f, -2.25f, 126.6f}},
      {&kInt4, {0.5f, -6.1f}},
  };
  for (const Case& c : cases) {
    // The format's finite grid, for the neighbours of x.
    std::vector<float> g;
    for (uint32_t code = 0; code < c.f->num_codes(); ++code) {
      const float v = decode(*c.f, code);
      if (std::isfinite(v)) g.push_back(v);
    }
    std::sort(g.begin(), g.end());
    for (float x : c.xs) {
      const auto hi_it = std::upper_bound(g.begin(), g.end(), x);
      ASSERT_TRUE(hi_it != g.begin() && hi_it != g.end());
      const double lo = *(hi_it - 1), hi = *hi_it;
      const double p = (double(x) - lo) / (hi - lo);
      std::vector<float> in(static_cast<size_t>(N), x), out(static_cast<size_t>(N));
      fake_quantize(in.data(), out.data(), 1, N, unscaled(*c.f, Rounding::kStochastic),
                    RoundingKey{42, 7, 3, 2});
      double sum = 0;
      int64_t ups = 0;
      for (float y : out) {
        ASSERT_TRUE(y == lo || y == hi) << c.f->name << " x=" << x << " y=" << y;
        sum += y;
        ups += y == hi;
      }
      const double mean = sum / double(N);
      const double sigma = (hi - lo) * std::sqrt(p * (1 - p) / double(N));
      EXPECT_LE(std::fabs(mean - double(x)), 5 * sigma + (hi - lo) * 0x1p-24)
          << c.f->name << " x=" << x << " mean=" << mean << " p=" << p << " ups=" << ups;
    }
  }
}

double rmse(const std::vector<float>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  return std::sqrt(s / double(a.size()));
}

TEST(Rounding, MeanOfFiftyDrawsBeatsRne) {
  const int64_t R = 64, C = 256;
  std::mt19937 gen(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(size_t(R * C));
  for (float& v : x) v = nd(gen);
  for (const char* recipe : {"fp4", "mxfp4", "e1m2"}) {
    QuantSpec sr = recipes::RecipeSet().find(recipe)[Operand::kDgradDY];
    ASSERT_EQ(sr.rounding, Rounding::kStochastic) << recipe;
    QuantSpec rne = sr;
    rne.rounding = Rounding::kRNE;
    std::vector<float> y(x.size());
    fake_quantize(x.data(), y.data(), R, C, rne, RoundingKey{});
    std::vector<double> xd(x.begin(), x.end());
    const double err_rne = rmse(y, xd);
    std::vector<double> mean(x.size(), 0.0);
    for (uint64_t step = 0; step < 50; ++step) {
      fake_quantize(x.data(), y.data(), R, C, sr, RoundingKey{1, step, 0, 2});
      for (size_t i = 0; i < x.size(); ++i) mean[i] += y[i] / 50.0;
    }
    std::vector<float> meanf(mean.begin(), mean.end());
    const double err_mean = rmse(meanf, xd);
    EXPECT_LT(err_mean, 0.5 * err_rne) << recipe << ": " << err_mean << " vs RNE " << err_rne;
  }
}

TEST(Rounding, IndependentOfThreadCount) {
  const int64_t R = 993, C = 512;
  const auto x = testing::awkward_data(R, C, 5);
  const int saved = omp_get_max_threads();
  for (const char* recipe : {"fp4", "mxfp4", "fp8", "posit8", "int8", "bf16"}) {
    QuantSpec s = recipes::RecipeSet().find(recipe)[Operand::kWgradDY];
    s.rounding = Rounding::kStochastic;
    std::vector<float> y1(x.size()), y2(x.size()), y3(x.size());
    QuantStats st1, st2, st3;
    const RoundingKey key{9, 123, 17, 4};
    omp_set_num_threads(1);
    fake_quantize(x.data(), y1.data(), R, C, s, key, &st1);
    omp_set_num_threads(2);
    fake_quantize(x.data(), y2.data(), R, C, s, key, &st2);
    omp_set_num_threads(3);
    fake_quantize(x.data(), y3.data(), R, C, s, key, &st3);
    EXPECT_TRUE(bits_equal(y1, y2, C)) << recipe;
    EXPECT_TRUE(bits_equal(y1, y3, C)) << recipe;
    EXPECT_EQ(st1.sum_sq_err, st2.sum_sq_err) << recipe;
    EXPECT_EQ(st1.sum_sq_err, st3.sum_sq_err) << recipe;
    EXPECT_EQ(st1.underflow, st2.underflow) << recipe;
    // Another step gives other draws.
    std::vector<float> y4(x.size());
    fake_quantize(x.data(), y4.data(), R, C, s, RoundingKey{9, 124, 17, 4});
    EXPECT_FALSE(bits_equal(y1, y4, C)) << recipe;
  }
  omp_set_num_threads(saved);
}

}  // namespace
}  // namespace snip::formats
