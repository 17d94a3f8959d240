// src/train/session.h (private to src/train): the parts `snip train` is made
// of. train() (trainer.cpp) opens a TrainSession and runs the loop; each
// component below owns its state and lives in its own file:
//
//   TrainSession   session.cpp, session_model.cpp, session_resume.cpp: the
//                  run's configuration checked and typed, the ranks, the
//                  data, the model, its optimizer, the precision controller
//                  and the guard, opened once, restored from a checkpoint
//                  on --resume
//   StepRunner     trainer.cpp: the step, chosen once (train_step or
//                  pipeline_step), and the test faults of TrainOptions::faults
//   LoraSetup      lora_setup.cpp: SNIP-LoRA's frozen base and adapters
//   PipelineStages stages.cpp: this rank's pipeline stage, the stage balancer
//                  and the gather of every stage's quantizer state
//   History        history.cpp: the losses the summary and checkpoint
//                  validation read (the trajectory: a rollback cuts it)
//   Checkpointer   checkpointer.cpp: trainer_state.json, writing a
//                  checkpoint, loading one (resume and rollback share it)
//   GuardActions   guard_actions.cpp: a guard decision carried out
//                  (rollback, replan, fp8-layer, stop)
//   Evaluator      evaluate.cpp: validation losses and samples
//   StopOnSignal, StallWatchdog   signals.cpp
//   Progress       progress.cpp: the step's metrics record, the progress
//                  line and the end-of-run summary
//
// Dimensions (docs/glossary.md): B sequences of T tokens per micro-batch,
// `accum` micro-batches per step and data-parallel rank, R ranks, S
// pipeline stages, DP = R / S data-parallel replicas.
#pragma once

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "snip/config/config.h"
#include "snip/data/data_folder.h"
#include "snip/data/loader.h"
#include "snip/data/token_client.h"
#include "snip/dist/data_parallel.h"
#include "snip/dist/grad_reducer.h"
#include "snip/dist/world.h"
#include "snip/dist/zero.h"
#include "snip/io/dir_lock.h"
#include "snip/method/controller.h"
#include "snip/model/hf.h"
#include "snip/model/lora.h"
#include "snip/monitor/exporter.h"
#include "snip/run/trainer_state.h"
#include "snip/recipes/recipe_file.h"
#include "snip/train/faults.h"
#include "guard.h"
#include "metrics.h"
#include "pipeline_step.h"
#include "snip/train/sample.h"
#include "snip/train/step.h"
#include "snip/train/trainer.h"

namespace snip {

/// Monotonic clock in nanoseconds (async-signal-safe: clock_gettime).
int64_t monotonic_ns();

/// RUN/report.html (report/report.h); a failure is a warning, never the run's end.
void write_run_report(const std::string& run_dir);

/// SNIP-LoRA's state in a run (model/lora.h, docs/lora.md).
struct LoraSetup {
  std::shared_ptr<FrozenBase> frozen_base;  ///< nullptr = no adapters
  int64_t held_max = 0;  ///< the most bytes the base's linear weights were held in, this invocation
  nlohmann::json ref;    ///< trainer_state.json "lora": the base's reference
  std::vector<torch::Tensor> trainable;  ///< the adapters (and norms with lora.train_norms)
  bool enabled() const { return frozen_base != nullptr; }
};

class PipelineStages;

/// Everything a run of `snip train` holds once opened: configuration,
/// ranks, data, model, optimizer, controller, guard. Opened by
/// open_session(), which validates everything before anything is written
/// in RUN and restores a checkpoint on --resume.
struct TrainSession {
  TrainSession();
  ~TrainSession();
  TrainSession(const TrainSession&) = delete;
  TrainSession& operator=(const TrainSession&) = delete;

  // ---- the invocation
  Config cfg;            ///< the options, [model] adopted from --init-from's config.json
  TrainOptions opts;
  std::filesystem::path run;  ///< RUN
  dist::World world;
  bool writer = true;   ///< rank 0: the one process that writes in RUN
  bool quiet = false;   ///< no progress lines, samples or info logs (--quiet, or not rank 0)
  bool chatty = false;  ///< !quiet and the log level shows info lines
  std::unique_ptr<io::DirLock> lock;

  // ---- the checkpoint --resume starts from ("" = none), verified once
  std::string resume_ckpt;
  nlohmann::json resume_state;  ///< its trainer_state.json
  TrainerState resume_typed;    ///< the same, typed: read once (TrainerState::from_json)
  // ---- --init-from (or a LoRA run's base)
  std::optional<HfFolder> init;
  std::vector<std::string> init_notes;  ///< what the folder's config.json changed or means
  bool adopted = false;                 ///< some [model] option came from the folder's config.json

