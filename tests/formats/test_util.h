// Helpers shared by the snip_formats tests.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace snip::formats::testing {

inline uint32_t fbits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// Bitwise equality of two float arrays; reports the first mismatch.
inline ::testing::AssertionResult bits_equal(const std::vector<float>& a,
                                             const std::vector<float>& b, int64_t cols = 1) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "size " << a.size() << " vs " << b.size();
  for (size_t i = 0; i < a.size(); ++i)
    if (fbits(a[i]) != fbits(b[i]))
      return ::testing::AssertionFailure()
             << "first mismatch at [" << int64_t(i) / cols << ", " << int64_t(i) % cols
             << "]: " << a[i] << " (0x" << std::hex << fbits(a[i]) << ") vs " << b[i] << " (0x"
             << fbits(b[i]) << std::dec << ")";
  return ::testing::AssertionSuccess();
}

/// Awkward test data: Gaussian bulk with per-row magnitudes spanning many
/// binades, outliers, exact zeros, runs of zeros (all-zero blocks), tiny and
/// FP32-subnormal values, and exact grid points.
inline std::vector<float> awkward_data(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  std::vector<float> v(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float row_scale = std::ldexp(1.0f, int(gen() % 40) - 20);
    const int kind = int(gen() % 10);
    for (int64_t c = 0; c < cols; ++c) {
      float x = normal(gen) * row_scale;
      const float p = uni(gen);
      if (p < 0.01f) x *= 1000.0f;                      // outlier
      else if (p < 0.03f) x = 0.0f;                     // zero
      else if (p < 0.035f) x = std::ldexp(normal(gen), -130);  // FP32 subnormal
      else if (p < 0.04f) x = std::ldexp(float(int(gen() % 16) - 8), int(gen() % 8) - 4);  // grid-ish
      if (kind == 0 && c < 40) x = 0.0f;                // all-zero leading blocks
      v[size_t(r * cols + c)] = x;
    }
  }
  return v;
}

}  // namespace snip::formats::testing
