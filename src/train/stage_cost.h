// src/train/stage_cost.h: per-option GEMM cost factors measured on this
// machine, for the pipeline stages' balance (dist.stage_cost = measured;
// dist/pipeline.h stage_cost_factors has the configured ones).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "snip/recipes/recipe.h"

namespace snip {

/// For each option (a recipe of `recipes`, or "bf16" = no quantizer), the wall time
/// of one forward and backward of a quantized linear layer x [N, IN] ->
/// [N, OUT] (QuantLinear with that option's quantizer and GEMMs in
/// `gemm_dtype`), the fastest of `repeats` after one warm-up, divided by the
/// same for "bf16" (no quantizer): a dimensionless factor, 1 for "bf16".
/// This build's kernels decide it (on a CPU the quantizers are emulated, so
/// FP4 may cost more than BF16). Deterministic inputs; timing is not.
/// Throws UserError for an unknown option.
std::map<std::string, double> measure_stage_cost_factors(const recipes::RecipeSet& recipes,
                                                         const std::vector<std::string>& options, int64_t N,
                                                         int64_t IN, int64_t OUT, at::ScalarType gemm_dtype,
                                                         int repeats = 3);

}  // namespace snip
