// Glob matching, pins, block indices, stages, the conservative preset.
#include <fnmatch.h>
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "snip/plan/cost_table.h"
#include "snip/plan/planner.h"
#include "snip/core/error.h"

using namespace snip::plan;

namespace {

PlanItem layer_item(const std::string& name, double flops = 1.0) {
  PlanItem it;
  it.name = it.layer = name;
  it.flops = flops;
  it.q = {{"fp4", 1.0}, {"fp8", 0.1}, {"bf16", 0.0}};
  return it;
}

PlanItem gemm_item(const std::string& layer, const std::string& gemm) {
  PlanItem it = layer_item(layer + ":" + gemm);
  it.layer = layer;
  it.gemm = gemm;
  return it;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const snip::UserError& e) {
    return e.what();
  }
  return "(no UserError)";
}

}  // namespace

TEST(Glob, HandWrittenCases) {
  struct Case {
    const char* pat;
    const char* text;
    bool match;
  };
  const Case cases[] = {
      {"*.down_proj", "model.layers.3.mlp.down_proj", true},
      {"*.down_proj", "model.layers.3.mlp.up_proj", false},
      {"*", "", true},
      {"", "", true},
      {"", "a", false},
      {"?", "", false},
      {"?", "x", true},
      {"a*b*c", "abc", true},
      {"a*b*c", "aXbYc", true},
      {"a*b*c", "aXbYcZ", false},
      {"*layers.1.*", "model.layers.11.mlp", false},
      {"*layers.1[0-9].*", "model.layers.11.mlp", true},
      {"[!0-9]*", "model", true},
      {"[!0-9]*", "7up", false},
      {"[]]", "]", true},
      {"[!]]", "]", false},
      {"[a-]", "-", true},
      {"[", "[", true},       // unclosed bracket: a literal '['
      {"a[", "a[", true},
      {"\\*", "*", true},     // escaped star is literal
      {"\\*", "x", false},
      {"*:wgrad", "x.y:wgrad", true},
      {"**a", "bba", true},
  };
  for (const Case& c : cases)
    EXPECT_EQ(glob_match(c.pat, c.text), c.match) << "'" << c.pat << "' vs '" << c.text << "'";
}

TEST(Glob, AgreesWithFnmatchOnRandomStrings) {
  // fnmatch(3) without flags is the reference for the documented syntax.
  std::mt19937_64 rng(5);
  const std::string pat_alpha = "ab.*?[]!-";
  const std::string text_alpha = "ab.-]!";
  int matches = 0;
  for (int k = 0; k < 20000; ++k) {
    std::string pat, text;
    const int lp = static_cast<int>(rng() % 7), lt = static_cast<int>(rng() % 8);
    for (int i = 0; i < lp; ++i) pat += pat_alpha[rng() % pat_alpha.size()];
    for (int i = 0; i < lt; ++i) text += text_alpha[rng() % text_alpha.size()];
    const bool ref = fnmatch(pat.c_str(), text.c_str(), 0) == 0;
    matches += ref;
    ASSERT_EQ(glob_match(pat, text), ref) << "'" << pat << "' vs '" << text << "'";
  }
  EXPECT_GT(matches, 500);  // the sample exercises matches, not just misses
}

TEST(Pins, ParsePin) {
  const Pin p = parse_pin("*.down_proj=fp8");
  EXPECT_EQ(p.pattern, "*.down_proj");
  EXPECT_EQ(p.option, "fp8");
  EXPECT_EQ(p.text(), "*.down_proj=fp8");
  EXPECT_EQ(parse_pin("a=b=c").pattern, "a=b");  // split at the last '='
  EXPECT_NE(error_of([] { parse_pin("*.down_proj"); }).find("expected GLOB=OPTION"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_pin("=fp8"); }).find("expected a glob"), std::string::npos);
  EXPECT_NE(error_of([] { parse_pin("x="); }).find("expected an option"), std::string::npos);
}

