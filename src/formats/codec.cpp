// The generic element codec (reference implementation) and the element
// format registry. Arithmetic is done in double on exact values: |x| * 2^k
// and integer rounding of a value below 2^25 are exact there.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <mutex>

#include "snip/formats/element_format.h"
#include "snip/formats/integer.h"
#include "snip/formats/minifloat.h"
#include "snip/formats/posit.h"
#include "snip/formats/rounding.h"
#include "snip/core/error.h"

namespace snip::formats {

bool operator==(const ElementFormat& a, const ElementFormat& b) {
  return std::strcmp(a.name, b.name) == 0 && a.kind == b.kind && a.bits == b.bits &&
         a.ebits == b.ebits && a.mbits == b.mbits && a.bias == b.bias &&
         a.has_inf == b.has_inf && a.nan == b.nan;
}

namespace {

// Round the non-negative q (exact, < 2^40) to an integer: RNE, or
// floor(q) + [u < frac(q)] for stochastic rounding.
double round_int(double q, Rounding rounding, uint32_t random_bits) {
  if (rounding == Rounding::kRNE) return std::nearbyint(q);  // FE_TONEAREST: ties to even
  const double fl = std::floor(q);
  return fl + (double(uniform_from_bits(random_bits)) < q - fl ? 1.0 : 0.0);
}

uint32_t float_nan_code(const ElementFormat& f, bool neg) {
  const uint32_t sign = neg ? f.sign_mask() : 0;
  switch (f.nan) {
    case NanEncoding::kAllOnes:
      return sign | f.exponent_mask() | f.mantissa_mask();
    case NanEncoding::kIeee:  // quiet NaN: top mantissa bit set
      return sign | f.exponent_mask() | (f.mbits > 0 ? 1u << (f.mbits - 1) : 0u);
    default:  // no NaN: negative zero, as ml_dtypes does
      return f.sign_mask();
  }
}

uint32_t encode_float(const ElementFormat& f, float x, Rounding rounding, uint32_t rbits,
                      bool saturate) {
  const bool neg = std::signbit(x);
  const uint32_t sign = neg ? f.sign_mask() : 0;
  if (std::isnan(x)) return float_nan_code(f, neg);
  const uint32_t max_code = f.max_code();
  const uint32_t inf_code = f.exponent_mask();  // meaningful only with has_inf
  if (std::isinf(x)) {
    if (f.has_inf) return sign | inf_code;
    if (saturate || !f.has_nan()) return sign | max_code;
    return float_nan_code(f, neg);
  }
  const double a = std::fabs(double(x));
  if (a == 0.0) return sign;
  int e2 = 0;
  std::frexp(a, &e2);  // a = f * 2^e2, f in [0.5, 1): floor(log2 a) = e2 - 1
  // Biased exponent of a's binade, clamped to 1 for the subnormal range,
  // where the grid spacing stays 2^(1 - bias - mbits).
  const int eb = std::max(e2 - 1 + f.bias, 1);
  const int quantum_exp = eb - f.bias - f.mbits;      // grid spacing 2^quantum_exp
  const double q = std::ldexp(a, -quantum_exp);       // exact; < 2^(mbits+1)
  const double n = round_int(q, rounding, rbits);     // integer in [0, 2^(mbits+1)]
  // code = (eb - 1) << mbits + n: for normals n includes the implicit
  // 2^mbits, which adds the missing 1 to the exponent field; a carry out of
  // the mantissa (n = 2^(mbits+1)) moves to the next binade by itself.
  const int64_t code = (int64_t(eb - 1) << f.mbits) + int64_t(n);
  if (code > int64_t(max_code)) {
    if (saturate) return sign | max_code;
    if (f.has_inf) return sign | inf_code;
    if (f.has_nan()) return float_nan_code(f, neg);
    return sign | max_code;
  }
  return sign | uint32_t(code);
}

float decode_float(const ElementFormat& f, uint32_t code) {
  const bool neg = (code & f.sign_mask()) != 0;
  const uint32_t mag = code & (f.sign_mask() - 1);
  const int e = int(mag >> f.mbits);
  const uint32_t m = mag & f.mantissa_mask();
  const int emask = (1 << f.ebits) - 1;
  double v;
  if (f.nan == NanEncoding::kIeee && e == emask) {
    v = m == 0 ? std::numeric_limits<double>::infinity()
               : std::numeric_limits<double>::quiet_NaN();
  } else if (f.nan == NanEncoding::kAllOnes && e == emask && m == f.mantissa_mask()) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else if (e == 0) {
    v = std::ldexp(double(m), 1 - f.bias - f.mbits);
  } else {
    v = std::ldexp(double(m | (1u << f.mbits)), e - f.bias - f.mbits);
  }
  return float(neg ? -v : v);
}

uint32_t encode_int(const ElementFormat& f, float x, Rounding rounding, uint32_t rbits) {
  const double maxv = f.max_value();
  if (std::isnan(x)) return 0;
  double n;
  if (std::isinf(x)) {
    n = x > 0 ? maxv : -maxv;
  } else {
    const double v = std::clamp(double(x), -maxv - 1.0, maxv + 1.0);
    if (rounding == Rounding::kRNE) {
      n = std::nearbyint(v);
    } else {
      const double fl = std::floor(v);
      n = fl + (double(uniform_from_bits(rbits)) < v - fl ? 1.0 : 0.0);
    }
    n = std::clamp(n, -maxv, maxv);
  }
  return uint32_t(int32_t(n)) & f.code_mask();
}

float decode_int(const ElementFormat& f, uint32_t code) {
  code &= f.code_mask();
  const int32_t v = (code & f.sign_mask()) ? int32_t(code) - int32_t(f.num_codes())
                                           : int32_t(code);
  return float(v);
}

}  // namespace

uint32_t encode(const ElementFormat& fmt, float x, Rounding rounding, uint32_t random_bits,
                bool saturate) {
  switch (fmt.kind) {
    case ElementKind::kFloat:
      return encode_float(fmt, x, rounding, random_bits, saturate);
    case ElementKind::kPosit:
      return posit_encode(double(x), fmt.bits, fmt.ebits, rounding, random_bits);
    case ElementKind::kInt:
      return encode_int(fmt, x, rounding, random_bits);
  }
  return 0;
}

float decode(const ElementFormat& fmt, uint32_t code) {
  code &= fmt.code_mask();
  switch (fmt.kind) {
    case ElementKind::kFloat:
      return decode_float(fmt, code);
    case ElementKind::kPosit:
      return float(posit_decode(code, fmt.bits, fmt.ebits));
    case ElementKind::kInt:
      return decode_int(fmt, code);
  }
  return 0.0f;
}

bool is_nan_code(const ElementFormat& fmt, uint32_t code) {
  code &= fmt.code_mask();
  switch (fmt.nan) {
    case NanEncoding::kNone:
      return false;
    case NanEncoding::kNaR:
      return code == fmt.sign_mask();
    case NanEncoding::kAllOnes:
      return (code & (fmt.sign_mask() - 1)) == (fmt.exponent_mask() | fmt.mantissa_mask());
    case NanEncoding::kIeee:
      return (code & fmt.exponent_mask()) == fmt.exponent_mask() &&
             (code & fmt.mantissa_mask()) != 0;
  }
  return false;
}

bool is_inf_code(const ElementFormat& fmt, uint32_t code) {
  code &= fmt.code_mask();
  return fmt.has_inf && (code & (fmt.sign_mask() - 1)) == fmt.exponent_mask();
}

void validate_element_format(const ElementFormat& f, const std::string& where) {
  const std::string name = f.name ? f.name : "";
  if (name.empty() || !std::all_of(name.begin(), name.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
      }))
    fail(where, ": element format name: expected lower-case [a-z0-9_]+, got '", name, "'");
  const std::string w = str_cat(where, ": element format '", name, "': ");
  switch (f.kind) {
    case ElementKind::kFloat:
      if (f.ebits < 1 || f.ebits > 8) fail(w, "ebits: expected 1..8, got ", f.ebits);
      if (f.mbits < 0 || f.mbits > 23) fail(w, "mbits: expected 0..23, got ", f.mbits);
      if (f.bits != 1 + f.ebits + f.mbits)
        fail(w, "bits: expected 1 + ebits + mbits = ", 1 + f.ebits + f.mbits, ", got ", f.bits);
      if (f.bits > 16) fail(w, "bits: expected <= 16, got ", f.bits);
      if (f.bias < 0 || f.bias > 127) fail(w, "bias: expected 0..127, got ", f.bias);
      if (f.has_inf && f.nan != NanEncoding::kIeee)
        fail(w, "has_inf: Inf needs the IEEE NaN encoding");
      if (f.nan == NanEncoding::kNaR) fail(w, "nan: NaR is a posit encoding");
      if (f.nan == NanEncoding::kAllOnes && f.mbits == 0)
        fail(w, "nan: all-ones NaN needs mantissa bits");
      if (f.nan == NanEncoding::kIeee && f.ebits < 2)
        fail(w, "nan: IEEE Inf/NaN needs ebits >= 2");
      break;
    case ElementKind::kPosit:
      if (f.bits < 3 || f.bits > 16) fail(w, "bits: expected 3..16, got ", f.bits);
      if (f.ebits < 0 || f.ebits > 4) fail(w, "es: expected 0..4, got ", f.ebits);
      if (f.nan != NanEncoding::kNaR || f.has_inf) fail(w, "nan: posits have NaR and no Inf");
      break;
    case ElementKind::kInt:
      if (f.bits < 2 || f.bits > 16) fail(w, "bits: expected 2..16, got ", f.bits);
      if (f.nan != NanEncoding::kNone || f.has_inf) fail(w, "nan: integers have no NaN/Inf");
      break;
  }
}

