// snip/recipes/recipe.h: named recipes, i.e. how each of the six GEMM operands
// of a linear layer is quantized, and the set of them a run can name.
//
// A linear layer with W [out, in] and X [N, in] (N = B·T tokens) runs three GEMMs (docs/method.md
// section 1). Scaling blocks run along each GEMM's reduction dimension K, so
// the caller hands each operand to fake_quantize laid out [rows, K] with K
// contiguous:
//
//   operand    GEMM                 tensor  passed as         K (blocked dim)
//   fprop.x    Y  = X · Wᵀ          X       X   [N, in]       in
//   fprop.w    Y  = X · Wᵀ          W       W   [out, in]     in
//   dgrad.dy   dX = dY · W          dY      dY  [N, out]      out
//   dgrad.w    dX = dY · W          W       Wᵀ  [in, out]     out
//   wgrad.dy   dW = dYᵀ · X         dY      dYᵀ [out, N]      N
//   wgrad.x    dW = dYᵀ · X         X       Xᵀ  [in, N]       N
//
// (With square 2-D blocks, as the fp8 recipe uses for weights, the blocks of
// W and Wᵀ coincide, so one quantized copy of W serves fprop and dgrad.)
//
// Built-in recipes (see recipe.cpp for the exact specs; `snip formats
// --recipes` prints them):
//   bf16        every operand cast to BF16 (RNE, IEEE overflow), no scaling
//   fp8         docs/method.md default: E4M3; X, dY in 1x128 tiles, W in 128x128
//               blocks; FP32 power-of-two scales (rounded up); RNE (DeepSeek-V3 layout)
//   fp4         E2M1 with NVFP4 scaling (1x16 blocks, E4M3 block scale, FP32
//               tensor scale); RNE for X and W, stochastic rounding for dY
//   nvfp4       TransformerEngine's NVFP4 recipe: as fp4 but W in 16x16 2-D
//               blocks; 16x16 random Hadamard transform of both wgrad operands
//   mxfp8       OCP MX: E4M3, 1x32 blocks, E8M0 scale, spec floor rule, RNE
//   mxfp8_rceil as mxfp8 with the scale rounded up (NVIDIA cuBLAS / TE MXFP8)
//   mxfp4       OCP MX: E2M1, 1x32, E8M0, floor rule; RNE for X, W; SR for dY
//   mxfp4_rceil as mxfp4 with RCEIL scales
//   mxfp6       OCP MX: E2M3, 1x32, E8M0, floor rule, RNE
//   block_fp8   E4M3, 1x16 blocks, FP32 scale amax/448, RNE
//   fp8_tensor  TE DelayedScaling "HYBRID": E4M3 for X, W; E5M2 for dY;
//               per-tensor FP32 scales from a 1024-step amax history
//   e1m2        E1M2 with NVFP4-style two-level scaling (1x16, E4M3 x FP32), SR for dY
//   posit8      Posit8 (es = 2), 1x128 tiles, FP32 power-of-two scales, RNE
//   int8        INT8 (-127..127), one FP32 scale per row (amax/127), RNE
#pragma once

#include <array>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "snip/formats/quant_spec.h"
#include "snip/recipes/gemm.h"

namespace snip::recipes {

// The GEMMs and operands (Gemm, Operand, operand_name, parse_operand) are
// snip/recipes/gemm.h.

/// How an operand is laid out when quantized (the table above).
struct OperandLayout {
  const char* tensor;     ///< "X", "W" or "dY"
  const char* passed_as;  ///< "[N, in]", "[in, out]" (Wᵀ), ...
  const char* k_dim;      ///< the reduction dim along the last axis: "in", "out" or "N"
};
OperandLayout operand_layout(Operand op);

/// A named recipe: one QuantSpec per GEMM operand.
struct Recipe {
  std::string name;
  std::string description;
  std::array<formats::QuantSpec, kNumOperands> operands;
  /// Error feedback on the weight operand (recipe files only; docs/formats.md
  /// "Recipe files"): the W quantized at step t is Q(W_t + r_t), r_{t+1} =
  /// (W_t + r_t) - Q_fprop.w(W_t + r_t), r_0 = 0, per layer (docs/method.md
  /// section 7; Seide et al. 2014, Karimireddy et al. 2019). The state lives
  /// in the quantizer (model/quantizers.h).
  bool error_feedback = false;

  const formats::QuantSpec& operator[](Operand op) const {
    return operands[size_t(static_cast<int>(op))];
  }
  formats::QuantSpec& operator[](Operand op) { return operands[size_t(static_cast<int>(op))]; }
  /// True if every operand is a BF16 passthrough (the bf16 recipe).
  bool is_passthrough() const;
};

/// Checks every operand spec and the Hadamard pairs of `recipe`; throws
/// snip::UserError "recipe 'x' dgrad.dy: ..." (what RecipeSet::add checks).
void validate_recipe(const Recipe& recipe);
/// True for the names of the recipes built into snip (bf16, fp8, ...), which
/// a recipe file may not reuse.
bool is_builtin_recipe(const std::string& name);

/// A set of named recipes: the built-in ones, plus those a run's recipe file
/// adds (recipe_file.h load_recipe_set). A value, not a registry: the run's
/// configuration owns its set (RunConfig::recipes) and hands it to what
/// resolves a recipe name (the precision controller, the quantizers, the
/// gradient format of data parallelism, the exporter); copies are
/// independent. Const access is thread-safe.
class RecipeSet {
 public:
  /// The built-in recipes (bf16, fp8, fp4, ...), validated.
  RecipeSet();
  /// Adds `recipe` (or with replace = true, overwrites the one of its name).
  /// Validates every operand spec. Throws snip::UserError on an empty name,
  /// an invalid spec ("recipe 'x' dgrad.dy: ...") or a taken name when
  /// !replace.
  void add(const Recipe& recipe, bool replace = false);
  /// The recipe named `name`. Throws snip::UserError "unknown recipe 'x'
  /// (known: bf16, block_fp8, ...)".
  const Recipe& find(const std::string& name) const;
  /// True when the set holds a recipe named `name`.
  bool has(const std::string& name) const;
  /// The names, sorted.
  std::vector<std::string> names() const;

 private:
  std::map<std::string, Recipe> recipes_;
};

/// Plain-config form: {"name", "description", "operands": {"fprop.x": {...
/// QuantSpec ...}, ...}} (+ "error_feedback": true when set).
nlohmann::json to_json(const Recipe& recipe);
/// Inverse of to_json. "operands" may also hold a single "all" entry applied
/// to every operand, then overridden per operand. Throws snip::UserError
/// "<where>.operands.dgrad.dy.block: ..." on bad input.
Recipe recipe_from_json(const nlohmann::json& j, const std::string& where);

/// Longest recipe description accepted, in bytes.
constexpr size_t kMaxRecipeDescription = 500;

/// A recipe's description is one line a terminal prints as it is: at most
/// kMaxRecipeDescription bytes, no control characters (bytes below 0x20,
/// 0x7f; UTF-8 letters are fine). Throws UserError "<where>: description:
/// expected one line of at most 500 bytes without control characters, got
/// ..." otherwise.
void check_recipe_description(const std::string& d, const std::string& where);

}  // namespace snip::recipes
