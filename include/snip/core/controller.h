// snip/core/controller.h: the method inside `snip train` (METHOD.md sections
// 3-6): which precision option every quantizable linear layer runs, decided
// at step boundaries.
//
// Granularity (precision.granularity, METHOD.md section 2): "layer" (one
// option for the three GEMMs of a layer; plan items are layer names) or
// "gemm" (plan items "<layer>:fprop", ":dgrad", ":wgrad", each 1/3 of the
// layer's FLOPs; the stats step's per-GEMM cost table gives fprop α·LDn,
// dgrad (1−α)·wd_up/ΣWD, wgrad (1−α)·wd_own/ΣWD, stats.h). A layer whose
// three GEMMs got different options runs a composite quantizer that applies
// each GEMM's option to that GEMM's two operands.
//
// Steps. `s` below is the number of optimizer steps completed, i.e. the
// 0-based index of the step about to run (checkpoints/step-s holds the state
// after s steps). A decision "at step s" is made at the boundary before step
// s runs, on the weights after s steps, and step s (metrics record
// "step": s+1) is the first to run under it. plans/step-s.json and
// stats/step-s.json use the same s.
//
// Schedule (PrecisionSchedule, N = train.max_steps):
//   W  = warmup_steps, or round(warmup_fraction·N) when warmup_steps = -1
//   I0 = initial_interval, or initial_interval_fraction·N when -1 (same for I1,
//        final_interval)
//   F  = N − round(final_high_precision_fraction·N)
//   s < W       warmup: every layer runs warmup_precision (pins ignored);
//   plan steps  p_0 = W, p_{k+1} = p_k + max(1, round(I0 + (I1−I0)·p_k/N)),
//               all < F (the interval grows linearly over the run);
//   s >= F      final phase: every layer runs final_precision (pins ignored).
//   With METHOD.md's defaults for a 100k-step run (W = 5k, I0 = 20k, I1 = 100k):
//   plans at 5k, 29k, 72.2k (intervals 24k, 43.2k); all FP8 from 90k.
//
// At a plan step, by policy:
//   snip         measure() on the step's first micro-batch (loss_fn), smooth
//                with the previous smoothed stats (precision.smoothing), save
//                stats/step-s.json (top level: the smoothed cost table the
//                planner used; "measured": this step's raw stats), then the
//                ILP (policy::plan) at precision.budget with precision.pins,
//                restricted to precision.options.
//   min-rel-err  the same stats step (its rel_err per option), then the
//                heuristic.
//   layer-type, first-last-fp8, random, uniform-<option>: no stats; the
//                heuristic on the layer shapes (FLOPs ∝ in·out).
//   bf16         the controller is inactive: nothing is quantized (or
//                precision.recipe on every layer, the pre-controller
//                behaviour; recipe != none with any other policy is a
//                UserError).
// Every decision (warmup, plan, final) is saved as plans/step-s.json: the
// planner's plan JSON (cost_table.h) plus "step", "policy", "phase"
// ("warmup" | "plan" | "final") and, when stats exist, "q_table"
// {layer: {option: Q}} and "rel_err_fprop" {layer: {option: rel}}.
//
// Applying a plan sets each layer's precision to {quantizer of the option,
// train.gemm_dtype}; one quantizer per option, shared by the layers; "bf16" =
// no quantizer. Same inputs give the same plan, so every rank agrees.
#pragma once

// ---- Plan files (LibTorch-free: `snip plan show` includes only this part by
// defining SNIP_CONTROLLER_PLAN_FILES_ONLY, so the planner tests, which
// compile src/cli/cmd_plan.cpp without LibTorch, still build).
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "snip/util/error.h"

