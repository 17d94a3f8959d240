// snip/app/formats_command.h: what `snip formats` and `snip quantize` do
// (README, "Number formats"; docs/formats.md). LibTorch-free: formats, io and
// recipes.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

#include "snip/recipes/recipe.h"

namespace snip::app {

/// `snip formats [--json]`: every element format with its bits, exponent and
/// mantissa widths, bias, largest and smallest normal/subnormal values,
/// Inf/NaN encodings, as a table or a JSON array.
void print_format_table(std::ostream& out, bool json);

/// `snip formats --codes NAME [--json]`: every code of a format of 8 bits or
/// fewer with its bits and value. Throws UserError for an unknown name or a
/// format wider than 8 bits.
void print_codes(std::ostream& out, const std::string& name, bool json);

/// The recipes `snip formats --recipes` lists: the built-ins, plus the
/// precision.recipe_file of run configuration `config` ("" = none), plus
/// those of `recipe_file` ("" = none; a name in both files is recipe_file's).
/// Throws UserError as Config::load_toml_file and load_recipe_file.
recipes::RecipeSet listed_recipes(const std::string& config, const std::string& recipe_file);

/// `snip formats --recipes [--json]`: every recipe of `set`, its spec per
/// GEMM operand (element format, block, scale rule and format, rounding).
void print_recipes(std::ostream& out, const recipes::RecipeSet& set, bool json);

/// The options of `snip quantize`.
struct QuantizeOpts {  // --scheme, --input, --output, --operand, --seed, --json
  std::string scheme, input, output, operand = "fprop.w";
  uint64_t seed = 0;
  bool json = false;
};

/// `snip quantize`: fake-quantizes every floating-point tensor of `o.input`
/// along its last dimension with built-in recipe `o.scheme`'s spec for `o.operand`,
/// writes `o.output` (FP32; non-float tensors copied) atomically, and prints
/// per tensor the SQNR (dB), relative error, underflow and saturated shares
/// on `out`, flush-to-zero warnings on `err`. Throws UserError, one line,
/// before anything is written or printed: an unwritable --output, an unknown
/// recipe or operand, an unreadable input, an undecodable dtype (F6_*), an
/// F64 beyond FP32's range.
void run_quantize(const QuantizeOpts& o, std::ostream& out, std::ostream& err);

}  // namespace snip::app