// ---------------------------------------------------------------------------
// Registry
// ---------------------------------------------------------------------------
namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, ElementFormat> formats;
  std::deque<std::string> names;  // stable storage for registered names

  Registry() {
    for (const ElementFormat& f :
         {kE2M1, kE1M2, kE2M3, kE3M2, kE4M3, kE5M2, kBF16, kPosit8, kInt8, kInt4})
      formats.emplace(f.name, f);
  }
};

Registry& registry() {
  static Registry r;
  return r;
}

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

std::optional<ElementFormat> lookup_element_format(const std::string& name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  const auto it = r.formats.find(lower(name));
  if (it == r.formats.end()) return std::nullopt;
  return it->second;
}

ElementFormat find_element_format(const std::string& name) {
  if (const std::optional<ElementFormat> f = lookup_element_format(name)) return *f;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::string known;
  for (const auto& kv : r.formats) known += (known.empty() ? "" : ", ") + kv.first;
  fail("unknown element format '", name, "' (known: ", known, ")");
}

std::vector<std::string> element_format_names() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> out;
  for (const auto& kv : r.formats) out.push_back(kv.first);
  return out;
}

void register_element_format(const ElementFormat& fmt) {
  validate_element_format(fmt, "register_element_format");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  const auto it = r.formats.find(fmt.name);
  if (it != r.formats.end()) {
    if (it->second == fmt) return;
    fail("register_element_format: name '", fmt.name,
         "' is already registered with different traits");
  }
  r.names.emplace_back(fmt.name);
  ElementFormat copy = fmt;
  copy.name = r.names.back().c_str();
  r.formats.emplace(r.names.back(), copy);
}

}  // namespace snip::formats
