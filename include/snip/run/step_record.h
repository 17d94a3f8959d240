// snip/run/step_record.h: one line of RUN/metrics.jsonl, typed. The trainer
// builds a StepRecord per optimizer step (train/progress.cpp) and appends it
// (train/metrics.h); /metrics (monitor/exporter.h), the run report
// (report/report.h) and `snip experiment` (app/experiment.h) read the same
// type back, so a key is spelled once, here.
//
// Every field but `step` is optional: a record holds a key only when the step
// had it (val_loss at evaluation steps, precision at the first step under a
// new decision, pipe_bubble with pipeline stages, ...). A number written as
// null is a non-finite value (NaN or ±inf; JSON has neither): it reads back
// as NaN, present. Keys snip does not type are kept in `extra` and written
// back unchanged.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "snip/config/config.h"

namespace snip {

/// One condition the guard saw at a step and what it did (train/guard.h).
struct GuardEvent {
  int64_t step = 0;
  std::string condition;        ///< "nonfinite", "loss_spike", "quant_error", "throughput_drop", "stall"
  GuardAction action = GuardAction::kWarn;
  std::string reason;           ///< one line with the numbers, e.g. "loss 9.12 > 1.5 x mean 4.10 of 20 steps"
  std::vector<std::string> layers;  ///< the layers it names (quant_error), else empty
  /// What the trainer did, filled in after the action ran (e.g. "rolled back
  /// to checkpoints/step-20, skipped 40 windows"); "" until then.
  std::string outcome;
  /// {"step", "condition", "action", "reason", "layers", "outcome"}.
  nlohmann::json to_json() const;
};

/// One optimizer step of a run, as metrics.jsonl records it. Units: losses in
/// nats/token, times in seconds, throughput in tokens/s (all ranks), shares
/// as fractions in [0, 1], bytes per step.
struct StepRecord {
  int64_t step = 0;                     ///< optimizer step, 1-based
  std::optional<double> loss;           ///< training loss of the step
  std::optional<double> lr;             ///< learning rate of the step
  std::optional<double> grad_norm;      ///< global gradient L2 norm before clipping
  std::optional<double> tokens_per_s;   ///< tokens per step / step_s
  std::optional<double> elapsed_s;      ///< wall time since the run's first step, continued across resumes
  std::optional<double> fp4_share;      ///< share of linear-layer GEMM FLOPs at the low option
  std::optional<double> step_s;         ///< wall time of the step (stats steps included)
  std::optional<double> val_loss;       ///< at evaluation steps
  std::optional<double> val_ppl;        ///< exp(val_loss), at evaluation steps
  std::optional<double> grad_clip;      ///< the clipping threshold in force, when it changed (train.clip_low_precision)
  // Several ranks (dist/grad_reducer.h):
  std::optional<int64_t> grad_comm_bytes;       ///< gradient bytes all-reduced per rank (full precision)
  std::optional<int64_t> grad_comm_sent_bytes;  ///< bytes actually sent (quantized communication)
  std::optional<double> comm_s;                 ///< time spent in gradient communication
  // A precision decision (method/controller.h), on the first step run under it:
  std::optional<std::map<std::string, std::string>> precision;  ///< item (layer or "layer:gemm") -> option
  std::optional<int64_t> plan_step;           ///< the decision boundary s (the record's step is s + 1)
  std::optional<std::string> phase;           ///< "warmup" | "plan" | "final"
  std::optional<std::string> plan_status;     ///< the planner's status ("optimal", "heuristic", ...)
  std::optional<double> plan_solve_seconds;   ///< the planner's solve time
  std::optional<double> stats_seconds;        ///< the stats step's wall time
  std::optional<std::map<std::string, double>> rel_err_fprop;  ///< layer -> fprop relative error at its option
  bool guard_replan = false;                  ///< this plan was asked for by the guard's replan action
  /// The per-step quantization error (docs/operations.md "Per-step
  /// quantization error"), every step that quantized something: layer ->
  /// operand ("fprop.x", "fprop.w", "dgrad.dy", "dgrad.w", "wgrad.dy",
  /// "wgrad.x") -> ||Q(x) - x|| / ||x|| over the step's training passes (all
  /// micro-batches and ranks), a fraction; NaN (null) when not finite.
  /// Operands that were not quantized are absent.
  std::optional<std::map<std::string, std::map<std::string, double>>> quant_err;
  // The guard (train/guard.h):
  std::vector<GuardEvent> guard;     ///< the conditions seen at this step (written when any)
  bool skipped = false;              ///< the update was skipped (a non-finite gradient)
  std::optional<int64_t> rollback_to;  ///< the run rolled back to this step after this one
  // Pipeline stages (dist/pipeline.h):
  std::optional<double> pipe_bubble;       ///< idle share of the schedule, in [0, 1]
  std::optional<int64_t> boundary_bytes;   ///< activation/gradient bytes sent across stage boundaries
  std::optional<double> stage_imbalance;   ///< slowest / mean stage cost, estimated, after a plan
  std::optional<std::vector<int64_t>> rebalanced_to;  ///< the new block bounds after a rebalance
  nlohmann::json extra = nlohmann::json::object();  ///< every other key, kept as read

  /// The record as its metrics.jsonl object (present fields and `extra`).
  nlohmann::json to_json() const;
  /// Sets the fields `fields` holds (an object of record keys, e.g. the
  /// controller's decision metrics) and keeps the rest in `extra`. Throws
  /// UserError "<what>: <key>: expected ..., got ..." for a wrong type.
  void merge(const nlohmann::json& fields, const std::string& what);
};

/// Reads one metrics.jsonl record. Throws UserError, one line, "<what>:
/// <key>: expected ..., got ..." when `j` is not an object, "step" is not an
/// integer >= 0, or a typed key holds a value of another type.
StepRecord step_record_from_json(const nlohmann::json& j, const std::string& what);

}  // namespace snip
