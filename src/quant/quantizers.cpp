// Recipes (snip_formats) as OperandQuantizer hooks on LibTorch tensors.
#include "snip/quant/quantizers.h"

#include <map>
#include <mutex>

#include "snip/formats/fake_quant.h"
#include "snip/formats/scaling.h"
#include "snip/model/matmul.h"
#include "snip/quant/recipe.h"
#include "snip/util/error.h"

namespace snip {

namespace {

// One recipe applied to every operand of every layer it is attached to.
// Delayed-scaling state (amax history) is kept per (layer, operand).
class RecipeQuantizer final : public OperandQuantizer {
 public:
  explicit RecipeQuantizer(quant::Recipe r) : recipe_(std::move(r)) {}

  torch::Tensor quantize(const torch::Tensor& t, const QuantKey& key) const override {
    TORCH_CHECK(t.dim() == 2, "quantize: expected [rows, K], got ", t.sizes());
    // The kernels read host memory through raw pointers.
    if (!t.device().is_cpu())
      fail("quantizer ", recipe_.name, ": ", t.device().str(), " tensors are not supported yet (the kernels run "
           "on CPU; CUDA kernels are not built)");
    const torch::Tensor in = t.to(torch::kFloat).contiguous();  // [rows, K]
    torch::Tensor out = torch::empty_like(in);
    const formats::QuantSpec& spec = recipe_.operands[size_t(key.operand)];
    formats::RoundingKey rk{key.seed, uint64_t(key.step), uint64_t(key.layer), uint32_t(key.operand)};
    if (spec.rule == formats::ScaleRule::kDelayed) {
      std::lock_guard<std::mutex> g(mu_);
      auto it = delayed_.try_emplace({key.layer, int(key.operand)}, spec).first;
      formats::fake_quantize(in.data_ptr<float>(), out.data_ptr<float>(), in.size(0), in.size(1), rk,
                             it->second);
    } else {
      formats::fake_quantize(in.data_ptr<float>(), out.data_ptr<float>(), in.size(0), in.size(1), spec, rk);
    }
    return out.to(t.scalar_type());
  }

  // quantize() returns a tensor of its own, so the emulated BF16 rounding can
  // happen in it (no second tensor per operand).
  torch::Tensor quantize_for_gemm(const torch::Tensor& t, const QuantKey& key,
                                  at::ScalarType gemm_dtype) const override {
    return gemm_operand_fresh(quantize(t, key), gemm_dtype);
  }

  std::string name() const override { return recipe_.name; }

 private:
  quant::Recipe recipe_;
  mutable std::mutex mu_;
  mutable std::map<std::pair<int64_t, int>, formats::DelayedScaling> delayed_;
};

}  // namespace

std::shared_ptr<const OperandQuantizer> make_recipe_quantizer(const std::string& recipe) {
  if (recipe == "none" || recipe.empty()) return nullptr;
  try {
    return std::make_shared<RecipeQuantizer>(quant::find_recipe(recipe));
  } catch (const UserError& e) {
    fail("precision.recipe: ", e.what());
  }
}

}  // namespace snip
