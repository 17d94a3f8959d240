// cmd_formats.cpp: the command lines of `snip formats` and `snip quantize`
// (app::print_format_table, print_codes, print_recipes, run_quantize;
// snip/app/formats_command.h).
#include <iostream>
#include <memory>
#include <string>

#include "commands.h"
#include "snip/app/formats_command.h"
#include "snip/core/error.h"

namespace snip::cli {

using app::print_codes;
using app::print_format_table;
using app::print_recipes;
using app::QuantizeOpts;
using app::run_quantize;

void add_format_commands(CLI::App& app) {
  struct FormatsOpts {
    std::string codes;
    bool json = false;
    bool recipes = false;
    std::string config, recipe_file;
  };
  auto fo = std::make_shared<FormatsOpts>();
  CLI::App* formats_cmd = app.add_subcommand(
      "formats", "List the element formats (bits, range, Inf/NaN), a format's codes, or the recipes");
  formats_cmd->add_option("--codes", fo->codes,
                          "print every code of FORMAT (8 bits or fewer) with its value")
      ->type_name("FORMAT");
  formats_cmd->add_flag("--recipes", fo->recipes,
                        "print the quantization recipes (per GEMM operand)");
  formats_cmd->add_flag("--json", fo->json, "print JSON instead of a table");
  formats_cmd->add_option("--config", fo->config,
                          "with --recipes: also the recipes of this run configuration's precision.recipe_file");
  formats_cmd->add_option("--recipe-file", fo->recipe_file,
                          "with --recipes: also the recipes of this recipe file (.toml or .json; docs/formats.md)");
  formats_cmd->callback([fo] {
    if (!fo->codes.empty() && fo->recipes) fail("snip formats: give --codes or --recipes, not both");
    if ((!fo->config.empty() || !fo->recipe_file.empty()) && !fo->recipes)
      fail("snip formats: --config and --recipe-file go with --recipes");
    if (!fo->codes.empty()) {
      print_codes(std::cout, fo->codes, fo->json);
    } else if (fo->recipes) {
      print_recipes(std::cout, app::listed_recipes(fo->config, fo->recipe_file), fo->json);
    } else {
      print_format_table(std::cout, fo->json);
    }
  });

  auto qo = std::make_shared<QuantizeOpts>();
  CLI::App* quantize_cmd = app.add_subcommand(
      "quantize",
      "Fake-quantize every tensor of a safetensors file along its last dimension; "
      "print per-tensor SQNR and relative error");
  quantize_cmd->footer(
      "Columns (x = input, q = fake-quantized output, sums over finite inputs):\n"
      "  SQNR dB    10 log10(sum x^2 / sum (q - x)^2)\n"
      "  rel err    ||q - x|| / ||x||\n"
      "  underflow  nonzero inputs that came out exactly 0, as a fraction of all elements\n"
      "  saturated  finite inputs whose scaled magnitude exceeded the element format's largest\n"
      "             finite value (clamped to it), as a fraction of all elements\n"
      "--output must be a file in an existing, writable folder; it is checked before any work.\n"
      "A tensor with nonzero inputs of which more than half come out exactly 0 is named on\n"
      "stderr, one line each: \"snip: warning: tensor 'NAME' [mostly] flushed to zero by RECIPE\n"
      "(K of its N nonzero inputs became 0)\" (e.g. values ~1e-40, below what NVFP4's FP32\n"
      "tensor scale can lift into the E2M1 range).\n"
      "Dtypes: every float dtype of the input (F32, F64, F16, BF16, F8_*, F4) is decoded to FP32\n"
      "exactly (F64 rounded to nearest) and quantized; BOOL, integers and C64 are copied unchanged\n"
      "(the tensor's line says so); F6_E2M3/F6_E3M2 are refused (their bit order is not defined).\n"
      "Table per dtype: docs/formats.md.\n"
      "An operand with a random Hadamard transform (nvfp4's wgrad.x and wgrad.dy) is quantized\n"
      "as x·R and written mapped back, Q(x·R)·Rᵀ; its statistics are over x·R (same norm as x).");
  quantize_cmd->add_option("--scheme", qo->scheme, "recipe name (see `snip formats --recipes`)")
      ->required();
  quantize_cmd->add_option("--input", qo->input, "input .safetensors")->required();
  quantize_cmd->add_option("--output", qo->output, "output .safetensors (quantized tensors as F32; copied ones keep their dtype)")->required();
  quantize_cmd->add_option("--operand", qo->operand,
                           "whose spec to use: fprop.x, fprop.w, dgrad.dy, dgrad.w, wgrad.dy, wgrad.x")
      ->capture_default_str();
  quantize_cmd->add_option("--seed", qo->seed, "seed of stochastic rounding")->capture_default_str();
  quantize_cmd->add_flag("--json", qo->json, "one JSON object per tensor instead of a table");
  quantize_cmd->callback([qo] { run_quantize(*qo, std::cout, std::cerr); });
}

}  // namespace snip::cli
