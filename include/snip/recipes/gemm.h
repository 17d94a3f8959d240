// snip/recipes/gemm.h: the one vocabulary of a linear layer's GEMMs and their
// operands (docs/method.md section 1; docs/method.md). LibTorch-free: formats,
// recipes, the policy, the stats step and the layer all use it.
//
// A linear layer with weight W [OUT, IN] and input X [N, IN] (N = B·T tokens) runs
// three GEMMs per step, each 2·N·IN·OUT FLOPs:
//
//   Gemm     computes        operands (in Operand order)   reduction dim K
//   fprop    Y  = X  · Wᵀ    fprop.x = X,   fprop.w = W      IN
//   dgrad    dX = dY · W     dgrad.dy = dY, dgrad.w = W      OUT
//   wgrad    dW = dYᵀ · X    wgrad.dy = dY, wgrad.x = X      N
//
// Operand numbering is stable (it keys stochastic rounding, formats/rounding.h,
// and names recipe entries): operand 2g and 2g+1 belong to GEMM g.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string>

namespace snip {

enum class Gemm : int { kFprop = 0, kDgrad = 1, kWgrad = 2 };
inline constexpr int kNumGemms = 3;
inline constexpr std::array<Gemm, kNumGemms> kAllGemms = {Gemm::kFprop, Gemm::kDgrad, Gemm::kWgrad};

enum class Operand : int { kFpropX = 0, kFpropW, kDgradDY, kDgradW, kWgradDY, kWgradX };
inline constexpr int kNumOperands = 6;

/// The GEMM an operand feeds.
constexpr Gemm gemm_of(Operand op) { return Gemm(int(op) / 2); }

/// "fprop", "dgrad", "wgrad" (the names of plan items "<layer>:<gemm>" and of
/// cost-table "gemms" entries).
constexpr const char* gemm_name(Gemm g) {
  return g == Gemm::kFprop ? "fprop" : g == Gemm::kDgrad ? "dgrad" : g == Gemm::kWgrad ? "wgrad" : "?";
}

/// A plan item's key (plan/planner.h PlanItem::name): a whole layer, or
/// one GEMM of it (precision.granularity = gemm). Written as the layer's
/// Hugging Face name, or "<layer>:<gemm>" ("model.layers.0.mlp.up_proj:wgrad");
/// plan files, assignments and the metrics record key their entries by
/// that text, built by str() only. Ordered as its text, so maps keyed by
/// PlanKey iterate in the order of the plan files' keys.
struct PlanKey {
  std::string layer;           ///< the layer's Hugging Face name
  std::optional<Gemm> gemm;    ///< nullopt = every GEMM of the layer
  std::string str() const { return gemm ? layer + ":" + gemm_name(*gemm) : layer; }
  friend bool operator<(const PlanKey& a, const PlanKey& b) { return a.str() < b.str(); }
  friend bool operator==(const PlanKey& a, const PlanKey& b) { return a.layer == b.layer && a.gemm == b.gemm; }
  friend bool operator!=(const PlanKey& a, const PlanKey& b) { return !(a == b); }
};

/// Inverse of PlanKey::str(): "<layer>:fprop|dgrad|wgrad" is a GEMM item,
/// any other text a layer (Hugging Face names hold no ':'). Throws
/// snip::UserError "<where>: empty plan item" for "" or ":fprop".
PlanKey parse_plan_key(const std::string& text, const std::string& where);

inline std::string plan_item_key(const std::string& layer) { return PlanKey{layer, std::nullopt}.str(); }
inline std::string plan_item_key(const std::string& layer, Gemm g) { return PlanKey{layer, g}.str(); }

/// "fprop.x", "fprop.w", "dgrad.dy", "dgrad.w", "wgrad.dy", "wgrad.x".
constexpr const char* operand_name(Operand op) {
  constexpr const char* kNames[kNumOperands] = {"fprop.x", "fprop.w", "dgrad.dy", "dgrad.w", "wgrad.dy", "wgrad.x"};
  return int(op) >= 0 && int(op) < kNumOperands ? kNames[int(op)] : "?";
}

/// Inverse of operand_name. Throws snip::UserError "<where>: unknown GEMM
/// operand 'x' (expected fprop.x, ...)".
Operand parse_operand(const std::string& name, const std::string& where);

/// One value per GEMM, indexed by Gemm.
template <typename T>
struct PerGemm {
  std::array<T, kNumGemms> v{};
  T& operator[](Gemm g) { return v[size_t(g)]; }
  const T& operator[](Gemm g) const { return v[size_t(g)]; }
};

}  // namespace snip
