// The run configuration: TOML parsing, overrides, errors with suggestions,
// and the resolved TOML round trip.
#include <gtest/gtest.h>

#include <optional>

#include <nlohmann/json.hpp>

#include "snip/config/config.h"
#include "snip/core/error.h"
#include "micro.h"

using namespace snip;

namespace {
using test::error_of;
}  // namespace

TEST(Config, DefaultsAndOverrides) {
  Config c;
  EXPECT_EQ(c.get_int("train.batch_size"), 16);
  c.load_toml_string("[train]\nbatch_size = 4\nlr = 1\n[model]\ntie_word_embeddings = false\n", "t.toml");
  EXPECT_EQ(c.get_int("train.batch_size"), 4);
  EXPECT_DOUBLE_EQ(c.get_float("train.lr"), 1.0);  // an integer is accepted as a number
  EXPECT_FALSE(c.get_bool("model.tie_word_embeddings"));
  c.set_override("train.lr=0.25");
  c.set_override("data.dir=some/where");
  c.set_override("model.tie_word_embeddings=true");
  EXPECT_DOUBLE_EQ(c.get_float("train.lr"), 0.25);
  EXPECT_EQ(c.get_string("data.dir"), "some/where");
  EXPECT_TRUE(c.get_bool("model.tie_word_embeddings"));
}

TEST(Config, UnknownKeyNamesTheClosestValidOne) {
  Config c;
  EXPECT_EQ(error_of([&] { c.load_toml_string("[train]\nbatch_sise = 4\n", "run.toml"); }),
            "run.toml:2: unknown option 'train.batch_sise' (did you mean 'train.batch_size'? "
            "`snip train --help` lists every option)");
  EXPECT_NE(error_of([&] { c.set_override("train.warmup_step=3"); }).find("did you mean 'train.warmup_steps'"),
            std::string::npos);
  EXPECT_EQ(closest_option_key("hiden_size"), "model.hidden_size");
  EXPECT_EQ(closest_option_key("model.num_layers"), "model.num_hidden_layers");
  // Other trainers' names for the same options (edit distance would miss them).
  EXPECT_EQ(error_of([&] { c.load_toml_string("[train]\nlearning_rate = 3e-4\n", "hf.toml"); }),
            "hf.toml:2: unknown option 'train.learning_rate' (did you mean 'train.lr'? "
            "`snip train --help` lists every option)");
  EXPECT_EQ(closest_option_key("steps"), "train.max_steps");
  EXPECT_EQ(closest_option_key("train.bsz"), "train.batch_size");
  EXPECT_EQ(closest_option_key("gradient_accumulation_steps"), "train.grad_accum");
  EXPECT_EQ(closest_option_key("model.n_layer"), "model.num_hidden_layers");
}

TEST(Config, ListOptionsAcceptTomlArrays) {
  Config c;
  c.load_toml_string("[precision]\noptions = [\"fp4\", \"fp8\", \"bf16\"]\npins = []\n", "a.toml");
  EXPECT_EQ(c.get_string("precision.options"), "fp4,fp8,bf16");
  EXPECT_EQ(c.get_string("precision.pins"), "");
  EXPECT_EQ(error_of([&] { c.load_toml_string("[precision]\noptions = [\"fp4\", 8]\n", "b.toml"); }),
            "b.toml:2: precision.options: expected a list of non-empty strings without commas, e.g. "
            "[\"fp4\", \"fp8\"]");
  // An array where one value is expected stays an error naming the type.
  EXPECT_EQ(error_of([&] { c.load_toml_string("[train]\nlr = [1, 2]\n", "c.toml"); }),
            "c.toml:2: train.lr: expected a number, got a TOML array");
}

TEST(Config, DtypeNamesAreTheSameEverywhere) {
  Config c;
  c.set_override("train.gemm_dtype=bfloat16");
  EXPECT_EQ(c.get_string("train.gemm_dtype"), "bf16");
  c.load_toml_string("[train]\ngemm_dtype = \"float32\"\n", "d.toml");
  EXPECT_EQ(c.get_string("train.gemm_dtype"), "fp32");
  c.set_override("train.gemm_dtype=bf16");
  EXPECT_EQ(c.get_string("train.gemm_dtype"), "bf16");
  // Only dtype options: other strings keep their spelling.
  c.set_override("data.dir=bfloat16");
  EXPECT_EQ(c.get_string("data.dir"), "bfloat16");
}

