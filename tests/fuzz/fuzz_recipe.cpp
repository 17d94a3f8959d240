// A recipe as JSON (recipes/recipe.h recipe_from_json: name, description,
// operands with a QuantSpec each) -> io::parse_json -> recipe_from_json; a
// recipe that parses must come back from to_json.
#include "harness.h"
#include "snip/io/json.h"
#include "snip/recipes/recipe.h"

using namespace snip;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::guarded(data, size, [](std::string_view in) {
    const recipes::Recipe r = recipes::recipe_from_json(io::parse_json(in, "recipe.json"), "recipe.json");
    const recipes::Recipe back = recipes::recipe_from_json(recipes::to_json(r), "round trip");
    if (back.name != r.name || recipes::to_json(back) != recipes::to_json(r))
      fuzz::finding("recipe round trip changed the recipe");
  });
  return 0;
}
