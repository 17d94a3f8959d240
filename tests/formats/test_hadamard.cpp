// The random Hadamard transform: H·Hᵀ = n·I for every supported size (entries
// from the Sylvester definition, checked by exact integer arithmetic), the fast
// transform against an explicit matrix product in double, the inverse, GEMM
// invariance (A·R)(B·R)ᵀ = A·Bᵀ, TE's sign vector, and the transform inside
// fake_quantize.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <random>
#include <vector>

#include "snip/formats/fake_quant.h"
#include "snip/formats/hadamard.h"
#include "snip/formats/minifloat.h"
#include "snip/core/error.h"
#include "test_util.h"

namespace snip::formats {
namespace {

using testing::fbits;

int sylvester(int i, int j) { return (__builtin_popcount(unsigned(i & j)) & 1) ? -1 : 1; }

TEST(Hadamard, SylvesterMatrixIsOrthogonal) {
  for (int n : {4, 16, 64, 256}) {
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        int dot = 0;
        for (int k = 0; k < n; ++k) dot += sylvester(i, k) * sylvester(j, k);
        ASSERT_EQ(dot, i == j ? n : 0) << "n=" << n << " i=" << i << " j=" << j;
      }
  }
}

// The fast transform of each unit vector e_i is row i of R = diag(s)·H/sqrt(n):
// every entry s_i·H[i][j]/sqrt(n), exactly (one nonzero input, no rounding).
TEST(Hadamard, FastTransformOfUnitVectorsIsTheMatrix) {
  for (int n : {4, 16, 64, 256}) {
    const std::vector<float> s = hadamard_signs(n, 7);
    std::vector<float> x(size_t(n) * size_t(n), 0.0f);
    for (int i = 0; i < n; ++i) x[size_t(i) * n + i] = 1.0f;
    hadamard_rows(x.data(), n, n, n, s.data());
    const float inv = 1.0f / std::sqrt(float(n));
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j)
        ASSERT_EQ(x[size_t(i) * n + j], s[size_t(i)] * float(sylvester(i, j)) * inv) << n << " " << i << " " << j;
  }
}

TEST(Hadamard, MatchesExplicitProductInDoubleAndInverts) {
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int n : {4, 16, 64, 256}) {
    const int64_t rows = 3, cols = 2 * n + n / 2 + 1;  // two whole blocks and a tail
    const std::vector<float> s = hadamard_signs(n, 99);
    std::vector<float> x(size_t(rows * cols));
    for (auto& v : x) v = normal(gen);
    std::vector<float> y = x;
    hadamard_rows(y.data(), rows, cols, n, s.data());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t b = 0; b < 2; ++b)
        for (int j = 0; j < n; ++j) {
          double want = 0;
          for (int i = 0; i < n; ++i)
            want += double(x[size_t(r * cols + b * n + i)]) * s[size_t(i)] * sylvester(i, j);
          want /= std::sqrt(double(n));
          ASSERT_NEAR(y[size_t(r * cols + b * n + j)], want, 1e-5 * std::sqrt(double(n))) << n;
        }
      for (int64_t c = 2 * n; c < cols; ++c) ASSERT_EQ(fbits(y[size_t(r * cols + c)]), fbits(x[size_t(r * cols + c)]));
    }
    hadamard_rows_inverse(y.data(), rows, cols, n, s.data());
    for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(y[i], x[i], 1e-5) << n;
  }
}

// Integer data small enough that every FP32 sum is exact: the transformed
// GEMM equals the plain one exactly (R is orthonormal), block tails included.
TEST(Hadamard, GemmOverTransformedOperandsEqualsTheUntransformedGemm) {
  std::mt19937 gen(2);
  for (int n : {4, 16, 64}) {
    const int64_t M = 5, N = 4, K = 3 * n + 3;
    const std::vector<float> s = hadamard_signs(n, 5);
    std::vector<float> a(size_t(M * K)), b(size_t(N * K));
    for (auto& v : a) v = float(int(gen() % 17) - 8);
    for (auto& v : b) v = float(int(gen() % 17) - 8);
    std::vector<float> at = a, bt = b;
    hadamard_rows(at.data(), M, K, n, s.data());
    hadamard_rows(bt.data(), N, K, n, s.data());
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double plain = 0, transformed = 0;
        for (int64_t k = 0; k < K; ++k) {
          plain += double(a[size_t(i * K + k)]) * b[size_t(j * K + k)];
          transformed += double(at[size_t(i * K + k)]) * bt[size_t(j * K + k)];
        }
        ASSERT_EQ(transformed, plain) << n;
      }
  }
}