namespace snip {

namespace detail_plan {
inline std::string fmtd(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}
}  // namespace detail_plan

/// The plan table the planner CLI prints (item, option, FLOPs %, Q per option,
/// fprop rel. error at the chosen option when known) and a summary (step,
/// policy, phase, budget, achieved FP4 share, sum Q, solver status), from a
/// saved plans/step-N.json object. UserError for a malformed plan.

inline std::string format_plan_table(const nlohmann::json& pj) {
  std::ostringstream os;
  try {
    const std::string low = pj.value("low_option", std::string("fp4"));
    std::string up = low;
    for (char& c : up) c = char(std::toupper(static_cast<unsigned char>(c)));
    const nlohmann::json& items = pj.at("items");
    const bool has_q = pj.contains("q_table"), has_rel = pj.contains("rel_err_fprop");
    std::vector<std::string> cols;
    if (has_q) {
      // Columns: options with a Q that the plan chose among ("options"; the
      // q_table also holds the bf16 reference when bf16 was not allowed).
      std::set<std::string> all, allowed;
      if (pj.contains("options") && pj["options"].is_array())
        for (const auto& o : pj["options"])
          if (o.is_string()) allowed.insert(o.get<std::string>());
      for (const auto& [layer, q] : pj["q_table"].items())
        for (const auto& [opt, v] : q.items())
          if (allowed.empty() || allowed.count(opt)) all.insert(opt);
      cols.assign(all.begin(), all.end());
      std::map<std::string, double> cost = pj.value("option_costs", std::map<std::string, double>{});
      auto c = [&](const std::string& s) { return cost.count(s) ? cost[s] : 1e300; };
      std::stable_sort(cols.begin(), cols.end(), [&](const std::string& a, const std::string& b) {
        if ((a == low) != (b == low)) return a == low;
        return c(a) < c(b);
      });
    }
    size_t w = 4;
    double total = 0;
    for (const nlohmann::json& it : items) {
      w = std::max(w, it.at("name").get<std::string>().size());
      total += it.at("flops").get<double>();
    }
    auto pad = [](const std::string& s, size_t n) { return s.size() >= n ? s : s + std::string(n - s.size(), ' '); };
    auto lpad = [](const std::string& s, size_t n) { return s.size() >= n ? s : std::string(n - s.size(), ' ') + s; };
    os << "precision plan at step " << pj.value("step", int64_t{-1}) << ": policy "
       << pj.value("policy", std::string("?")) << ", phase " << pj.value("phase", std::string("?")) << "\n";
    os << pad("item", w) << "  " << pad("option", 8) << lpad("FLOPs %", 9);
    for (const auto& c : cols) os << lpad("Q(" + c + ")", 13);
    if (has_rel) os << lpad("rel.err fprop", 15);
    os << "\n";
    for (const nlohmann::json& it : items) {
      const std::string name = it.at("name").get<std::string>(), opt = it.at("option").get<std::string>();
      os << pad(name, w) << "  " << pad(opt, 8) << lpad(detail_plan::fmtd("%.2f%%", 100.0 * it.at("flops").get<double>() / total), 9);
      for (const auto& c : cols) {
        const nlohmann::json& q = pj["q_table"].value(name, nlohmann::json::object());
        os << lpad(q.contains(c) ? detail_plan::fmtd("%.4g", q[c].get<double>()) : "-", 13);
      }
      if (has_rel) {
        // Layers, and the fprop GEMM of per-GEMM items ("<layer>:fprop"): the
        // layer's fprop error; dgrad/wgrad items: "-" (not in the plan file).
        const size_t colon = name.find(':');
        const bool fprop = colon == std::string::npos || name.compare(colon + 1, std::string::npos, "fprop") == 0;
        const nlohmann::json& r =
            fprop ? pj["rel_err_fprop"].value(name.substr(0, colon), nlohmann::json::object()) : nlohmann::json::object();
        os << lpad(r.contains(opt) ? detail_plan::fmtd("%.4g", r[opt].get<double>()) : "-", 15);
      }
      os << "\n";
    }
    os << "\n";
    const std::string method = pj.value("method", std::string("?"));
    if (pj.contains("budget") && pj["budget"].is_number() && pj.value("phase", std::string()) == "plan" &&
        method.rfind("uniform-", 0) != 0)
      os << "budget:    " << up << " FLOPs share >= " << detail_plan::fmtd("%.4g", pj["budget"].get<double>()) << "\n";
    os << "achieved:  " << up << " share " << detail_plan::fmtd("%.4f", pj.at("fp4_share").get<double>());
    if (pj.contains("cost_per_flop") && pj["cost_per_flop"].is_number())
      os << ", cost " << detail_plan::fmtd("%.4f", pj["cost_per_flop"].get<double>()) << " per FLOP";
    os << "\n";
    if (has_q) os << "objective: sum Q = " << detail_plan::fmtd("%.6g", pj.at("objective").get<double>()) << "\n";
    if (method == "ilp")
      os << "solver:    cbc " << pj.value("status", std::string("?"))
         << (pj.value("proven_optimal", false) ? " (proven)" : " (NOT proven optimal)") << " in "
         << detail_plan::fmtd("%.3f", pj.value("solve_seconds", 0.0)) << " s\n";
    else
      os << "method:    " << (method.rfind("uniform-", 0) == 0 ? "" : "heuristic ") << method << " in "
         << detail_plan::fmtd("%.3f", pj.value("solve_seconds", 0.0)) << " s\n";
    if (pj.contains("stats_seconds")) os << "stats:     " << detail_plan::fmtd("%.3f", pj["stats_seconds"].get<double>()) << " s\n";
  } catch (const nlohmann::json::exception& e) {
    fail("plan JSON: expected a plan file written by `snip train` (", e.what(), ")");
  }
  return os.str();
}

/// RUN/plans/step-N.json, or when step < 0 the newest plan made in the plan
/// phase (the newest decision of any phase if there is none, e.g. uniform
/// runs). Throws UserError when there is none.
inline std::string find_plan_file(const std::string& run_dir, int64_t step = -1) {
  const std::filesystem::path dir = std::filesystem::path(run_dir) / "plans";
  if (step >= 0) {
    const std::filesystem::path p = dir / ("step-" + std::to_string(step) + ".json");
    if (!std::filesystem::exists(p)) fail("snip plan show: ", p.string(), " does not exist");
    return p.string();
  }
  if (!std::filesystem::is_directory(dir)) fail("snip plan show: ", dir.string(), " does not exist (no plan was made in ", run_dir, ")");
  std::vector<int64_t> steps;
  const std::regex re("step-([0-9]+)\\.json");
  for (auto& e : std::filesystem::directory_iterator(dir)) {
    std::smatch m;
    const std::string n = e.path().filename().string();
    if (std::regex_match(n, m, re)) steps.push_back(std::stoll(m[1]));
  }
  if (steps.empty()) fail("snip plan show: no plans/step-N.json in ", run_dir);
  std::sort(steps.rbegin(), steps.rend());
  auto path = [&](int64_t s) { return (dir / ("step-" + std::to_string(s) + ".json")).string(); };
  // The newest real plan (phase "plan"), not the final phase's all-FP8 decision.
  for (int64_t s : steps) {
    std::ifstream in(path(s));
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.value("phase", std::string()) == "plan") return path(s);
  }
  return path(steps.front());
}

}  // namespace snip