  // ---- the configuration, checked and typed
  recipes::RecipeFile recipe_file;
  std::string alias;  ///< the precision alias line ("" = none)
  monitor::MonitorOptions monitor_opts;
  RunConfig rc;
  const DistConfig& dopt() const { return rc.dist; }
  const TrainConfig& tc() const { return rc.train; }

  // ---- ranks
  std::unique_ptr<dist::Communicator> comm;  ///< nullptr in one process
  int R = 1, S = 1, DP = 1;                  ///< ranks, pipeline stages, data-parallel replicas
  dist::GradComm gcomm{dist::GradCompressor(), {}};
  bool keeps_residuals = false;  ///< error-feedback residuals travel in checkpoints
  int zero_stage = 0;            ///< in force (0 in one process or under stages)
  torch::Device device = torch::kCPU;  ///< train.device resolved (model/device.h)
  std::string device_reason;           ///< why, one line (the run's log and summary)

  // ---- data
  std::filesystem::path data_dir;
  std::string train_bin, val_bin;
  data::DataFolderInfo data_info;
  std::string val_sha256;  ///< SHA-256 of val.bin (which validation set the losses are on)
  int64_t B = 0, T = 0, max_steps = 0, accum = 1;
  uint64_t seed = 0;
  std::unique_ptr<data::TokenLoader> loader;

  // ---- model and optimizer
  LlamaConfig mcfg;
  LlamaForCausalLM model{nullptr};
  at::ScalarType gemm = at::kFloat;
  std::unique_ptr<torch::optim::AdamW> optimizer;
  std::optional<dist::ZeroPartition> zpart;  ///< ZeRO: who owns which parameter
  LoraSetup lora;
  std::unique_ptr<PipelineStages> stages;    ///< nullptr without pipeline stages
  /// Whose optimizer shards a checkpoint holds (ZeRO, or the stages); nullptr = one file.
  const dist::ZeroPartition* shard_part = nullptr;
  std::vector<std::string> param_names;
  std::vector<torch::Tensor> params;  ///< every parameter, model order

  std::unique_ptr<PrecisionController> ctl;
  std::unique_ptr<Guard> guard;

  // ---- where the run stands
  int64_t step = 0;            ///< optimizer steps done on the trajectory
  int64_t start_step = 0;      ///< the step this invocation started from
  int64_t tokens_per_step = 0; ///< B x T x accum x DP
  int64_t tokens_trained = 0;  ///< tokens of the trajectory (a rollback returns to its checkpoint's)
  nlohmann::json loader_base;  ///< where the run last changed its number of ranks; null = never
  std::vector<int64_t> resumed_at;  ///< the steps at which sessions resumed this run
  double elapsed0 = 0;         ///< wall time of the earlier invocations, seconds
  double init_val = std::nan("");  ///< --init-from: the loaded model's validation loss
  std::optional<MetricsLog> metrics;  ///< rank 0
  std::unique_ptr<monitor::Exporter> exporter;
  std::chrono::steady_clock::time_point t0;
  /// Seconds since this invocation's loop began.
  double elapsed() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }

  /// Every stage's weights (and quantizer state) on every rank, from the
  /// stage that trains them; nothing without stages.
  void sync_weights();
  /// The precision assignments' digest agreed by every rank (after a plan).
  void check_same_plan();
};

/// Opens the run (session.cpp): validates every option, the data, the
/// checkpoint and the ranks before creating anything in RUN, builds the
/// model, optimizer, controller and guard, restores the checkpoint on
/// --resume, then creates RUN's files (rank 0). Throws UserError as train().
std::unique_ptr<TrainSession> open_session(const Config& cfg, const TrainOptions& opts);

// The opening's parts, in order (session.cpp, session_model.cpp,
// session_resume.cpp, lora_setup.cpp, stages.cpp).
void check_run_dir(TrainSession& s);
void read_init_folder(TrainSession& s);
void resolve_config(TrainSession& s);
void check_resume_config(TrainSession& s);
void connect_ranks(TrainSession& s);
void check_layout(TrainSession& s);
void open_data(TrainSession& s);
void build_model(TrainSession& s);
void setup_lora(TrainSession& s);
void restore_checkpoint(TrainSession& s);
void open_run_files(TrainSession& s);
void announce(TrainSession& s);

/// Loads weights, optimizer, precision state and error-feedback residuals
/// of checkpoint `dir` (its verified trainer_state.json `st`, at step `to`):
/// what --resume and a rollback both restore (checkpointer.cpp). `resume`:
/// a weights error is said as --resume's.
void load_training_state(TrainSession& s, const std::string& dir, const nlohmann::json& st, int64_t to, bool resume);

