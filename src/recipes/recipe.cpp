// The built-in recipes and the RecipeSet of named recipes (see recipes/recipe.h).
#include "snip/recipes/recipe.h"

#include "snip/formats/hadamard.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "snip/formats/integer.h"
#include "snip/formats/minifloat.h"
#include "snip/formats/posit.h"
#include "snip/core/error.h"

namespace snip::recipes {

using formats::BlockShape;
using formats::QuantSpec;
using formats::Rounding;
using formats::ScaleFormat;
using formats::ScaleRule;

namespace {

QuantSpec spec(const formats::ElementFormat& elem, ScaleRule rule, ScaleFormat sf, BlockShape block,
               Rounding rounding = Rounding::kRNE) {
  QuantSpec s;
  s.element = elem;
  s.rule = rule;
  s.scale_format = sf;
  s.block = block;
  s.rounding = rounding;
  return s;
}

bool is_grad(Operand op) { return op == Operand::kDgradDY || op == Operand::kWgradDY; }
bool is_weight(Operand op) { return op == Operand::kFpropW || op == Operand::kDgradW; }

// A recipe from a per-operand function.
template <typename F>
Recipe make(const std::string& name, const std::string& description, F&& per_operand) {
  Recipe r;
  r.name = name;
  r.description = description;
  for (int i = 0; i < kNumOperands; ++i) r.operands[size_t(i)] = per_operand(Operand(i));
  return r;
}

std::vector<Recipe> builtin_recipes() {
  using namespace formats;
  std::vector<Recipe> v;
  v.push_back(make("bf16", "every operand cast to BF16 (RNE, IEEE overflow); no scaling",
                   [](Operand) {
                     QuantSpec s = spec(kBF16, ScaleRule::kNone, ScaleFormat::kFP32,
                                        BlockShape::tensor());
                     s.saturate = false;
                     return s;
                   }));
  v.push_back(make("fp8",
                   "E4M3; X and dY in 1x128 tiles, W in 128x128 blocks; FP32 power-of-two "
                   "scales rounded up, so no element exceeds E4M3's max (TE Float8BlockScaling); RNE (DeepSeek-V3 layout, "
                   "docs/method.md section 1)",
                   [](Operand op) {
                     return spec(kE4M3, ScaleRule::kCurrent, ScaleFormat::kFP32Pow2,
                                 is_weight(op) ? BlockShape::square(128) : BlockShape::tile(128));
                   }));
  v.push_back(make("fp4",
                   "E2M1 with NVFP4 scaling (1x16 blocks, E4M3 block scale, FP32 tensor "
                   "scale); RNE for X and W, stochastic rounding for dY (docs/method.md section 1)",
                   [](Operand op) {
                     return spec(kE2M1, ScaleRule::kTwoLevel, ScaleFormat::kE4M3,
                                 BlockShape::tile(16),
                                 is_grad(op) ? Rounding::kStochastic : Rounding::kRNE);
                   }));
  v.push_back(make("nvfp4",
                   "TransformerEngine NVFP4BlockScaling (defaults): E2M1, E4M3 x FP32 two-level "
                   "scales; X and dY in 1x16 blocks, W in 16x16 blocks; SR for dY; 16x16 random "
                   "Hadamard transform (TE's signs) on both wgrad operands",
                   [](Operand op) {
                     QuantSpec s = spec(kE2M1, ScaleRule::kTwoLevel, ScaleFormat::kE4M3,
                                        is_weight(op) ? BlockShape::square(16) : BlockShape::tile(16),
                                        is_grad(op) ? Rounding::kStochastic : Rounding::kRNE);
                     if (gemm_of(op) == Gemm::kWgrad) {
                       s.hadamard_size = 16;
                       s.hadamard_seed = kHadamardTeSigns;
                     }
                     return s;
                   }));
  v.push_back(make("mxfp8", "OCP MX v1.0 MXFP8: E4M3, 1x32 blocks, E8M0 scale (spec floor rule), RNE",
                   [](Operand) {
                     return spec(kE4M3, ScaleRule::kMxFloor, ScaleFormat::kE8M0,
                                 BlockShape::tile(32));
                   }));
  v.push_back(make("mxfp8_rceil",
                   "MXFP8 with E8M0 scales rounded up (RCEIL, NVIDIA cuBLAS/TE): no element exceeds E4M3's max",
                   [](Operand) {
                     return spec(kE4M3, ScaleRule::kCurrent, ScaleFormat::kE8M0,
                                 BlockShape::tile(32));
                   }));
  v.push_back(make("mxfp4",
                   "OCP MX v1.0 MXFP4: E2M1, 1x32 blocks, E8M0 scale (floor rule); RNE for X "
                   "and W, SR for dY",
                   [](Operand op) {
                     return spec(kE2M1, ScaleRule::kMxFloor, ScaleFormat::kE8M0,
                                 BlockShape::tile(32),
                                 is_grad(op) ? Rounding::kStochastic : Rounding::kRNE);
                   }));
  v.push_back(make("mxfp4_rceil", "MXFP4 with E8M0 scales rounded up (RCEIL); SR for dY",
                   [](Operand op) {
                     return spec(kE2M1, ScaleRule::kCurrent, ScaleFormat::kE8M0,
                                 BlockShape::tile(32),
                                 is_grad(op) ? Rounding::kStochastic : Rounding::kRNE);
                   }));
  v.push_back(make("mxfp6", "OCP MX v1.0 MXFP6 (E2M3): 1x32 blocks, E8M0 scale (floor rule), RNE",
                   [](Operand) {
                     return spec(kE2M3, ScaleRule::kMxFloor, ScaleFormat::kE8M0,
                                 BlockShape::tile(32));
                   }));
  v.push_back(make("block_fp8", "Block-FP8: E4M3, 1x16 blocks, FP32 scales (TE current scaling: 448/amax), RNE",
                   [](Operand) {
                     return spec(kE4M3, ScaleRule::kCurrent, ScaleFormat::kFP32,
                                 BlockShape::tile(16));
                   }));
  v.push_back(make("fp8_tensor",
                   "TransformerEngine DelayedScaling HYBRID: E4M3 for X and W, E5M2 for dY; "
                   "per-tensor FP32 scales from the max of a 1024-step amax history",
                   [](Operand op) {
                     return spec(is_grad(op) ? kE5M2 : kE4M3, ScaleRule::kDelayed,
                                 ScaleFormat::kFP32, BlockShape::tensor());
                   }));
  v.push_back(make("e1m2",
                   "E1M2 (uniform 4-bit grid) with NVFP4-style two-level scaling (1x16 "
                   "blocks, E4M3 x FP32); RNE for X and W, SR for dY",
                   [](Operand op) {
                     return spec(kE1M2, ScaleRule::kTwoLevel, ScaleFormat::kE4M3,
                                 BlockShape::tile(16),
                                 is_grad(op) ? Rounding::kStochastic : Rounding::kRNE);
                   }));
  v.push_back(make("posit8",
                   "Posit8 (es = 2, 2022 standard), 1x128 tiles, FP32 power-of-two scales "
                   "mapping amax to 16, RNE",
                   [](Operand) {
                     return spec(kPosit8, ScaleRule::kCurrent, ScaleFormat::kFP32Pow2,
                                 BlockShape::tile(128));
                   }));
  v.push_back(make("int8", "INT8 (-127..127), one FP32 scale amax/127 per row, RNE",
                   [](Operand) {
                     return spec(kInt8, ScaleRule::kCurrent, ScaleFormat::kFP32, BlockShape::row());
                   }));
  return v;
}

namespace {
// A Hadamard transform cancels in a GEMM only when both operands share it.
void check_hadamard_pairs(const Recipe& r, const std::string& where) {
  for (int g = 0; g < kNumGemms; ++g) {
    const formats::QuantSpec &a = r.operands[size_t(2 * g)], &b = r.operands[size_t(2 * g + 1)];
    if (a.hadamard_size != b.hadamard_size || (a.hadamard_size > 0 && a.hadamard_seed != b.hadamard_seed))
      fail(where, ": ", operand_name(Operand(2 * g)), " and ", operand_name(Operand(2 * g + 1)),
           ": a Hadamard transform must be the same on both operands of a GEMM (hadamard ", a.hadamard_size,
           " vs ", b.hadamard_size, ")");
  }
}
}  // namespace

}  // namespace

void validate_recipe(const Recipe& r) {
  if (r.name.empty()) fail("recipe name: expected a non-empty name");
  for (int i = 0; i < kNumOperands; ++i)
    formats::validate_quant_spec(r.operands[size_t(i)],
                                 str_cat("recipe '", r.name, "' ", operand_name(Operand(i))));
  check_hadamard_pairs(r, str_cat("recipe '", r.name, "'"));
}

bool is_builtin_recipe(const std::string& name) {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const Recipe& r : builtin_recipes()) v.push_back(r.name);
    return v;
  }();
  return std::find(names.begin(), names.end(), name) != names.end();
}