// The unquantized policy is "none" (its GEMMs run in train.gemm_dtype, FP32
// too); "bf16", its name until 2026-12-01, reads as it.
TEST(Config, UnquantizedPolicyIsNoneAndBf16IsItsOldName) {
  Config c;
  EXPECT_EQ(c.get_string("precision.policy"), "none");
  EXPECT_EQ(RunConfig::from(c).precision.policy, Policy::kNone);
  EXPECT_EQ(RunConfig::from(c).precision.policy_name(), "none");
  c.load_toml_string("[precision]\npolicy = \"bf16\"\n", "old.toml");
  EXPECT_EQ(c.get_string("precision.policy"), "none");
  EXPECT_NE(c.to_toml().find("\npolicy = " + format_option_value(std::string("none")) + "  #"), std::string::npos);
  c.set_override("precision.policy=snip");
  c.set_override("precision.policy=bf16");
  EXPECT_EQ(RunConfig::from(c).precision.policy_name(), "none");
  // Only the policy: an option list keeps the bf16 recipe's name.
  c.set_override("precision.options=fp4,bf16");
  EXPECT_EQ(c.get_string("precision.options"), "fp4,bf16");
  c.set_override("precision.policy=fp32");
  EXPECT_NE(error_of([&] { RunConfig::from(c); }).find("expected none (or its old name bf16)"), std::string::npos);
}

TEST(Config, UnquotedStringSaysToQuoteIt) {
  Config c;
  const std::string e = error_of([&] { c.load_toml_string("[precision]\nrecipe = fp4\n", "q.toml"); });
  EXPECT_EQ(e.rfind("q.toml:2:", 0), 0u) << e;
  EXPECT_NE(e.find("TOML syntax error"), std::string::npos) << e;
  EXPECT_NE(e.find("(strings need quotes: recipe = \"fp4\")"), std::string::npos) << e;
  // No hint where quoting is not the problem.
  EXPECT_EQ(error_of([&] { c.load_toml_string("[train\n", "b.toml"); }).find("need quotes"), std::string::npos);
}

TEST(Config, WrongTypesAreNamed) {
  Config c;
  EXPECT_EQ(error_of([&] { c.load_toml_string("[train]\nbatch_size = \"big\"\n", "r.toml"); }),
            "r.toml:2: train.batch_size: expected an integer, got 'big'");
  EXPECT_EQ(error_of([&] { c.set_override("train.lr=fast"); }),
            "--set train.lr=fast: train.lr: expected a number, got 'fast'");
  EXPECT_EQ(error_of([&] { c.set_override("train.lr"); }), "--set train.lr: expected section.key=value");
  EXPECT_NE(error_of([&] { c.load_toml_string("[train\n", "broken.toml"); }).find("broken.toml:1:"),
            std::string::npos);
}

TEST(Config, ValidateChecksShapes) {
  Config c;
  c.set_override("model.num_attention_heads=3");
  EXPECT_NE(error_of([&] { c.validate(); }).find("must be divisible by model.num_attention_heads (3)"),
            std::string::npos);
  Config d;
  d.set_override("train.seq_len=4096");
  EXPECT_NE(error_of([&] { d.validate(); }).find("exceeds model.max_position_embeddings"), std::string::npos);
}

TEST(Config, ResolvedTomlRoundTrips) {
  Config c;
  c.set_override("train.lr=0.1");
  c.set_override("data.dir=a \"quoted\" path");
  Config d;
  d.load_toml_string(c.to_toml(), "resolved");
  for (const auto& o : option_table()) {
    SCOPED_TRACE(o.key);
    EXPECT_EQ(format_option_value(d.values().at(o.key)),
              format_option_value(c.values().count(o.key) ? c.values().at(o.key) : o.def));
  }
  EXPECT_EQ(d.get_string("data.dir"), "a \"quoted\" path");
}

// Every option is declared once and bound to its typed member of RunConfig:
// each one's default is its member's initializer, and a value set through
// its key comes back out of its member (RunConfig::from, then the table's
// reader), for each option alone at a value other than its default.
// The enums of word options: read from their words, written back as them
// (the saved config.toml) and into JSON as them (summary.json, the report),
// never as nlohmann's default integer.
TEST(Config, EnumOptionsAreTheirWords) {
  Config c;
  c.set("dist.pipeline_schedule", std::string("gpipe"), "test");
  c.set("dist.boundary_comm", std::string("fp8"), "test");
  c.set("train.gemm_backend", std::string("emulated"), "test");
  c.set("lora.init", std::string("gaussian"), "test");
  const RunConfig r = RunConfig::from(c);
  EXPECT_EQ(r.dist.pipeline_schedule, PipelineSchedule::kGpipe);
  EXPECT_EQ(r.dist.boundary_comm, BoundaryComm::kFp8);
  EXPECT_EQ(r.train.gemm_backend, GemmBackend::kEmulated);
  EXPECT_EQ(r.lora.init, LoraInit::kGaussian);
  EXPECT_EQ(RunConfig{}.dist.pipeline_schedule, PipelineSchedule::k1F1B);  // the documented defaults
  EXPECT_EQ(RunConfig{}.train.gemm_backend, GemmBackend::kAuto);
  const nlohmann::json j = {{"schedule", r.dist.pipeline_schedule}, {"boundary_comm", r.dist.boundary_comm},
                            {"gemm_backend", r.train.gemm_backend}, {"init", r.lora.init}};
  EXPECT_EQ(j.dump(), R"({"boundary_comm":"fp8","gemm_backend":"emulated","init":"gaussian","schedule":"gpipe"})");
  Config bad;
  bad.set("dist.pipeline_schedule", std::string("zb-h1"), "test");
  EXPECT_THROW(RunConfig::from(bad), UserError);
}

