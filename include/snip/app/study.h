// snip/app/study.h: the correlation study of docs/method.md section 7: does the
// stats step's predicted quality loss Q_l(fp4) rank layers the way training
// does?
//
// From one checkpoint (weights, AdamW moments, data position of a run):
//   1. prediction: one stats step (stats.h run_stats_step(), options {fp4, fp8},
//      low option fp4) on the micro-batch the next step would train on, with
//      the run's precision.alpha / first_order / curvature_probes;
//   2. baseline: K steps of ordinary training (every layer BF16 GEMMs, the
//      run's LR schedule and data order), then the validation loss v_0 and
//      the mean training loss over the K steps t_0;
//   3. per studied layer l: back to the checkpoint, the same K steps with ONLY
//      layer l quantized at `option` (all three GEMMs), then v_l and t_l.
//      measured Δval_l = v_l − v_0, Δtrain_l = t_l − t_0 (nats/token).
// Everything is deterministic (same data, same stochastic-rounding keys), so
// Δ_l is the effect of quantizing l alone, not run-to-run noise. But one
// K-step window is one trajectory: a perturbation of any layer moves the
// loss by a chaotic amount of the same size as small effects. Repeats
// (options.repeats = R > 1) average that out: repeat r (0 .. R−1) runs the
// baseline and every layer arm again with stochastic-rounding seed
// train.seed + r and the K steps' data taken r·K steps further along the
// run's data order (repeat 0 is the single study); Δ_l is the mean of the R
// per-repeat differences (each against its own repeat's baseline), reported
// with its standard error sd/√R.
//
// Correlations: Pearson (linear) and Spearman (Pearson of average ranks, ties
// share their mean rank; pearson / spearman, snip/core/statistics.h) between the measured Δval and each predictor: Q, LD,
// WD, and the grid of open choices of docs/method.md section 3 — first-order term
// abs | signed | drop × α ∈ {0, 0.25, 0.5, 0.75, 1} — recomputed from the
// same measured parts (LD = max(0, F + ½·max(c,0)·||e||²), normalised by its
// sum over the studied layers, likewise WD; Q = α·LDn + (1−α)·WDn).
//
// With R >= 2 each correlation of a predictor (predictor_names()) also gets a 95% percentile-bootstrap interval (2000 resamples of the
// layers, statistics.h bootstrap_interval).
//
// Output (OUT = options.out_dir): OUT/correlation.json (every number, the
// command's options and the correlation grid), OUT/correlation.csv (one row
// per layer), written atomically.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <iosfwd>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace snip {

/// Options of correlation_study().
struct CorrelationOptions {
  std::string run_dir;        ///< a run of `snip train` (its config.toml and checkpoints/)
  int64_t step = -1;          ///< checkpoint step; -1 = the newest checkpoint
  int64_t steps = 20;         ///< K: training steps per arm, >= 1
  std::string option = "fp4"; ///< the option the studied layer runs (a recipe name)
  std::vector<std::string> layers;  ///< glob patterns on layer names; empty = every quantizable layer
  int64_t eval_batches = -1;  ///< validation micro-batches; -1 = the run's train.eval_batches
  std::string out_dir;        ///< where the results go ("" = nowhere)
  bool quiet = false;         ///< no progress lines
  int64_t repeats = 1;        ///< R: repeats of the baseline and every layer arm (header comment), >= 1
};


/// One studied layer.
struct CorrelationLayer {
  std::string name;
  double q = 0, ld = 0, wd = 0;                 ///< predicted (the run's α, first_order), at `option`
  double ld_first_order = 0, ld_curvature = 0;           ///< <g,e_fprop>, ½·max(c,0)·||e||² (nats)
  double wd_own = 0, wd_upstream = 0;                 ///< fractions
  double rel_err_fprop = 0;                     ///< ||e_fprop||/||Y|| at `option`
  double val_loss = 0, train_loss = 0;          ///< after / over the K steps (nats/token)
  double delta_val = 0, delta_train = 0;        ///< minus the baseline, mean over repeats (nats/token)
  /// Standard errors of delta_val / delta_train over the repeats (sd/√R;
  /// NaN for R = 1).
  double delta_val_se = std::numeric_limits<double>::quiet_NaN(),
         delta_train_se = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> delta_val_repeats;        ///< Δval of each repeat (R values; nats/token)
};

