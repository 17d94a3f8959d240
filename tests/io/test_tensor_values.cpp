// Tests for snip/io/tensor_values.h: every code of every float dtype of at
// most 16 bits against values derived by hand from the formats' specs (the
// sign/exponent/mantissa formula written out here, special codes listed one
// by one, and landmark values typed in as literals), never against the
// decoder itself.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "snip/io/tensor_values.h"
#include "snip/core/error.h"

namespace snip::io {
namespace {

using ::testing::HasSubstr;

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

/// A record of `dtype` holding `bytes` (shape [numel]).
TensorRecord record(DType dtype, int64_t numel, const std::vector<uint8_t>& bytes) {
  TensorRecord r;
  r.name = "t";
  r.dtype = dtype;
  r.shape = {numel};
  r.data = bytes;
  return r;
}

/// Every 8-bit code 0..255 in order, as a record of `dtype`.
std::vector<float> all_codes8(DType dtype) {
  std::vector<uint8_t> b(256);
  for (int c = 0; c < 256; ++c) b[size_t(c)] = uint8_t(c);
  return decode_to_f32(record(dtype, 256, b), "test");
}

/// Every 16-bit code 0..65535 in order (little-endian), as a record of `dtype`.
std::vector<float> all_codes16(DType dtype) {
  std::vector<uint8_t> b(2 * 65536);
  for (uint32_t c = 0; c < 65536; ++c) {
    b[2 * c] = uint8_t(c & 0xFF);
    b[2 * c + 1] = uint8_t(c >> 8);
  }
  return decode_to_f32(record(dtype, 65536, b), "test");
}

/// The value of sign/exponent/mantissa fields by the minifloat formula of
/// the OCP specs and IEEE-754: (-1)^S 2^(E-bias) (1 + M/2^m) for E > 0,
/// (-1)^S 2^(1-bias) (M/2^m) for E = 0. Special codes are the caller's.
float by_formula(uint32_t code, int ebits, int mbits, int bias) {
  const uint32_t s = code >> (ebits + mbits), e = (code >> mbits) & ((1u << ebits) - 1),
                 m = code & ((1u << mbits) - 1);
  const double frac = double(m) / double(1u << mbits);
  const double mag = e == 0 ? std::ldexp(frac, 1 - bias) : std::ldexp(1.0 + frac, int(e) - bias);
  return float(s ? -mag : mag);
}

/// Bit-exact comparison that also matches NaN with NaN (any payload) and
/// tells -0 from +0.
void expect_same(float got, float want, const std::string& where) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << where << ": got " << got;
    return;
  }
  uint32_t g, w;
  std::memcpy(&g, &got, 4);
  std::memcpy(&w, &want, 4);
  EXPECT_EQ(g, w) << where << ": got " << got << ", want " << want;
}

std::string hex(uint32_t c) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%02x", c);
  return buf;
}

// --------------------------------------------------------------- kinds ---

