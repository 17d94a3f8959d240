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
      if (QuantStateFreeze::active()) {
        // Same scale as the next training call would use; the record goes to
        // a copy that is dropped.
        auto it = delayed_.find({key.layer, int(key.operand)});
        formats::DelayedScaling copy = it != delayed_.end() ? it->second : formats::DelayedScaling(spec);
        formats::fake_quantize(in.data_ptr<float>(), out.data_ptr<float>(), in.size(0), in.size(1), rk, copy);
      } else {
        auto it = delayed_.try_emplace({key.layer, int(key.operand)}, spec).first;
        formats::fake_quantize(in.data_ptr<float>(), out.data_ptr<float>(), in.size(0), in.size(1), rk,
                               it->second);
      }
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

  // {"recipe": name, "delayed": [{"layer": L, "operand": "fprop.x", "history":
  //   [...], "calls": n, "skipped": n, "since_refresh": n, "scale_amax": a |
  //   null}, ...]} in (layer, operand) order; null before any delayed-scaling
  // call. FP32 values survive JSON exactly (17 significant digits).
  nlohmann::json state() const override {
    std::lock_guard<std::mutex> g(mu_);
    if (delayed_.empty()) return nullptr;
    nlohmann::json list = nlohmann::json::array();
    for (const auto& [k, d] : delayed_) {
      const formats::DelayedScaling::State s = d.state();
      nlohmann::json e = {{"layer", k.first},
                          {"operand", operand_name(Operand(k.second))},
                          {"history", s.history},
                          {"calls", s.calls},
                          {"skipped", s.skipped},
                          {"since_refresh", s.since_refresh}};
      e["scale_amax"] = s.has_scale ? nlohmann::json(s.scale_amax) : nlohmann::json(nullptr);
      list.push_back(std::move(e));
    }
    return {{"recipe", recipe_.name}, {"delayed", std::move(list)}};
  }

  void restore_state(const nlohmann::json& st, const std::string& what, int64_t num_layers) const override {
    std::map<std::pair<int64_t, int>, formats::DelayedScaling> restored;
    if (!st.is_null()) {
      try {
        if (st.at("recipe").get<std::string>() != recipe_.name)
          fail(what, ": state of recipe '", st.at("recipe").get<std::string>(), "', expected '", recipe_.name, "'");
        if (!st.at("delayed").is_array()) fail(what, ".delayed: expected a list, got ", st.at("delayed").type_name());
        auto count = [&](const nlohmann::json& e, const char* key, const std::string& where) {
          const nlohmann::json& v = e.at(key);
          if (!v.is_number_integer()) fail(where, ": ", key, ": expected an integer, got ", v.dump());
          return v.get<int64_t>();
        };
        for (const auto& e : st.at("delayed")) {
          const int64_t layer = count(e, "layer", what + ".delayed");
          if (layer < 0 || layer >= num_layers)
            fail(what, ".delayed: layer ", layer, " is not a linear layer of this model (0 .. ", num_layers - 1, ")");
          const Operand op = parse_operand(e.at("operand").get<std::string>(), what + ": operand");
          const formats::QuantSpec& spec = recipe_.operands[size_t(op)];
          const std::string where = str_cat(what, ": layer ", layer, " ", operand_name(op));
          if (spec.rule != formats::ScaleRule::kDelayed)
            fail(where, ": recipe '", recipe_.name, "' does not use delayed scaling for this operand");
          formats::DelayedScaling::State s;
          s.history = e.at("history").get<std::vector<float>>();
          s.calls = count(e, "calls", where);
          s.skipped = count(e, "skipped", where);
          s.since_refresh = count(e, "since_refresh", where);
          s.has_scale = !e.at("scale_amax").is_null();
          if (s.has_scale) s.scale_amax = e.at("scale_amax").get<float>();
          formats::DelayedScaling d(spec);
          d.restore(s, where);
          if (!restored.emplace(std::make_pair(layer, int(op)), std::move(d)).second)
            fail(where, ": appears twice");
        }
      } catch (const nlohmann::json::exception& e) {
        fail(what, ": malformed quantizer state (", e.what(), ")");
      }
    }
    std::lock_guard<std::mutex> g(mu_);
    delayed_ = std::move(restored);
  }

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
