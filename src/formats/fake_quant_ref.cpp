// The reference fake-quantization path: plain loops, the generic codec and
// block_scale_reference. Also QuantStats, check_rounding_key and the
// delayed-scaling glue shared with the fast path.
#include <cmath>
#include <limits>
#include <stdexcept>

#include "fq_common.h"
#include "snip/formats/fake_quant.h"

namespace snip::formats {

void check_rounding_key(const RoundingKey& key) {
  if (key.step >= (uint64_t(1) << 32))
    throw std::invalid_argument("RoundingKey.step: expected < 2^32, got " +
                                std::to_string(key.step));
  if (key.layer >= (uint64_t(1) << 32))
    throw std::invalid_argument("RoundingKey.layer: expected < 2^32, got " +
                                std::to_string(key.layer));
  if (key.operand >= 256)
    throw std::invalid_argument("RoundingKey.operand: expected < 256, got " +
                                std::to_string(key.operand));
}

double QuantStats::rel_error() const {
  if (sum_sq_ref == 0.0) return sum_sq_err == 0.0 ? 0.0 : std::numeric_limits<double>::infinity();
  return std::sqrt(sum_sq_err / sum_sq_ref);
}

double QuantStats::sqnr_db() const {
  if (sum_sq_err == 0.0) return std::numeric_limits<double>::infinity();
  return 10.0 * std::log10(sum_sq_ref / sum_sq_err);
}

double ErrorNorms::rel_error() const {
  if (std::isnan(sum_sq_err)) return std::numeric_limits<double>::quiet_NaN();
  if (sum_sq_ref == 0.0) return sum_sq_err == 0.0 ? 0.0 : std::numeric_limits<double>::infinity();
  return std::sqrt(sum_sq_err / sum_sq_ref);
}

void ErrorNorms::merge(const ErrorNorms& o) {
  sum_sq_err += o.sum_sq_err;
  sum_sq_ref += o.sum_sq_ref;
  calls += o.calls;
}

void QuantStats::merge(const QuantStats& o) {
  count += o.count;
  amax = detail::nan_max(amax, o.amax);
  nonfinite += o.nonfinite;
  underflow += o.underflow;
  saturated += o.saturated;
  sum_sq_err += o.sum_sq_err;
  sum_sq_ref += o.sum_sq_ref;
}

namespace {

void reference_core(const float* in, float* out, int64_t rows, int64_t cols,
                    const QuantSpec& spec, const RoundingKey& key, QuantStats* stats,
                    const BlockScale* delayed, ErrorNorms* norms) {
  const ScaleArray sa = compute_scales_reference(in, rows, cols, spec, delayed);
  const float maxv = float(spec.element.max_value());
  const bool sr = spec.rounding == Rounding::kStochastic;
  std::vector<QuantStats> row_stats(stats ? size_t(rows) : 0);
  std::vector<double> row_norms(norms ? size_t(2 * rows) : 0);
  std::vector<float> xrow(norms ? size_t(cols) : 0);  // the row's input (out may be in)
  for (int64_t r = 0; r < rows; ++r) {
    if (norms) std::copy(in + r * cols, in + (r + 1) * cols, xrow.begin());
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r * cols + c;
      const BlockScale& s = sa.at(r, c);
      const float x = in[i];
      const uint32_t rbits = sr ? random_bits(key, uint64_t(i)) : 0u;
      const float y = detail::reference_element(x, s, spec, rbits);
      out[i] = y;
      if (stats) detail::stats_add(row_stats[size_t(r)], x, y, s.encode, maxv);
    }
    if (norms)
      detail::row_error_norms(xrow.data(), out + r * cols, cols, row_norms[size_t(2 * r)], row_norms[size_t(2 * r + 1)]);
  }
  if (stats) *stats = detail::sum_rows(row_stats);
  if (norms) *norms = detail::sum_row_norms(row_norms);
}

float tensor_amax_reference(const float* in, int64_t n) {
  float a = 0.0f;
  for (int64_t i = 0; i < n; ++i) a = detail::nan_max(a, std::fabs(in[i]));
  return a;
}

}  // namespace

namespace detail {
// The scale a delayed-scaling call uses: the state's, or current scaling of
// this call's tensor amax before the first record (bootstrap).
BlockScale delayed_call_scale(const DelayedScaling& state, float amax_tensor) {
  if (state.has_scale()) return state.scale();
  QuantSpec cur = state.spec();
  cur.rule = ScaleRule::kCurrent;
  return block_scale(amax_tensor, cur);
}
}  // namespace detail

void fake_quantize_reference(const float* in, float* out, int64_t rows, int64_t cols,
                             const QuantSpec& spec, const RoundingKey& key, QuantStats* stats,
                             ErrorNorms* norms) {
  detail::check_fq_args(in, out, rows, cols, spec, key, /*delayed_ok=*/false);
  in = detail::hadamard_input(in, out, rows, cols, spec);
  reference_core(in, out, rows, cols, spec, key, stats, nullptr, norms);
}

void fake_quantize_reference(const float* in, float* out, int64_t rows, int64_t cols,
                             const RoundingKey& key, DelayedScaling& state, QuantStats* stats,
                             ErrorNorms* norms) {
  detail::check_fq_args(in, out, rows, cols, state.spec(), key, /*delayed_ok=*/true);
  in = detail::hadamard_input(in, out, rows, cols, state.spec());
  const float amax = tensor_amax_reference(in, rows * cols);
  const BlockScale s = detail::delayed_call_scale(state, amax);
  reference_core(in, out, rows, cols, state.spec(), key, stats, &s, norms);
  state.record(amax);
}

}  // namespace snip::formats
