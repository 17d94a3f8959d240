// snip/formats/element_format.h: an element format described ONCE by its
// traits, everything else (masks, limits, codes) derived from them, and one
// generic codec (float -> code with RNE or stochastic rounding, code -> float).
//
// The named formats and their bit-layout banners live in minifloat.h (E2M1,
// E1M2, E2M3, E3M2, E4M3, E5M2, BF16), posit.h (Posit8, es = 2) and
// integer.h (INT8, INT4). The style follows jax-ml/ml_dtypes `float8.h` /
// `mxfloat.h`: (exponent bits, mantissa bits, bias, has_inf, NaN encoding),
// with only the exceptions special-cased.
//
// Code conventions (all kinds): a code is an unsigned integer holding `bits`
// bits; the sign bit is bit (bits-1). Floats and posits keep sign-magnitude
// resp. two's-complement order as their standards say; INTn codes are two's
// complement.
//
// Overflow and special values (written down once, tested per format):
//   * saturate = true (the default; what quantization with scaling uses, as
//     TransformerEngine and the OCP MX spec do): a finite value whose rounded
//     magnitude exceeds the largest finite value becomes +-max; +-Inf becomes
//     +-Inf where the format has Inf (E5M2, BF16), else +-max; Posit: NaR.
//   * saturate = false (IEEE-style): overflow becomes +-Inf where the format
//     has Inf, else NaN where it has one (E4M3: S.1111.111), else +-max (the
//     FP4/FP6 formats and INTn have neither).
//   * NaN input: the format's NaN code (sign kept); E4M3 0x7F/0xFF, E5M2
//     S.11111.10, Posit NaR 0x80. Formats without NaN (E2M1, E1M2, E2M3, E3M2)
//     have no code for it: the OCP MX spec leaves it implementation-defined and
//     we follow ml_dtypes, which returns the negative-zero code 1.00..0. INTn:
//     code 0. (fake_quantize never loses a NaN: its output is FP32 and NaN.)
//   * Subnormals are supported by every float format (gradual underflow);
//     posits never round a nonzero value to 0 (2022 Posit Standard); INTn
//     rounds small values to 0.
//   * Negative zero: floats keep the sign of a value that rounds to 0 (code
//     1.00..0 decodes to -0.0). Posit and INTn have a single zero.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace snip::formats {

/// How the bits of an element are interpreted.
enum class ElementKind : uint8_t {
  kFloat,  ///< sign | exponent | mantissa, IEEE-754 style with subnormals
  kPosit,  ///< 2022 Standard for Posit Arithmetic: sign | regime | es | fraction
  kInt,    ///< two's-complement integer, used symmetrically (-max..max)
};

/// Where a format keeps its NaN, if anywhere.
enum class NanEncoding : uint8_t {
  kNone,     ///< no NaN code (OCP FP4/FP6, INTn)
  kAllOnes,  ///< only S.1111.111 is NaN, no Inf (OCP FP8 E4M3 "fn")
  kIeee,     ///< exponent all ones: mantissa 0 = Inf, else NaN (E5M2, BF16)
  kNaR,      ///< posit Not-a-Real, code 1000...0
};

/// Rounding of a value onto the format's grid.
enum class Rounding : uint8_t {
  kRNE,         ///< round to nearest, ties to even (IEEE-754 roundTiesToEven)
  kStochastic,  ///< round up with probability equal to the fraction (unbiased)
};

namespace detail {
/// 2^e as a double, computed exactly in a constant expression (|e| < 1024).
constexpr double pow2(int e) {
  double r = 1.0;
  for (int i = 0; i < e; ++i) r *= 2.0;
  for (int i = 0; i > e; --i) r *= 0.5;
  return r;
}
}  // namespace detail

