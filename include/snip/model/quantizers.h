// snip/model/quantizers.h: recipes (snip_formats) as OperandQuantizer hooks.
#pragma once

#include <memory>
#include <string>

#include "snip/model/linear.h"
#include "snip/recipes/recipe.h"

namespace snip {

/// The quantizer hook for the recipe of `recipes` named `recipe`, or nullptr
/// for "none" or "" (no quantization: the GEMMs see the operands as they
/// are). Throws UserError "precision.recipe: unknown recipe 'X' (known:
/// ...)".
///
/// Its state() (checkpointed by PrecisionController) holds, per layer, the
/// delayed-scaling amax histories of kDelayed operands and, for a recipe with
/// error_feedback, the weight residual r_{t+1} [OUT, IN] (FP32, as base64 of
/// its little-endian bytes). Error feedback (docs/formats.md "Error
/// feedback"): the weight operand of step t is Q(W_t + r_t) for fprop.w and
/// dgrad.w alike, r_{t+1} = (W_t + r_t) - Q_fprop.w(W_t + r_t), advanced once
/// per QuantKey::step; under QuantStateFreeze, W + r_{t+1} and no update.
std::shared_ptr<const OperandQuantizer> make_recipe_quantizer(const recipes::RecipeSet& recipes,
                                                              const std::string& recipe);

}  // namespace snip