TEST(Pins, MatchesWholeNameOrDottedSuffix) {
  const PlanItem up = layer_item("model.layers.21.mlp.up_proj");
  const auto L = Granularity::layer;
  EXPECT_TRUE(pin_matches({"layers.21.mlp.*", "fp8"}, up, L));
  EXPECT_TRUE(pin_matches({"model.layers.21.mlp.*", "fp8"}, up, L));
  EXPECT_TRUE(pin_matches({"up_proj", "fp8"}, up, L));
  EXPECT_TRUE(pin_matches({"mlp.*", "fp8"}, up, L));
  EXPECT_FALSE(pin_matches({"p_proj", "fp8"}, up, L));    // suffix must start a component
  EXPECT_FALSE(pin_matches({"layers.2.*", "fp8"}, up, L));
  EXPECT_FALSE(pin_matches({"layers.1.*", "fp8"},
                           layer_item("model.layers.11.mlp.up_proj"), L));
  EXPECT_TRUE(pin_matches({"layers.1?.*", "fp8"}, layer_item("model.layers.11.mlp.up_proj"), L));
}

TEST(Pins, GemmPart) {
  const auto G = Granularity::gemm;
  const PlanItem w = gemm_item("model.layers.0.mlp.down_proj", "wgrad");
  const PlanItem f = gemm_item("model.layers.0.mlp.down_proj", "fprop");
  EXPECT_TRUE(pin_matches({"*.down_proj:wgrad", "fp8"}, w, G));
  EXPECT_FALSE(pin_matches({"*.down_proj:wgrad", "fp8"}, f, G));
  EXPECT_TRUE(pin_matches({"*.down_proj", "fp8"}, f, G));  // no GEMM part: all three
  EXPECT_TRUE(pin_matches({"*:[dw]grad", "fp8"}, w, G));
  EXPECT_FALSE(pin_matches({"*:[dw]grad", "fp8"}, f, G));
  // A GEMM part at layer granularity is a user error with a hint.
  const std::string msg = error_of([] {
    pin_matches({"*.down_proj:wgrad", "fp8"}, layer_item("model.layers.0.mlp.down_proj"),
                Granularity::layer);
  });
  EXPECT_NE(msg.find("--per-gemm"), std::string::npos) << msg;
}

TEST(Pins, ResolveConflictsAndErrors) {
  PlanProblem p;
  for (const char* n : {"model.layers.0.self_attn.v_proj", "model.layers.0.mlp.down_proj",
                        "model.layers.1.self_attn.v_proj", "model.layers.1.mlp.down_proj"})
    p.items.push_back(layer_item(n));
  PlanOptions o;
  o.pins = {{"*.down_proj", "fp8"}, {"layers.1.*", "fp8"}, {"*.v_proj", "bf16"}};
  // Same-option overlap is fine and credited to the first pin; the v_proj
  // of block 1 is matched by "layers.1.*=fp8" and "*.v_proj=bf16": conflict.
  std::string msg = error_of([&] { resolve_pins(p, o); });
  EXPECT_EQ(msg,
            "pins 'layers.1.*=fp8' and '*.v_proj=bf16' both match "
            "'model.layers.1.self_attn.v_proj'; expected at most one option per item");
  o.pins = {{"*.down_proj", "fp8"}, {"layers.1.*", "fp8"}};
  const PinResolution r = resolve_pins(p, o);
  EXPECT_EQ(r.option, (std::vector<std::string>{"", "fp8", "fp8", "fp8"}));
  EXPECT_EQ(r.source, (std::vector<int>{-1, 0, 1, 0}));

  o.pins = {{"*.gate_proj", "fp8"}};
  msg = error_of([&] { resolve_pins(p, o); });
  EXPECT_NE(msg.find("pin '*.gate_proj=fp8' matches no item"), std::string::npos) << msg;

  o.pins = {{"*.v_proj", "int4"}};
  msg = error_of([&] { resolve_pins(p, o); });
  EXPECT_NE(msg.find("selects option 'int4', which item 'model.layers.0.self_attn.v_proj' "
                     "does not offer (it offers bf16, fp4, fp8)"),
            std::string::npos)
      << msg;
}

TEST(Pins, StageBoundariesYieldToUserPins) {
  PlanProblem p;
  for (int b = 0; b < 4; ++b)
    for (const char* t : {"self_attn.q_proj", "mlp.down_proj"}) {
      PlanItem it = layer_item("model.layers." + std::to_string(b) + "." + t);
      it.stage = b / 2;  // stage 0: blocks 0-1, stage 1: blocks 2-3
      p.items.push_back(it);
    }
  PlanOptions o;
  o.stage_boundary_option = "fp8";
  o.pins = {{"layers.3.mlp.down_proj", "bf16"}};
  const PinResolution r = resolve_pins(p, o);
  // Boundaries: stage 0 first = layers.0.q, last = layers.1.down; stage 1
  // first = layers.2.q, last = layers.3.down (user pin wins: bf16).
  EXPECT_EQ(r.option,
            (std::vector<std::string>{"fp8", "", "", "fp8", "fp8", "", "", "bf16"}));
  EXPECT_EQ(r.source, (std::vector<int>{-2, -1, -1, -2, -2, -1, -1, 0}));
  // Without stages the boundary pins cannot apply.
  for (PlanItem& it : p.items) it.stage = -1;
  EXPECT_NE(error_of([&] { resolve_pins(p, o); }).find("need a pipeline stage"),
            std::string::npos);
}

