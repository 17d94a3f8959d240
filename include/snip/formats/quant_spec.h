// snip/formats/quant_spec.h: how one GEMM operand is quantized, as a plain
// value: element format x scaling scheme (rule, block shape, scale format) x
// rounding. Element format and scaling are independent (STYLE.md: E2M1 is an
// element; MXFP4 and NVFP4 are scaling schemes around it).
//
// Shapes: an operand is a row-major matrix [R, C] whose last, contiguous
// dimension C is the GEMM's reduction dimension K (callers transpose when
// needed, see recipes/recipe.h). A block is [BR, BC]; blocks tile [R, C] from
// the top-left corner; the last block of a row (column) is partial when C
// (R) is not a multiple of BC (BR): its scale comes from the elements present
// (the same as zero padding, since padding cannot raise the amax).
//
// Scaling rules (d = decode scale of a block, m = encode multiplier, amax =
// max |x| over it, T = element.scale_target(), normally the format's max).
// Each follows its reference's FP32 operation order exactly (fl() = one FP32
// rounding, RNE); docs/formats.md has the table and how it was checked:
//   kNone      d = m = 1, no scaling (the bf16 recipe).
//   kCurrent   from this call's data (TE compute_scale_from_amax, recipe_common.cuh,
//              margin 0, epsilon 0), stored in scale_format:
//                fp32      m = fl(T / amax) (Inf -> FLT_MAX), d = fl(1 / m)
//                          (TE Float8CurrentScaling; int8 uses the same rule)
//                fp32_pow2 m = fl(T / amax) with its mantissa cleared (rounded DOWN to
//                          2^j, j >= -126), d = 2^-j: no element saturates (TE
//                          Float8BlockScaling force_pow_2_scales, the DeepSeek-V3 layout)
//                e8m0      "RCEIL" MX variant of NVIDIA cuBLAS / TE MXFP8: v = fl(amax *
//                          fl(1/T)), d = v rounded UP to a power of two on the E8M0
//                          grid, saturating at 2^127; v <= 2^-127 -> 2^-127
//                          (TE ptx::float_to_e8m0), m = 1 / d
//              amax = 0 -> m = d = 1 (fp32, fp32_pow2), d = 2^-127 (e8m0). (E4M3 scales exist
//              only under kTwoLevel: alone their range 2^-9..448 is too narrow.)
//   kDelayed   per-tensor only: kCurrent's fp32 / fp32_pow2 rule applied to the max of
//              the amaxes of previous calls (TE DelayedScaling, "max" algorithm, margin
//              0); needs a DelayedScaling state (scaling.h).
//   kMxFloor   OCP MX v1.0 section 6.3: d = 2^(floor(log2(amax)) - emax_elem), emax_elem =
//              element.emax(); clamped to [2^-127, 2^127]; scale_format must be e8m0.
//              Elements above the max after scaling saturate (up to ~1.33x for E2M1).
//              amax = 0 -> floor(log2(2^-126)) is used (microsoft/microxcaling).
//   kTwoLevel  NVFP4 (NVIDIA, "Introducing NVFP4 for Efficient and Accurate Low-Precision
//              Inference", 2025; TransformerEngine NVFP4BlockScaling, core_nvfp4.cuh):
//              an FP32 tensor scale S_enc = fl(fl(448 * T) / amax_tensor) (FLT_MAX if
//              that overflows; 1 if amax_tensor = 0), S_dec = fl(1 / S_enc) (448 = E4M3
//              max; T = 6 for E2M1), an E4M3 block scale s_b = E4M3_RNE_sat(min(
//              fl(amax_block * fl(S_enc * fl(1/T))), FLT_MAX)), d = fl(s_b * S_dec),
//              m = min(fl(1 / d), FLT_MAX). scale_format must be e4m3.
// Every rule: elements are e = Q(fl(x * m)) and the output is fl(e * d) (TE's scale /
// scale_inv convention; with power-of-two d both products are exact).
//
// Non-finite data: a block whose amax is NaN or +-Inf gets d = NaN and all its
// outputs are NaN (MX spec 6.3: a NaN scale makes the block NaN; we extend it to
// Inf, whose log2 overflows the E8M0 range); under kTwoLevel a non-finite
// tensor amax makes the whole tensor NaN (TE would fall back to S_enc = 1;
// we keep the fault visible). Under kNone / kDelayed the scale does not depend
// on the data: NaN -> NaN, +-Inf -> +-Inf where the element format has Inf,
// else +-max * d (saturating) or NaN (non-saturating).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "snip/formats/element_format.h"
#include "snip/formats/minifloat.h"
#include "snip/formats/scale_format.h"

