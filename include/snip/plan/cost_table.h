// snip/plan/cost_table.h: the planner's input and output files, and the
// Llama layer-shape helper.
//
// Cost table (JSON; one object, other top-level keys are ignored):
//
//   {"layers": [
//     {"name": "model.layers.0.self_attn.q_proj",     // unique, non-empty
//      "flops": 3.4e13,                               // FLOPs per step, > 0
//      "q": {"fp4": 0.012, "fp8": 0.0004, "bf16": 0}, // option -> Q >= 0
//      "stage": 0,                                    // optional, int >= 0
//      "rel_err": {"fp4": 0.11, "fp8": 0.02}},        // optional, fractions
//     ...]}
//
// Per-GEMM variant of an entry (instead of "flops" and "q"):
//
//     {"name": "model.layers.0.self_attn.q_proj", "stage": 0,
//      "gemms": {"fprop": {"flops": F, "q": {...}, "rel_err": {...}},
//                "dgrad": {"flops": F, "q": {...}},
//                "wgrad": {"flops": F, "q": {...}}}}
//
// An option absent from a "q" map is not allowed for that item. A table
// whose entries all have "gemms" supports both granularities: per layer,
// FLOPs and Q are summed over the three GEMMs (Q is additive in the ILP
// objective), the options offered are those all three GEMMs offer, and
// rel_err is the FLOPs-weighted mean. Per-GEMM planning needs "gemms" on
// every entry. Unknown keys inside an entry are errors (typos such as
// "flop" must not silently drop data), so are keys repeated in one object
// (load_cost_table; a parsed json has already dropped them) and a table whose
// FLOPs sum to more than a double holds.
//
// Plan file (JSON, written by plan_to_json / save_plan_json):
//
//   {"granularity": "layer" | "gemm",
//    "method": "ilp" | "<heuristic>",
//    "budget": 0.75 | null,           // FP4 share b; null for a cost budget
//    "cost_budget": 2.5,              // only for a cost budget: C per FLOP
//    "low_option": "fp4",
//    "options": ["fp4", "fp8"],       // what the plan chose among (after --options)
//    "status": "optimal", "proven_optimal": true, "solve_seconds": 0.01,
//    "algorithm": "cbc",              // ILP only: "cbc" | "mckp" | "mckp+cbc"
//    "objective": 1.23,               // Σ Q
//    "lower_bound": 1.23,             // proven bound on Σ Q (null: heuristic)
//    "gap": 0, "relative_gap": 0,     // objective - lower_bound; / objective
//    "fp4_share": 0.7512,             // achieved fraction
//    "cost_per_flop": 1.62,           // null when an option has no cost
//    "option_costs": {"fp4": 1, "fp8": 2, "bf16": 4},
//    "stage_fp4_share": [..],         // only when items have stages
//    "warnings": ["..."],             // only when there are any (PlanResult)
//    "assignments": {"<item name>": "fp4", ...},
//    "items": [{"name": .., "flops": .., "option": .., "q": .., "stage": ..}]}
//
// All parse errors are snip::UserError naming the file, the JSON path
// (e.g. "layers[3].q.fp4"), what was expected and what was found.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "snip/plan/planner.h"

namespace snip::plan {

/// FLOPs and quality losses of one GEMM of a layer.
struct GemmCost {
  double flops = 0;                       // FLOPs per step, > 0
  std::map<std::string, double> q;        // option -> Q >= 0
  std::map<std::string, double> rel_err;  // option -> fraction (optional)
};

/// One "layers" entry of a cost table.
struct LayerCost {
  std::string name;
  int stage = -1;  // -1 when absent
  // Layer form ("flops" + "q"); unused when has_gemms.
  double flops = 0;
  std::map<std::string, double> q;
  std::map<std::string, double> rel_err;
  // Per-GEMM form, indexed by Gemm (fprop, dgrad, wgrad; recipes/gemm.h).
  bool has_gemms = false;
  std::array<GemmCost, 3> gemms;
};

struct CostTable {
  std::string source;              // file name used in error messages
  std::vector<LayerCost> layers;   // in file order
  /// True when every entry has the per-GEMM form.
  bool per_gemm() const;
};

/// Parses a cost table from JSON; `source` names it in errors. Throws
/// UserError ("costs.json: layers[3].q.fp4: expected a finite number >= 0,
/// got \"x\"").
CostTable parse_cost_table(const nlohmann::json& j, const std::string& source);

/// `table` as cost-table JSON (the inverse of parse_cost_table; "stage" only
/// when >= 0, "rel_err" only when non-empty).
nlohmann::json to_json(const CostTable& table);

/// Reads and parses a cost table file. Throws UserError for a missing or
/// unreadable file, invalid JSON (with line/column), or a bad table.
CostTable load_cost_table(const std::string& path);

/// Builds the planning problem at granularity `g` (see the header comment).
/// Throws UserError for per-GEMM planning of a table without "gemms", or a
/// layer whose GEMMs have no option in common.
PlanProblem make_problem(const CostTable& table, Granularity g);

/// Plan result as the plan-file JSON above.
nlohmann::json plan_to_json(const PlanResult& result);

/// Sweep result: {"low_option": .., "points": [{"budget": b, "fp4_share": ..,
/// "objective": .., "lower_bound": .., "gap": .., "relative_gap": ..,
/// "proven_optimal": .., "cost_per_flop": .., "status": ..,
/// "solve_seconds": .., "assignments": {..}}, ...]}.
nlohmann::json sweep_to_json(const std::vector<ParetoPoint>& points);

// save_json_atomic is snip/io/json.h.

/// A linear layer of a Llama-style block.
struct LinearLayerShape {
  std::string name;          // HF name, "model.layers.<i>.self_attn.q_proj"
  int64_t in_features = 0;   // K of fprop
  int64_t out_features = 0;  // K of dgrad
  double gemm_flops = 0;     // FLOPs of ONE GEMM per step: 2*T*in*out
                             // (the layer's three GEMMs cost 3x this)
};

/// The 7 linear layers of each of `n_layers` blocks in HF order (q, k, v, o,
/// gate, up, down), for hidden size C, MLP size I, NH query heads, NKV
/// key/value heads (head_dim = C/NH; k/v project to NKV*head_dim) and T
/// tokens per step. E.g. TinyLlama-1.1B: (22, 2048, 5632, 32, 4, T);
/// Llama-2-70B: (80, 8192, 28672, 64, 8, T). Throws UserError for
/// non-positive sizes, C % NH != 0 or NH % NKV != 0.
std::vector<LinearLayerShape> llama_linear_layers(int n_layers, int64_t hidden,
                                                  int64_t intermediate, int n_heads,
                                                  int n_kv_heads,
                                                  int64_t tokens_per_step);

/// The conservative opt-in pin preset of docs/method.md section 4 for a model
/// whose last block has index `last_block`: "*.down_proj=fp8",
/// "*.v_proj=fp8", "layers.<last>.mlp.*=fp8". Caps the FP4 share at about
/// 0.70 on TinyLlama shapes.
std::vector<Pin> conservative_pins(int last_block, const std::string& option = "fp8");

}  // namespace snip::plan
