// The random Hadamard transform (contract and sources: hadamard.h).
#include "snip/formats/hadamard.h"

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "snip/core/error.h"

namespace snip::formats {

namespace {

// TransformerEngine get_wgrad_sign_vector() (pytorch/tensor/nvfp4_tensor.py).
constexpr float kTeSigns[16] = {1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1};

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Unnormalised fast Walsh-Hadamard transform of v[0..n): v <- v · H_n.
template <typename T>
inline void fwht(T* v, int n) {
  for (int h = 1; h < n; h *= 2)
    for (int i = 0; i < n; i += 2 * h)
      for (int j = i; j < i + h; ++j) {
        const T a = v[j], b = v[j + h];
        v[j] = a + b;
        v[j + h] = a - b;
      }
}

// The same block transform in double, each result saturated to +-FLT_MAX:
// for blocks whose FP32 sums overflowed (|x·R| can reach sqrt(n)·max|x|).
template <bool kInverse>
void block_in_double(float* v, const float* orig, int n, const float* signs) {
  double d[256];
  for (int i = 0; i < n; ++i) d[i] = double(orig[i]) * (kInverse ? 1.0 : double(signs[i]));
  fwht(d, n);
  const double scale = 1.0 / std::sqrt(double(n));
  for (int i = 0; i < n; ++i) {
    const double y = d[i] * scale * (kInverse ? double(signs[i]) : 1.0);
    v[i] = float(std::clamp(y, -double(FLT_MAX), double(FLT_MAX)));
  }
}

template <bool kInverse>
void apply(float* x, int64_t rows, int64_t cols, int n, const float* signs) {
  if (!valid_hadamard_size(n)) fail("hadamard size: expected 4, 16, 64 or 256, got ", n);
  if (rows < 0 || cols < 0) fail("hadamard: negative size [", rows, ", ", cols, "]");
  const int64_t blocks = cols / n;
  const float scale = 1.0f / std::sqrt(float(n));  // exact: n is a power of 4
#pragma omp parallel for schedule(static) if (rows * cols >= (int64_t(1) << 16))
  for (int64_t r = 0; r < rows; ++r) {
    float orig[256];
    for (int64_t b = 0; b < blocks; ++b) {
      float* v = x + r * cols + b * n;
      std::copy(v, v + n, orig);
      if (!kInverse)
        for (int i = 0; i < n; ++i) v[i] *= signs[i];
      fwht(v, n);
      bool finite_out = true, finite_in = true;
      for (int i = 0; i < n; ++i) {
        v[i] *= kInverse ? scale * signs[i] : scale;
        finite_out = finite_out && std::isfinite(v[i]);
      }
      if (finite_out) continue;
      for (int i = 0; i < n; ++i) finite_in = finite_in && std::isfinite(orig[i]);
      // Finite data never becomes Inf or NaN: redo the block without overflow
      // (Inf / NaN inputs propagate as IEEE arithmetic makes them).
      if (finite_in) block_in_double<kInverse>(v, orig, n, signs);
    }
  }
}

}  // namespace

bool valid_hadamard_size(int n) { return n == 4 || n == 16 || n == 64 || n == 256; }

std::vector<float> hadamard_signs(int n, int64_t seed) {
  if (!valid_hadamard_size(n)) fail("hadamard size: expected 4, 16, 64 or 256, got ", n);
  if (seed == kHadamardTeSigns) {
    if (n != 16) fail("hadamard seed 'te': TransformerEngine's sign vector has 16 entries, got size ", n);
    return std::vector<float>(kTeSigns, kTeSigns + 16);
  }
  if (seed < 0) fail("hadamard seed: expected 'te' or an integer >= 0, got ", seed);
  std::vector<float> s(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) s[size_t(i)] = (splitmix64(uint64_t(seed) + uint64_t(i)) >> 63) ? -1.0f : 1.0f;
  return s;
}

void hadamard_rows(float* x, int64_t rows, int64_t cols, int n, const float* signs) {
  apply<false>(x, rows, cols, n, signs);
}

void hadamard_rows_inverse(float* x, int64_t rows, int64_t cols, int n, const float* signs) {
  apply<true>(x, rows, cols, n, signs);
}

}  // namespace snip::formats
