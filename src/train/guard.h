// src/train/guard.h: the in-process guard (docs/operations.md "The guard").
//
// After every optimizer step the trainer hands the guard what the step
// measured (Observation); the guard evaluates its conditions and returns one
// Event per condition that fired, each with the action configured for it.
// The trainer carries the actions out (train/trainer.cpp) and writes every
// event to metrics.jsonl ("guard": [...] in the step's record), the log and
// the report. The guard itself only decides: it has no LibTorch state, so its
// conditions are unit-tested on plain numbers (tests/train/test_guard.cpp).
//
// Conditions (the same as deploy/prometheus/snip-rules.yml, counted in steps
// instead of wall time):
//   nonfinite       the step's loss or global gradient norm is NaN or +-Inf.
//                   The step's update was skipped (train/step.h) before the
//                   guard saw it, whatever the action.
//   loss_spike      loss > (1 + spike_ratio) x mean of the last spike_window
//                   losses of steps that neither spiked nor were non-finite,
//                   once spike_window such losses exist.
//   quant_error     a quantized operand's relative error ||Q(x) - x|| / ||x||
//                   (the metrics record's "quant_err", measured at every step
//                   by the quantizers' own pass, summed over micro-batches and
//                   ranks) strictly above its format's threshold
//                   (GuardConfig::threshold_for: E2M1 0.3, E5M2 0.15, E4M3
//                   0.08 by default) for quant_error_steps steps in a row;
//                   one at or below the threshold resets that operand's count
//                   (monitor::Streak), and so does a step that does not
//                   measure it (not quantized then, or under another format:
//                   the key holds the format, monitor::operand_streak_key).
//                   Exactly at the threshold does not count. A streak fires
//                   once, at its quant_error_steps-th step; a streak that
//                   breaks and builds up again fires again.
//   throughput_drop tokens/s < (1 - throughput_drop) x mean of the last
//                   spike_window steps' tokens/s (the window of steps that
//                   were not slow), once spike_window exist, for
//                   kThroughputSteps = 3 steps in a row (one slow step is
//                   noise); the first step of an invocation and stats steps
//                   (extra passes) are not measured.
// After a loss_spike or throughput_drop event its window refills (spike_window
// new steps) before the condition is judged again, so a lasting change of
// level is one event, not one per step.
// Actions:
//   warn       log and record; nothing else (a non-finite step stays skipped).
//   fp8-layer  the offending layers move to guard.raise_option at once and
//              stay there until the next plan decides afresh. The offending
//              layers: those of the quant_error event; for a condition that
//              names no layer, every layer running below FP8.
//   replan     precision.budget lowered by budget_step (FP4 FLOPs share,
//              floored at 0), precision.smoothing raised to at least
//              guard.smoothing, and a new plan (stats step + ILP under policy
//              snip) at the next step boundary. Kept for the rest of the run
//              (checkpointed).
//   rollback   the weights, optimizer and precision state of the last good
//              checkpoint are loaded, the data since then is skipped (the
//              loader keeps its position, as PaLM restarted ~100 steps
//              before a spike and skipped 200-500 batches: Chowdhery et al.
//              2022, section 5.1), and the run continues with the raised
//              precision of replan. More than max_rollbacks rollbacks, or no
//              checkpoint to return to before the first one is written,
//              turn into stop / replan respectively (said in the event).
//   stop       the run ends with a UserError naming the condition; its last
//              checkpoint is intact (never written from a non-finite state).
// When several conditions fire at one step, every event is recorded and the
// strongest action is carried out once (stop > rollback > replan >
// fp8-layer > warn).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "snip/config/config.h"
#include "snip/monitor/exporter.h"
#include "snip/run/step_record.h"

