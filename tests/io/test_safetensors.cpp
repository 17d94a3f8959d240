// Tests for snip/io/safetensors.h against hand-built files and every
// malformation the reader must reject.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "snip/io/atomic_file.h"
#include "snip/io/safetensors.h"
#include "snip/core/error.h"
#include "tmpdir.h"

namespace snip::io {
namespace {

using testing::TmpDirTest;
using ::testing::HasSubstr;

const std::vector<DType>& kAll = all_dtypes();

/// u64 little-endian, written out byte by byte.
std::string le64(uint64_t v) {
  std::string s;
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return s;
}

/// A file image: header length, `header` as given, then `buffer`.
std::string image(const std::string& header, const std::string& buffer = "") {
  return le64(header.size()) + header + buffer;
}

bool same(const TensorRecord& a, const TensorRecord& b) {
  return a.name == b.name && a.dtype == b.dtype && a.shape == b.shape && a.data == b.data;
}

// ------------------------------------------------------------------ dtypes ---

TEST(SafeTensorsDType, NamesAndBitsMatchTheReference) {
  // Hand-written from huggingface/safetensors, safetensors/src/tensor.rs
  // (`enum Dtype`, `Dtype::bitsize`): every dtype of the current format.
  const std::vector<std::pair<std::string, int>> expect = {
      {"BOOL", 8},        {"U8", 8},          {"I8", 8},      {"I16", 16},     {"U16", 16},
      {"F16", 16},        {"BF16", 16},       {"I32", 32},    {"U32", 32},     {"F32", 32},
      {"F64", 64},        {"I64", 64},        {"U64", 64},    {"F8_E4M3", 8},  {"F8_E5M2", 8},
      {"F8_E8M0", 8},     {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8}, {"F4", 4},   {"F6_E2M3", 6},
      {"F6_E3M2", 6},     {"C64", 64}};
  ASSERT_EQ(expect.size(), kAll.size());
  for (size_t i = 0; i < kAll.size(); ++i) {
    EXPECT_EQ(dtype_name(kAll[i]), expect[i].first);
    EXPECT_EQ(dtype_bits(kAll[i]), expect[i].second) << expect[i].first;
    EXPECT_EQ(parse_dtype(expect[i].first), kAll[i]);
  }
  for (const char* bad : {"F33", "f32", "float32", "", "BF16 ", "E8M0", "F8_E8M0FNU", "F4_E2M1", "C128"}) {
    try {
      parse_dtype(bad);
      ADD_FAILURE() << bad;
    } catch (const UserError& e) {
      EXPECT_THAT(e.what(), HasSubstr("unknown safetensors dtype '" + std::string(bad) + "'"));
      EXPECT_THAT(e.what(), HasSubstr("BF16"));  // lists the valid names
      EXPECT_THAT(e.what(), HasSubstr("F8_E8M0"));
    }
  }
}

TEST(SafeTensorsDType, SubByteTensorsFillWholeBytes) {
  // The reference's rule: bytes = numel * bits / 8, refused unless numel *
  // bits is a multiple of 8 (F4 [1, 3] = 12 bits is MisalignedSlice there).
  EXPECT_EQ(tensor_bytes({1, 2}, DType::F4, "t"), 1u);
  EXPECT_EQ(tensor_bytes({3, 6}, DType::F4, "t"), 9u);
  EXPECT_EQ(tensor_bytes({4}, DType::F6_E2M3, "t"), 3u);
  EXPECT_EQ(tensor_bytes({2, 8}, DType::F6_E3M2, "t"), 12u);
  EXPECT_EQ(tensor_bytes({0, 3}, DType::F4, "t"), 0u);
  EXPECT_EQ(tensor_bytes({}, DType::C64, "t"), 8u);
  EXPECT_EQ(tensor_bytes({3}, DType::F8_E8M0, "t"), 3u);
  for (const auto& [shape, d] : std::vector<std::pair<std::vector<int64_t>, DType>>{
           {{1, 3}, DType::F4}, {{}, DType::F4}, {{2}, DType::F6_E2M3}, {{5}, DType::F6_E3M2}}) {
    try {
      tensor_bytes(shape, d, "tensor \"x\"");
      ADD_FAILURE() << dtype_name(d);
    } catch (const UserError& e) {
      EXPECT_THAT(e.what(), HasSubstr("not a whole number of bytes"));
      EXPECT_THAT(e.what(), HasSubstr("tensor \"x\": shape"));
    }
  }
  SafeTensors st;
  const uint8_t b[2] = {0x21, 0x43};
  EXPECT_EQ(st.add("f4", DType::F4, {4}, b).nbytes(), 2u);
  EXPECT_THROW(st.add("f4odd", DType::F4, {3}, b), UserError);
  // A reader meets the same rule: F4 [3] claiming 2 bytes.
  const std::string h = R"({"x":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})";
  try {
    parse_safetensors(le64(h.size()) + h + "ab", "odd.safetensors");
    ADD_FAILURE();
  } catch (const UserError& e) {
    EXPECT_THAT(e.what(), HasSubstr("odd.safetensors: tensor \"x\": shape [3] of F4 holds 3 elements"));
  }
}

// A spec-valid file with an E8M0 scale was "unknown safetensors dtype
// 'F8_E8M0'". Bytes written out by hand.
TEST(SafeTensorsDType, ReadsAnE8M0ScaleBesideItsWeights) {
  const std::string h =
      R"({"w":{"dtype":"F32","shape":[1,4],"data_offsets":[0,16]},)"
      R"("w_scale":{"dtype":"F8_E8M0","shape":[1],"data_offsets":[16,17]}})";
  std::string buf;
  for (int i = 0; i < 4; ++i) buf += std::string("\x00\x00\x80\x3f", 4);  // 1.0f
  buf += "\x7f";
  const SafeTensors st = parse_safetensors(le64(h.size()) + h + buf, "mx.safetensors");
  ASSERT_EQ(st.tensors.size(), 2u);
  const TensorRecord* s = st.find("w_scale");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->dtype, DType::F8_E8M0);
  EXPECT_EQ(s->shape, std::vector<int64_t>{1});
  EXPECT_EQ(s->data, std::vector<uint8_t>{0x7f});
}

TEST(SafeTensorsRecord, NumelAndAdd) {
  SafeTensors st;
  const float v[6] = {1, 2, 3, 4, 5, 6};
  TensorRecord& r = st.add("m", DType::F32, {2, 3}, v);
  EXPECT_EQ(r.numel(), 6);
  EXPECT_EQ(r.nbytes(), 24u);
  EXPECT_EQ(std::memcmp(r.data.data(), v, 24), 0);
  const double s = 2.5;
  EXPECT_EQ(st.add("s", DType::F64, {}, &s).numel(), 1);
  EXPECT_EQ(st.add("z", DType::F64, {4, 0}, nullptr).numel(), 0);
  EXPECT_EQ(st.find("s")->shape.size(), 0u);
  EXPECT_EQ(st.find("nope"), nullptr);
  EXPECT_THROW(st.add("m", DType::F32, {1}, v), UserError);             // duplicate
  EXPECT_THROW(st.add("neg", DType::F32, {-1}, v), UserError);          // negative dim
  EXPECT_THROW(st.add("__metadata__", DType::F32, {1}, v), UserError);  // reserved
  EXPECT_THROW(st.add("", DType::F32, {1}, v), UserError);
  EXPECT_EQ(st.tensors.size(), 3u);
}

// ------------------------------------------------------ hand-built files ---

TEST(SafeTensorsFormat, ByteExactAgainstHandBuiltFile) {
  // header JSON (79 bytes, counted by hand) + 1 space to reach 80 = 0x50:
  const std::string json =
      R"({"__metadata__":{"k":"v"},"w":{"data_offsets":[0,8],"dtype":"F32","shape":[2]}})";
  ASSERT_EQ(json.size(), 79u);
  std::string expected("\x50\0\0\0\0\0\0\0", 8);
  expected += json + " ";
  // 1.0f = 0x3f800000, -2.0f = 0xc0000000, little-endian.
  expected += std::string("\x00\x00\x80\x3f\x00\x00\x00\xc0", 8);
  ASSERT_EQ(expected.size(), 96u);

  SafeTensors st;
  st.metadata["k"] = "v";
  const float w[2] = {1.0f, -2.0f};
  st.add("w", DType::F32, {2}, w);
  EXPECT_EQ(serialize_safetensors(st), expected);

  SafeTensors back = parse_safetensors(expected, "hand.safetensors");
  ASSERT_EQ(back.tensors.size(), 1u);
  EXPECT_TRUE(same(back.tensors[0], st.tensors[0]));
  EXPECT_EQ(back.metadata, st.metadata);
}

TEST(SafeTensorsFormat, HandBuiltTwoTensorsWithoutMetadata) {
  // Data order follows `tensors`, header keys are sorted: "b" is written
  // first in the buffer but appears second in the JSON.
  SafeTensors st;
  const uint16_t b = 0x3f80;  // BF16 1.0
  const int8_t a[3] = {-1, 0, 127};
  st.add("b", DType::BF16, {}, &b);
  st.add("a", DType::I8, {3}, a);
  const std::string json =
      R"({"a":{"data_offsets":[2,5],"dtype":"I8","shape":[3]},)"
      R"("b":{"data_offsets":[0,2],"dtype":"BF16","shape":[]}})";
  ASSERT_EQ(json.size(), 106u);  // 53 + 53 bytes, padded by 6 to 112
  const std::string expected =
      le64(112) + json + "      " + std::string("\x80\x3f\xff\x00\x7f", 5);
  EXPECT_EQ(serialize_safetensors(st), expected);
  // Reading yields file order (by data offset): b then a.
  SafeTensors back = parse_safetensors(expected, "x");
  ASSERT_EQ(back.tensors.size(), 2u);
  EXPECT_TRUE(same(back.tensors[0], st.tensors[0]));
  EXPECT_TRUE(same(back.tensors[1], st.tensors[1]));
  EXPECT_TRUE(back.metadata.empty());
}

TEST(SafeTensorsFormat, AcceptsUnpaddedAndExtraWhitespaceHeaders) {
  // Other writers may not pad, or pad with more spaces; both are valid.
  const std::string h = R"({"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})";
  for (const std::string& hdr : {h, h + "       ", std::string("{}")}) {
    const std::string buf = hdr == "{}" ? "" : "\x01\x02";
    SafeTensors st = parse_safetensors(image(hdr, buf), "w");
    EXPECT_EQ(st.tensors.size(), hdr == "{}" ? 0u : 1u);
  }
}

