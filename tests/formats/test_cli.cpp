// `snip formats` and `snip quantize` through the built snip program.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "snip/formats/fake_quant.h"
#include "snip/formats/hadamard.h"
#include "snip/formats/minifloat.h"
#include "snip/io/safetensors.h"
#include "snip/recipes/recipe.h"
#include "snip/core/error.h"
#include "program.h"
#include "test_util.h"

namespace snip::cli {
namespace {

// Runs the built `snip <args>` and returns what it printed on stdout; a
// `snip: error: <message>` becomes UserError(message).
std::string run(const std::string& args) {
  const test::Ran r = test::run_program(SNIP_EXE, args);
  if (!r.error.empty()) throw UserError(r.error);
  if (r.status != 0) throw std::runtime_error("snip " + args + " exited " + std::to_string(r.status) + ": " + r.err);
  return r.out;
}

// What one `snip <args>` printed on stdout and stderr, and the message of its
// `snip: error:` line ("" if none).
using Ran = test::Ran;
Ran run_all(const std::string& args) { return test::run_program(SNIP_EXE, args); }

// Names in `dir` (to see that nothing, not even a temp file, was left).
std::set<std::string> listing(const std::filesystem::path& dir) {
  std::set<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "snip_formats_cli_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string at(const std::string& n) const { return (dir_ / n).string(); }
  std::filesystem::path dir_;
};

TEST(CliFormats, TableListsEveryFormatWithItsLimits) {
  const std::string out = run("formats");
  std::istringstream is(out);
  std::string line;
  std::map<std::string, std::string> rows;
  while (std::getline(is, line)) rows[line.substr(0, line.find(' '))] = line;
  ASSERT_TRUE(rows.count("e4m3")) << out;
  EXPECT_NE(rows["e4m3"].find("448"), std::string::npos);
  EXPECT_NE(rows["e4m3"].find("0.015625"), std::string::npos);     // 2^-6
  EXPECT_NE(rows["e4m3"].find("0.001953125"), std::string::npos);  // 2^-9
  EXPECT_NE(rows["e5m2"].find("57344"), std::string::npos);
  EXPECT_NE(rows["posit8"].find("16777216"), std::string::npos);
  for (const char* n : {"e2m1", "e1m2", "e2m3", "e3m2", "bf16", "int8", "int4"}) EXPECT_TRUE(rows.count(n)) << n;
  const auto j = nlohmann::json::parse(run("formats --json"));
  bool found = false;
  for (const auto& f : j)
    if (f["name"] == "e2m1") {
      found = true;
      EXPECT_EQ(f["max"], 6.0);
      EXPECT_EQ(f["min_normal"], 1.0);
      EXPECT_EQ(f["min_subnormal"], 0.5);
      EXPECT_EQ(f["bias"], 1);
    }
  EXPECT_TRUE(found);
}

TEST(CliFormats, CodesAsJson) {
  const auto j = nlohmann::json::parse(run("formats --codes e2m1 --json"));
  ASSERT_EQ(j.size(), 16u);
  const std::vector<double> pos = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (int c = 0; c < 16; ++c) {
    EXPECT_EQ(j[size_t(c)]["code"], c);
    EXPECT_EQ(j[size_t(c)]["value"].get<double>(), c < 8 ? pos[size_t(c)] : -pos[size_t(c - 8)]);
  }
  EXPECT_EQ(j[7]["bits"], "0111");
  const auto e4 = nlohmann::json::parse(run("formats --codes E4M3 --json"));
  ASSERT_EQ(e4.size(), 256u);
  EXPECT_EQ(e4[0x7E]["value"], 448.0);
  EXPECT_TRUE(e4[0x7F]["value"].is_null());
  EXPECT_EQ(e4[0x7F]["special"], "nan");
  const auto e5 = nlohmann::json::parse(run("formats --codes e5m2 --json"));
  EXPECT_EQ(e5[0xFC]["special"], "-inf");
  EXPECT_THROW(run("formats --codes bf16"), UserError);  // 16 bits
  EXPECT_THROW(run("formats --codes e7m7"), UserError);
  const std::string text = run("formats --codes int4");
  EXPECT_NE(text.find("0x09  1001  -7"), std::string::npos) << text;
}

TEST(CliFormats, Recipes) {
  const auto j = nlohmann::json::parse(run("formats --recipes --json"));
  bool fp8 = false;
  for (const auto& r : j)
    if (r["name"] == "fp8") {
      fp8 = true;
      EXPECT_EQ(r["operands"]["dgrad.w"]["block"], "128x128");
    }
  EXPECT_TRUE(fp8);
  EXPECT_NE(run("formats --recipes").find("fprop.x  e2m1 1x16 two_level/e4m3 rne"), std::string::npos);
}

TEST_F(CliTest, QuantizeWritesFp32AndReportsSqnr) {
  io::SafeTensors st;
  const auto a = formats::testing::awkward_data(4, 40, 9);
  st.add("a", io::DType::F32, {4, 40}, a.data());
  std::vector<uint16_t> b_bits;
  std::vector<float> b_vals;
  for (int i = 0; i < 48; ++i) {
    const float v = float(i - 20) * 0.37f;
    const uint32_t code = formats::encode(formats::kBF16, v);
    b_bits.push_back(uint16_t(code));
    b_vals.push_back(formats::decode(formats::kBF16, code));
  }
  st.add("b", io::DType::BF16, {3, 16}, b_bits.data());
  const std::vector<int64_t> ids = {1, 2, 3, 4, 5};
  st.add("ids", io::DType::I64, {5}, ids.data());
  st.metadata["format"] = "pt";
  io::write_safetensors(at("in.safetensors"), st);

  const std::string out = run("quantize --scheme mxfp4 --input " + at("in.safetensors") +
                              " --output " + at("out.safetensors") + " --json");
  const io::SafeTensors got = io::read_safetensors(at("out.safetensors"));
  const formats::QuantSpec spec = recipes::RecipeSet().find("mxfp4")[Operand::kFpropW];
  // a: equals fake_quantize of the data.
  std::vector<float> ya(a.size());
  formats::QuantStats sa;
  formats::fake_quantize(a.data(), ya.data(), 4, 40, spec, {}, &sa);
  const io::TensorRecord* ra = got.find("a");
  ASSERT_NE(ra, nullptr);
  EXPECT_EQ(ra->dtype, io::DType::F32);
  EXPECT_EQ(ra->shape, (std::vector<int64_t>{4, 40}));
  std::vector<float> ga(a.size());
  std::memcpy(ga.data(), ra->data.data(), ga.size() * 4);
  EXPECT_TRUE(formats::testing::bits_equal(ga, ya, 40));
  // b: BF16 in, FP32 out.
  std::vector<float> yb(b_vals.size());
  formats::fake_quantize(b_vals.data(), yb.data(), 3, 16, spec, {});
  const io::TensorRecord* rb = got.find("b");
  ASSERT_NE(rb, nullptr);
  EXPECT_EQ(rb->dtype, io::DType::F32);
  std::vector<float> gb(yb.size());
  std::memcpy(gb.data(), rb->data.data(), gb.size() * 4);
  EXPECT_TRUE(formats::testing::bits_equal(gb, yb, 16));
  // ids: copied unchanged; metadata kept and extended.
  EXPECT_EQ(got.find("ids")->dtype, io::DType::I64);
  EXPECT_EQ(got.find("ids")->data, st.find("ids")->data);
  EXPECT_EQ(got.metadata.at("format"), "pt");
  EXPECT_EQ(got.metadata.at("snip.quantize.scheme"), "mxfp4");
  // The JSON line of a reports the same SQNR.
  std::istringstream is(out);
  std::string line;
  std::getline(is, line);
  const auto ja = nlohmann::json::parse(line);
  EXPECT_EQ(ja["tensor"], "a");
  EXPECT_DOUBLE_EQ(ja["sqnr_db"].get<double>(), sa.sqnr_db());
  EXPECT_DOUBLE_EQ(ja["rel_error"].get<double>(), sa.rel_error());
  // The table form mentions every tensor.
  const std::string table = run("quantize --scheme fp8_tensor --operand dgrad.dy --input " +
                                at("in.safetensors") + " --output " + at("out2.safetensors"));
  EXPECT_NE(table.find("copied (I64 is not floating point)"), std::string::npos) << table;
  EXPECT_NE(table.find("all tensors: SQNR"), std::string::npos) << table;
}

// nvfp4's wgrad operands pass a Hadamard transform: the file holds the
// dequantized values mapped back to the input's basis (an approximation of
// the input, not of x·R), the statistics are over x·R, and the flush
// warning counts x·R's elements.
TEST_F(CliTest, QuantizeWithHadamardOperandWritesAnApproximationOfTheInput) {
  io::SafeTensors st;
  std::vector<float> a(4 * 48);
  for (size_t i = 0; i < a.size(); ++i) a[i] = std::sin(0.37f * float(i)) * (i % 23 == 0 ? 30.0f : 1.0f);
  st.add("a", io::DType::F32, {4, 48}, a.data());
  std::vector<float> tiny(4 * 32, 0.0f);  // one FP32 subnormal per 16-block: x·R spreads it over 16
  for (size_t i = 0; i < tiny.size(); i += 16) tiny[i] = 1e-40f;
  st.add("tiny", io::DType::F32, {4, 32}, tiny.data());
  io::write_safetensors(at("in.safetensors"), st);
  const Ran r = run_all("quantize --scheme nvfp4 --operand wgrad.x --input " + at("in.safetensors") +
                        " --output " + at("out.safetensors") + " --json");
  ASSERT_EQ(r.error, "");
  const io::SafeTensors got = io::read_safetensors(at("out.safetensors"));
  // Expected: x·R quantized with the plain spec, mapped back with Rᵀ.
  formats::QuantSpec spec = recipes::RecipeSet().find("nvfp4")[Operand::kWgradX];
  ASSERT_EQ(spec.hadamard_size, 16);
  const auto signs = formats::hadamard_signs(16, spec.hadamard_seed);
  std::vector<float> t = a, q(a.size());
  formats::hadamard_rows(t.data(), 4, 48, 16, signs.data());
  spec.hadamard_size = 0;
  formats::QuantStats sq;
  formats::fake_quantize(t.data(), q.data(), 4, 48, spec, {0, 0, 0, uint32_t(Operand::kWgradX)}, &sq);
  formats::hadamard_rows_inverse(q.data(), 4, 48, 16, signs.data());
  std::vector<float> ga(a.size());
  std::memcpy(ga.data(), got.find("a")->data.data(), ga.size() * 4);
  EXPECT_TRUE(formats::testing::bits_equal(ga, q, 48));
  // The written tensor approximates the input: NVFP4's error, not a rotation's.
  double err = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) err += double(ga[i] - a[i]) * (ga[i] - a[i]), ref += double(a[i]) * a[i];
  EXPECT_LT(std::sqrt(err / ref), 0.2);
  EXPECT_DOUBLE_EQ(nlohmann::json::parse(r.out.substr(0, r.out.find('\n')))["sqnr_db"].get<double>(), sq.sqnr_db());
  // 'tiny': 8 nonzero inputs, but its x·R has 128 nonzeros that all flush:
  // the warning counts x·R's, never more flushed than nonzero.
  EXPECT_NE(r.err.find("every one of its 128 nonzero inputs became 0"), std::string::npos) << r.err;
  EXPECT_EQ(got.metadata.count("snip.quantize.hadamard"), 1u);
}

TEST_F(CliTest, QuantizeErrorsAreUserErrorsAndLeaveNoOutput) {
  io::SafeTensors st;
  const std::vector<float> v = {1, 2, 3};
  st.add("v", io::DType::F32, {3}, v.data());
  io::write_safetensors(at("in.safetensors"), st);
  EXPECT_THROW(run("quantize --scheme nope --input " + at("in.safetensors") + " --output " +
                   at("o.safetensors")),
               UserError);
  EXPECT_THROW(run("quantize --scheme fp8 --input " + at("missing.safetensors") + " --output " +
                   at("o.safetensors")),
               UserError);
  EXPECT_THROW(run("quantize --scheme fp8 --operand fprop.q --input " + at("in.safetensors") +
                   " --output " + at("o.safetensors")),
               UserError);
  EXPECT_FALSE(std::filesystem::exists(at("o.safetensors")));
}

// An output that cannot be written is refused before any work: one line
// naming --output and the path, nothing on stdout, no file (not even the
// atomic writer's temp file) left behind, no folder created.
TEST_F(CliTest, QuantizeRefusesAnUnwritableOutputBeforePrintingAnything) {
  io::SafeTensors st;
  const std::vector<float> v = {1, 2, 3};
  st.add("v", io::DType::F32, {3}, v.data());
  io::write_safetensors(at("in.safetensors"), st);
  std::vector<std::pair<std::string, std::string>> cases = {  // output, expected reason
      {"/proc/x/out.safetensors", "folder /proc/x does not exist"},
      {at("missing/out.safetensors"), "folder " + at("missing") + " does not exist"},
      {dir_.string(), "it is a folder"},
  };
  // A folder that exists but refuses new files: mode 0555, unless we are a
  // user that permission bits do not stop (root); /sys refuses root too
  // (EACCES on sysfs, EROFS where it is mounted read-only).
  std::filesystem::create_directory(at("ro"));
  ASSERT_EQ(::chmod(at("ro").c_str(), 0555), 0);
  if (::access(at("ro").c_str(), W_OK) != 0) cases.push_back({at("ro/out.safetensors"), ""});
  if (std::filesystem::is_directory("/sys")) cases.push_back({"/sys/out.safetensors", ""});
  const std::set<std::string> before = listing(dir_);
  for (const auto& [output, reason] : cases) {
    SCOPED_TRACE(output);
    const Ran r = run_all("quantize --scheme fp4 --input " + at("in.safetensors") + " --output " + output);
    EXPECT_EQ(r.error.rfind("--output " + output + " is not writable: ", 0), 0u) << r.error;
    EXPECT_NE(r.error.find(reason), std::string::npos) << r.error;
    EXPECT_EQ(r.error.find('\n'), std::string::npos) << r.error;
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(r.err, "snip: error: " + r.error + "\n");  // the error line alone
    EXPECT_EQ(r.status, 2);
    EXPECT_FALSE(std::filesystem::is_regular_file(output));
  }
  EXPECT_EQ(listing(dir_), before);  // no temp file, no "missing" folder created
  EXPECT_TRUE(listing(at("ro")).empty());
  ::chmod(at("ro").c_str(), 0755);
  // The check does not refuse what can be written: a new file, and an
  // existing file (replaced atomically), here the input itself.
  EXPECT_EQ(run_all("quantize --scheme fp4 --input " + at("in.safetensors") + " --output " +
                    at("out.safetensors")).error, "");
  EXPECT_EQ(run_all("quantize --scheme fp4 --input " + at("in.safetensors") + " --output " +
                    at("in.safetensors")).error, "");
  EXPECT_EQ(listing(dir_), (std::set<std::string>{"in.safetensors", "out.safetensors", "ro"}));
}

std::vector<float> floats_of(const io::TensorRecord& r) {
  std::vector<float> f(size_t(r.numel()));
  std::memcpy(f.data(), r.data.data(), f.size() * 4);
  return f;
}

// `w` F32 [1,4] and `w_scale` F8_E8M0 [1] = 0x7F (2^0).
// Before, `snip quantize --scheme bf16` exited 2 with "unknown safetensors
// dtype 'F8_E8M0'". Now the scale is decoded (1.0) and fake-quantized like
// any float tensor; bf16 is an RNE cast, so 1.0 and 0.5/-3/2^-10 stay.
TEST_F(CliTest, QuantizeDecodesAnE8M0ScaleTensor) {
  const std::string h =
      R"({"w":{"dtype":"F32","shape":[1,4],"data_offsets":[0,16]},)"
      R"("w_scale":{"dtype":"F8_E8M0","shape":[1],"data_offsets":[16,17]}})";
  std::string img(8, '\0');
  for (int i = 0; i < 8; ++i) img[size_t(i)] = char((h.size() >> (8 * i)) & 0xFF);
  img += h;
  const float w[4] = {1.0f, 0.5f, -3.0f, 0.0009765625f};
  img.append(reinterpret_cast<const char*>(w), 16);
  img += '\x7f';
  {
    std::ofstream f(at("mx.safetensors"), std::ios::binary);
    f << img;
  }
  const Ran r = run_all("quantize --scheme bf16 --input " + at("mx.safetensors") + " --output " +
                        at("out.safetensors"));
  ASSERT_EQ(r.error, "");
  const io::SafeTensors got = io::read_safetensors(at("out.safetensors"));
  const io::TensorRecord* s = got.find("w_scale");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->dtype, io::DType::F32);
  EXPECT_EQ(s->shape, std::vector<int64_t>{1});
  EXPECT_EQ(floats_of(*s), std::vector<float>{1.0f});
  EXPECT_EQ(floats_of(*got.find("w")), (std::vector<float>{1.0f, 0.5f, -3.0f, 0.0009765625f}));
  EXPECT_NE(r.out.find("w_scale"), std::string::npos) << r.out;
}