/// Where this run's loader stood when a checkpoint was written (its
/// trainer_state.json `st`): every rank's loader walks the whole step
/// (step.h), accum x the writer's loader ranks (`ts`, st typed:
/// TrainerState::loader_ranks) micro-batches. Throws UserError naming `what` for a malformed position
/// (checkpointer.cpp).
data::LoaderState checkpoint_position(const TrainSession& s, const nlohmann::json& st, const TrainerState& ts,
                                      const std::string& what);

/// Pipeline stages (dist/pipeline.h): this rank's stage, its parameters and
/// optimizer, the process groups, the stage balancer (dist.stage_cost,
/// dist.rebalance) and the gather of every stage's quantizer state. Every
/// rank keeps every stage's weights (evaluation, samples and checkpoints
/// read them; TrainSession::sync_weights refreshes them from the stages);
/// gradients, AdamW state and activations are the stage's own.
class PipelineStages {
 public:
  /// Builds the stages of `s` (S > 1): the split (a resumed run keeps its
  /// checkpoint's), the subgroups, the stage's optimizer. Collective.
  explicit PipelineStages(TrainSession& s);
  PipelineContext pc;
  std::unique_ptr<dist::Communicator> pipe_comm, dp_comm;
  dist::ZeroPartition stage_part;  ///< owner = world rank of (stage, replica 0)

  /// dist.stage_cost = measured: every option's time on this machine (rank
  /// 0's, broadcast). Collective.
  void measure_costs();
  /// The controller's layer -> stage map (again after a rebalance).
  void set_controller_stages();
  /// The quantizer state of every stage (collective: two all-gathers).
  /// `own`: this rank's own stage's entries from `mine`, the others' from
  /// each stage's first replica; else every stage's first replica's.
  nlohmann::json quantizer_state(const nlohmann::json& mine, bool own);
  /// After a step that decided a plan: the imbalance under it, and the
  /// split to move to at the next checkpoint (dist.rebalance) or a hint.
  void after_plan(StepRecord& rec);
  /// After a checkpoint: the split a rebalance decided, in force.
  void rebalance_if_pending(const std::string& checkpoint);
  /// The replicas of a stage hold the same stage weights (collective).
  void check_replica_weights(const std::string& when);
  /// summary.json "pipeline".
  nlohmann::json summary() const;
  /// The step's record: what a rebalance moved to (once).
  void record(StepRecord& rec, const StepResult& r);

 private:
  void assign_stage_params();
  std::pair<std::vector<double>, double> block_costs(const std::map<PlanKey, std::string>& assign) const;
  std::tuple<double, std::vector<int64_t>, double> balance(const std::map<PlanKey, std::string>& assign) const;
  TrainSession& s_;
  std::map<std::string, double> measured_factors_;
  std::vector<int64_t> pending_bounds_;  ///< the split to move to at the next checkpoint
  std::optional<std::vector<int64_t>> rebalanced_to_;  ///< the split a rebalance moved to (the next step's record)
  double bubble_sum_ = 0;                ///< measured bubble fractions of this invocation's steps
  int64_t bubble_steps_ = 0, boundary_bytes_ = -1;
  double imbalance_now_ = 1.0;
};

/// The losses of the trajectory: the last 10 finite training losses (the
/// summary's train loss) and the evaluations (best_val is their minimum).
/// A rollback cuts both at its step, as a resume rebuilding them from
/// metrics.jsonl does.
class History {
 public:
  /// From the records a resume kept (MetricsLog::earlier).
  void replay(const std::vector<StepRecord>& records);
  void add_loss(int64_t step, double loss);
  void add_val(int64_t step, double val);
  /// Drops what came after `step`; `val` is the checkpoint's validation loss (NaN = none).
  void rollback_to(int64_t step, double val);
  double last_val = std::nan("");
  double best_val = std::numeric_limits<double>::infinity();
  /// Mean of the last losses (0 when none) and how many.
  std::pair<double, int64_t> final_train_loss() const;

 private:
  std::deque<std::pair<int64_t, double>> recent_;
  std::vector<std::pair<int64_t, double>> val_hist_;
};

/// Validation losses and samples at evaluation steps.
class Evaluator {
 public:
  explicit Evaluator(TrainSession& s);
  /// The validation loss of the model as this rank holds it (under
  /// pipeline stages call TrainSession::sync_weights first), nats/token;
  /// collective over the ranks.
  double validation_loss();
  /// A short sample, printed on stderr (train.sample_tokens; nothing when
  /// samples are off or failed before).
  void print_sample();

 private:
  TrainSession& s_;
  std::unique_ptr<data::TokenizerClient> sampler_;
  std::vector<int32_t> prompt_;
  SampleOptions sample_opts_;
};

