// A precision assignment and the one function that installs it (assignment.h).
#include "snip/method/assignment.h"

#include "snip/core/error.h"

namespace snip {

PerGemm<std::string> PrecisionAssignment::layer_options(const std::string& layer) const {
  PerGemm<std::string> o;
  const auto whole = options.find(PlanKey{layer, std::nullopt});
  for (Gemm g : kAllGemms) {
    const auto it = whole != options.end() ? whole : options.find(PlanKey{layer, g});
    SNIP_CHECK(it != options.end(), "plan has no option for ", plan_item_key(layer, g));
    o[g] = it->second;
  }
  return o;
}

nlohmann::json PrecisionAssignment::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [item, option] : options) j[item.str()] = option;
  return j;
}

std::map<PlanKey, std::string> PrecisionAssignment::options_from_json(const nlohmann::json& j,
                                                                     const std::string& what) {
  if (!j.is_object()) fail(what, ": expected an object {item: option}, got ", j.type_name());
  std::map<PlanKey, std::string> out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!it.value().is_string())
      fail(what, ": item '", it.key(), "': expected an option name, got ", it.value().type_name());
    out[parse_plan_key(it.key(), what)] = it.value().get<std::string>();
  }
  return out;
}

void install_precision(const std::vector<QuantLinear>& layers, const PrecisionAssignment& a) {
  if (a.empty()) return;
  SNIP_CHECK(layers.size() == a.precision.size() && layers.size() == a.layer_names.size(), "assignment for ",
             a.precision.size(), " layers installed on ", layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    SNIP_CHECK(layers[i]->name == a.layer_names[i], "assignment's layer ", i, " is ", a.layer_names[i],
               ", the model's ", layers[i]->name);
    QuantLinear l = layers[i];  // a handle: the layer itself changes
    l->precision = a.precision[i];
  }
}

}  // namespace snip
