// A recipe file (quant/recipe_file.h parse_recipe_file_text: precision.
// recipe_file, TOML or JSON with roles, operands, error_feedback,
// compensation_freq): the first byte picks the format (even: TOML, odd:
// JSON), the rest is the file. A file that parses must give recipes whose
// JSON form (quant::to_json) parses back to the same recipes.
#include "harness.h"
#include "snip/quant/recipe.h"
#include "snip/quant/recipe_file.h"

using namespace snip;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const char* format = (data[0] & 1) ? "json" : "toml";
  fuzz::guarded(data + 1, size - 1, [&](std::string_view in) {
    const quant::RecipeFile f = quant::parse_recipe_file_text(std::string(in), format, "recipes.file");
    for (const quant::Recipe& r : f.recipes) {
      const quant::Recipe back = quant::recipe_from_json(quant::to_json(r), "round trip");
      if (quant::to_json(back) != quant::to_json(r)) fuzz::finding("recipe file round trip changed a recipe");
    }
  });
  return 0;
}