class SafeTensorsFile : public TmpDirTest {};

TEST_F(SafeTensorsFile, RoundTripAllDTypesScalarsAndEmpty) {
  SafeTensors st;
  st.metadata = {{"format", "pt"}, {"note", "utf-8 \xc3\xa9 \"quoted\"\n"}};
  uint8_t counter = 1;
  for (DType d : kAll) {
    for (const std::vector<int64_t>& shape :
         {std::vector<int64_t>{2, 3}, std::vector<int64_t>{}, std::vector<int64_t>{0},
          std::vector<int64_t>{3, 0, 2}, std::vector<int64_t>{1, 1, 5},
          std::vector<int64_t>{2, 4}}) {
      int64_t n = 1;
      for (int64_t s : shape) n *= s;
      if ((n * dtype_bits(d)) % 8 != 0) continue;  // sub-byte: whole bytes only
      std::vector<uint8_t> bytes(static_cast<size_t>(n * dtype_bits(d) / 8));
      for (auto& b : bytes) b = counter++;
      st.add(dtype_name(d) + "/" + std::to_string(shape.size()) + "/" +
                 std::to_string(n),
             d, shape, bytes.data());
    }
  }
  const std::string p = at("all.safetensors");
  write_safetensors(p, st);
  EXPECT_EQ(entries(), std::vector<std::string>{"all.safetensors"});
  const std::string img = read_file(p);
  EXPECT_EQ(img, serialize_safetensors(st));
  uint64_t n = 0;
  std::memcpy(&n, img.data(), 8);
  EXPECT_EQ(n % 8, 0u);  // data starts 8-byte aligned

  for (const SafeTensors& back : {read_safetensors(p), parse_safetensors(img, p)}) {
    EXPECT_EQ(back.metadata, st.metadata);
    ASSERT_EQ(back.tensors.size(), st.tensors.size());
    // Zero-size tensors share an offset with their successor: order ties by
    // name, so compare by lookup and check the data order separately.
    for (const TensorRecord& r : st.tensors) {
      const TensorRecord* b = back.find(r.name);
      ASSERT_NE(b, nullptr) << r.name;
      EXPECT_TRUE(same(*b, r)) << r.name;
    }
    // Non-empty tensors come back in written order.
    std::vector<std::string> written, read;
    for (const auto& r : st.tensors)
      if (!r.data.empty()) written.push_back(r.name);
    for (const auto& r : back.tensors)
      if (!r.data.empty()) read.push_back(r.name);
    EXPECT_EQ(read, written);
  }
}

