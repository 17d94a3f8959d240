// Recipe files (precision.recipe_file, recipes/recipe_file.h): the same recipe
// from TOML and JSON, roles expanded to operands with per-operand overrides,
// compensation_freq as delayed scaling's refresh interval, one-line errors
// naming file, recipe and field for every bad field, unknown keys and
// built-in names refused, registration and the run folder's copy.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "snip/formats/minifloat.h"
#include "snip/recipes/recipe_file.h"
#include "snip/core/error.h"

namespace snip::recipes {
namespace {

namespace fs = std::filesystem;
using formats::BlockShape;
using formats::Rounding;
using formats::ScaleFormat;
using formats::ScaleRule;

const char* kToml = R"(
[recipes.w4a8]
description = "W4 per-channel E2M1, A8 per-tensor E4M3"
error_feedback = true
compensation_freq = 16

[recipes.w4a8.activations]
element = "e4m3"

[recipes.w4a8.weights]
element = "e2m1"
block = "row"

[recipes.w4a8.gradients]
element = "e5m2"
rule = "delayed"
amax_history_len = 64

[recipes.w4a8.operands."dgrad.dy"]
rounding = "stochastic"
)";

const char* kJson = R"({
  "recipes": {
    "w4a8": {
      "description": "W4 per-channel E2M1, A8 per-tensor E4M3",
      "error_feedback": true,
      "compensation_freq": 16,
      "activations": {"element": "e4m3"},
      "weights": {"element": "e2m1", "block": "row"},
      "gradients": {"element": "e5m2", "rule": "delayed", "amax_history_len": 64},
      "operands": {"dgrad.dy": {"rounding": "stochastic"}}
    }
  }
})";

TEST(RecipeFile, TomlAndJsonGiveTheSameRecipe) {
  const RecipeFile t = parse_recipe_file_text(kToml, "toml", "r.toml");
  const RecipeFile j = parse_recipe_file_text(kJson, "json", "r.json");
  ASSERT_EQ(t.recipes.size(), 1u);
  ASSERT_EQ(j.recipes.size(), 1u);
  EXPECT_EQ(to_json(t.recipes[0]), to_json(j.recipes[0]));
  const Recipe& r = t.recipes[0];
  EXPECT_EQ(r.name, "w4a8");
  EXPECT_TRUE(r.error_feedback);
  // Roles -> operands.
  for (Operand op : {Operand::kFpropX, Operand::kWgradX}) {
    EXPECT_EQ(r[op].element.name, "e4m3");
    EXPECT_EQ(r[op].rule, ScaleRule::kCurrent);
    EXPECT_EQ(r[op].block, BlockShape::tensor());
  }
  for (Operand op : {Operand::kFpropW, Operand::kDgradW}) {
    EXPECT_EQ(r[op].element.name, "e2m1");
    EXPECT_EQ(r[op].block, BlockShape::row());
    EXPECT_EQ(r[op].scale_refresh_interval, 1);  // not delayed: compensation_freq does not apply
  }
  for (Operand op : {Operand::kDgradDY, Operand::kWgradDY}) {
    EXPECT_EQ(r[op].element.name, "e5m2");
    EXPECT_EQ(r[op].rule, ScaleRule::kDelayed);
    EXPECT_EQ(r[op].amax_history_len, 64);
    EXPECT_EQ(r[op].scale_refresh_interval, 16);  // compensation_freq
  }
  // The per-operand override wins over its role, for that operand only.
  EXPECT_EQ(r[Operand::kDgradDY].rounding, Rounding::kStochastic);
  EXPECT_EQ(r[Operand::kWgradDY].rounding, Rounding::kRNE);
  // The resolved form reads back through recipe_from_json to the same recipe.
  const nlohmann::json res = t.resolved();
  EXPECT_EQ(res.at("recipe_file"), "r.toml");
  EXPECT_EQ(to_json(recipe_from_json(res.at("recipes").at(0), "resolved")), to_json(r));
}

TEST(RecipeFile, AllEntryAndOperandsAlone) {
  const RecipeFile f = parse_recipe_file_text(R"({"recipes": {"a": {"all": {"element": "int8", "block": "row"},
      "operands": {"fprop.w": {"element": "int4"}}}, "b": {"operands": {"fprop.x": {}, "fprop.w": {},
      "dgrad.dy": {}, "dgrad.w": {}, "wgrad.dy": {}, "wgrad.x": {}}}}})",
                                              "json", "f.json");
  ASSERT_EQ(f.recipes.size(), 2u);
  EXPECT_EQ(f.recipes[0].name, "a");
  EXPECT_EQ(f.recipes[0][Operand::kFpropW].element.name, "int4");
  EXPECT_EQ(f.recipes[0][Operand::kFpropW].block, BlockShape::row());  // from all
  EXPECT_EQ(f.recipes[0][Operand::kDgradW].element.name, "int8");
  EXPECT_FALSE(f.recipes[0].error_feedback);
  EXPECT_EQ(f.recipes[1][Operand::kWgradX], formats::QuantSpec{});  // every default
}

