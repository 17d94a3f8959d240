// snip/recipes/recipe_file.h: user recipes from a file (precision.recipe_file),
// added to the built-in ones in a RecipeSet (docs/formats.md "Recipe files").
//
// The file is TOML (.toml) or JSON (.json), chosen by extension, with the
// same tree in both:
//
//   [recipes.w4a8]                       # one table per recipe; the key is its name
//   description = "W4 per-channel E2M1, A8 per-tensor E4M3"
//   error_feedback = true                # weights only (recipes/recipe.h Recipe::error_feedback)
//   compensation_freq = 16               # delayed scaling's scale_refresh_interval, steps
//   [recipes.w4a8.activations]           # fprop.x and wgrad.x
//   element = "e4m3"
//   [recipes.w4a8.weights]               # fprop.w and dgrad.w
//   element = "e2m1"
//   block = "row"
//   [recipes.w4a8.gradients]             # dgrad.dy and wgrad.dy
//   element = "e5m2"
//   rule = "delayed"
//   [recipes.w4a8.operands."dgrad.dy"]   # per-operand keys override the role's
//   rounding = "stochastic"
//
// Each role, `all` and each operand entry is a QuantSpec in its JSON form
// (formats/quant_spec.h). An operand's spec is `all`, then its role's keys,
// then its own keys (later keys win). compensation_freq sets
// scale_refresh_interval on every operand whose rule is delayed; a recipe
// with no delayed operand refuses it (the other rules take each scale from
// the call's own data: nothing to refresh).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "snip/recipes/recipe.h"

namespace snip::recipes {

/// The recipes of one file, parsed and validated.
struct RecipeFile {
  std::string path;              ///< as given (relative paths are relative to the working directory)
  std::vector<Recipe> recipes;   ///< sorted by name
  /// {"recipe_file": path, "recipes": [to_json(recipe), ...]}: the resolved
  /// form, what RUN/recipes.json holds.
  nlohmann::json resolved() const;
};

/// Parses recipe-file text. `format` is "toml" or "json"; `where` names the
/// source in errors. Every error is one UserError line "<where>: recipe
/// 'x': <field>: expected ..., got ..." (fields as written in the file:
/// weights.block, operands.dgrad.dy.rounding, compensation_freq, ...), also
/// for unknown keys, a bad recipe name (expected [A-Za-z][A-Za-z0-9_]*, at
/// most 64 characters) and the name of a built-in recipe.
RecipeFile parse_recipe_file_text(const std::string& text, const std::string& format, const std::string& where);

/// Reads and parses `path` (.toml or .json). Throws UserError "<path>: ..."
/// as parse_recipe_file_text, or when the file cannot be read or has
/// another extension.
RecipeFile load_recipe_file(const std::string& path);

/// The built-in recipes plus those of `file`.
RecipeSet recipe_set(const RecipeFile& file);

/// The built-in recipes plus those of load_recipe_file(`path`); an empty
/// path gives the built-ins. What RunConfig::from loads for
/// precision.recipe_file. Throws UserError as load_recipe_file.
RecipeSet load_recipe_set(const std::string& path);

/// The recipes of a run folder's copy (RUN/recipes.json, the resolved form
/// record_run_recipes writes), validated: what the run trained with, for
/// readers of a finished run (`snip experiment --no-train`). Throws
/// UserError "<path>: ..." when it cannot be read or parsed, or names a
/// built-in recipe.
std::vector<Recipe> load_recipe_copy(const std::string& path);

/// For a training run's folder: on resume, compares `file`'s resolved form
/// with RUN/recipes.json and warns (spdlog) when a recipe the run used
/// changed or vanished (the resumed steps then differ from an uninterrupted
/// run); then writes RUN/recipes.json (atomically) when `file` has recipes.
/// Returns the warning text ("" when none).
std::string record_run_recipes(const std::string& run_dir, const RecipeFile& file, bool resume);

}  // namespace snip::recipes
