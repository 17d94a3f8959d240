// Recipes: the presets match METHOD.md / their sources field by field, the
// registry's errors, the plain-config round trip, and a new recipe on a new
// element format plugging in without touching callers.
#include <gtest/gtest.h>

#include "snip/formats/hadamard.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "snip/formats/fake_quant.h"
#include "snip/formats/integer.h"
#include "snip/formats/minifloat.h"
#include "snip/formats/posit.h"
#include "snip/recipes/recipe.h"
#include "snip/core/error.h"
#include "test_util.h"

namespace snip::recipes {
namespace {

using formats::BlockShape;
using formats::Rounding;
using formats::ScaleFormat;
using formats::ScaleRule;

TEST(Recipe, PresetsExist) {
  const auto names = RecipeSet().names();
  for (const char* n : {"bf16", "fp8", "fp4", "mxfp8", "mxfp4", "nvfp4", "block_fp8", "fp8_tensor",
                        "e1m2", "posit8", "int8"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
}

TEST(Recipe, Fp8MatchesMethodSection1) {
  const Recipe r = RecipeSet().find("fp8");
  for (int i = 0; i < kNumOperands; ++i) {
    const Operand op = Operand(i);
    const formats::QuantSpec& s = r[op];
    EXPECT_EQ(s.element, formats::kE4M3);
    EXPECT_EQ(s.rule, ScaleRule::kCurrent);
    EXPECT_EQ(s.scale_format, ScaleFormat::kFP32Pow2);
    EXPECT_EQ(s.rounding, Rounding::kRNE);
    const bool weight = op == Operand::kFpropW || op == Operand::kDgradW;
    EXPECT_EQ(s.block, weight ? BlockShape::square(128) : BlockShape::tile(128)) << operand_name(op);
  }
}

TEST(Recipe, Fp4MatchesMethodSection1) {
  const Recipe r = RecipeSet().find("fp4");
  for (int i = 0; i < kNumOperands; ++i) {
    const Operand op = Operand(i);
    EXPECT_EQ(r[op].element, formats::kE2M1);
    EXPECT_EQ(r[op].rule, ScaleRule::kTwoLevel);
    EXPECT_EQ(r[op].scale_format, ScaleFormat::kE4M3);
    EXPECT_EQ(r[op].block, BlockShape::tile(16));
    const bool grad = op == Operand::kDgradDY || op == Operand::kWgradDY;
    EXPECT_EQ(r[op].rounding, grad ? Rounding::kStochastic : Rounding::kRNE) << operand_name(op);
  }
  // nvfp4: 16x16 weight blocks (TE's 2-D weight quantization).
  EXPECT_EQ(RecipeSet().find("nvfp4")[Operand::kDgradW].block, BlockShape::square(16));
  EXPECT_EQ(RecipeSet().find("nvfp4")[Operand::kFpropX].block, BlockShape::tile(16));
}

TEST(Recipe, OtherPresets) {
  const Recipe bf16 = RecipeSet().find("bf16");
  EXPECT_TRUE(bf16.is_passthrough());
  EXPECT_FALSE(bf16[Operand::kFpropX].saturate);
  EXPECT_FALSE(RecipeSet().find("fp8").is_passthrough());
  const Recipe mx = RecipeSet().find("mxfp8");
  EXPECT_EQ(mx[Operand::kWgradX].block, BlockShape::tile(32));
  EXPECT_EQ(mx[Operand::kWgradX].scale_format, ScaleFormat::kE8M0);
  EXPECT_EQ(mx[Operand::kWgradX].rule, ScaleRule::kMxFloor);
  EXPECT_EQ(RecipeSet().find("mxfp8_rceil")[Operand::kFpropX].rule, ScaleRule::kCurrent);
  const Recipe t = RecipeSet().find("fp8_tensor");
  EXPECT_EQ(t[Operand::kFpropX].element, formats::kE4M3);
  EXPECT_EQ(t[Operand::kDgradW].element, formats::kE4M3);
  EXPECT_EQ(t[Operand::kDgradDY].element, formats::kE5M2);
  EXPECT_EQ(t[Operand::kWgradDY].element, formats::kE5M2);
  EXPECT_EQ(t[Operand::kWgradDY].rule, ScaleRule::kDelayed);
  EXPECT_EQ(t[Operand::kWgradDY].amax_history_len, 1024);
  EXPECT_EQ(RecipeSet().find("block_fp8")[Operand::kFpropW].block, BlockShape::tile(16));
  EXPECT_EQ(RecipeSet().find("e1m2")[Operand::kFpropW].element, formats::kE1M2);
  EXPECT_EQ(RecipeSet().find("posit8")[Operand::kFpropW].element, formats::kPosit8);
  EXPECT_EQ(RecipeSet().find("int8")[Operand::kFpropW].element, formats::kInt8);
  EXPECT_EQ(RecipeSet().find("int8")[Operand::kFpropW].block, BlockShape::row());
}

TEST(Recipe, OperandNamesAndLayouts) {
  EXPECT_STREQ(operand_name(Operand::kFpropX), "fprop.x");
  EXPECT_STREQ(operand_name(Operand::kWgradX), "wgrad.x");
  EXPECT_EQ(parse_operand("dgrad.w", "t"), Operand::kDgradW);
  EXPECT_THROW(parse_operand("dgrad.x", "t"), UserError);
  EXPECT_STREQ(operand_layout(Operand::kFpropW).k_dim, "in");
  EXPECT_STREQ(operand_layout(Operand::kDgradW).k_dim, "out");
  EXPECT_STREQ(operand_layout(Operand::kDgradDY).k_dim, "out");
  EXPECT_STREQ(operand_layout(Operand::kWgradDY).k_dim, "N");
  EXPECT_STREQ(operand_layout(Operand::kWgradX).k_dim, "N");
}

// Plan item keys as the plan files write them (docs/method.md section 2):
// "<layer>" or "<layer>:fprop|dgrad|wgrad"; ordered as that text.
TEST(Recipe, PlanKeysRoundTripAndOrderAsText) {
  const std::string l = "model.layers.0.mlp.up_proj";
  EXPECT_EQ((PlanKey{l, std::nullopt}.str()), l);
  EXPECT_EQ((PlanKey{l, Gemm::kWgrad}.str()), "model.layers.0.mlp.up_proj:wgrad");
  EXPECT_EQ(parse_plan_key(l + ":dgrad", "t"), (PlanKey{l, Gemm::kDgrad}));
  EXPECT_EQ(parse_plan_key(l, "t"), (PlanKey{l, std::nullopt}));
  EXPECT_EQ(parse_plan_key("lm:head", "t"), (PlanKey{"lm:head", std::nullopt}));  // not a GEMM suffix
  try {
    parse_plan_key(":fprop", "plan.json");
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("plan.json: empty plan item ':fprop'", 0), 0u) << e.what();
  }
  // '.' (0x2E) sorts before ':' (0x3A): the text order, not (layer, gemm).
  EXPECT_TRUE((PlanKey{"a.b", std::nullopt}) < (PlanKey{"a", Gemm::kFprop}));
  EXPECT_TRUE((PlanKey{"a", Gemm::kWgrad}) < (PlanKey{"b", std::nullopt}));
}

TEST(Recipe, UnknownNameListsKnownOnes) {
  try {
    RecipeSet().find("fp3");
    FAIL();
  } catch (const UserError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("unknown recipe 'fp3'"), std::string::npos) << m;
    EXPECT_NE(m.find("known: bf16, block_fp8, e1m2"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos);
  }
}

TEST(Recipe, JsonRoundTrip) {
  for (const std::string& name : RecipeSet().names()) {
    const Recipe r = RecipeSet().find(name);
    const nlohmann::json j = to_json(r);
    const Recipe back = recipe_from_json(j, "test");
    EXPECT_EQ(back.name, r.name);
    for (int i = 0; i < kNumOperands; ++i)
      EXPECT_EQ(back.operands[size_t(i)], r.operands[size_t(i)]) << name << " " << i;
  }
  const nlohmann::json j = to_json(RecipeSet().find("fp8"));
  EXPECT_EQ(j["operands"]["fprop.w"]["block"], "128x128");
  EXPECT_EQ(j["operands"]["fprop.x"]["scale_format"], "fp32_pow2");
  EXPECT_EQ(j["operands"]["fprop.x"]["element"], "e4m3");
}

TEST(Recipe, JsonErrorsNameTheField) {
  auto message = [](const std::string& text) {
    try {
      recipe_from_json(nlohmann::json::parse(text), "plan.json:recipes[0]");
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message(R"({"name": "x", "operands": {"all": {"element": "e4m3", "block": "1x"}}})"),
            "plan.json:recipes[0].operands.fprop.x.block: expected a block shape 'tensor', 'row' "
            "or 'RxC' (e.g. 1x32, 128x128), got '1x'");
  EXPECT_EQ(message(R"({"name": "x", "operands": {"all": {"rule": "mx_floor"}}})"),
            "plan.json:recipes[0].operands.fprop.x: scale_format: rule mx_floor expects e8m0, got fp32");
  EXPECT_NE(message(R"({"name": "x", "operands": {"all": {"element": "e9m9"}}})")
                .find("plan.json:recipes[0].operands.fprop.x.element: unknown element format 'e9m9'"),
            std::string::npos);
  EXPECT_EQ(message(R"({"name": "x", "operands": {"fprop.x": {}}})"),
            "plan.json:recipes[0].operands.fprop.w: missing (give every operand, or an 'all' entry)");
  EXPECT_EQ(message(R"({"name": "x", "operands": {"all": {"saturate": 1}}})"),
            "plan.json:recipes[0].operands.fprop.x.saturate: expected true or false, got 1");
  EXPECT_EQ(message(R"({"name": "x", "operands": {"all": {"hadamard": 8}}})"),
            "plan.json:recipes[0].operands.fprop.x: hadamard: expected 0 (none), 4, 16, 64 or 256, got 8");
  EXPECT_EQ(message(R"({"name": "x", "operands": {"all": {"hadamard": 4294967312}}})"),
            "plan.json:recipes[0].operands.fprop.x.hadamard: expected 0 (none), 4, 16, 64 or 256, got 4294967312");
  EXPECT_EQ(message(R"({"name": "x", "operands": {"all": {"hadamard": 64}}})"),
            "plan.json:recipes[0].operands.fprop.x.hadamard_seed: hadamard 64 needs a seed (an integer >= 0; "
            "\"te\" is for 16 only)");
  EXPECT_EQ(message(R"({"name": "x", "operands": {"all": {"hadamard_seed": 9}}})"),
            "plan.json:recipes[0].operands.fprop.x.hadamard_seed: given without a Hadamard transform (set "
            "hadamard to 4, 16, 64 or 256)");
  EXPECT_EQ(message(R"({"name": "x", "operands": {"all": {"hadamard": 64, "hadamard_seed": "te"}}})"),
            "plan.json:recipes[0].operands.fprop.x: hadamard_seed: 'te' (TransformerEngine's 16 signs) needs "
            "hadamard 16, got 64");
  EXPECT_EQ(message(R"({"name": "x", "operands": {"all": {"hadamard": 16, "hadamard_seed": -3}}})"),
            "plan.json:recipes[0].operands.fprop.x.hadamard_seed: expected \"te\" or an integer >= 0, got -3");
  // Only one operand of the wgrad GEMM transformed: the GEMM would be wrong.
  EXPECT_NE(message(R"({"name": "x", "operands": {"all": {}, "wgrad.x": {"hadamard": 16, "hadamard_seed": 5}}})")
                .find("wgrad.dy and wgrad.x: a Hadamard transform must be the same on both operands of a GEMM"),
            std::string::npos);
}

TEST(Recipe, Nvfp4IsTransformerEngineDefaultRecipe) {
  // TE NVFP4BlockScaling defaults (common/recipe/__init__.py): inputs 1D,
  // weights 2D 16x16, SR on gradients, RHT on the wgrad (columnwise) usage
  // of inputs and gradients, none on weights.
  const Recipe r = RecipeSet().find("nvfp4");
  for (Operand op : {Operand::kFpropX, Operand::kFpropW, Operand::kDgradDY, Operand::kDgradW})
    EXPECT_EQ(r[op].hadamard_size, 0) << operand_name(op);
  for (Operand op : {Operand::kWgradDY, Operand::kWgradX}) {
    EXPECT_EQ(r[op].hadamard_size, 16) << operand_name(op);
    EXPECT_EQ(r[op].hadamard_seed, formats::kHadamardTeSigns);
  }
  EXPECT_EQ(r[Operand::kFpropW].block, BlockShape::square(16));
  EXPECT_EQ(r[Operand::kDgradW].block, BlockShape::square(16));
  EXPECT_EQ(r[Operand::kWgradX].block, BlockShape::tile(16));
  EXPECT_EQ(r[Operand::kWgradDY].rounding, formats::Rounding::kStochastic);
  EXPECT_EQ(r[Operand::kDgradDY].rounding, formats::Rounding::kStochastic);
  EXPECT_EQ(r[Operand::kWgradX].rounding, formats::Rounding::kRNE);
  EXPECT_EQ(to_json(r)["operands"]["wgrad.x"]["hadamard_seed"], "te");
  // snip's own fp4 recipe (METHOD.md section 1) has no transform.
  const Recipe fp4 = RecipeSet().find("fp4");
  for (const auto& spec : fp4.operands) EXPECT_EQ(spec.hadamard_size, 0);
}

TEST(Recipe, NewFormatPlugsInByAddingToASet) {
  // A new element format and a recipe using it, both from plain config; the
  // quantizer runs it without any caller knowing the format.
  formats::register_element_format(
      {"e3m3", formats::ElementKind::kFloat, 7, 3, 3, 3, false, formats::NanEncoding::kNone});
  const Recipe r = recipe_from_json(nlohmann::json::parse(R"({
      "name": "mx_e3m3", "description": "test",
      "operands": {"all": {"element": "e3m3", "rule": "mx_floor", "scale_format": "e8m0", "block": "1x32"},
                   "wgrad.dy": {"rounding": "stochastic"}}})"),
                                    "test");
  RecipeSet set;
  set.add(r);
  EXPECT_THROW(set.add(r), UserError);  // taken
  set.add(r, /*replace=*/true);
  EXPECT_FALSE(RecipeSet().has("mx_e3m3"));  // a value: another set does not see it
  const Recipe got = set.find("mx_e3m3");
  EXPECT_EQ(got[Operand::kWgradDY].rounding, Rounding::kStochastic);
  EXPECT_EQ(got[Operand::kWgradX].rounding, Rounding::kRNE);
  EXPECT_EQ(got[Operand::kFpropX].element.max_value(), 30.0);  // 2^(7-3) * 1.875
  const auto x = formats::testing::awkward_data(9, 100, 4);
  std::vector<float> y(x.size()), yr(x.size());
  formats::fake_quantize(x.data(), y.data(), 9, 100, got[Operand::kWgradDY], {});
  formats::fake_quantize_reference(x.data(), yr.data(), 9, 100, got[Operand::kWgradDY], {});
  EXPECT_TRUE(formats::testing::bits_equal(y, yr, 100));
  // An invalid recipe is refused with the operand named.
  Recipe bad = got;
  bad.name = "bad";
  bad[Operand::kDgradDY].block = {-2, 1};
  try {
    set.add(bad);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("recipe 'bad' dgrad.dy: block"), std::string::npos);
  }
}

// Found reviewing fuzz_recipe's parser: get<int>() wrapped an integer past 32
// bits, so 2^32 + 5 history entries became 5 silently.
TEST(Recipe, IntegersPast32BitsAreRefusedNotWrapped) {
  const auto with = [](const std::string& v) {
    return nlohmann::json::parse(R"({"name": "d", "operands": {"all": {"element": "e4m3", "rule": "delayed",
        "scale_format": "fp32", "block": "tensor", "amax_history_len": )" + v + "}}}");
  };
  EXPECT_EQ(recipe_from_json(with("16"), "r.json")[Operand::kFpropX].amax_history_len, 16);
  for (const std::string v : {"4294967301", "18446744073709551615", "-4294967291"}) {
    std::string msg;
    try {
      recipe_from_json(with(v), "r.json");
    } catch (const UserError& e) {
      msg = e.what();
    }
    EXPECT_EQ(msg, "r.json.operands.fprop.x.amax_history_len: expected an integer of 32 bits, got " + v);
  }
}

}  // namespace
}  // namespace snip::recipes