TEST(TensorValues, KindAndConversionOfEveryDType) {
  // (dtype, kind, conversion), typed in from the table in tensor_values.h.
  struct Row { DType d; DTypeKind k; F32Conversion c; };
  const std::vector<Row> rows = {
      {DType::BOOL, DTypeKind::kBool, F32Conversion::kNone},
      {DType::U8, DTypeKind::kInteger, F32Conversion::kNone},
      {DType::I8, DTypeKind::kInteger, F32Conversion::kNone},
      {DType::I16, DTypeKind::kInteger, F32Conversion::kNone},
      {DType::U16, DTypeKind::kInteger, F32Conversion::kNone},
      {DType::F16, DTypeKind::kFloat, F32Conversion::kExact},
      {DType::BF16, DTypeKind::kFloat, F32Conversion::kExact},
      {DType::I32, DTypeKind::kInteger, F32Conversion::kNone},
      {DType::U32, DTypeKind::kInteger, F32Conversion::kNone},
      {DType::F32, DTypeKind::kFloat, F32Conversion::kExact},
      {DType::F64, DTypeKind::kFloat, F32Conversion::kRounded},
      {DType::I64, DTypeKind::kInteger, F32Conversion::kNone},
      {DType::U64, DTypeKind::kInteger, F32Conversion::kNone},
      {DType::F8_E4M3, DTypeKind::kFloat, F32Conversion::kExact},
      {DType::F8_E5M2, DTypeKind::kFloat, F32Conversion::kExact},
      {DType::F8_E8M0, DTypeKind::kFloat, F32Conversion::kExact},
      {DType::F8_E4M3FNUZ, DTypeKind::kFloat, F32Conversion::kExact},
      {DType::F8_E5M2FNUZ, DTypeKind::kFloat, F32Conversion::kExact},
      {DType::F4, DTypeKind::kFloat, F32Conversion::kExact},
      {DType::F6_E2M3, DTypeKind::kFloat, F32Conversion::kNone},
      {DType::F6_E3M2, DTypeKind::kFloat, F32Conversion::kNone},
      {DType::C64, DTypeKind::kComplex, F32Conversion::kNone},
  };
  ASSERT_EQ(rows.size(), all_dtypes().size());  // a new dtype needs a row here
  for (const Row& r : rows) {
    EXPECT_EQ(dtype_kind(r.d), r.k) << dtype_name(r.d);
    EXPECT_EQ(f32_conversion(r.d), r.c) << dtype_name(r.d);
  }
}

// ------------------------------------------------------- 8-bit tables ---

TEST(TensorValues, E8M0EveryCode) {
  // OCP MX v1.0 section 5.4: 2^(c - 127); 0xFF = NaN.
  const std::vector<float> v = all_codes8(DType::F8_E8M0);
  for (uint32_t c = 0; c < 255; ++c) expect_same(v[c], std::ldexp(1.0f, int(c) - 127), hex(c));
  EXPECT_TRUE(std::isnan(v[0xFF]));
  // Landmarks as literals: 2^-127 (an FP32 subnormal), 1, 2, 2^127.
  expect_same(v[0x00], 5.877471754111438e-39f, "0x00");
  expect_same(v[0x7F], 1.0f, "0x7f");
  expect_same(v[0x80], 2.0f, "0x80");
  expect_same(v[0x7E], 0.5f, "0x7e");
  expect_same(v[0xFE], 1.7014118346046923e38f, "0xfe");
}

TEST(TensorValues, E4M3EveryCode) {
  // OCP OFP8 E4M3: bias 7, no Inf, NaN = S.1111.111 (0x7F, 0xFF).
  const std::vector<float> v = all_codes8(DType::F8_E4M3);
  for (uint32_t c = 0; c < 256; ++c) {
    const float want = (c & 0x7F) == 0x7F ? kNaN : by_formula(c, 4, 3, 7);
    expect_same(v[c], want, hex(c));
  }
  expect_same(v[0x7E], 448.0f, "max");
  expect_same(v[0xFE], -448.0f, "-max");
  expect_same(v[0x38], 1.0f, "one");
  expect_same(v[0x08], 0.015625f, "min normal 2^-6");
  expect_same(v[0x01], 0.001953125f, "min subnormal 2^-9");
  expect_same(v[0x80], -0.0f, "negative zero");
}

TEST(TensorValues, E5M2EveryCode) {
  // OCP OFP8 E5M2 (IEEE style): bias 15, Inf S.11111.00, NaN S.11111.{01,10,11}.
  const std::vector<float> v = all_codes8(DType::F8_E5M2);
  for (uint32_t c = 0; c < 256; ++c) {
    float want = by_formula(c, 5, 2, 15);
    if ((c & 0x7C) == 0x7C) want = (c & 0x03) ? kNaN : ((c & 0x80) ? -kInf : kInf);
    expect_same(v[c], want, hex(c));
  }
  expect_same(v[0x7B], 57344.0f, "max");
  expect_same(v[0x7C], kInf, "+inf");
  expect_same(v[0xFC], -kInf, "-inf");
  expect_same(v[0x3C], 1.0f, "one");
  expect_same(v[0x01], 1.52587890625e-05f, "min subnormal 2^-16");
}