OperandLayout operand_layout(Operand op) {
  switch (op) {
    case Operand::kFpropX: return {"X", "X [N, in]", "in"};
    case Operand::kFpropW: return {"W", "W [out, in]", "in"};
    case Operand::kDgradDY: return {"dY", "dY [N, out]", "out"};
    case Operand::kDgradW: return {"W", "W^T [in, out]", "out"};
    case Operand::kWgradDY: return {"dY", "dY^T [out, N]", "N"};
    case Operand::kWgradX: return {"X", "X^T [in, N]", "N"};
  }
  return {"?", "?", "?"};
}

bool Recipe::is_passthrough() const {
  for (const QuantSpec& s : operands)
    if (!s.is_bf16_passthrough()) return false;
  return true;
}

RecipeSet::RecipeSet() {
  static const std::map<std::string, Recipe> builtin = [] {
    std::map<std::string, Recipe> m;
    for (const Recipe& r : builtin_recipes()) {
      validate_recipe(r);
      m.emplace(r.name, r);
    }
    return m;
  }();
  recipes_ = builtin;
}

void RecipeSet::add(const Recipe& recipe, bool replace) {
  validate_recipe(recipe);
  const auto it = recipes_.find(recipe.name);
  if (it != recipes_.end()) {
    if (!replace) fail("RecipeSet::add: a recipe named '", recipe.name, "' already exists");
    it->second = recipe;
    return;
  }
  recipes_.emplace(recipe.name, recipe);
}

