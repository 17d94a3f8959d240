// snip/method/assignment.h: a precision assignment as a value: the option of
// every plan item and the LinearPrecision each layer runs it with.
//
// PrecisionController (controller.h) decides assignments; it never touches a
// layer. install_precision() puts one on the layers, at a step boundary: the
// training step after PrecisionController::begin_step decided, the guard's
// fp8-layer action after PrecisionController::force_option, and loading a
// checkpoint after PrecisionController::restore (train/). Nothing else in a
// training run writes QuantLinearImpl::precision; the stats step measures
// under precisions of its own and puts the installed one back (stats.h).
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "snip/model/linear.h"
#include "snip/recipes/gemm.h"

namespace snip {

/// One decision of the controller (docs/method.md sections 4-5).
struct PrecisionAssignment {
  /// Option (precision option name: "fp4", "fp8", "bf16", ...) per plan
  /// item; the items are the layers (precision.granularity = layer) or their
  /// three GEMMs each (gemm). Empty before the first decision.
  std::map<PlanKey, std::string> options;
  /// [L] the layers' Hugging Face names, forward order (the controller's layers).
  std::vector<std::string> layer_names;
  /// [L] what each layer runs: the option's quantizer (one composite when
  /// its three GEMMs run different options; nullptr for bf16) and train.gemm_dtype.
  std::vector<LinearPrecision> precision;

  bool empty() const { return options.empty(); }
  /// The options of `layer`'s fprop, dgrad and wgrad GEMMs: its GEMM items,
  /// or its one layer item for all three. Throws InternalError (SNIP_CHECK)
  /// when no item covers a GEMM of `layer`.
  PerGemm<std::string> layer_options(const std::string& layer) const;
  /// {"<item>": "<option>"}: plans' "assignments", the metrics record's
  /// "precision", a checkpoint's precision.assignments.
  nlohmann::json to_json() const;
  /// Inverse of to_json (the options only). Throws UserError naming `what`
  /// for anything but an object of strings.
  static std::map<PlanKey, std::string> options_from_json(const nlohmann::json& j, const std::string& what);
};

/// Installs `a` on `layers` (the same layers, in the same order, as the
/// controller that decided it: LlamaForCausalLMImpl::linear_layers()).
/// Throws InternalError (SNIP_CHECK) when the names or count differ. A no-op
/// for an empty assignment.
void install_precision(const std::vector<QuantLinear>& layers, const PrecisionAssignment& a);

}  // namespace snip