TEST_F(SafeTensorsFile, WriterRejectsInconsistentRecordAndKeepsOldFile) {
  const std::string p = at("m.safetensors");
  SafeTensors ok;
  const float v = 3.0f;
  ok.add("v", DType::F32, {}, &v);
  write_safetensors(p, ok);
  const std::string before = read_file(p);

  SafeTensors bad = ok;
  bad.tensors[0].shape = {2};  // needs 8 bytes, has 4
  try {
    write_safetensors(p, bad);
    ADD_FAILURE();
  } catch (const UserError& e) {
    EXPECT_THAT(e.what(), HasSubstr("\"v\""));
    EXPECT_THAT(e.what(), HasSubstr("needs 8"));
  }
  SafeTensors dup = ok;
  dup.tensors.push_back(ok.tensors[0]);
  EXPECT_THROW(write_safetensors(p, dup), UserError);
  SafeTensors badutf = ok;
  badutf.tensors[0].name = "bad\xff";
  EXPECT_THROW(write_safetensors(p, badutf), UserError);
  EXPECT_EQ(read_file(p), before);
  EXPECT_EQ(entries(), std::vector<std::string>{"m.safetensors"});
}

TEST_F(SafeTensorsFile, ReadErrorsNameThePath) {
  try {
    read_safetensors(at("missing.safetensors"));
    ADD_FAILURE();
  } catch (const UserError& e) {
    EXPECT_THAT(e.what(), HasSubstr(at("missing.safetensors")));
  }
  EXPECT_THROW(read_safetensors(dir_.string()), UserError);
}

