// snip/monitor/exporter.h: the live side of a run, a Prometheus /metrics
// endpoint (monitor.listen; docs/operations.md).
//
// Libraries: prometheus-cpp 1.0 core (Debian's prometheus-cpp-dev): its
// TextSerializer writes the text exposition format 0.0.4 (label escaping of
// \ " and newline, NaN / +Inf / -Inf); cpp-httplib serves it (one accept
// thread, one worker). Not prometheus-cpp's own Exposer: its civetweb
// threads ask for a 100 KiB stack, which glibc refuses (EINVAL) in a process
// whose static TLS (LibTorch, OpenBLAS, glog) needs more (docs/operations.md).
// snip adds only what the numbers mean: one Collectable that turns the
// trainer's per-step record (the metrics.jsonl line, keys in
// train/trainer.h) into metric families at scrape time. LibTorch-free.
//
// What is measured when (nothing is invented between measurements):
//   every step     loss, lr, gradient norm, tokens/s, step time, FP4 share
//   evaluations    validation loss (train.eval_interval)
//   plan steps     per layer the precision of each GEMM operand, the planner's
//                  status and solve time; with a stats step (policies snip,
//                  min-rel-err) also the stats-step time and, per layer, the
//                  fprop GEMM's relative output error ||Y_q - Y|| / ||Y|| under
//                  the option chosen (both operands quantized: label
//                  operand="both")
//   every step     (with a quantized operand) per layer and operand the
//                  relative error ||Q(x) - x|| / ||x|| of the step's training
//                  passes (snip_quant_operand_rel_error, the record's
//                  "quant_err") and its streak above the operand format's
//                  threshold (the guard's; the SnipQuantErrorHigh alert)
//   each scrape    process RSS and peak RSS (/proc/self/status), checkpoint age
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "snip/config/config.h"
#include "snip/recipes/recipe.h"
#include "snip/run/step_record.h"

namespace httplib {
class Server;
}

namespace snip::monitor {

/// The default threshold of a Streak: guard.quant_error_threshold's default
/// (E4M3 and wider formats; GuardConfig::threshold_for gives each format's).
inline constexpr double kQuantErrorThreshold = 0.08;

/// [monitor] options, parsed and checked once (monitor_options).
struct MonitorOptions {
  bool enabled = false;  ///< monitor.listen is not empty
  std::string host;      ///< e.g. "127.0.0.1" (IPv4 dotted quad or "localhost")
  int port = 0;          ///< 0 = any free port (the one bound is logged)
  bool all_ranks = false;  ///< monitor.ranks = "all" (else "rank0")
  /// host:port this process binds: port + local_rank with all_ranks (port 0
  /// stays 0). Empty when this rank exports nothing.
  std::string address(int rank, int local_rank) const;
};

/// monitor.listen and monitor.ranks of a run (RunConfig::monitor) as an
/// address to bind. Throws UserError "monitor.listen: expected HOST:PORT
/// (e.g. 127.0.0.1:9464) or an empty string, got 'x'" for a malformed value
/// or a port outside 0..65535.
MonitorOptions monitor_options(const MonitorConfig& cfg);

/// Consecutive measurements above a threshold, per key (the streak the
/// quantization-error alert counts inside snip, since Prometheus's `for:`
/// counts wall time, not steps). A value strictly above the threshold adds
/// one, a value at or below it resets the key to 0; NaN and +-Inf count as
/// above (a broken measurement is not a good one).
class Streak {
 public:
  explicit Streak(double threshold = kQuantErrorThreshold) : threshold_(threshold) {}
  /// Records one measurement of `key`; returns its streak after it.
  int64_t add(const std::string& key, double value);
  /// The same against `threshold` instead of the one given at construction.
  int64_t add(const std::string& key, double value, double threshold);
  int64_t get(const std::string& key) const;
  /// Drops every key not in `keys` (their streaks restart at 0): an operand
  /// not measured at a step is not quantized (or not under that format) any
  /// more, so its run of consecutive steps is broken.
  void keep_only(const std::set<std::string>& keys);
  double threshold() const { return threshold_; }
  /// Every key's streak (for checkpoints), and setting one back.
  const std::map<std::string, int64_t>& counts() const { return n_; }
  void set(const std::string& key, int64_t n) { n_[key] = n; }

