// Recipes as OperandQuantizer hooks.
#include "snip/core/quantizers.h"

#include "snip/util/error.h"

namespace snip {

std::shared_ptr<const OperandQuantizer> make_recipe_quantizer(const std::string& recipe) {
  if (recipe == "none" || recipe.empty()) return nullptr;
  fail("precision.recipe: unknown recipe '", recipe, "' (known: none)");
}

}  // namespace snip
