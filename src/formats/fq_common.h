// Private to snip_formats: pieces shared by the reference and fast
// fake-quantization paths (argument checks, per-element reference rule,
// statistics accumulation in a fixed order).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "fast_math.h"
#include "snip/formats/fake_quant.h"
#include "snip/formats/hadamard.h"

namespace snip::formats::detail {

/// The data a quantizer reads under `spec`: `in` itself, or with a Hadamard
/// transform (spec.hadamard_size > 0) `in` copied to `buf` (which may be
/// `in` itself, for in-place calls) and transformed there (hadamard.h).
inline const float* hadamard_input(const float* in, float* buf, int64_t rows, int64_t cols,
                                   const QuantSpec& spec) {
  if (spec.hadamard_size == 0 || rows * cols == 0) return in;
  if (buf != in) std::copy(in, in + rows * cols, buf);
  const std::vector<float> signs = hadamard_signs(spec.hadamard_size, spec.hadamard_seed);
  hadamard_rows(buf, rows, cols, spec.hadamard_size, signs.data());
  return buf;
}

inline void check_fq_args(const float* in, const float* out, int64_t rows, int64_t cols,
                          const QuantSpec& spec, const RoundingKey& key, bool delayed_ok) {
  if (rows < 0 || cols < 0)
    throw std::invalid_argument("fake_quantize: negative size [" + std::to_string(rows) + ", " +
                                std::to_string(cols) + "]");
  if (rows * cols > 0 && (in == nullptr || out == nullptr))
    throw std::invalid_argument("fake_quantize: null data pointer");
  validate_quant_spec(spec, "fake_quantize");
  if (!delayed_ok && spec.rule == ScaleRule::kDelayed)
    throw std::invalid_argument(
        "fake_quantize: rule delayed needs its DelayedScaling state (use that overload)");
  check_rounding_key(key);
  if (uint64_t(rows) * uint64_t(cols) >= (uint64_t(1) << 58))
    throw std::invalid_argument("fake_quantize: more than 2^58 elements");
}

/// NaN-propagating max of magnitudes, canonical NaN.
inline float nan_max(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return fast::float_of(fast::kCanonicalNaN);
  return a > b ? a : b;
}

/// The reference rule for one element: NaN if x or the scale is NaN, else
/// decode(encode(x * m)) * d, NaN results canonical.
inline float reference_element(float x, const BlockScale& s, const QuantSpec& spec,
                               uint32_t rbits) {
  const float nan = fast::float_of(fast::kCanonicalNaN);
  if (std::isnan(x) || std::isnan(s.decode)) return nan;
  const float v = x * s.encode;
  const float e = decode(spec.element, encode(spec.element, v, spec.rounding, rbits, spec.saturate));
  if (std::isnan(e)) return nan;
  const float y = e * s.decode;
  // A finite code whose value overflows FP32 saturates (fast::dequantize).
  if (std::isinf(y) && std::isfinite(e)) return std::copysign(std::numeric_limits<float>::max(), y);
  return y;
}

/// Accumulates one element into a row's statistics (column order).
inline void stats_add(QuantStats& st, float x, float y, float m, float maxv) {
  ++st.count;
  st.amax = nan_max(st.amax, std::fabs(x));
  if (!std::isfinite(x)) {
    ++st.nonfinite;
  } else {
    if (std::fabs(x * m) > maxv) ++st.saturated;
    const double err = double(y) - double(x);
    st.sum_sq_err += err * err;
    st.sum_sq_ref += double(x) * double(x);
  }
  if (x != 0.0f && y == 0.0f) ++st.underflow;
}

/// ErrorNorms of one row [cols] (fake_quant_fast.cpp): column c into FP32
/// lane c % 16, the 16 lanes then added in double in a fixed order; a row
/// whose FP32 squares overflow or underflow (|x| above ~1.8e19, or the row's
/// sum of squares below 1e-30) is summed again in double lanes. The lanes
/// are explicit and the library is built without FMA contraction, so every
/// clone (SSE2, AVX2, AVX-512) gives the same bits. Non-finite inputs count
/// in neither sum; a finite input with a NaN output makes the error sum NaN.
void row_error_norms(const float* x, const float* y, int64_t cols, double& err, double& ref);

/// Per-row error sums [rows][2] added in row order into one call's ErrorNorms.
inline ErrorNorms sum_row_norms(const std::vector<double>& rows2) {
  ErrorNorms n;
  n.calls = 1;
  for (size_t i = 0; i + 1 < rows2.size(); i += 2) {
    n.sum_sq_err += rows2[i];
    n.sum_sq_ref += rows2[i + 1];
  }
  return n;
}

/// Sum of per-row statistics in row order.
inline QuantStats sum_rows(const std::vector<QuantStats>& rows) {
  QuantStats total;
  for (const QuantStats& r : rows) total.merge(r);
  return total;
}

}  // namespace snip::formats::detail