TEST(TensorValues, E4M3FnuzEveryCode) {
  // arXiv 2206.02915 / PyTorch float8_e4m3fnuz: bias 8, no Inf, no -0,
  // 0x80 is the only NaN.
  const std::vector<float> v = all_codes8(DType::F8_E4M3FNUZ);
  for (uint32_t c = 0; c < 256; ++c) {
    const float want = c == 0x80 ? kNaN : by_formula(c, 4, 3, 8);
    expect_same(v[c], want, hex(c));
  }
  expect_same(v[0x7F], 240.0f, "max");
  expect_same(v[0xFF], -240.0f, "-max");
  expect_same(v[0x40], 1.0f, "one");
  expect_same(v[0x01], 0.0009765625f, "min subnormal 2^-10");
  expect_same(v[0x00], 0.0f, "zero");
  EXPECT_TRUE(std::isnan(v[0x80]));
}

TEST(TensorValues, E5M2FnuzEveryCode) {
  // PyTorch float8_e5m2fnuz: bias 16, no Inf, no -0, 0x80 is the only NaN.
  const std::vector<float> v = all_codes8(DType::F8_E5M2FNUZ);
  for (uint32_t c = 0; c < 256; ++c) {
    const float want = c == 0x80 ? kNaN : by_formula(c, 5, 2, 16);
    expect_same(v[c], want, hex(c));
  }
  expect_same(v[0x7F], 57344.0f, "max");
  expect_same(v[0x40], 1.0f, "one");
  expect_same(v[0x01], 7.62939453125e-06f, "min subnormal 2^-17");
  EXPECT_TRUE(std::isnan(v[0x80]));
}