TEST(Config, EveryOptionIsBoundToItsMember) {
  const RunConfig defaults;
  for (const OptionSpec& o : option_table()) {
    ASSERT_TRUE(o.set && o.get) << o.key << " is not bound to a member of RunConfig";
    EXPECT_EQ(o.get(defaults), o.def) << o.key << ": the member's initializer differs from the option's default";
  }
  EXPECT_EQ(RunConfig::from(Config()).train.lr, defaults.train.lr);
  size_t checked = 0;
  for (const OptionSpec& o : option_table()) {
    std::optional<OptionValue> v;  // a valid value other than the default
    switch (o.type) {
      case OptionType::kBool: v = !std::get<bool>(o.def); break;
      case OptionType::kInt:
        for (int64_t d : {int64_t{1}, int64_t{-1}, int64_t{2}})
          if (!v && o.range.contains(double(std::get<int64_t>(o.def) + d))) v = std::get<int64_t>(o.def) + d;
        break;
      case OptionType::kFloat:
        for (double f : {0.5, 2.0, 0.25})
          if (!v && std::get<double>(o.def) * f != std::get<double>(o.def) && o.range.contains(std::get<double>(o.def) * f))
            v = std::get<double>(o.def) * f;
        if (!v && o.range.contains(0.5) && std::get<double>(o.def) != 0.5) v = 0.5;
        break;
      case OptionType::kString:
        for (const std::string& w : o.choices)
          if (!v && w != std::get<std::string>(o.def)) v = w;
        break;
    }
    if (!v) continue;
    Config c;
    c.set(o.key, *v, "test");
    RunConfig r;
    try {
      r = RunConfig::from(c);
    } catch (const UserError&) {
      continue;  // valid alone, not with the other defaults (e.g. a shape another option must divide)
    }
    EXPECT_EQ(o.get(r), *v) << o.key << ": the value set by its key is not the one its member holds";
    ++checked;
  }
  EXPECT_GE(checked, option_table().size() * 3 / 4) << "too few options could be set alone";
}

TEST(Config, NumbersPrintAsTheShortestDecimalThatReadsBack) {
  EXPECT_EQ(format_option_value(0.9), "0.9");
  EXPECT_EQ(format_option_value(1e-5), "1e-05");
  EXPECT_EQ(format_option_value(3.0), "3.0");
  EXPECT_EQ(format_option_value(10.0), "10.0");  // not 1e+01 (guard.stall_minutes' default)
  EXPECT_EQ(format_option_value(300.0), "300.0");
  EXPECT_EQ(format_option_value(10000.0), "10000.0");
  EXPECT_EQ(format_option_value(123.456), "123.456");
  EXPECT_EQ(format_option_value(1e30), "1e+30");  // beyond 1e16: the exponent
  EXPECT_EQ(format_option_value(0.1 + 0.2), "0.30000000000000004");  // needs all 17 digits
  EXPECT_EQ(format_option_value(int64_t{42}), "42");
  EXPECT_EQ(format_option_value(std::string("a b")), "'a b'");
}