 private:
  double threshold_;
  std::map<std::string, int64_t> n_;
};

/// The streak key of one quantized operand, the same in the guard
/// (train/guard.h) and the exporter: "<layer> <operand> <format>", e.g.
/// "model.layers.0.mlp.up_proj fprop.x e2m1". The format is part of the
/// key, so a count made under one format never carries over to another.
inline std::string operand_streak_key(const std::string& layer, const std::string& operand,
                                      const std::string& format) {
  return layer + " " + operand + " " + format;
}

/// What the trainer knows before the first step.
struct RunInfo {
  int64_t tokens_per_step = 0;  ///< B x T x grad_accum x ranks
  int rank = 0, world_size = 1;
  std::string policy;           ///< precision.policy as written
  /// Element format per operand of each precision option (recipe name ->
  /// {"fprop.x": "e2m1", ...}, registry names); start_exporter fills it from
  /// the run's recipes. Gives the bits of snip_layer_precision_bits and the
  /// thresholds of the streaks.
  std::map<std::string, std::map<std::string, std::string>> option_formats;
  /// The guard's thresholds (GuardConfig::threshold_for: per element
  /// format), which the streaks count against, as the guard does.
  GuardConfig guard;
};

/// Every metric family snip exports: name, type ("gauge"/"counter") and help.
struct MetricInfo {
  const char* name;
  const char* type;
  const char* help;
};
const std::vector<MetricInfo>& metric_table();

class Collector;

/// The exporter: state from records, families at scrape time, and (when
/// listen() succeeded) the HTTP endpoint. Thread-safe: the trainer updates,
/// civetweb's threads scrape.
class Exporter {
 public:
  explicit Exporter(RunInfo info);
  ~Exporter();
  Exporter(const Exporter&) = delete;
  Exporter& operator=(const Exporter&) = delete;

  /// Serves /metrics on `address` (host:port). Returns the port bound, or -1
  /// with `*error` set (e.g. the port is in use); the run goes on without it.
  int listen(const std::string& address, std::string* error);

  /// Takes one step's metrics.jsonl record (snip/run/step_record.h): step,
  /// loss, lr, grad_norm, tokens_per_s, fp4_share, val_loss, precision,
  /// rel_err_fprop, plan_step, stats_seconds, plan_status,
  /// plan_solve_seconds. Absent fields keep their last value; a non-finite
  /// value (NaN) is exported as NaN.
  void update(const StepRecord& record);
  /// The precision in force when the exporter starts (a resumed run records
  /// its precision only at its next change): item -> option, as a record's
  /// "precision".
  void set_precision(const std::map<std::string, std::string>& items);
  /// Replaces the per-step operand streaks with `counts` (operand_streak_key
  /// -> steps): the guard's, restored from a checkpoint at the start of a
  /// resumed run, or emptied by a rollback, so the gauge and the alert count
  /// what the guard counts.
  void set_operand_streaks(const std::map<std::string, int64_t>& counts);
  /// A checkpoint was written now (its step).
  void checkpoint_written(int64_t step);
  /// The guard's state (train/guard.h GuardState: 0 idle, 1 warned, 2
  /// raised, 3 rolled back, 4 stopped).
  void set_guard_state(int state);

  /// The current exposition text (what /metrics returns).
  std::string text() const;
  /// The streak of (layer, gemm, operand) (see Streak).
  int64_t streak(const std::string& layer, const std::string& gemm = "fprop",
                 const std::string& operand = "both") const;

 private:
  std::shared_ptr<Collector> collector_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;  // runs server_'s accept loop
};

/// Starts the exporter of this rank when `opts` says it serves one (else
/// nullptr): fills info.option_formats from `recipes` (the run's), binds
/// opts.address(rank, local_rank) and logs the URL (when `log`). A port that
/// cannot be bound is one warning naming it and what to set, and nullptr:
/// metrics are never a reason to stop a run.
std::unique_ptr<Exporter> start_exporter(const MonitorOptions& opts, RunInfo info, const recipes::RecipeSet& recipes,
                                         int local_rank, bool log);

}  // namespace snip::monitor