namespace snip::formats {

/// How a block's decode scale is derived (see the file comment).
enum class ScaleRule : uint8_t { kNone, kCurrent, kDelayed, kMxFloor, kTwoLevel };

/// "none", "current", "delayed", "mx_floor", "two_level".
const char* scale_rule_name(ScaleRule r);
/// Inverse of scale_rule_name; throws snip::UserError naming `where`.
ScaleRule parse_scale_rule(const std::string& name, const std::string& where);
/// "rne", "stochastic".
const char* rounding_name(Rounding r);
/// Inverse of rounding_name; throws snip::UserError naming `where`.
Rounding parse_rounding(const std::string& name, const std::string& where);

/// Shape of a scaling block [rows, cols] over a row-major [R, C] operand;
/// 0 means "the whole extent" (so {0, 0} = per tensor, {1, 0} = per row).
struct BlockShape {
  int64_t rows = 0;
  int64_t cols = 0;

  static constexpr BlockShape tensor() { return {0, 0}; }
  /// One scale per row ("per-channel" / "per-token" along K).
  static constexpr BlockShape row() { return {1, 0}; }
  /// 1 x n tiles along the row (MX: n = 32, NVFP4: 16, DeepSeek-V3 acts: 128).
  static constexpr BlockShape tile(int64_t n) { return {1, n}; }
  /// n x n 2-D blocks (DeepSeek-V3 weights: 128).
  static constexpr BlockShape square(int64_t n) { return {n, n}; }

  /// Rows of a block over an operand with R rows (R when rows == 0).
  int64_t rows_over(int64_t R) const { return rows == 0 ? R : rows; }
  /// Columns of a block over an operand with C columns (C when cols == 0).
  int64_t cols_over(int64_t C) const { return cols == 0 ? C : cols; }
  /// "tensor", "row", "1x32", "128x128", "0x1" style text.
  std::string to_string() const;
  friend bool operator==(const BlockShape& a, const BlockShape& b) {
    return a.rows == b.rows && a.cols == b.cols;
  }
};
/// Parses BlockShape::to_string's forms ("tensor", "row", "RxC"); throws
/// snip::UserError naming `where`.
BlockShape parse_block_shape(const std::string& text, const std::string& where);

/// How one GEMM operand is quantized. Defaults: E4M3, per-tensor current
/// FP32 scaling, RNE, saturating.
struct QuantSpec {
  ElementFormat element = kE4M3;
  ScaleRule rule = ScaleRule::kCurrent;
  ScaleFormat scale_format = ScaleFormat::kFP32;
  BlockShape block = BlockShape::tensor();
  Rounding rounding = Rounding::kRNE;
  /// Saturating conversion (true) or IEEE overflow to Inf/NaN (false); see
  /// element_format.h. Scaled quantization saturates.
  bool saturate = true;
  /// kDelayed: length of the amax history (steps) and how often (in calls)
  /// the scale is recomputed from it. TE defaults: 1024 and 1.
  int amax_history_len = 1024;
  int scale_refresh_interval = 1;
  /// Random Hadamard transform of the operand before quantization
  /// (hadamard.h): block size along K (0 = none; 4, 16, 64 or 256) and the
  /// seed of its sign vector (kHadamardTeSigns = TransformerEngine's). Both
  /// operands of a GEMM must use the same transform (validate_recipe checks),
  /// so that the GEMM over the transformed operands equals the plain one.
  int hadamard_size = 0;
  int64_t hadamard_seed = -1;

  /// True for the identity-like BF16 cast (element bf16, rule kNone).
  bool is_bf16_passthrough() const;
  /// One-line description, e.g. "e4m3 1x128 current/fp32_pow2 rne".
  std::string describe() const;
  friend bool operator==(const QuantSpec& a, const QuantSpec& b);
};

/// Checks that `spec` is a combination the kernels implement. Throws
/// snip::UserError "<where>: <field>: expected ..., got ..." otherwise:
/// invalid element format; block dims < 0; kNone with a block other than
/// tensor; kDelayed with a block other than tensor or a scale format other
/// than fp32/fp32_pow2, or history_len/refresh_interval < 1; kMxFloor without
/// e8m0; kTwoLevel without e4m3; kCurrent with e4m3 scales (only kTwoLevel
/// stores E4M3 scales); a hadamard_size other than 0, 4, 16, 64, 256, or a
/// hadamard_seed below -1 (or -1, TE's signs, with a size other than 16).
void validate_quant_spec(const QuantSpec& spec, const std::string& where);

/// Plain-config form: {"element": "e4m3", "rule": "current", "scale_format":
/// "fp32_pow2", "block": "1x128", "rounding": "rne", "saturate": true} (+
/// "amax_history_len", "scale_refresh_interval" for kDelayed; + "hadamard":
/// 16, "hadamard_seed": "te" or an integer >= 0 with a Hadamard transform).
nlohmann::json to_json(const QuantSpec& spec);
/// Inverse of to_json; missing keys take the QuantSpec defaults; element
/// names are looked up in the element registry. Throws snip::UserError
/// "<where>.<key>: expected ..., got ..." and on unknown keys; validates.
QuantSpec quant_spec_from_json(const nlohmann::json& j, const std::string& where);

}  // namespace snip::formats
