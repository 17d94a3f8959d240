// snip/report/report.h: the run report, runs/NAME/report.html.
//
// One self-contained HTML file (inline CSS and SVG from svg.h; no
// JavaScript, no network access of any kind) summarising a run directory:
//
//   header      run name, policy, model shape (RUN/config.toml), and when
//               RUN/summary.json exists the end-of-run numbers (final and
//               best validation loss, perplexity, tokens/s, steps, wall time:
//               over the whole run, every session of a resumed one); with a
//               reference, how the two runs differ (compare.h: data,
//               tokenizer, model, steps, tokens per step), under a warning
//               when forced past incomparable losses
//   loss        training loss (raw, faint, and EMA-smoothed with span
//               steps/60; below span 2, i.e. under 120 steps, the raw loss
//               alone, with no EMA label) and validation loss over steps; a
//               reference run (optional) overlaid dashed; a marker on every
//               validation point (hollow for the reference), so that a run
//               evaluated once shows
//   precision   FP4 FLOPs share over steps; the precision map (items ×
//               decision steps, colour = option); the quantization-error heat
//               map (layers × decision steps, relative error of the fprop
//               GEMM at the chosen option; empty where no stats were taken)
//   plan        the latest plan as a table (item, option, FLOPs %, Q per
//               option the plan could choose: its "options", else the run's
//               precision.options; rel. error of the row's own GEMM at its
//               option: fprop from the plan, dgrad/wgrad of per-GEMM items
//               from the "measured" part of stats/step-s.json of the same
//               step, "-" when unknown) with budget, achieved share and
//               solver status
//   stats       the latest stats step: per layer Q, relative errors, LD and
//               WD at the low option, and a Q-vs-relative-error scatter plot
//               with Pearson and Spearman correlation
//
// A run with policy none (no quantization; "bf16" in runs of earlier
// versions) has no plans: the precision sections say "no precision
// decisions (policy none (bf16 GEMMs))", with the run's GEMM dtype, instead
// of empty charts.
//
// Inputs (read-only; run layout in README.md "A run on disk"):
//   RUN/metrics.jsonl        read_metrics below
//   RUN/plans/step-N.json    every precision decision (controller.h)
//   RUN/stats/step-N.json    the latest one (core/stats.h to_json), and
//                            the one of the latest plan's step
//   RUN/summary.json         optional (an unfinished run has none)
//   RUN/config.toml          optional; only [model] shape,
//                            [precision] policy and options are used
//   with a reference, both runs' records (compare.h: the newest
//   checkpoint's trainer_state.json, the data folder, config.toml)
//
// Decision steps: a decision "at step s" is made at the boundary before step
// s runs (plans/step-s.json; the metrics record of step s+1 carries it as
// "plan_step": s). The maps' columns are these s, from plans/ and from the
// metrics records together.
//
// Row order of the maps and tables ("model order"): by the decoder layer
// index (the number after "layers."; names without one last), then by the
// projection q, k, v, o, gate, up, down (others after), then by the GEMM
// suffix fprop, dgrad, wgrad (":fprop" etc. for per-GEMM items), then by name.
//
// Plain C++17, no LibTorch: the trainer calls write_report at the end of a
// run, and `snip report` (src/cli/cmd_report.cpp) on any run directory.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "snip/report/compare.h"