// Every dtype of the format through `snip quantize --scheme bf16`: float
// tensors come out as FP32 holding their exact values (each value below is
// a BF16 number, so the RNE cast keeps it; the values are the hand tables
// of the formats), the others are copied byte for byte and said so, F6 is
// refused (its bit order is not defined) before anything is written.
TEST_F(CliTest, QuantizeHandlesEveryDType) {
  io::SafeTensors st;
  // (name, dtype, bytes, numel, expected FP32 values)
  struct Float { const char* name; io::DType d; std::vector<uint8_t> bytes; std::vector<float> want; };
  const std::vector<Float> floats = {
      {"f8_e4m3", io::DType::F8_E4M3, {0x38, 0x7E, 0x01, 0xC0}, {1.0f, 448.0f, 0.001953125f, -2.0f}},
      {"f8_e5m2", io::DType::F8_E5M2, {0x3C, 0x7B, 0x01, 0xC0}, {1.0f, 57344.0f, 1.52587890625e-05f, -2.0f}},
      {"f8_e4m3fnuz", io::DType::F8_E4M3FNUZ, {0x40, 0x7F, 0x01, 0xC8}, {1.0f, 240.0f, 0.0009765625f, -2.0f}},
      {"f8_e5m2fnuz", io::DType::F8_E5M2FNUZ, {0x40, 0x7F, 0x01, 0xC4}, {1.0f, 57344.0f, 7.62939453125e-06f, -2.0f}},
      {"f8_e8m0", io::DType::F8_E8M0, {0x7F, 0x80, 0x00, 0xFE}, {1.0f, 2.0f, 5.877471754111438e-39f, 1.7014118346046923e38f}},
      {"f4", io::DType::F4, {0x72, 0xA1}, {1.0f, 6.0f, 0.5f, -1.0f}},
      {"f16", io::DType::F16, {0x00, 0x3C, 0x00, 0xC0, 0x00, 0x7C, 0x00, 0x38}, {1.0f, -2.0f, INFINITY, 0.5f}},
      {"bf16", io::DType::BF16, {0x80, 0x3F, 0x7F, 0x7F, 0x01, 0x00, 0x00, 0xC0},
       {1.0f, 3.3895313892515355e38f, 9.183549615799121e-41f, -2.0f}},
  };
  for (const Float& f : floats) st.add(f.name, f.d, {int64_t(f.want.size())}, f.bytes.data());
  // F64 -> FP32 rounding itself is tested in tests/io (1/3 is not a BF16
  // number, so it would not come back through the bf16 cast here).
  const double f64[3] = {0.25, -0.375, 1e-50};  // 1e-50 underflows FP32 to +0
  st.add("f64", io::DType::F64, {3}, f64);
  const bool flags[3] = {true, false, true};
  st.add("mask", io::DType::BOOL, {3}, flags);
  const uint16_t u16[2] = {1, 65535};
  st.add("u16", io::DType::U16, {2}, u16);
  const float c64[4] = {1.0f, -1.0f, 0.5f, 2.0f};  // 1 - i, 0.5 + 2i
  st.add("freqs", io::DType::C64, {2}, c64);
  io::write_safetensors(at("in.safetensors"), st);

  const Ran r = run_all("quantize --scheme bf16 --input " + at("in.safetensors") + " --output " +
                        at("out.safetensors"));
  ASSERT_EQ(r.error, "");
  const io::SafeTensors got = io::read_safetensors(at("out.safetensors"));
  for (const Float& f : floats) {
    SCOPED_TRACE(f.name);
    const io::TensorRecord* g = got.find(f.name);
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(g->dtype, io::DType::F32);
    EXPECT_EQ(floats_of(*g), f.want);
  }
  EXPECT_EQ(floats_of(*got.find("f64")), (std::vector<float>{0.25f, -0.375f, 0.0f}));
  for (const char* n : {"mask", "u16", "freqs"}) {
    SCOPED_TRACE(n);
    EXPECT_EQ(got.find(n)->dtype, st.find(n)->dtype);
    EXPECT_EQ(got.find(n)->data, st.find(n)->data);
  }
  EXPECT_NE(r.out.find("copied (BOOL is not floating point)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("copied (U16 is not floating point)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("copied (C64 is complex; snip quantizes real tensors only)"), std::string::npos) << r.out;
  // The JSON lines say the same of each tensor.
  const Ran rj = run_all("quantize --scheme bf16 --json --input " + at("in.safetensors") + " --output " +
                         at("out2.safetensors"));
  ASSERT_EQ(rj.error, "");
  std::istringstream is(rj.out);
  std::map<std::string, nlohmann::json> lines;
  for (std::string line; std::getline(is, line);) {
    const auto j = nlohmann::json::parse(line);
    lines[j["tensor"].get<std::string>()] = j;
  }
  EXPECT_EQ(lines.size(), st.tensors.size());
  EXPECT_EQ(lines["freqs"]["action"], "copied");
  EXPECT_EQ(lines["freqs"]["dtype"], "C64");
  EXPECT_EQ(lines["f8_e8m0"]["action"], "quantized");
  EXPECT_EQ(lines["f8_e8m0"]["dtype"], "F8_E8M0");

  // F6: refused with one line naming the tensor; no output, nothing printed.
  const uint8_t f6[3] = {0x12, 0x34, 0x56};
  st.add("f6", io::DType::F6_E2M3, {4}, f6);
  io::write_safetensors(at("f6.safetensors"), st);
  const Ran r6 = run_all("quantize --scheme bf16 --input " + at("f6.safetensors") + " --output " +
                         at("f6out.safetensors"));
  EXPECT_NE(r6.error.find("tensor 'f6': F6_E2M3 is not decoded"), std::string::npos) << r6.error;
  EXPECT_EQ(r6.error.find('\n'), std::string::npos);
  EXPECT_EQ(r6.out, "");
  EXPECT_FALSE(std::filesystem::exists(at("f6out.safetensors")));
  // F64 beyond FP32's range: refused the same way.
  io::SafeTensors big;
  const double huge[2] = {1.0, 1e39};
  big.add("huge", io::DType::F64, {2}, huge);
  io::write_safetensors(at("big.safetensors"), big);
  const Ran rb = run_all("quantize --scheme bf16 --input " + at("big.safetensors") + " --output " +
                         at("bigout.safetensors"));
  EXPECT_NE(rb.error.find("tensor 'huge': F64 element 1 = 1e+39 is beyond FP32's range"), std::string::npos)
      << rb.error;
  EXPECT_EQ(rb.out, "");
  EXPECT_FALSE(std::filesystem::exists(at("bigout.safetensors")));
}

// fp4 (fprop.w: E2M1, 1x16 blocks, E4M3 block scale, FP32 tensor scale) on a
// tensor of 1e-40 values (FP32 subnormals), by hand: S_enc = 448 * 6 / 1e-40
// = 2.7e43 is clamped to FLT_MAX = 3.4e38, so S_dec = 2.9e-39; the block
// scale 1e-40 / 6 * FLT_MAX = 5.7e-3 rounds to the E4M3 subnormal 3 * 2^-9,
// d = 3 * 2^-9 * S_dec = 1.7e-41 and m = 1/d overflows to FLT_MAX; x * m =
// 0.034 is below half of E2M1's smallest step 0.5, so every element is 0.
// The normal tensor (E2M1 grid values, amax 6) comes back to within 1e-6.
TEST_F(CliTest, QuantizeWarnsAboutATensorFlushedToZero) {
  io::SafeTensors st;
  const std::vector<float> w = {6, -4, 3, -2, 1.5f, 1, -0.5f, 0, 6, 4, -3, 2, -1.5f, -1, 0.5f, 0};
  std::vector<float> tiny(16, 1e-40f);
  for (size_t i = 0; i < tiny.size(); i += 2) tiny[i] = -1e-40f;
  ASSERT_NE(tiny[1], 0.0f);  // the compiler keeps subnormals (no flush-to-zero mode)
  st.add("w", io::DType::F32, {1, 16}, w.data());
  st.add("tiny", io::DType::F32, {1, 16}, tiny.data());
  io::write_safetensors(at("in.safetensors"), st);
  for (const char* json : {"", " --json"}) {
    SCOPED_TRACE(json);
    const Ran r = run_all("quantize --scheme fp4 --input " + at("in.safetensors") + " --output " +
                          at("out.safetensors") + json);
    ASSERT_EQ(r.error, "");
    EXPECT_EQ(r.err, "snip: warning: tensor 'tiny' flushed to zero by fp4 (every one of its 16 "
                     "nonzero inputs became 0)\n");
    EXPECT_EQ(r.out.find("warning"), std::string::npos) << r.out;  // stdout stays a table / JSON
    const io::SafeTensors got = io::read_safetensors(at("out.safetensors"));
    for (const float y : floats_of(*got.find("tiny"))) EXPECT_EQ(y, 0.0f);
    const std::vector<float> gw = floats_of(*got.find("w"));
    for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(gw[i], w[i], 1e-6) << i;
  }
}

// The rule's threshold (kFlushWarning): more than half of the nonzero inputs.
// One 1x16 block with amax 6 has d = 1 up to an ulp, so 0.1 rounds to 0
// (below 0.25) and 1 stays 1; zero inputs count neither way.
TEST_F(CliTest, QuantizeWarnsWhenMoreThanHalfOfTheNonzeroInputsBecomeZero) {
  auto block = [](int small, int zeros) {  // 6, then `small` x 0.1, `zeros` x 0, the rest 1
    std::vector<float> b(16, 1.0f);
    b[0] = 6;
    for (int i = 0; i < small; ++i) b[size_t(1 + i)] = 0.1f;
    for (int i = 0; i < zeros; ++i) b[size_t(15 - i)] = 0.0f;
    return b;
  };
  io::SafeTensors st;
  const auto half = block(8, 0), most = block(9, 0), with_zeros = block(7, 3);
  st.add("half", io::DType::F32, {1, 16}, half.data());              // 8 of 16: no warning
  st.add("most", io::DType::F32, {1, 16}, most.data());              // 9 of 16
  st.add("with_zeros", io::DType::F32, {1, 16}, with_zeros.data());  // 7 of 13
  io::write_safetensors(at("in.safetensors"), st);
  const Ran r = run_all("quantize --scheme fp4 --input " + at("in.safetensors") + " --output " +
                        at("out.safetensors"));
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.err,
            "snip: warning: tensor 'most' mostly flushed to zero by fp4 (9 of its 16 nonzero inputs "
            "became 0)\n"
            "snip: warning: tensor 'with_zeros' mostly flushed to zero by fp4 (7 of its 13 nonzero "
            "inputs became 0)\n");
  // The counts are the file's: 0.1 -> 0, 1 -> 1.
  const io::SafeTensors got = io::read_safetensors(at("out.safetensors"));
  const std::vector<float> gh = floats_of(*got.find("half"));
  EXPECT_EQ(std::count(gh.begin(), gh.end(), 0.0f), 8);
  EXPECT_NEAR(gh[15], 1.0f, 1e-6);
}

}  // namespace
}  // namespace snip::cli