// ---------------------------------------------------------- malformations ---

struct Bad {
  const char* what;    // the case
  std::string bytes;   // whole file image
  const char* expect;  // substring the message must contain
};

std::vector<Bad> malformed() {
  const std::string f32x3 = std::string(12, '\0');
  auto one = [](const std::string& entry) { return std::string(R"({"t":)") + entry + "}"; };
  return {
      {"empty file", "", "shorter than the 8-byte header length"},
      {"7-byte file", std::string(7, '\0'), "file is 7 bytes"},
      {"header longer than file", le64(100) + "{}", "is larger than the file"},
      {"header over 100 MB", le64(200'000'000) + "{}", "exceeds the limit of 100000000"},
      {"header length all ones", le64(~0ull) + "{}", "exceeds the limit"},
      {"empty header", image(""), "header is empty"},
      {"array header", image("[]"), "does not start with '{'"},
      {"leading space", image(" {}"), "does not start with '{'"},
      {"not JSON", image("{abc}"), "header: expected valid JSON, got a syntax error"},
      {"truncated JSON", image(R"({"t":{"dtype":"F32")"), "header: expected valid JSON, got a syntax error"},
      {"trailing garbage", image("{} x"), "header: expected valid JSON, got a syntax error"},
      {"zero padding", image(std::string("{}\0\0", 4)), "raw NUL byte at offset 2"},
      {"NUL then garbage", image(std::string("{}\0junk", 7)), "not valid UTF-8 JSON"},
      {"invalid UTF-8 in key",
       image("{\"t\xff\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}", "x"),
       "ill-formed UTF-8 byte"},
      {"entry not an object", image(one("[1]")), "expected an object"},
      {"missing dtype", image(one(R"({"shape":[3],"data_offsets":[0,12]})"), f32x3),
       "missing key \"dtype\""},
      {"missing shape", image(one(R"({"dtype":"F32","data_offsets":[0,12]})"), f32x3),
       "missing key \"shape\""},
      {"missing data_offsets", image(one(R"({"dtype":"F32","shape":[3]})"), f32x3),
       "missing key \"data_offsets\""},
      {"extra key",
       image(one(R"({"dtype":"F32","shape":[3],"data_offsets":[0,12],"offsets":[0,12]})"), f32x3),
       "unexpected key \"offsets\""},
      {"unknown dtype", image(one(R"({"dtype":"F33","shape":[3],"data_offsets":[0,12]})"), f32x3),
       "unknown safetensors dtype 'F33'"},
      {"dtype not a string", image(one(R"({"dtype":4,"shape":[3],"data_offsets":[0,12]})"), f32x3),
       "dtype must be a string"},
      {"negative dim", image(one(R"({"dtype":"F32","shape":[-3],"data_offsets":[0,12]})"), f32x3),
       "negative dim -3"},
      {"fractional dim", image(one(R"({"dtype":"F32","shape":[1.5],"data_offsets":[0,12]})"), f32x3),
       "shape must be an array of integers"},
      {"shape not an array", image(one(R"({"dtype":"F32","shape":3,"data_offsets":[0,12]})"), f32x3),
       "shape must be an array"},
      {"offsets of one element", image(one(R"({"dtype":"F32","shape":[3],"data_offsets":[12]})"), f32x3),
       "data_offsets must be [begin, end]"},
      {"offsets of three elements",
       image(one(R"({"dtype":"F32","shape":[3],"data_offsets":[0,12,24]})"), f32x3),
       "data_offsets must be [begin, end]"},
      {"begin > end", image(one(R"({"dtype":"F32","shape":[0],"data_offsets":[12,0]})"), f32x3),
       "data_offsets must be [begin, end]"},
      {"negative offset", image(one(R"({"dtype":"F32","shape":[3],"data_offsets":[-1,11]})"), f32x3),
       "data_offsets must be [begin, end]"},
      {"size mismatch", image(one(R"({"dtype":"F32","shape":[3],"data_offsets":[0,8]})"), f32x3),
       "span 8 bytes but shape [3] of F32 needs 12 bytes"},
      {"numel overflow",
       image(one(R"({"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,0]})")),
       "overflows 64 bits"},
      {"overlap",
       image(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
             R"("b":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}})",
             std::string(12, 'x')),
       "overlaps tensor \"a\""},
      {"duplicate range",
       image(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
             R"("b":{"dtype":"I8","shape":[4],"data_offsets":[0,4]}})",
             std::string(4, 'x')),
       "overlaps"},
      {"hole",
       image(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
             R"("b":{"dtype":"U8","shape":[4],"data_offsets":[8,12]}})",
             std::string(12, 'x')),
       "hole in the data buffer: bytes [4, 8)"},
      {"hole at start", image(one(R"({"dtype":"U8","shape":[4],"data_offsets":[4,8]})"), "12345678"),
       "bytes [0, 4) are not covered"},
      {"trailing bytes", image(one(R"({"dtype":"U8","shape":[4],"data_offsets":[0,4]})"), "12345678"),
       "4 trailing bytes not covered"},
      {"buffer too short", image(one(R"({"dtype":"U8","shape":[8],"data_offsets":[0,8]})"), "1234"),
       "past the end of the data buffer"},
      {"bytes but no tensors", image("{}", "abc"), "3 trailing bytes"},
      {"duplicate tensor name",
       image(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
             R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
             "12"),
       "header: (top level): expected each key once, got \"a\" twice"},
      {"duplicate key inside entry",
       image(one(R"({"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]})"), "1"),
       "header: t: expected each key once, got \"dtype\" twice"},
      {"metadata value not a string", image(R"({"__metadata__":{"a":"x","n":1}})"),
       "\"__metadata__\" value for key \"n\" must be a string"},
      {"metadata not an object", image(R"({"__metadata__":"x"})"),
       "\"__metadata__\" must be an object"},
  };
}