namespace snip::report {

/// One precision decision as the metrics log records it (on the first step
/// run under it).
struct Decision {
  int64_t step = 0;       ///< metrics "step" of the record (1-based) = plan_step + 1
  int64_t plan_step = 0;  ///< the decision boundary s ("plan_step"; step − 1 when absent)
  std::string phase;      ///< "warmup" | "plan" | "final" ("" when absent)
  std::map<std::string, std::string> precision;  ///< item (layer, or "layer:gemm") -> option
  std::map<std::string, double> rel_err_fprop;   ///< layer -> fprop relative error at its option (stats decisions only)
};

/// The time series of one run's metrics.jsonl. The per-step vectors all have
/// S entries (one per record with a "step"), in ascending step order; a field
/// a record lacks is NaN.
struct RunCurves {
  std::vector<double> step;          ///< S: optimizer step, 1-based
  std::vector<double> loss;          ///< S: training loss, nats/token
  std::vector<double> lr;            ///< S: learning rate
  std::vector<double> grad_norm;     ///< S: global gradient norm before clipping
  std::vector<double> tokens_per_s;  ///< S: throughput, tokens/s
  std::vector<double> elapsed_s;     ///< S: wall time since the start, s
  std::vector<double> fp4_share;     ///< S: FP4 FLOPs share, fraction in [0,1]
  std::vector<double> val_step;      ///< V: steps with an evaluation
  std::vector<double> val_loss;      ///< V: validation loss, nats/token
  std::vector<double> val_ppl;       ///< V: validation perplexity (NaN when absent)
  std::vector<Decision> decisions;   ///< records with a "precision" key, in step order
  /// The guard's events (train/guard.h: the "guard" lists of the records, in
  /// file order, rolled-back steps included): step, condition, action,
  /// reason, outcome.
  struct GuardEvent {
    int64_t step = 0;
    std::string condition, action, reason, outcome;
  };
  std::vector<GuardEvent> guard;
  int64_t skipped_lines = 0;         ///< lines that are not a record (e.g. a torn last line)
};

/// Reads RUN/metrics.jsonl (one StepRecord per line, run/step_record.h).
/// Blank lines are skipped; lines that are not a record snip writes (a torn
/// last line of a killed run, no integer "step", a key of another type) are
/// skipped whole and counted. When a step appears again (a log
/// that continues after a resume from an earlier checkpoint), the later
/// records replace everything from that step on. Throws UserError "cannot
/// read file PATH: ..." when the file cannot be read.
RunCurves read_metrics(const std::string& metrics_jsonl_path);

/// Exponential moving average with span `span` (α = 2/(span+1)), debiased
/// like Adam (divided by 1 − (1−α)^k after k values), so the first output is
/// the first value. NaN inputs give NaN outputs and do not move the average.
/// span <= 1 returns y unchanged. Same length as y.
std::vector<double> ema_smooth(const std::vector<double>& y, double span);

/// True when layer/item name a comes before b in model order (header comment).
bool model_order_less(const std::string& a, const std::string& b);

/// Sorts names into model order (stable; duplicates kept).
void sort_model_order(std::vector<std::string>& names);

// pearson() and spearman() are snip/core/statistics.h.

/// The differences between the runs `run_dir` and `reference_dir`
/// (read_run_record, compare_runs). Throws UserError "snip report: RUN and
/// the reference OTHER have incomparable losses (...): ..." naming every
/// difference that makes them so (tokenizer, vocabulary, validation data)
/// unless `force`; "snip report: DIR does not exist" for a missing folder.
std::vector<RunDifference> check_reference(const std::string& run_dir, const std::string& reference_dir, bool force);

/// The report of `run_dir` as one HTML document (see the header comment),
/// with `reference_dir` ("" = none) overlaid on the loss charts (of the
/// reference only metrics.jsonl, summary.json, config.toml and the record
/// read_run_record reads are used). Throws UserError "snip report: DIR does
/// not exist" for a missing run or reference directory, check_reference's
/// UserError for a reference with incomparable losses unless `force` (then
/// the header carries a warning naming the differences), and a UserError
/// naming the file for an unparsable plan, stats or summary JSON file. A
/// missing metrics.jsonl is not an error (the charts say "no data").
std::string report_html(const std::string& run_dir, const std::string& reference_dir = "", bool force = false);

/// Writes report_html(run_dir, reference_dir, force) atomically
/// (io::write_file_atomic) to out_path, default RUN/report.html, and returns
/// the path written. Errors as report_html (nothing is written then), plus
/// UserError "cannot write file ..." from the write.
std::string write_report(const std::string& run_dir, const std::string& reference_dir = "",
                         const std::string& out_path = "", bool force = false);

}  // namespace snip::report