#ifndef SNIP_CONTROLLER_PLAN_FILES_ONLY

#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "snip/core/config.h"
#include "snip/core/linear.h"
#include "snip/core/stats.h"
#include "snip/policy/planner.h"

namespace snip {

/// The re-planning schedule in steps (header comment).
struct PrecisionSchedule {
  int64_t max_steps = 0;       ///< N
  int64_t warmup_end = 0;      ///< W: first plan step (steps before it are warmup)
  int64_t final_start = 0;     ///< F: first step of the final high-precision phase
  double initial_interval = 0; ///< I0, steps
  double final_interval = 0;   ///< I1, steps

  /// From the [precision] options and train.max_steps. UserError on bad values.
  static PrecisionSchedule from_config(const Config& cfg);
  /// Re-plan interval after a plan at step s: max(1, round(I0 + (I1−I0)·s/N)).
  int64_t interval_at(int64_t s) const;
  /// Every plan step p_0 < p_1 < ... < F.
  std::vector<int64_t> plan_steps() const;
  /// "warmup", "plan" or "final" for the step about to run.
  std::string phase_at(int64_t s) const;
};

/// What begin_step() did, for the step's metrics record.
struct PrecisionEvent {
  bool decided = false;   ///< a plan (warmup, re-plan or final) was made at this boundary
  nlohmann::json metrics = nlohmann::json::object();  ///< keys to merge into the metrics record
};

/// Decides and applies each layer's precision at step boundaries.
class PrecisionController {
 public:
  /// Validates every [precision] option against `layers` (policy name,
  /// options, pins, budget feasibility by running the planner on the layer
  /// list), so a bad configuration fails before anything is written.
  /// `layers` in forward order (LlamaForCausalLMImpl::linear_layers()).
  /// Throws UserError (the planner's message for an infeasible budget).
  PrecisionController(const Config& cfg, std::vector<QuantLinear> layers, at::ScalarType gemm_dtype);