TEST(TensorValues, F4EveryCodeAndNibbleOrder) {
  // OCP MX FP4 (E2M1), typed in: codes 0..15.
  const float table[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                           -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  // Bytes 0x10, 0x32, ..., 0xFE: element 2k in the low nibble, so codes come
  // out 0, 1, 2, ..., 15 in order.
  std::vector<uint8_t> b;
  for (int k = 0; k < 8; ++k) b.push_back(uint8_t((2 * k) | ((2 * k + 1) << 4)));
  const std::vector<float> v = decode_to_f32(record(DType::F4, 16, b), "test");
  ASSERT_EQ(v.size(), 16u);
  for (int c = 0; c < 16; ++c) expect_same(v[size_t(c)], table[c], "code " + std::to_string(c));
  // One byte 0x7A: low nibble 0xA (-1.0) first, high nibble 0x7 (6.0) second.
  const std::vector<float> one = decode_to_f32(record(DType::F4, 2, {0x7A}), "test");
  expect_same(one[0], -1.0f, "element 0 (low nibble)");
  expect_same(one[1], 6.0f, "element 1 (high nibble)");
  // Shape [2, 2]: row-major, 2 bytes.
  TensorRecord r = record(DType::F4, 4, {0x21, 0x43});
  r.shape = {2, 2};
  const std::vector<float> m = decode_to_f32(r, "test");
  EXPECT_EQ(m, (std::vector<float>{0.5f, 1.0f, 1.5f, 2.0f}));
}

// ------------------------------------------------------ 16-bit tables ---

TEST(TensorValues, F16EveryCode) {
  // IEEE binary16: bias 15, Inf/NaN at E = 31.
  const std::vector<float> v = all_codes16(DType::F16);
  for (uint32_t c = 0; c < 65536; ++c) {
    float want = by_formula(c, 5, 10, 15);
    if ((c & 0x7C00) == 0x7C00) want = (c & 0x3FF) ? kNaN : ((c & 0x8000) ? -kInf : kInf);
    expect_same(v[c], want, hex(c));
  }
  expect_same(v[0x3C00], 1.0f, "one");
  expect_same(v[0x7BFF], 65504.0f, "max");
  expect_same(v[0x0001], 5.960464477539063e-08f, "min subnormal 2^-24");
  expect_same(v[0xC000], -2.0f, "-2");
}

TEST(TensorValues, BF16EveryCode) {
  // bfloat16: bias 127, Inf/NaN at E = 255.
  const std::vector<float> v = all_codes16(DType::BF16);
  for (uint32_t c = 0; c < 65536; ++c) {
    float want = by_formula(c, 8, 7, 127);
    if ((c & 0x7F80) == 0x7F80) want = (c & 0x7F) ? kNaN : ((c & 0x8000) ? -kInf : kInf);
    expect_same(v[c], want, hex(c));
  }
  expect_same(v[0x3F80], 1.0f, "one");
  expect_same(v[0x7F7F], 3.3895313892515355e38f, "max");
  expect_same(v[0x0001], 9.183549615799121e-41f, "min subnormal 2^-133");
}

// ------------------------------------------------------- F32 and F64 ---

TEST(TensorValues, F32IsCopiedBitForBit) {
  const std::vector<uint32_t> bits = {0x3f800000u, 0x80000000u, 0x7fc00001u, 0x00000001u, 0xff800000u};
  std::vector<uint8_t> b(bits.size() * 4);
  std::memcpy(b.data(), bits.data(), b.size());
  const std::vector<float> v = decode_to_f32(record(DType::F32, int64_t(bits.size()), b), "test");
  for (size_t i = 0; i < bits.size(); ++i) {
    uint32_t g;
    std::memcpy(&g, &v[i], 4);
    EXPECT_EQ(g, bits[i]) << i;  // NaN payload kept
  }
}

TEST(TensorValues, F64RoundsToNearestEvenAndRefusesWhatWouldBeInf) {
  // Hand-derived: 1 + 2^-24 is halfway between 1 and 1 + 2^-23: ties to
  // even -> 1. 1 + 3*2^-24 is halfway between 1 + 2^-23 and 1 + 2^-22 ->
  // 1 + 2^-22 (even mantissa). 1/3 -> 0x3eaaaaab = 0.3333333432674408.
  // FLT_MAX stays; 1e-50 underflows to +0.
  const std::vector<double> in = {1.0 + std::ldexp(1.0, -24), 1.0 + 3 * std::ldexp(1.0, -24), 1.0 / 3.0,
                                  3.4028234663852886e38, 1e-50, -kInf, double(kNaN)};
  const std::vector<float> want = {1.0f, 1.0f + std::ldexp(1.0f, -22), 0.3333333432674408f,
                                   3.4028234663852886e38f, 0.0f, -kInf, kNaN};
  std::vector<uint8_t> b(in.size() * 8);
  std::memcpy(b.data(), in.data(), b.size());
  const std::vector<float> v = decode_to_f32(record(DType::F64, int64_t(in.size()), b), "test");
  for (size_t i = 0; i < in.size(); ++i) expect_same(v[i], want[i], std::to_string(i));
  // A finite value beyond FP32's range would become Inf: refused.
  const double big[2] = {1.0, 3.5e38};
  std::vector<uint8_t> bb(16);
  std::memcpy(bb.data(), big, 16);
  try {
    decode_to_f32(record(DType::F64, 2, bb), "in.safetensors");
    ADD_FAILURE();
  } catch (const UserError& e) {
    EXPECT_THAT(e.what(), HasSubstr("in.safetensors: tensor 't': F64 element 1 = 3.5e+38 is beyond FP32's range"));
  }
}

// ---------------------------------------------------- not decoded ---

TEST(TensorValues, NonFloatF6AndComplexAreRefusedByName) {
  const std::vector<std::pair<DType, std::string>> cases = {
      {DType::BOOL, "BOOL is not floating point"},
      {DType::U8, "U8 is not floating point"},
      {DType::I64, "I64 is not floating point"},
      {DType::C64, "C64 is complex, not a real value"},
      {DType::F6_E2M3, "F6_E2M3 is not decoded: the safetensors format fixes its size (6 bits) but not"},
      {DType::F6_E3M2, "F6_E3M2 is not decoded"},
  };
  for (const auto& [d, msg] : cases) {
    TensorRecord r = record(d, 4, std::vector<uint8_t>(size_t(4 * dtype_bits(d) / 8), 0));
    try {
      decode_to_f32(r, "f.safetensors");
      ADD_FAILURE() << dtype_name(d);
    } catch (const UserError& e) {
      EXPECT_THAT(e.what(), HasSubstr("f.safetensors: tensor 't': " + msg));
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace snip::io