struct BadCase {
  const char* recipe_json;  // the body of recipe 'r' in {"recipes": {"r": ...}}
  const char* message;      // the whole expected message after "bad.json: recipe 'r': "
};

// Every field, one bad value each: the error is one line naming the file,
// the recipe and the field as written.
TEST(RecipeFile, EachBadFieldGivesItsOneLineError) {
  const BadCase cases[] = {
      {R"({"weights": {"block": "3y"}, "activations": {}, "gradients": {}})", "weights.block: expected"},
      {R"({"weights": {"element": "e9m9"}, "activations": {}, "gradients": {}})", "weights.element: "},
      {R"({"activations": {"rule": "sometimes"}, "weights": {}, "gradients": {}})", "activations.rule: "},
      {R"({"gradients": {"rounding": "up"}, "weights": {}, "activations": {}})", "gradients.rounding: "},
      {R"({"gradients": {"rule": "mx_floor"}, "weights": {}, "activations": {}})", "gradients: scale_format: "},
      {R"({"weights": {"blok": "row"}, "activations": {}, "gradients": {}})", "weights.blok: unknown key"},
      {R"({"weights": {}, "activations": {}, "gradients": {}, "operands": {"dgrad.dy": {"saturate": 1}}})",
       "operands.dgrad.dy.saturate: expected true or false"},
      {R"({"weights": {}, "activations": {}, "gradients": {}, "operands": {"dgrad.z": {}}})",
       "operands: unknown GEMM operand 'dgrad.z'"},
      {R"({"weights": {}, "activations": {}, "gradients": {}, "operands": {"fprop.x": 3}})",
       "operands.fprop.x: expected a table"},
      {R"({"weights": {}, "activations": {}, "gradients": {}, "error_feedback": "yes"})",
       "error_feedback: expected true or false"},
      {R"({"weights": {}, "activations": {}, "gradients": {}, "compensation_freq": 0})",
       "compensation_freq: expected an integer number of steps in [1, 2^30], got 0"},
      {R"({"weights": {}, "activations": {}, "gradients": {}, "compensation_freq": 2.5})",
       "compensation_freq: expected an integer number of steps"},
      {R"({"weights": {}, "activations": {}, "gradients": {}, "compensation_freq": 8})",
       "compensation_freq: expected a recipe with delayed scaling"},
      {R"({"weights": {}, "activations": {}, "gradients": {"rule": "delayed", "scale_refresh_interval": 4},
           "compensation_freq": 8})",
       "compensation_freq: given together with gradients.scale_refresh_interval"},
      {R"({"weights": {}, "activations": {}, "gradients": {}, "description": 7})", "description: expected a string"},
      {R"({"weights": {}, "activations": {}})", "gradients: missing"},
      {R"({"weights": {}, "activations": {}, "gradients": {}, "error_feedbak": true})",
       "error_feedbak: unknown key (expected description, error_feedback"},
      {R"({"weights": 4, "activations": {}, "gradients": {}})", "weights: expected a table"},
      {R"(["x"])", "expected a table of fields"},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.recipe_json);
    const std::string text = std::string(R"({"recipes": {"r": )") + c.recipe_json + "}}";
    try {
      parse_recipe_file_text(text, "json", "bad.json");
      ADD_FAILURE() << "no error";
    } catch (const UserError& e) {
      const std::string m = e.what();
      EXPECT_EQ(m.rfind(std::string("bad.json: recipe 'r': ") + c.message, 0), 0u) << m;
      EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    }
  }
}

