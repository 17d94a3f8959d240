// Measured cost factors of the precision options (see train/stage_cost.h).
#include "stage_cost.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "snip/model/linear.h"
#include "snip/model/quantizers.h"

namespace snip {

std::map<std::string, double> measure_stage_cost_factors(const recipes::RecipeSet& recipes,
                                                         const std::vector<std::string>& options, int64_t N,
                                                         int64_t IN, int64_t OUT, at::ScalarType gemm_dtype,
                                                         int repeats) {
  torch::manual_seed(0);  // deterministic operands; restored by the caller's seeding
  QuantLinear layer(IN, OUT, 0.02);
  const torch::Tensor x = torch::randn({N, IN}), dy = torch::randn({N, OUT});
  auto time_of = [&](const std::string& option) {
    layer->precision = LinearPrecision{option == "bf16" ? nullptr : make_recipe_quantizer(recipes, option), gemm_dtype};
    double best = std::numeric_limits<double>::infinity();
    for (int k = 0; k <= repeats; ++k) {
      const torch::Tensor xi = x.clone().requires_grad_(true);
      const auto t0 = std::chrono::steady_clock::now();
      layer->forward(xi).backward(dy);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (k > 0) best = std::min(best, s);  // k = 0 warms up
      layer->weight.mutable_grad() = torch::Tensor();
    }
    return best;
  };
  const double base = time_of("bf16");
  std::map<std::string, double> out;
  for (const std::string& o : options) out[o] = o == "bf16" ? 1.0 : std::max(1e-3, time_of(o) / base);
  out["bf16"] = 1.0;
  return out;
}

}  // namespace snip