TEST(Pins, BoundaryInGemmModeCoversAllThreeGemms) {
  PlanProblem p;
  p.granularity = Granularity::gemm;
  for (const char* l : {"model.layers.0.mlp.up_proj", "model.layers.0.mlp.gate_proj",
                        "model.layers.0.mlp.down_proj"})
    for (snip::Gemm gemm : snip::kAllGemms) {
      const char* g = snip::gemm_name(gemm);
      PlanItem it = gemm_item(l, g);
      it.stage = 0;
      p.items.push_back(it);
    }
  PlanOptions o;
  o.stage_boundary_option = "fp8";
  const PinResolution r = resolve_pins(p, o);
  for (int i = 0; i < 9; ++i) EXPECT_EQ(r.option[i], (i / 3 == 1) ? "" : "fp8") << i;
}

TEST(Stages, BlockIndex) {
  EXPECT_EQ(block_index("model.layers.12.mlp.up_proj"), 12);
  EXPECT_EQ(block_index("layers.0.self_attn.q_proj"), 0);
  EXPECT_EQ(block_index("model.layers.7.mlp.up_proj:wgrad"), 7);
  EXPECT_EQ(block_index("lm_head"), -1);
  EXPECT_EQ(block_index("model.sublayers.3.x"), -1);
  EXPECT_EQ(block_index("model.layers.x.mlp"), -1);
}

TEST(Stages, AssignContiguousNearlyEqual) {
  PlanProblem p;
  for (int b = 0; b < 22; ++b) p.items.push_back(layer_item("model.layers." + std::to_string(b) + ".mlp.up_proj"));
  p.items.push_back(layer_item("lm_head"));
  assign_stages(p, 4);
  // 22 blocks over 4 stages: 6, 6, 5, 5.
  std::vector<int> count(4, 0);
  for (int b = 0; b < 22; ++b) count[p.items[b].stage]++;
  EXPECT_EQ(count, (std::vector<int>{6, 6, 5, 5}));
  EXPECT_EQ(p.items[5].stage, 0);
  EXPECT_EQ(p.items[6].stage, 1);
  EXPECT_EQ(p.items[21].stage, 3);
  EXPECT_EQ(p.items[22].stage, 3);  // lm_head joins the item before it
  EXPECT_NE(error_of([&] { assign_stages(p, 23); }).find("at most 22 stages"), std::string::npos);
  EXPECT_NE(error_of([&] { assign_stages(p, 0); }).find("positive"), std::string::npos);
}

TEST(Pins, ConservativePresetCapsTinyLlamaAt59Over84) {
  // Hand-derived: per block (in*out) q 2048², k,v 2048·256, o 2048², gate,
  // up, down 2048·5632. Pinned: every down and v (22 blocks) plus the last
  // block's gate and up: 288,358,400 of 968,884,224 -> share 59/84.
  PlanProblem p;
  for (const LinearLayerShape& l : llama_linear_layers(22, 2048, 5632, 32, 4, 1)) {
    PlanItem it = layer_item(l.name, 3 * l.gemm_flops);
    p.items.push_back(it);
  }
  PlanOptions o;
  o.pins = conservative_pins(21);
  EXPECT_NEAR(max_fp4_share(p, o), 59.0 / 84.0, 1e-12);
  // "about 0.7" and a budget of 0.75 is infeasible, naming the pins.
  o.budget = Budget::share(0.75);
  const std::string msg = error_of([&] { solve(p, o); });
  EXPECT_EQ(msg,
            "budget 0.75 is infeasible: pins '*.down_proj=fp8' (22 layers, 26.2% of FLOPs), "
            "'*.v_proj=fp8' (22 layers, 1.2% of FLOPs) and 'layers.21.mlp.*=fp8' (2 layers, "
            "2.4% of FLOPs) cap the FP4 share at 0.702");
}