TEST(RecipeFile, FileLevelErrors) {
  auto msg = [](const std::string& text, const char* fmt) {
    try {
      parse_recipe_file_text(text, fmt, "f");
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(msg("{}", "json").rfind("f: recipes: expected at least one recipe", 0), 0u);
  EXPECT_EQ(msg(R"({"recipes": {}, "recipe": 1})", "json"), "f: recipe: unknown key (expected recipes)");
  // A wrongly typed element names its place once (it used to repeat the prefix).
  EXPECT_EQ(msg(R"({"recipes": {"j": {"all": {"element": 5}}}})", "json"),
            "f: recipe 'j': all.element: expected a string, got number 5");
  EXPECT_EQ(msg("[recipes.x\n", "toml").rfind("f:1:", 0), 0u) << msg("[recipes.x\n", "toml");
  // The guarded readers (io::parse_json, io::parse_toml_as_json): syntax,
  // a key twice, non-finite numbers, each one line naming the file.
  EXPECT_EQ(msg("{", "json").rfind("f: expected valid JSON, got a syntax error", 0), 0u) << msg("{", "json");
  EXPECT_NE(msg(R"({"recipes": {"x8": {"all": {"element": "e4m3"}, "all": {"element": "e2m1"}}}})", "json")
                .find("expected each key once, got \"all\" twice"),
            std::string::npos)
      << msg(R"({"recipes": {"x8": {"all": {}, "all": {}}}})", "json");
  EXPECT_EQ(msg("[recipes.x]\ndescription = nan\n", "toml"),
            "f: recipes.x.description: expected a finite number, got nan");
  EXPECT_EQ(msg("[recipes.x]\ndescription = 1979-05-27\n", "toml"),
            "f: recipes.x.description: expected a string, number, boolean, table or array, got a date/time");
  EXPECT_EQ(msg("[recipes.x]\ndescription = \"two\\nlines\"\n[recipes.x.all]\n", "toml").rfind(
                "f: recipe 'x': description: expected one line of at most 500 bytes without control characters", 0),
            0u)
      << msg("[recipes.x]\ndescription = \"two\\nlines\"\n[recipes.x.all]\n", "toml");
  EXPECT_EQ(msg("", "yaml").rfind("f: expected a .toml or .json", 0), 0u);
  // Names: a built-in is refused, and so is text the option lists cannot hold.
  EXPECT_EQ(msg(R"({"recipes": {"fp8": {"all": {}}}})", "json"),
            "f: recipe 'fp8': name: the name of a built-in recipe (`snip formats --recipes`); choose another name");
  EXPECT_EQ(msg(R"({"recipes": {"w4-a8": {"all": {}}}})", "json").rfind("f: recipe 'w4-a8': name: expected", 0),
            0u);
  EXPECT_EQ(msg(R"({"recipes": {"4w": {"all": {}}}})", "json").rfind("f: recipe '4w': name: expected", 0), 0u);
  // "none" already means no quantization (precision.recipe = none).
  EXPECT_EQ(msg(R"({"recipes": {"none": {"all": {}}}})", "json").rfind("f: recipe 'none': name: 'none' means no", 0),
            0u);
  // A Hadamard transform on one wgrad operand only (recipe-level check).
  EXPECT_EQ(msg(R"({"recipes": {"h": {"all": {}, "operands": {"wgrad.x": {"hadamard": 16}}}}})", "json")
                .rfind("f: recipe 'h': wgrad.dy and wgrad.x: a Hadamard transform", 0),
            0u)
      << msg(R"({"recipes": {"h": {"all": {}, "operands": {"wgrad.x": {"hadamard": 16}}}}})", "json");
}

TEST(RecipeFile, JoinsTheBuiltInsInARecipeSet) {
  const fs::path dir = fs::temp_directory_path() / "snip_recipe_file_test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string path = (dir / "recipes.toml").string();
  std::ofstream(path) << kToml;
  EXPECT_EQ(load_recipe_set("").names(), RecipeSet().names());  // no file: the built-ins
  const RecipeFile f = load_recipe_file(path);
  ASSERT_EQ(f.recipes.size(), 1u);
  const RecipeSet set = load_recipe_set(path);
  const Recipe got = set.find("w4a8");
  EXPECT_EQ(to_json(got), to_json(f.recipes[0]));
  EXPECT_EQ(set.names().size(), RecipeSet().names().size() + 1);
  EXPECT_TRUE(set.has("fp8"));
  EXPECT_FALSE(RecipeSet().has("w4a8"));  // a value: the built-ins are untouched
  EXPECT_FALSE(is_builtin_recipe("w4a8"));
  EXPECT_TRUE(is_builtin_recipe("fp8"));
  // Errors through the file name.
  std::ofstream(dir / "x.yaml") << "";
  EXPECT_THROW(load_recipe_set((dir / "x.yaml").string()), UserError);
  EXPECT_THROW(load_recipe_set((dir / "missing.toml").string()), UserError);
  // Run folder copy: written, then a resume with a changed recipe warns.
  const std::string run = (dir / "run").string();
  fs::create_directories(run);
  EXPECT_EQ(record_run_recipes(run, f, false), "");
  ASSERT_TRUE(fs::exists(dir / "run" / "recipes.json"));
  EXPECT_EQ(record_run_recipes(run, f, true), "");  // unchanged: no warning
  // The copy holds what the run trained with (snip experiment --no-train).
  const std::vector<Recipe> copy = load_recipe_copy(run + "/recipes.json");
  ASSERT_EQ(copy.size(), 1u);
  EXPECT_EQ(to_json(copy[0]), to_json(f.recipes[0]));
  RecipeFile changed = f;
  changed.recipes[0].operands[0].rounding = Rounding::kStochastic;
  const std::string w = record_run_recipes(run, changed, true);
  EXPECT_NE(w.find("w4a8"), std::string::npos) << w;
  EXPECT_NE(w.find("not be bit-identical"), std::string::npos) << w;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace snip::recipes