// Every registered recipe, every operand, over the extremes of FP32 ("a finite
// input becomes Inf"): a finite input never dequantizes to Inf or NaN, except
// where the element format itself is IEEE non-saturating (the bf16 cast:
// FLT_MAX rounds to Inf in BF16, as every BF16 conversion does). Fast and
// reference paths agree bit for bit on these inputs. Before the fix, FLT_MAX
// came out as +Inf under fp8, mxfp8_rceil, mxfp4_rceil, int8 and posit8 (a code
// rounded up next to the largest value, times a scale rounded up, overflows
// FP32).
TEST(Recipe, FiniteExtremesStayFiniteUnderEveryRecipe) {
  constexpr float kMax = std::numeric_limits<float>::max();
  const float extremes[] = {kMax, -kMax, std::nextafter(kMax, 0.0f), 0x1p-126f, -0x1p-126f, 0x1p-149f,
                            -0x1p-149f, 0x1p-140f, 0.0f, -0.0f, 1.0f, -3.0f, 1e30f, -1e-30f, 448.0f, 6.0f};
  // 32 x 32: covers 1x16, 1x32, 1x128 (partial), 16x16 and 128x128 (partial)
  // blocks; the extremes on the first row (rows of their own), then mixed in
  // with ordinary values in later rows (blocks shared with small values).
  constexpr int64_t R = 32, C = 32;
  std::vector<float> in(size_t(R * C), 0.0f);
  for (int64_t c = 0; c < C; ++c) in[size_t(c)] = extremes[c % 16];
  for (int64_t r = 1; r < R; ++r)
    for (int64_t c = 0; c < C; ++c)
      in[size_t(r * C + c)] = (c + r) % 5 == 0 ? extremes[(c * 7 + r) % 16] : float((c - r) % 9) * 0.37f;
  for (const std::string& name : snip::recipes::RecipeSet().names()) {
    const snip::recipes::Recipe rc = snip::recipes::RecipeSet().find(name);
    for (size_t op = 0; op < rc.operands.size(); ++op) {
      const snip::formats::QuantSpec& spec = rc.operands[op];
      std::vector<float> fast(in.size()), ref(in.size());
      const snip::formats::RoundingKey key{1, 2, 3, uint32_t(op)};
      if (spec.rule == snip::formats::ScaleRule::kDelayed) {
        snip::formats::DelayedScaling s1(spec), s2(spec);
        snip::formats::fake_quantize(in.data(), fast.data(), R, C, key, s1);
        snip::formats::fake_quantize_reference(in.data(), ref.data(), R, C, key, s2);
      } else {
        snip::formats::fake_quantize(in.data(), fast.data(), R, C, spec, key);
        snip::formats::fake_quantize_reference(in.data(), ref.data(), R, C, spec, key);
      }
      const bool ieee_cast = spec.rule == snip::formats::ScaleRule::kNone && !spec.saturate;
      for (size_t i = 0; i < in.size(); ++i) {
        uint32_t a, b;
        std::memcpy(&a, &fast[i], 4);
        std::memcpy(&b, &ref[i], 4);
        ASSERT_EQ(a, b) << name << " operand " << op << " element " << i << ": fast " << fast[i] << ", reference "
                        << ref[i];
        if (!ieee_cast || std::fabs(in[i]) < 0x1p127f) {
          ASSERT_TRUE(std::isfinite(fast[i])) << name << " operand " << op << ": input " << in[i] << " -> "
                                              << fast[i];
        }
      }
    }
  }
}
