// Scale formats, block scale rules (fast and reference), the reference scale
// array, and delayed scaling. Formulas and sources: quant_spec.h.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "fast_math.h"
#include "snip/formats/scale_format.h"
#include "snip/formats/scaling.h"
#include "snip/core/error.h"

namespace snip::formats {

// ---------------------------------------------------------------------------
// Scale formats
// ---------------------------------------------------------------------------
const char* scale_format_name(ScaleFormat f) {
  switch (f) {
    case ScaleFormat::kFP32: return "fp32";
    case ScaleFormat::kFP32Pow2: return "fp32_pow2";
    case ScaleFormat::kE8M0: return "e8m0";
    case ScaleFormat::kE4M3: return "e4m3";
  }
  return "?";
}

ScaleFormat parse_scale_format(const std::string& name, const std::string& where) {
  for (ScaleFormat f : {ScaleFormat::kFP32, ScaleFormat::kFP32Pow2, ScaleFormat::kE8M0,
                        ScaleFormat::kE4M3})
    if (name == scale_format_name(f)) return f;
  fail(where, ": unknown scale format '", name, "' (expected fp32, fp32_pow2, e8m0 or e4m3)");
}

float e8m0_decode(uint8_t code) {
  if (code == kE8M0NaN) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, int(code) - 127);
}

uint8_t e8m0_from_exponent(int k) {
  return uint8_t(std::clamp(k, kE8M0MinExp, kE8M0MaxExp) + 127);
}

// ---------------------------------------------------------------------------
// Block scales
// ---------------------------------------------------------------------------
TensorScale two_level_tensor_scale(float amax_tensor, const QuantSpec& spec) {
  TensorScale t;
  if (spec.rule != ScaleRule::kTwoLevel) return t;
  if (!std::isfinite(amax_tensor)) {
    t.decode = t.encode = fast::float_of(fast::kCanonicalNaN);
    return t;
  }
  // S_enc = 448 * T / amax (TE compute_global_encode_scaling_factor_FP4).
  const float scale_max = float(kE4M3.max_value()) * float(spec.element.scale_target());
  float s_enc = scale_max / amax_tensor;
  s_enc = std::min(s_enc, FLT_MAX);
  if (amax_tensor == 0.0f || s_enc == 0.0f) s_enc = 1.0f;
  t.encode = s_enc;
  t.decode = 1.0f / s_enc;
  return t;
}

BlockScale block_scale(float amax, const QuantSpec& spec, const TensorScale& tensor) {
  return fast::block_scale_fast(amax, fast::ScaleCtx(spec, tensor));
}

BlockScale block_scale_reference(float amax, const QuantSpec& spec, const TensorScale& tensor) {
  const float nan = fast::float_of(fast::kCanonicalNaN);
  const ScaleFormat fmt = spec.scale_format;
  auto nan_scale = [&] {
    BlockScale s;
    s.decode = s.encode = nan;
    s.code = fmt == ScaleFormat::kE8M0   ? 0xFFu
             : fmt == ScaleFormat::kE4M3 ? 0x7Fu
                                         : fast::kCanonicalNaN;
    return s;
  };
  auto pow2 = [&](int k) {
    BlockScale s;
    s.decode = std::ldexp(1.0f, k);
    s.encode = std::ldexp(1.0f, -k);
    s.code = fmt == ScaleFormat::kE8M0 ? uint32_t(k + 127) : fast::bits_of(s.decode);
    return s;
  };
  if (spec.rule == ScaleRule::kNone) {
    BlockScale s;
    s.code = fast::bits_of(1.0f);
    return s;
  }
  if (!std::isfinite(amax)) return nan_scale();
  const double target = spec.element.scale_target();
  switch (spec.rule) {
    case ScaleRule::kMxFloor: {
      // OCP MX 6.3: shared_exp = floor(log2(amax)) - emax_elem, amax = 0 taken
      // as FP32_MIN_NORMAL (microxcaling), clamped to the E8M0 range.
      int e2 = 0;
      std::frexp(amax == 0.0f ? double(FLT_MIN) : double(amax), &e2);  // floor(log2) = e2 - 1
      return pow2(std::clamp(e2 - 1 - spec.element.emax(), kE8M0MinExp, kE8M0MaxExp));
    }
    case ScaleRule::kTwoLevel: {
      // TE core_nvfp4.cuh compute_decoding_scaling_factor: block_amax *
      // (global_encode_scale * fp4_max_inv), clamped to FLT_MAX, cast to E4M3.
      if (std::isnan(tensor.decode)) return nan_scale();
      const float fp4_max_inv = 1.0f / float(target);
      const float sb = std::fmin(amax * (tensor.encode * fp4_max_inv), FLT_MAX);
      const uint32_t code = encode(kE4M3, sb, Rounding::kRNE, 0, /*saturate=*/true);
      BlockScale s;
      s.code = code;
      s.decode = decode(kE4M3, code) * tensor.decode;
      const float inv = 1.0f / s.decode;
      s.encode = std::min(inv, FLT_MAX);
      return s;
    }
    default:
      break;
  }
  // kCurrent / kDelayed. TE compute_scale_from_amax (recipe_common.cuh), margin
  // 0, epsilon 0: scale = max / amax in FP32, Inf -> FLT_MAX, amax 0 -> 1.
  float scale = 1.0f;
  if (amax != 0.0f) {
    scale = float(target) / amax;
    if (std::isinf(scale)) scale = FLT_MAX;
  }
  if (fmt == ScaleFormat::kFP32) {
    BlockScale s;
    s.encode = scale;
    s.decode = 1.0f / scale;  // TE reciprocal(): scale_inv
    s.code = fast::bits_of(s.decode);
    return s;
  }
  if (fmt == ScaleFormat::kFP32Pow2) {
    // force_pow_2_scales: the scale's mantissa bits cleared (ilogb = floor
    // log2 of a normal float); a subnormal scale (TE: undefined) -> 2^-126.
    const int j = std::max(std::ilogb(scale), kPow2MinExp);
    return pow2(-j);
  }
  // E8M0 RCEIL: ceil(log2(fl(amax * fl(1/T)))) on the E8M0 grid, saturating
  // at 2^127; at most 2^-127 -> code 0 (TE ptx::float_to_e8m0, round toward +Inf).
  const float v = amax * (1.0f / float(target));
  int k = kE8M0MinExp;
  if (v > std::ldexp(1.0f, kE8M0MinExp)) {
    int e2 = 0;
    const float fr = std::frexp(v, &e2);  // v = fr * 2^e2, fr in [0.5, 1)
    k = fr == 0.5f ? e2 - 1 : e2;
  }
  return pow2(std::min(k, kE8M0MaxExp));
}