TEST(Hadamard, SignVectors) {
  // TE's get_wgrad_sign_vector().
  EXPECT_EQ(hadamard_signs(16, kHadamardTeSigns),
            (std::vector<float>{1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1}));
  // Seeded: deterministic, +-1 only, and different seeds differ.
  const auto a = hadamard_signs(64, 3), b = hadamard_signs(64, 3), c = hadamard_signs(64, 4);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  int minus = 0;
  for (float v : a) {
    EXPECT_TRUE(v == 1.0f || v == -1.0f);
    minus += v < 0;
  }
  EXPECT_GT(minus, 10);
  EXPECT_LT(minus, 54);
  EXPECT_THROW(hadamard_signs(8, 0), UserError);
  EXPECT_THROW(hadamard_signs(64, kHadamardTeSigns), UserError);
  EXPECT_THROW(hadamard_signs(16, -5), UserError);
  // The transform itself refuses sizes it cannot do (no out-of-bounds access).
  std::vector<float> x(1024, 1.0f);
  for (int n : {0, 3, 8, 512, 1024}) EXPECT_THROW(hadamard_rows(x.data(), 1, 1024, n, x.data()), UserError) << n;
  EXPECT_THROW(hadamard_rows_inverse(x.data(), 1, 1024, 2, x.data()), UserError);
}

// |x·R| can exceed FLT_MAX for finite x: saturated, never Inf or NaN. A
// block of 16 x FLT_MAX with all-plus signs sums to 16·FLT_MAX/4 in y_0.
TEST(Hadamard, FiniteExtremesSaturateInsteadOfOverflowing) {
  const std::vector<float> plus(16, 1.0f);
  std::vector<float> x(32, FLT_MAX);
  for (int i = 16; i < 32; ++i) x[size_t(i)] = i % 2 ? -FLT_MAX : 1.0f;
  std::vector<float> y = x;
  hadamard_rows(y.data(), 1, 32, 16, plus.data());
  EXPECT_EQ(y[0], FLT_MAX);
  for (int j = 1; j < 16; ++j) EXPECT_EQ(y[size_t(j)], 0.0f) << j;
  for (int j = 16; j < 32; ++j) EXPECT_TRUE(std::isfinite(y[size_t(j)])) << j;
  // Exact in double: y_16+j = sum_i x_i H[i][j] / 4 with x = (1, -M, 1, -M, ...):
  // j = 1 -> (8 + 8M) / 4 = 2M + 2 -> saturates; j = 0 -> (8 - 8M) / 4 -> -2M -> -FLT_MAX.
  EXPECT_EQ(y[16], -FLT_MAX);
  EXPECT_EQ(y[17], FLT_MAX);
  // NaN and Inf inputs are not hidden.
  std::vector<float> z(16, 1.0f);
  z[3] = NAN;
  hadamard_rows(z.data(), 1, 16, 16, plus.data());
  for (float v : z) EXPECT_TRUE(std::isnan(v));
}

// fake_quantize with a Hadamard spec quantizes x·R: equal to transforming
// first and quantizing with the same spec without the transform.
TEST(Hadamard, FakeQuantizeQuantizesTheTransformedOperand) {
  QuantSpec plain;
  plain.element = kE2M1;
  plain.rule = ScaleRule::kTwoLevel;
  plain.scale_format = ScaleFormat::kE4M3;
  plain.block = BlockShape::tile(16);
  plain.rounding = Rounding::kStochastic;
  QuantSpec rht = plain;
  rht.hadamard_size = 16;
  rht.hadamard_seed = kHadamardTeSigns;
  const int64_t rows = 32, cols = 80;
  std::vector<float> x = testing::awkward_data(rows, cols, 4), t = x;
  const auto s = hadamard_signs(16, kHadamardTeSigns);
  hadamard_rows(t.data(), rows, cols, 16, s.data());
  const RoundingKey key{1, 2, 3, 4};
  std::vector<float> want(x.size()), got(x.size()), ref(x.size());
  fake_quantize(t.data(), want.data(), rows, cols, plain, key);
  fake_quantize(x.data(), got.data(), rows, cols, rht, key);
  fake_quantize_reference(x.data(), ref.data(), rows, cols, rht, key);
  EXPECT_TRUE(testing::bits_equal(got, want, cols));
  EXPECT_TRUE(testing::bits_equal(ref, want, cols));
  // In place too.
  std::vector<float> io = x;
  fake_quantize(io.data(), io.data(), rows, cols, rht, key);
  EXPECT_TRUE(testing::bits_equal(io, want, cols));
}

}  // namespace
}  // namespace snip::formats