namespace snip {
namespace {

std::string toml_error(const std::string& text) {
  return test::error_of([&] {
    Config c;
    c.load_toml_string(text, "f.toml");
  });
}

std::string dotted(size_t parts) {
  std::string s = "a";
  for (size_t i = 1; i < parts; ++i) s += ".a";
  return s;
}

// A header [a.a. ... .a] of 31,287 parts crashed `snip train` (SIGSEGV in
// toml++'s recursion); nesting is bounded before toml++ parses.
TEST(ConfigRobustness, NestingIsBoundedBeforeTomlParses) {
  const std::string bound = "f.toml:1: expected tables, dotted keys, arrays and inline tables nested at most 64 deep, got more";
  EXPECT_EQ(toml_error("[" + dotted(31287) + "]\n"), bound);
  EXPECT_EQ(toml_error(dotted(31287) + " = 1\n"), bound);
  EXPECT_EQ(toml_error("x = " + std::string(65, '[') + std::string(65, ']') + "\n"), bound);
  EXPECT_EQ(toml_error("x = {" + dotted(70) + " = 1}\n"), bound);
  EXPECT_EQ(toml_error("[t]\n\nx = [{y = [{z = " + std::string(70, '[')).rfind("f.toml:3: expected tables", 0), 0u);
  // Within the bound toml++ decides (here: not snip options), and dots or
  // brackets inside strings and comments do not count.
  EXPECT_EQ(toml_error("[" + dotted(64) + "]\n").find("nested at most"), std::string::npos);
  EXPECT_EQ(toml_error("x = " + std::string(63, '[') + std::string(63, ']') + "\n").find("nested at most"),
            std::string::npos);
  Config c;
  c.load_toml_string("[data] # [" + dotted(100) + "]\ndir = \"" + dotted(100) + "[[[[\"\n[precision]\npins = '''\n" +
                         dotted(100) + "=fp8'''\n",
                     "f.toml");
  EXPECT_EQ(c.get_string("data.dir"), dotted(100) + "[[[[");
}

// lr = 1e308 passed the range (0, inf) and ended in an internal error inside
// LibTorch; 1e309 was a TOML syntax error naming no option.
TEST(ConfigRobustness, NumbersBeyondAnOptionsRangeAreRefusedByName) {
  Config c;
  c.load_toml_string("[train]\nlr = 1e308\n", "f.toml");
  EXPECT_EQ(test::error_of([&] { c.validate(); }),
            "config: f.toml:2: train.lr: expected a finite number in (0, 1000], got 1e+308");
  c.load_toml_string("[train]\ngrad_clip = 1e308\n", "f.toml");
  EXPECT_EQ(test::error_of([&] { RunConfig::from(c); }),
            "config: f.toml:2: train.grad_clip: expected a finite number in [0, 1e+30], got 1e+308");
  // A value out of range names where it came from: the file and line, or the --set.
  Config o;
  o.set_override("precision.budget=1.5");
  EXPECT_EQ(test::error_of([&] { o.validate(); }),
            "--set precision.budget=1.5: precision.budget: expected a finite number in [0, 1], got 1.5 (an FP4 "
            "FLOPs share; a ratio to the BF16 GEMM time needs precision.budget_unit = time)");
  // Under budget_unit time the budget is a ratio to the BF16 GEMM time: above
  // 1 is allowed (emulated FP4/FP8 GEMMs are slower than BF16), 0 is not.
  o.set_override("precision.budget_unit=time");
  EXPECT_NO_THROW(o.validate());
  EXPECT_DOUBLE_EQ(RunConfig::from(o).precision.budget, 1.5);
  o.set_override("precision.budget=0");
  EXPECT_EQ(test::error_of([&] { o.validate(); }),
            "--set precision.budget=0: precision.budget: expected a positive ratio to the BF16 GEMM time "
            "(precision.budget_unit = time), got 0");
  EXPECT_EQ(toml_error("[train]\n\nlr = 1e309\n"),
            "f.toml:3: train.lr: expected a finite number in (0, 1000], got 1e309 (beyond a double's range)");
  EXPECT_EQ(toml_error("[train]\nmax_steps = 99999999999999999999 # many\n"),
            "f.toml:2: train.max_steps: expected an integer >= 1, got 99999999999999999999 (beyond 64 bits)");
  Config s;
  EXPECT_EQ(test::error_of([&] { s.set_override("train.lr=-1e309"); }),
            "--set train.lr=-1e309: train.lr: expected a finite number in (0, 1000], got -1e309 (beyond a double's range)");
  EXPECT_EQ(test::error_of([&] { s.set_override("train.seed=99999999999999999999"); }),
            "--set train.seed=99999999999999999999: train.seed: expected an integer >= 0, got 99999999999999999999 "
            "(beyond 64 bits)");
  EXPECT_EQ(test::error_of([&] { s.set_override("train.lr=1e309x"); }),
            "--set train.lr=1e309x: train.lr: expected a number, got '1e309x'");
  s.set_override("train.eps=1e-310");  // subnormal: a double holds it
  EXPECT_GT(s.get_float("train.eps"), 0.0);
  s.set_override("train.lr=1000");
  EXPECT_EQ(test::error_of([&] { s.validate(); }), "(no error)");
}

}  // namespace
}  // namespace snip