class SafeTensorsMalformed : public TmpDirTest {};

TEST_F(SafeTensorsMalformed, EveryCaseRejectedWithItsOwnMessage) {
  const std::string p = at("bad.safetensors");
  for (const Bad& c : malformed()) {
    // Both entry points: in-memory image and the streaming file reader.
    for (int via_file = 0; via_file < 2; ++via_file) {
      std::string msg;
      try {
        if (via_file) {
          write_file_atomic(p, c.bytes);
          read_safetensors(p);
        } else {
          parse_safetensors(c.bytes, p);
        }
      } catch (const UserError& e) {
        msg = e.what();
      }
      SCOPED_TRACE(std::string(c.what) + (via_file ? " (file)" : " (memory)"));
      ASSERT_FALSE(msg.empty()) << "accepted";
      EXPECT_THAT(msg, HasSubstr(c.expect));
      EXPECT_EQ(msg.rfind(p + ": ", 0), 0u) << msg;  // starts with the path
      EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
    }
  }
}

TEST(SafeTensorsMalformedEdge, ZeroSizeTensorsMayShareOffsets) {
  const std::string img =
      image(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},)"
            R"("b":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
            R"("c":{"dtype":"F32","shape":[0,7],"data_offsets":[2,2]}})",
            "xy");
  SafeTensors st = parse_safetensors(img, "z");
  ASSERT_EQ(st.tensors.size(), 3u);
  EXPECT_EQ(st.tensors[0].name, "a");
  EXPECT_EQ(st.tensors[1].name, "b");
  EXPECT_EQ(st.tensors[2].name, "c");
  EXPECT_EQ(st.find("b")->data, (std::vector<uint8_t>{'x', 'y'}));
}