  /// False for policy bf16: begin_step() does nothing.
  bool active() const { return active_; }
  const std::string& policy() const { return policy_; }
  const PrecisionSchedule& schedule() const { return sched_; }

  /// Where plans/ and stats/ go ("" = nowhere, e.g. tests), and whether the
  /// plan table is printed (stderr) at every decision.
  void set_output(const std::string& run_dir, bool verbose);

  /// Call at the boundary before step `s` runs, after the LR is set and before
  /// its first forward. `loss_fn` evaluates the step's first micro-batch
  /// (deterministic; used only by a stats step). May run a stats step and the
  /// planner and change the layers' precision. Throws UserError at an
  /// infeasible re-plan or non-finite statistics.
  PrecisionEvent begin_step(int64_t s, const std::function<torch::Tensor()>& loss_fn,
                            torch::optim::AdamW& opt);

  /// FLOPs share of the low option (precision.low_option, "fp4" by default)
  /// in the current assignment, fraction.
  double fp4_share() const;
  /// Plan item -> option of the current assignment (empty before the first
  /// decision). Items are layer names, or "<layer>:fprop|dgrad|wgrad" with
  /// precision.granularity = gemm.
  const std::map<std::string, std::string>& assignments() const { return assign_; }
  /// The smoothed statistics (no layers before the first stats step).
  const StatsStep& smoothed() const { return smoothed_; }

  /// Everything resume needs (phase, last decision step, assignment, smoothed
  /// stats), as JSON; restore() applies it to the layers exactly.
  nlohmann::json state() const;
  /// Throws UserError naming `what` for a malformed state.
  void restore(const nlohmann::json& st, const std::string& what);

 private:
  void apply(const std::map<std::string, std::string>& assign);
  /// Plan item names: layer names, or "<layer>:fprop|dgrad|wgrad" per GEMM.
  std::vector<std::string> item_names() const;
  /// The options of a layer's fprop, dgrad and wgrad GEMMs under `assign`.
  std::array<std::string, 3> layer_options(const std::map<std::string, std::string>& assign,
                                           const std::string& layer) const;
  policy::PlanProblem shape_problem() const;
  policy::PlanOptions plan_options(bool with_pins) const;
  void decide(int64_t s, const std::string& phase, const std::function<torch::Tensor()>& loss_fn,
              torch::optim::AdamW& opt, PrecisionEvent& ev);
  std::shared_ptr<const OperandQuantizer> quantizer(const std::string& option) const;

  bool active_ = false;
  std::string policy_;
  std::vector<QuantLinear> layers_;
  at::ScalarType gemm_dtype_;
  PrecisionSchedule sched_;
  std::set<int64_t> plan_steps_;
  std::vector<std::string> options_;        // precision.options
  std::string warmup_precision_, final_precision_;
  double budget_ = 0.75, smoothing_ = 0.1, alpha_ = 0.5;
  uint64_t seed_ = 0, stats_seed_ = 0;
  std::vector<policy::Pin> pins_;
  std::map<std::string, std::shared_ptr<const OperandQuantizer>> quant_;
  std::map<std::string, std::shared_ptr<const OperandQuantizer>> per_gemm_quant_;  // "fprop/dgrad/wgrad" options
  policy::Granularity gran_ = policy::Granularity::layer;
  std::string first_order_ = "drop";
  std::string low_ = "fp4";  // precision.low_option: the option the budget and fp4_share count
  int64_t probes_ = 1;
  std::string run_dir_;
  bool verbose_ = false;
  // state (saved in checkpoints)
  std::string phase_;                         // "" before the first decision
  int64_t decided_at_ = -1;
  std::map<std::string, std::string> assign_;
  StatsStep smoothed_;
};

/// Inverse of to_json(StatsStep) (layer granularity or per-GEMM: both carry
/// "details", which holds every number). Throws UserError naming `what`.
StatsStep stats_from_json(const nlohmann::json& j, const std::string& what);

}  // namespace snip

#endif  // SNIP_CONTROLLER_PLAN_FILES_ONLY