ScaleArray compute_scales_reference(const float* in, int64_t rows, int64_t cols,
                                    const QuantSpec& spec, const BlockScale* delayed) {
  if (rows < 0 || cols < 0) throw std::invalid_argument("compute_scales: negative size");
  if (spec.rule == ScaleRule::kDelayed && delayed == nullptr)
    throw std::invalid_argument("compute_scales: kDelayed needs the delayed scale");
  ScaleArray sa;
  sa.block_rows = std::max<int64_t>(1, spec.block.rows_over(rows));
  sa.block_cols = std::max<int64_t>(1, spec.block.cols_over(cols));
  sa.grid_rows = (rows + sa.block_rows - 1) / sa.block_rows;
  sa.grid_cols = (cols + sa.block_cols - 1) / sa.block_cols;
  // amax per block, NaN-propagating (std::max would drop a NaN).
  auto nan_max = [](float a, float b) { return (std::isnan(a) || a > b) ? a : b; };
  std::vector<float> amax(size_t(sa.grid_rows * sa.grid_cols), 0.0f);
  float amax_tensor = 0.0f;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float a = std::fabs(in[r * cols + c]);
      float& slot = amax[size_t((r / sa.block_rows) * sa.grid_cols + c / sa.block_cols)];
      slot = nan_max(slot, a);
      amax_tensor = nan_max(amax_tensor, a);
    }
  sa.tensor = two_level_tensor_scale(amax_tensor, spec);
  sa.blocks.resize(amax.size());
  for (size_t i = 0; i < amax.size(); ++i)
    sa.blocks[i] = spec.rule == ScaleRule::kDelayed
                       ? *delayed
                       : block_scale_reference(amax[i], spec, sa.tensor);
  return sa;
}

// ---------------------------------------------------------------------------
// Delayed scaling
// ---------------------------------------------------------------------------
DelayedScaling::DelayedScaling(const QuantSpec& spec) : spec_(spec) {
  validate_quant_spec(spec, "DelayedScaling");
  if (spec.rule != ScaleRule::kDelayed)
    fail("DelayedScaling: rule: expected delayed, got ", scale_rule_name(spec.rule));
}

void DelayedScaling::record(float amax) {
  ++calls_;
  if (!std::isfinite(amax)) {
    ++skipped_;
    return;
  }
  history_.push_back(amax);
  if (int64_t(history_.size()) > spec_.amax_history_len) history_.erase(history_.begin());
  ++since_refresh_;
  if (!has_scale_ || since_refresh_ >= spec_.scale_refresh_interval) {
    const float hmax = *std::max_element(history_.begin(), history_.end());
    scale_ = block_scale(hmax, spec_);
    scale_amax_ = hmax;
    has_scale_ = true;
    since_refresh_ = 0;
  }
}

DelayedScaling::State DelayedScaling::state() const {
  State s;
  s.history = history_;
  s.calls = calls_;
  s.skipped = skipped_;
  s.since_refresh = since_refresh_;
  s.has_scale = has_scale_;
  s.scale_amax = scale_amax_;
  return s;
}

void DelayedScaling::restore(const State& s, const std::string& what) {
  if (int64_t(s.history.size()) > spec_.amax_history_len)
    fail(what, ": amax history has ", s.history.size(), " entries, more than amax_history_len ",
         spec_.amax_history_len);
  for (const float a : s.history)
    if (!std::isfinite(a) || a < 0.0f) fail(what, ": amax history holds ", a, " (expected finite values >= 0)");
  if (s.calls < 0 || s.skipped < 0 || s.skipped > s.calls || s.calls - s.skipped < int64_t(s.history.size()))
    fail(what, ": inconsistent counts (calls ", s.calls, ", skipped ", s.skipped, ", history ", s.history.size(),
         ")");
  if (s.since_refresh < 0 || s.since_refresh >= spec_.scale_refresh_interval)
    fail(what, ": since_refresh ", s.since_refresh, " outside [0, ", spec_.scale_refresh_interval, ")");
  if (s.has_scale != !s.history.empty())
    fail(what, ": ", s.has_scale ? "a scale without an amax history" : "an amax history without a scale");
  if (s.has_scale && !(std::isfinite(s.scale_amax) && s.scale_amax >= 0.0f))
    fail(what, ": scale_amax ", s.scale_amax, " is not a finite value >= 0");
  history_ = s.history;
  calls_ = s.calls;
  skipped_ = s.skipped;
  since_refresh_ = s.since_refresh;
  has_scale_ = s.has_scale;
  scale_amax_ = s.scale_amax;
  scale_ = has_scale_ ? block_scale(scale_amax_, spec_) : BlockScale{};
}

}  // namespace snip::formats
