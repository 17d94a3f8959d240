// snip/quant/quantizers.h: recipes (snip_formats) as OperandQuantizer hooks.
#pragma once

#include <memory>
#include <string>

#include "snip/model/linear.h"

namespace snip {

/// The quantizer hook for a registered recipe name, or nullptr for "none"
/// (no quantization: the GEMMs see the operands as they are). Throws
/// UserError "precision.recipe: unknown recipe 'X' (known: ...)".
std::shared_ptr<const OperandQuantizer> make_recipe_quantizer(const std::string& recipe);

}  // namespace snip