/// Writes and loads checkpoints (train/checkpoint.h) for the run.
class Checkpointer {
 public:
  Checkpointer(TrainSession& s, History& h, Evaluator& ev);
  /// trainer_state.json of the run now (collective under pipeline stages).
  nlohmann::json state();
  /// Writes checkpoint step-`step` (collective). It is a rollback target
  /// when `scheduled` and it passes validation (checkpoint.keep_good);
  /// `validated`: the validation of the checkpoint this one rewrites.
  void write(bool scheduled, bool eval_step, const nlohmann::json* validated);
  std::string last;           ///< the newest checkpoint this invocation wrote
  double last_s = 0;          ///< when (TrainSession::elapsed)
  nlohmann::json rollback_record;  ///< a rollback's record while its target is written again

 private:
  TrainSession& s_;
  History& h_;
  Evaluator& ev_;
  bool not_good_warned_ = false;
};

/// What the guard's action did to this step.
struct GuardOutcome {
  bool rolled_back = false;
  nlohmann::json rollback_checkpoint;  ///< the rolled-back-to checkpoint's "validation"
  std::string stop_reason;             ///< "" = the run goes on
};

/// Carries out the guard's decisions (train/guard.h "Actions").
class GuardActions {
 public:
  GuardActions(TrainSession& s, History& h, Checkpointer& ck);
  /// Observes step `r` (its record `rec`, `dt` seconds, `steps_done` of this
  /// invocation), carries out the strongest action and records the events
  /// in `rec`.
  GuardOutcome after_step(const StepResult& r, StepRecord& rec, double dt, int64_t steps_done);

 private:
  std::pair<int64_t, std::string> rollback(const std::string& target, const nlohmann::json& st);
  std::string raise();
  TrainSession& s_;
  History& h_;
  Checkpointer& ck_;
  int64_t consecutive_skips_ = 0;
  static constexpr int64_t kMaxConsecutiveSkips = 5;  // then the run stops whatever the action (guard.h)
};

/// SIGINT/SIGTERM during training: the first asks the loop to stop after
/// the step in progress, with a checkpoint; a second one (not an echo of the
/// first within a second) ends the process at once. Installed while alive.
class StopOnSignal {
 public:
  StopOnSignal();
  ~StopOnSignal();
  StopOnSignal(const StopOnSignal&) = delete;
  StopOnSignal& operator=(const StopOnSignal&) = delete;
  /// The first signal received, 0 if none.
  int received() const;

 private:
  struct Saved;
  std::unique_ptr<Saved> old_;
};

/// guard.stall_minutes: a thread that warns once per step that has run
/// longer than that. Inactive when the guard is off or the limit is 0.
class StallWatchdog {
 public:
  StallWatchdog(const TrainSession& s);
  ~StallWatchdog();
  void step_started() { started_ns_ = monotonic_ns(); }
  void step_ended() { started_ns_ = 0; }

 private:
  std::atomic<int64_t> started_ns_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

/// One optimizer step of the run, chosen once: train_step (one process,
/// data parallel with the gradient format of dist.grad_comm, ZeRO) or
/// pipeline_step (stages); with LoRA's frozen base re-packed after each step
/// boundary and the test faults of TrainOptions::faults (trainer.cpp).
class StepRunner {
 public:
  explicit StepRunner(TrainSession& s);
  /// The learning rate of the next step (train/optimizer.h lr_at; a test's lr-spike applied).
  double learning_rate();
  /// Runs step s.step + 1 at learning rate `lr`.
  StepResult run(double lr);
  /// The test fault that perturbs a rank's weights after a step (several ranks).
  void after_step();

 private:
  TrainSession& s_;
  /// How the ranks' gradients meet, chosen once (dist/grad_reducer.h); null
  /// in one process and under pipeline stages (PipelineContext's groups).
  std::unique_ptr<dist::GradReducer> reducer_;
  StepContext ctx_;
};

/// The step's metrics record, the progress line and the summary.
class Progress {
 public:
  explicit Progress(TrainSession& s);
  /// The record of step `r` (metrics.jsonl) before the guard and evaluation.
  StepRecord record(const StepResult& r, double lr, double dt);
  /// Measures every rank's memory after this invocation's first step.
  void measure_memory();
  /// The progress line (every train.log_interval steps, the last and evaluations).
  void print(const StepResult& r, double lr, int64_t steps_done, bool eval_step, double val);
  /// Ends a rewritten terminal line.
  void finish() const;
  /// The summary of the run; writes RUN/summary.json and the report on rank
  /// 0 when the run reached its end.
  TrainSummary summarize(const History& h, const Checkpointer& ck, int64_t steps_done, int stopped_by);

 private:
  TrainSession& s_;
  bool tty_ = false;
  double clip_in_force_ = -1;  // the clipping threshold of the last step (logged when it changes)
  nlohmann::json memory_per_rank_;
  /// The assignment the metrics last recorded (or the one in force when the
  /// session opened): a change without a decision is recorded too.
  std::map<PlanKey, std::string> recorded_;
};

}  // namespace snip
