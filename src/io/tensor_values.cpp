// Values of safetensors tensors (see snip/io/tensor_values.h for the rules).
#include "snip/io/tensor_values.h"

#include <array>
#include <limits>
#include <cmath>
#include <cstring>

#include "snip/formats/element_format.h"
#include "snip/formats/minifloat.h"
#include "snip/formats/scale_format.h"
#include "snip/core/error.h"

namespace snip::io {
namespace {

using formats::ElementFormat;
using formats::ElementKind;
using formats::NanEncoding;

// IEEE binary16: bias 15, 10 mantissa bits, Inf/NaN at the all-ones exponent.
constexpr ElementFormat kF16{"f16", ElementKind::kFloat, 16, 5, 10, 15, true, NanEncoding::kIeee};
// The FNUZ FP8 formats (arXiv 2206.02915; PyTorch float8_e4m3fnuz /
// float8_e5m2fnuz): the traits of a format with no Inf and no NaN, bias 8
// resp. 16; their one NaN, 0x80 (the code negative zero would have), is
// the exception applied in fnuz_table().
constexpr ElementFormat kE4M3Fnuz{"e4m3fnuz", ElementKind::kFloat, 8, 4, 3, 8, false, NanEncoding::kNone};
constexpr ElementFormat kE5M2Fnuz{"e5m2fnuz", ElementKind::kFloat, 8, 5, 2, 16, false, NanEncoding::kNone};
static_assert(kE4M3Fnuz.max_value() == 240.0 && kE4M3Fnuz.min_subnormal() == 1.0 / 1024);
static_assert(kE5M2Fnuz.max_value() == 57344.0 && kE5M2Fnuz.min_subnormal() == 1.0 / 131072);
static_assert(kF16.max_value() == 65504.0);

using Table8 = std::array<float, 256>;

/// Value of every code of an 8-bit format.
Table8 table8(const ElementFormat& f) {
  Table8 t{};
  for (uint32_t c = 0; c < 256; ++c) t[c] = formats::decode(f, c);
  return t;
}

Table8 fnuz_table(const ElementFormat& f) {
  Table8 t = table8(f);
  t[0x80] = std::numeric_limits<float>::quiet_NaN();
  return t;
}

Table8 e8m0_table() {
  Table8 t{};
  for (uint32_t c = 0; c < 256; ++c) t[c] = formats::e8m0_decode(uint8_t(c));
  return t;
}

/// Value of each F4 byte's two elements: [byte][0] = low nibble (element
/// 2k), [byte][1] = high nibble (element 2k + 1).
std::array<std::array<float, 2>, 256> f4_pair_table() {
  std::array<std::array<float, 2>, 256> t{};
  for (uint32_t b = 0; b < 256; ++b)
    t[b] = {formats::decode(formats::kE2M1, b & 0xF), formats::decode(formats::kE2M1, b >> 4)};
  return t;
}

const std::vector<float>& f16_table() {
  static const std::vector<float> t = [] {
    std::vector<float> v(65536);
    for (uint32_t c = 0; c < 65536; ++c) v[c] = formats::decode(kF16, c);
    return v;
  }();
  return t;
}

void apply8(const Table8& t, const uint8_t* p, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = t[p[i]];
}

uint16_t load_u16(const uint8_t* p) { return uint16_t(p[0] | (p[1] << 8)); }  // little-endian

}  // namespace

DTypeKind dtype_kind(DType d) {
  switch (d) {
    case DType::BOOL: return DTypeKind::kBool;
    case DType::U8: case DType::U16: case DType::U32: case DType::U64:
    case DType::I8: case DType::I16: case DType::I32: case DType::I64:
      return DTypeKind::kInteger;
    case DType::C64: return DTypeKind::kComplex;
    case DType::F64: case DType::F32: case DType::F16: case DType::BF16:
    case DType::F8_E4M3: case DType::F8_E5M2: case DType::F8_E8M0:
    case DType::F8_E4M3FNUZ: case DType::F8_E5M2FNUZ:
    case DType::F4: case DType::F6_E2M3: case DType::F6_E3M2:
      return DTypeKind::kFloat;
  }
  SNIP_CHECK(false, "unhandled DType ", static_cast<int>(d));
  return DTypeKind::kBool;
}

F32Conversion f32_conversion(DType d) {
  if (dtype_kind(d) != DTypeKind::kFloat) return F32Conversion::kNone;
  if (d == DType::F64) return F32Conversion::kRounded;
  if (d == DType::F6_E2M3 || d == DType::F6_E3M2) return F32Conversion::kNone;
  return F32Conversion::kExact;
}

std::vector<float> decode_to_f32(const TensorRecord& r, const std::string& what) {
  const std::string name = dtype_name(r.dtype);
  switch (dtype_kind(r.dtype)) {
    case DTypeKind::kBool:
    case DTypeKind::kInteger:
      fail(what, ": tensor '", r.name, "': ", name, " is not floating point (expected a float dtype)");
    case DTypeKind::kComplex:
      fail(what, ": tensor '", r.name, "': ", name, " is complex, not a real value (expected a float dtype)");
    case DTypeKind::kFloat:
      break;
  }
  if (r.dtype == DType::F6_E2M3 || r.dtype == DType::F6_E3M2)
    fail(what, ": tensor '", r.name, "': ", name,
         " is not decoded: the safetensors format fixes its size (6 bits) but not the order of the bits "
         "inside its bytes; convert it to F32 or BF16 first");
  SNIP_CHECK(r.data.size() == r.nbytes(), "tensor ", r.name, ": ", r.data.size(), " bytes, expected ",
             r.nbytes());
  const size_t n = size_t(r.numel());
  std::vector<float> out(n);
  const uint8_t* p = r.data.data();
  switch (r.dtype) {
    case DType::F32:
      if (n) std::memcpy(out.data(), p, n * 4);
      break;
    case DType::F64:
      for (size_t i = 0; i < n; ++i) {
        double d;
        std::memcpy(&d, p + 8 * i, 8);
        out[i] = float(d);  // IEEE conversion: round to nearest, ties to even
        if (std::isinf(out[i]) && std::isfinite(d))
          fail(what, ": tensor '", r.name, "': F64 element ", i, " = ", d,
               " is beyond FP32's range (max 3.40282347e+38) and would become Inf");
      }
      break;
    case DType::F16: {
      const std::vector<float>& t = f16_table();
      for (size_t i = 0; i < n; ++i) out[i] = t[load_u16(p + 2 * i)];
      break;
    }
    case DType::BF16:
      for (size_t i = 0; i < n; ++i) {
        const uint32_t bits = uint32_t(load_u16(p + 2 * i)) << 16;
        std::memcpy(&out[i], &bits, 4);
      }
      break;
    case DType::F8_E4M3: apply8(table8(formats::kE4M3), p, n, out.data()); break;
    case DType::F8_E5M2: apply8(table8(formats::kE5M2), p, n, out.data()); break;
    case DType::F8_E4M3FNUZ: apply8(fnuz_table(kE4M3Fnuz), p, n, out.data()); break;
    case DType::F8_E5M2FNUZ: apply8(fnuz_table(kE5M2Fnuz), p, n, out.data()); break;
    case DType::F8_E8M0: apply8(e8m0_table(), p, n, out.data()); break;
    case DType::F4: {
      const auto t = f4_pair_table();
      for (size_t i = 0; i < n; ++i) out[i] = t[p[i / 2]][i % 2];
      break;
    }
    default:
      SNIP_CHECK(false, "unhandled float dtype ", name);
  }
  return out;
}

}  // namespace snip::io