const Recipe& RecipeSet::find(const std::string& name) const {
  const auto it = recipes_.find(name);
  if (it != recipes_.end()) return it->second;
  std::string known;
  for (const auto& kv : recipes_) known += (known.empty() ? "" : ", ") + kv.first;
  fail("unknown recipe '", name, "' (known: ", known, ")");
}

bool RecipeSet::has(const std::string& name) const { return recipes_.count(name) > 0; }

std::vector<std::string> RecipeSet::names() const {
  std::vector<std::string> names;
  for (const auto& kv : recipes_) names.push_back(kv.first);
  return names;
}

nlohmann::json to_json(const Recipe& r) {
  nlohmann::json ops = nlohmann::json::object();
  for (int i = 0; i < kNumOperands; ++i)
    ops[operand_name(Operand(i))] = formats::to_json(r.operands[size_t(i)]);
  nlohmann::json j = {{"name", r.name}, {"description", r.description}, {"operands", ops}};
  if (r.error_feedback) j["error_feedback"] = true;
  return j;
}

void check_recipe_description(const std::string& d, const std::string& where) {
  const bool control = std::any_of(d.begin(), d.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u < 0x20 || u == 0x7f;
  });
  if (d.size() > kMaxRecipeDescription || control)
    fail(where, ": description: expected one line of at most ", kMaxRecipeDescription,
         " bytes without control characters, got ", d.size() > kMaxRecipeDescription
             ? str_cat(d.size(), " bytes") : std::string("a control character"));
}

Recipe recipe_from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) fail(where, ": expected an object, got ", j.type_name());
  Recipe r;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    if (key == "name" || key == "description") {
      if (!it->is_string()) fail(where, ".", key, ": expected a string, got ", it->dump());
      (key == "name" ? r.name : r.description) = it->get<std::string>();
      if (key == "description") check_recipe_description(r.description, where);
    } else if (key == "error_feedback") {
      if (!it->is_boolean()) fail(where, ".error_feedback: expected true or false, got ", it->dump());
      r.error_feedback = it->get<bool>();
    } else if (key != "operands") {
      fail(where, ".", key, ": unknown key (expected name, description, operands, error_feedback)");
    }
  }
  if (r.name.empty()) fail(where, ".name: expected a non-empty string");
  const auto ops_it = j.find("operands");
  if (ops_it == j.end() || !ops_it->is_object())
    fail(where, ".operands: expected an object with fprop.x .. wgrad.x (or all)");
  const nlohmann::json& ops = *ops_it;
  nlohmann::json base = nlohmann::json::object();
  if (ops.contains("all")) {
    if (!ops["all"].is_object()) fail(where, ".operands.all: expected an object");
    base = ops["all"];
  }
  for (auto it = ops.begin(); it != ops.end(); ++it) {
    if (it.key() == "all") continue;
    parse_operand(it.key(), where + ".operands");
    if (!it->is_object()) fail(where, ".operands.", it.key(), ": expected an object");
  }
  for (int i = 0; i < kNumOperands; ++i) {
    const char* name = operand_name(Operand(i));
    nlohmann::json merged = base;
    if (ops.contains(name)) merged.update(ops[name]);
    if (!ops.contains(name) && !ops.contains("all"))
      fail(where, ".operands.", name, ": missing (give every operand, or an 'all' entry)");
    r.operands[size_t(i)] = formats::quant_spec_from_json(merged, str_cat(where, ".operands.", name));
  }
  check_hadamard_pairs(r, where + ".operands");
  return r;
}

}  // namespace snip::recipes

namespace snip {

Operand parse_operand(const std::string& name, const std::string& where) {
  for (int i = 0; i < kNumOperands; ++i)
    if (name == operand_name(Operand(i))) return Operand(i);
  fail(where, ": unknown GEMM operand '", name,
       "' (expected fprop.x, fprop.w, dgrad.dy, dgrad.w, wgrad.dy or wgrad.x)");
}

PlanKey parse_plan_key(const std::string& text, const std::string& where) {
  PlanKey k{text, std::nullopt};
  if (const size_t colon = text.rfind(':'); colon != std::string::npos)
    for (Gemm g : kAllGemms)
      if (text.compare(colon + 1, std::string::npos, gemm_name(g)) == 0) k = PlanKey{text.substr(0, colon), g};
  if (k.layer.empty()) fail(where, ": empty plan item '", text, "' (expected a layer name or <layer>:fprop|dgrad|wgrad)");
  return k;
}

}  // namespace snip