namespace snip {

// GuardAction, to_string(GuardAction) and parse_guard_action are
// config/config.h's (GuardConfig holds the actions).

/// What one step measured, as the trainer recorded it.
struct GuardObservation {
  int64_t step = 0;             ///< the step's record number (1-based: steps completed)
  double loss = 0;              ///< mean training loss, nats per token (may be NaN/Inf)
  double grad_norm = 0;         ///< global gradient L2 norm before clipping (may be NaN/Inf)
  double tokens_per_s = 0;      ///< the step's throughput, tokens per second (all ranks); <= 0 = not measured
  /// One quantized operand's relative error at this step.
  struct QuantError {
    std::string layer;    ///< the layer (what fp8-layer moves), e.g. "model.layers.0.mlp.up_proj"
    std::string operand;  ///< "fprop.x", ... ("" for a measurement of the whole layer)
    std::string format;   ///< its element format ("e2m1", "e4m3", ...; "" = unknown): chooses the threshold
    double rel_err = 0;   ///< ||Q(x) - x|| / ||x||, a fraction (NaN/Inf count as above)
  };
  /// Every operand measured at this step; empty at steps that measured none.
  std::vector<QuantError> quant_error;
};

/// One condition that fired, and the action configured for it.
// GuardEvent (a condition seen and what was done) is snip/run/step_record.h:
// the guard's events are part of the step's metrics record.

/// Gauge values of snip_guard_state (monitor/exporter.h).
enum class GuardState { kIdle = 0, kWarned = 1, kRaised = 2, kRolledBack = 3, kStopped = 4 };

/// The conditions and their windows (header comment).
class Guard {
 public:
  /// `cfg` as parsed by RunConfig::from (validated ranges and words).
  explicit Guard(const GuardConfig& cfg);

  bool enabled() const { return cfg_.enabled; }
  const GuardConfig& config() const { return cfg_; }

  /// Evaluates every condition on one step's measurements and returns the
  /// events that fired (empty = nothing to do), in the order nonfinite,
  /// loss_spike, quant_error, throughput_drop. Updates the windows.
  std::vector<GuardEvent> observe(const GuardObservation& o);

  /// The strongest action among `events` (kWarn when empty).
  static GuardAction strongest(const std::vector<GuardEvent>& events);

  /// A rollback happened: the loss and throughput windows restart (they
  /// described the abandoned steps); the quantization-error streaks restart.
  void reset_windows();

  /// Streak of `key` (consecutive measurements above the threshold):
  /// monitor::operand_streak_key(layer, operand, format), or the layer for a
  /// whole-layer measurement (GuardObservation::QuantError).
  int64_t streak(const std::string& key) const { return streak_.get(key); }
  /// Every streak (key -> steps), for the exporter's gauge.
  const std::map<std::string, int64_t>& quant_streaks() const { return streak_.counts(); }

  // ---- what the guard did, saved in checkpoints ("guard" in trainer_state.json)
  int64_t rollbacks = 0;        ///< rollbacks carried out in this run
  int64_t skipped_steps = 0;    ///< steps whose update was skipped (non-finite)
  int64_t raises = 0;           ///< replan actions (each lowered the budget once)
  int64_t rolled_back_steps = 0;  ///< steps the rollbacks discarded (from - to, summed)
  GuardState state = GuardState::kIdle;
  std::vector<GuardEvent> events;  ///< every event of the run, in order (the last 1000)

  /// {"rollbacks", "skipped_steps", "raises", "rolled_back_steps", "state", "events": [...],
  /// "loss_window": [...], "quant_error_streaks": {key: n}} (keys as streak()).
  nlohmann::json to_json() const;
  /// Inverse of to_json: a resumed run judges the next steps as the
  /// uninterrupted one would (the throughput window, wall time, refills).
  /// Throws UserError naming `what` for a malformed object.
  void restore(const nlohmann::json& j, const std::string& what);
  /// Appends to `events`, keeping the newest 1000.
  void remember(const GuardEvent& e);

 private:
  static constexpr int kThroughputSteps = 3;
  GuardConfig cfg_;
  std::deque<double> losses_, throughput_;
  int slow_ = 0;  // consecutive slow steps
  monitor::Streak streak_;
};

}  // namespace snip