/// What correlation_study() found.
struct CorrelationResult {
  int64_t step = 0, steps = 0;
  std::string option;
  int64_t repeats = 1;
  double base_val_loss = 0, base_train_loss = 0;  ///< the all-BF16 arm, mean over repeats (nats/token)
  std::vector<double> base_val_losses;            ///< the all-BF16 arm's val loss in each repeat
  std::vector<CorrelationLayer> layers;
  /// predictor name ("q", "ld", "wd", "rel_err_fprop", "q[abs,a=0.5]", ...) ->
  /// {"pearson", "spearman"} against delta_val, and "<name>/train" against delta_train;
  /// with R >= 2 also "pearson_lo", "pearson_hi",
  /// "spearman_lo", "spearman_hi" (95% percentile bootstrap).
  std::map<std::string, std::map<std::string, double>> correlations;
  double seconds = 0;  ///< wall time of the study
};

/// Runs the study (header comment). Throws UserError for a missing run or
/// checkpoint, a pattern that matches no layer, fewer than 2 layers, steps < 1,
/// an unknown option, or data that does not match the run.
CorrelationResult correlation_study(const CorrelationOptions& options);

/// Everything in `r` as JSON (the correlation.json layout).
nlohmann::json to_json(const CorrelationResult& r);
/// Inverse of to_json (layers and base losses; correlations recomputed by the
/// caller). Throws UserError naming `what` for a malformed file.
CorrelationResult correlation_from_json(const nlohmann::json& j, const std::string& what);
/// The predictors the study correlates, in order: q, ld, wd, wd_own,
/// rel_err_fprop, then per first-order rule (abs, signed, drop) ld[rule] and
/// q[rule,a=α] for α in 0, 0.25, 0.5, 0.75, 1.
std::vector<std::string> predictor_names();
/// Adds 95% percentile-bootstrap intervals (statistics.h
/// bootstrap_interval: 2000 resamples of the layers, seed 1) of Pearson and
/// Spearman against delta_val to r.correlations for every predictor of
/// predictor_names() (keys pearson_lo/hi, spearman_lo/hi; pearson and
/// spearman themselves are (re)computed too).
void add_bootstrap_intervals(CorrelationResult& r);
/// The values of one predictor per studied layer: "q", "ld", "wd", "wd_own",
/// "rel_err_fprop", "ld[abs|signed|drop]" or "q[<first_order>,a=<α>]" (the
/// grid of the header comment, any α in [0, 1]). Throws UserError for an
/// unknown name.
std::vector<double> predictor_values(const CorrelationResult& r, const std::string& name);

/// What `snip correlate` shows of a study: writes
/// OUT_DIR/scatter.svg (or scatter-<predictor>.svg, with [],= as _) with
/// `predictor` on x and the measured Δval (nats/token) on y, and prints on
/// `out` the per-layer table (Q, LD, WD, Δval, its standard error when
/// R >= 2), the baseline's validation loss and every predictor's Pearson and
/// Spearman correlation with Δval. `replotted`: `r` came from
/// correlation_from_json (bootstrap intervals recomputed, only the SVG named
/// as written). Adds `predictor` to r.correlations when missing. Returns the
/// SVG's path. Throws UserError for an unknown predictor or an unwritable
/// out_dir.
std::string present_correlation(CorrelationResult& r, const std::string& predictor, const std::string& out_dir,
                                bool replotted, std::ostream& out);

}  // namespace snip