TEST(SafeTensorsMalformedEdge, RandomCorruptionOnlyEverThrowsUserError) {
  // Invariant: any byte flip or truncation of a valid file either parses or
  // raises UserError; never another exception, never a crash (run under ASan
  // once). Deterministic LCG so failures reproduce.
  SafeTensors st;
  st.metadata["k"] = "v";
  const float w[6] = {1, 2, 3, 4, 5, 6};
  st.add("w", DType::F32, {2, 3}, w);
  st.add("s", DType::I64, {}, "\1\0\0\0\0\0\0\0");
  const std::string good = serialize_safetensors(st);
  uint64_t x = 12345;
  auto rnd = [&x](uint64_t n) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return (x >> 33) % n;
  };
  int rejected = 0;
  for (int it = 0; it < 3000; ++it) {
    std::string img = good;
    if (it % 3 == 0) {
      img.resize(rnd(img.size()));
    } else {
      for (int k = 0, n = 1 + static_cast<int>(rnd(3)); k < n; ++k)
        img[rnd(img.size())] = static_cast<char>(rnd(256));
    }
    try {
      parse_safetensors(img, "fuzz");
    } catch (const UserError&) {
      ++rejected;
    } catch (const std::exception& e) {
      FAIL() << "iteration " << it << ": non-user exception: " << e.what();
    }
  }
  EXPECT_GT(rejected, 1500);  // every truncation and most header flips
}

}  // namespace
}  // namespace snip::io
