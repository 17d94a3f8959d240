// A recipe file (recipes/recipe_file.h parse_recipe_file_text: precision.
// recipe_file, TOML or JSON with roles, operands, error_feedback,
// compensation_freq): the first byte picks the format (even: TOML, odd:
// JSON), the rest is the file. A file that parses must give recipes whose
// JSON form (recipes::to_json) parses back to the same recipes.
#include "harness.h"
#include "snip/recipes/recipe.h"
#include "snip/recipes/recipe_file.h"

using namespace snip;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const char* format = (data[0] & 1) ? "json" : "toml";
  fuzz::guarded(data + 1, size - 1, [&](std::string_view in) {
    const recipes::RecipeFile f = recipes::parse_recipe_file_text(std::string(in), format, "recipes.file");
    for (const recipes::Recipe& r : f.recipes) {
      const recipes::Recipe back = recipes::recipe_from_json(recipes::to_json(r), "round trip");
      if (recipes::to_json(back) != recipes::to_json(r)) fuzz::finding("recipe file round trip changed a recipe");
    }
  });
  return 0;
}
