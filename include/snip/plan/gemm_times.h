// snip/plan/gemm_times.h: measured seconds per GEMM shape and precision
// option, the input of a time budget (precision.budget_unit = time,
// docs/method.md "Budget in measured time"). LibTorch-free: the table, its
// file, and the prediction of a plan item's seconds; the measurement itself
// is method/gemm_calibrate.h.
//
// Shapes. A GEMM multiplies A [M, K] by B [K, N] into C [M, N], 2·M·K·N
// FLOPs. A linear layer of IN inputs and OUT outputs on T tokens of a
// micro-batch runs three (model/linear.h):
//   fprop  Y  = X · Wᵀ      M = T,   K = IN,  N = OUT
//   dgrad  dX = dY · W      M = T,   K = OUT, N = IN
//   wgrad  dW = dYᵀ · X     M = OUT, K = T,   N = IN
// (each 2·T·IN·OUT FLOPs). Quantizing the two operands with the option's
// recipe is part of the GEMM's time (what a training step pays).
//
// File (RUN/gemm_times.json, written by `snip doctor --calibrate` and by the
// trainer at start; JSON, one object):
//
//   {"format": "snip-gemm-times", "version": 1,
//    "units": "seconds",              // every "seconds" value below
//    "device": "cpu",                 // "cpu" or "cuda:0 (NVIDIA H100 ...)"
//    "machine": "host, 2 threads, ...",  // free text: where it was measured
//    "gemm_dtype": "bf16",            // train.gemm_dtype the GEMMs ran in
//    "entries": [
//      {"gemm": "fprop",              // fprop | dgrad | wgrad
//       "m": 2048, "k": 256, "n": 688,  // the GEMM's shape, integers >= 1
//       "option": "fp4",              // precision option (recipe name or bf16)
//       "seconds": 0.00123,           // median seconds of one call, in (0, 86400] (in-step
//                                     //   calibration: the median over the timed
//                                     //   steps of the mean over the layers of
//                                     //   that shape; 1e-9 for a GEMM no step ran)
//       "repeats": 5},                // timed calls (or steps) the median is of, >= 1
//      ...]}
//
// Other top-level keys are ignored (e.g. "total_seconds", "options");
// unknown keys inside an entry are errors, as is an entry repeated (same
// gemm, shape and option). Every parse error is a one-line snip::UserError
// naming the file and the field ("t.json: entries[3].seconds: expected
// seconds per call in (0, 86400], got -1").
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "snip/plan/planner.h"
#include "snip/recipes/gemm.h"

namespace snip::plan {

/// A GEMM shape: A [m, k] · B [k, n].
struct GemmShape {
  int64_t m = 0, k = 0, n = 0;
  bool operator<(const GemmShape& o) const { return std::tie(m, k, n) < std::tie(o.m, o.k, o.n); }
  bool operator==(const GemmShape& o) const { return m == o.m && k == o.k && n == o.n; }
  /// "{M=2048, K=256, N=688}".
  std::string str() const;
};

/// The shapes of a linear layer's three GEMMs (header comment), indexed by
/// Gemm, for `tokens` rows of input, `in` and `out` features (all >= 1).
std::array<GemmShape, 3> linear_gemm_shapes(int64_t tokens, int64_t in, int64_t out);

/// One measured GEMM.
struct GemmTimeEntry {
  Gemm gemm = Gemm::kFprop;
  GemmShape shape;
  std::string option;
  double seconds = 0;  // median of `repeats` calls, s, in (0, 86400]
  int64_t repeats = 0;
};

struct GemmTimes {
  std::string source;      // file name in error messages
  std::string device;      // "cpu", "cuda:0 (NVIDIA H100 80GB HBM3)"
  std::string machine;     // free text
  std::string gemm_dtype;  // "bf16", "fp32", ...
  std::vector<GemmTimeEntry> entries;

  /// Seconds of `gemm` at `shape` and `option`; nullptr when not measured.
  const GemmTimeEntry* find(Gemm gemm, const GemmShape& shape, const std::string& option) const;
};

/// Parses the file's JSON; `source` names it in errors (UserError).
GemmTimes parse_gemm_times(const nlohmann::json& j, const std::string& source);
/// The file's JSON (inverse of parse_gemm_times).
nlohmann::json to_json(const GemmTimes& t);
/// Reads `path` (UserError: missing, unreadable, invalid JSON, bad table).
GemmTimes load_gemm_times(const std::string& path);
/// Writes `t` to `path` atomically (io::save_json_atomic: nothing partial).
void save_gemm_times(const GemmTimes& t, const std::string& path);

/// A linear layer as the time model sees it.
struct TimedLayer {
  std::string name;  // HF layer name, as PlanItem::layer
  int64_t in = 0, out = 0;
};

/// Fills PlanItem::seconds of every item of `problem` for every option in
/// `options` (typically the options the controller knows, bf16 included):
/// seconds per training step = micro_batches x the table's seconds of the
/// item's GEMM (gemm granularity) or of the layer's three GEMMs (layer
/// granularity) at `tokens` rows per micro-batch. Layers are matched by
/// PlanItem::layer against `layers`. Throws UserError naming the table's
/// file and the missing entry ("t.json: no entry for wgrad {M=688, K=2048,
/// N=256} at option fp4 (measured for another model or batch? re-run snip
/// doctor --calibrate --config ...)"), or std::logic_error for an item whose
/// layer is not in `layers`.
void apply_gemm_times(PlanProblem& problem, const GemmTimes& table, const std::vector<TimedLayer>& layers,
                      int64_t tokens, double micro_batches, const std::vector<std::string>& options);

}  // namespace snip::plan