/// An element format: the traits below, nothing else. Limits are derived.
/// For kFloat: value = (-1)^s * 2^(E - bias) * 1.M for E > 0 and
/// (-1)^s * 2^(1 - bias) * 0.M for E = 0 (subnormal).
/// For kPosit: `ebits` is es; `mbits` and `bias` are unused (0).
/// For kInt: `ebits`, `mbits`, `bias` are unused (0).
struct ElementFormat {
  const char* name;     ///< lower-case registry name ("e4m3", "posit8", ...)
  ElementKind kind;
  int bits;             ///< total bits including the sign (4 for E2M1)
  int ebits;            ///< kFloat: exponent bits; kPosit: es
  int mbits;            ///< kFloat: explicit mantissa bits
  int bias;             ///< kFloat: exponent bias
  bool has_inf;         ///< kFloat with kIeee NaNs: exponent all ones & M=0 is Inf
  NanEncoding nan;

  // ---- masks (kFloat; sign mask for every kind) -------------------------
  constexpr uint32_t num_codes() const { return 1u << bits; }
  constexpr uint32_t code_mask() const { return num_codes() - 1; }
  constexpr uint32_t sign_mask() const { return 1u << (bits - 1); }
  constexpr uint32_t mantissa_mask() const {
    return kind == ElementKind::kFloat ? (1u << mbits) - 1 : 0;
  }
  constexpr uint32_t exponent_mask() const {
    return kind == ElementKind::kFloat ? ((1u << ebits) - 1) << mbits : 0;
  }
  constexpr bool has_nan() const { return nan != NanEncoding::kNone; }

  // ---- the largest finite number --------------------------------------
  /// kFloat: exponent field of the largest finite value: all ones unless the
  /// all-ones exponent is reserved for Inf/NaN (kIeee).
  constexpr int max_exponent_field() const {
    return nan == NanEncoding::kIeee ? (1 << ebits) - 2 : (1 << ebits) - 1;
  }
  /// kFloat: mantissa field of the largest finite value: all ones unless
  /// S.1..1.1..1 is NaN (kAllOnes), then all ones minus one.
  constexpr uint32_t max_mantissa_field() const {
    return nan == NanEncoding::kAllOnes ? (1u << mbits) - 2 : (1u << mbits) - 1;
  }
  /// Code of +max (largest positive finite value). kInt: 2^(bits-1) - 1
  /// (the code -2^(bits-1) is never produced: the grid is symmetric).
  constexpr uint32_t max_code() const {
    return kind == ElementKind::kFloat
               ? (uint32_t(max_exponent_field()) << mbits) | max_mantissa_field()
               : sign_mask() - 1;
  }
  /// Largest finite value. kFloat: 2^(Emax - bias) * (1 + Mmax / 2^mbits);
  /// kPosit: maxpos = 2^((bits-2) * 2^es); kInt: 2^(bits-1) - 1.
  constexpr double max_value() const {
    if (kind == ElementKind::kPosit) return detail::pow2((bits - 2) << ebits);
    if (kind == ElementKind::kInt) return double(sign_mask() - 1);
    return detail::pow2(max_exponent_field() - bias) *
           (1.0 + double(max_mantissa_field()) / double(1u << mbits));
  }
  /// Smallest positive normal value: kFloat 2^(1 - bias); kPosit minpos =
  /// 2^-((bits-2) * 2^es) (posits have no subnormals); kInt 1.
  constexpr double min_normal() const {
    if (kind == ElementKind::kPosit) return detail::pow2(-((bits - 2) << ebits));
    if (kind == ElementKind::kInt) return 1.0;
    return detail::pow2(1 - bias);
  }
  /// Smallest positive value: kFloat 2^(1 - bias - mbits); kPosit minpos;
  /// kInt 1.
  constexpr double min_subnormal() const {
    if (kind != ElementKind::kFloat) return min_normal();
    return detail::pow2(1 - bias - mbits);
  }
  /// floor(log2(max_value())), "emax_elem" of the OCP MX spec (E2M1: 2,
  /// E4M3: 8, E5M2: 15); for kPosit and kInt the exponent of scale_target().
  constexpr int emax() const {
    if (kind == ElementKind::kFloat) return max_exponent_field() - bias;
    int e = 0;
    while (detail::pow2(e + 1) <= scale_target()) ++e;
    return e;
  }
  /// The magnitude a scaling rule maps a block's amax onto (scale =
  /// amax / scale_target()). The largest finite value for kFloat and kInt.
  /// Posits have tapered precision: their densest region (3 fraction bits
  /// for Posit8) is [2^-2^es, 2^2^es) = [1/16, 16); we map amax to 2^(2^es)
  /// = 16, the top of that region, rather than to maxpos = 2^24 where only
  /// the regime is left.
  constexpr double scale_target() const {
    return kind == ElementKind::kPosit ? detail::pow2(1 << ebits) : max_value();
  }
};

/// Equality of traits (the name is compared too).
bool operator==(const ElementFormat& a, const ElementFormat& b);
inline bool operator!=(const ElementFormat& a, const ElementFormat& b) { return !(a == b); }

// ---------------------------------------------------------------------------
// The generic codec (reference implementation; src/formats/codec.cpp).
// ---------------------------------------------------------------------------

/// Encodes `x` into `fmt`. Rounding: kRNE, or kStochastic with the 32 random
/// bits `random_bits`, from which u = (random_bits >> 8) * 2^-24 (a uniform
/// draw on the 2^24-point grid of [0, 1)); the magnitude rounds up iff
/// u < frac, frac being the fractional part of |x| in units of the grid
/// spacing (ulp) at |x|. So P(up) = ceil(frac * 2^24) / 2^24: unbiased to
/// within 2^-24 ulp. (kInt rounds the signed value: floor(x) + [u < x -
/// floor(x)]. kPosit rounds between the two neighbouring posits in value:
/// P(up) = (|x| - lo) / (hi - lo).) `random_bits` is ignored for kRNE.
/// Overflow/NaN/Inf/zero behaviour: see the file comment. Returns the code
/// in the low fmt.bits bits. Never throws.
uint32_t encode(const ElementFormat& fmt, float x, Rounding rounding = Rounding::kRNE,
                uint32_t random_bits = 0, bool saturate = true);

/// Decodes a code (only the low fmt.bits bits are read) to its exact value.
/// NaN codes decode to a quiet NaN with the code's sign; Inf codes to +-Inf.
/// Never throws.
float decode(const ElementFormat& fmt, uint32_t code);

/// True if `code` is a NaN/NaR code of `fmt`.
bool is_nan_code(const ElementFormat& fmt, uint32_t code);
/// True if `code` is an Inf code of `fmt`.
bool is_inf_code(const ElementFormat& fmt, uint32_t code);

/// Checks that the traits describe a format the codec supports. Throws
/// snip::UserError naming `where` and the field: kFloat needs
/// bits == 1 + ebits + mbits, 1 <= ebits <= 8, 0 <= mbits <= 23, bits <= 16,
/// has_inf only with kIeee NaNs, NaN encoding not kNaR; kPosit needs
/// 3 <= bits <= 16, 0 <= es <= 4 and kNaR; kInt needs 2 <= bits <= 16 and no
/// NaN/Inf; name non-empty lower-case [a-z0-9_].
void validate_element_format(const ElementFormat& fmt, const std::string& where);

// ---------------------------------------------------------------------------
// Registry: name -> format. The built-in formats are registered at first use;
// new formats plug in with register_element_format without touching callers.
// ---------------------------------------------------------------------------

/// The format registered under `name` (case-insensitive, e.g. "E4M3").
/// Throws snip::UserError "unknown element format 'x' (known: e1m2, ...)".
ElementFormat find_element_format(const std::string& name);
/// The same without the error: nullopt for a name that is not registered.
std::optional<ElementFormat> lookup_element_format(const std::string& name);
/// Registered names, sorted.
std::vector<std::string> element_format_names();
/// Adds a format (validated; the name is copied). Throws snip::UserError if
/// the name is taken by a different format. Thread-safe.
void register_element_format(const ElementFormat& fmt);

}  // namespace snip::formats
