// snip/method/controller.h: the method inside `snip train` (docs/method.md sections
// 3-6): which precision option every quantizable linear layer runs, decided
// at step boundaries.
//
// Granularity (precision.granularity, docs/method.md section 2): "layer" (one
// option for the three GEMMs of a layer; plan items are layer names) or
// "gemm" (plan items "<layer>:fprop", ":dgrad", ":wgrad", each 1/3 of the
// layer's FLOPs; the stats step's per-GEMM cost table gives fprop α·LDn,
// dgrad (1−α)·wd_upstream/ΣWD, wgrad (1−α)·wd_own/ΣWD, stats.h). A layer whose
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
// Schedule (PrecisionSchedule, S = train.max_steps):
//   W  = warmup_steps, or round(warmup_fraction·S) when warmup_steps = -1
//   I0 = initial_interval, or initial_interval_fraction·S when -1 (same for I1,
//        final_interval)
//   E  = S − round(final_high_precision_fraction·S)
//   s < W       warmup: every layer runs warmup_precision (pins ignored);
//   plan steps  p_0 = W, p_{k+1} = p_k + max(1, round(I0 + (I1−I0)·p_k/S)),
//               all < E (the interval grows linearly over the run);
//   s >= E      final phase: every layer runs final_precision (pins ignored).
//   With docs/method.md's defaults for a 100k-step run (W = 5k, I0 = 20k, I1 = 100k):
//   plans at 5k, 29k, 72.2k (intervals 24k, 43.2k); all FP8 from 90k.
//
// At a plan step, by policy:
//   snip         run_stats_step() on the step's first micro-batch (loss_fn), smooth
//                with the previous smoothed stats (precision.smoothing), save
//                stats/step-s.json (top level: the smoothed cost table the
//                planner used; "measured": this step's raw stats), then the
//                ILP (plan::solve) at precision.budget with precision.pins,
//                restricted to precision.options.
//   min-rel-err  the same stats step (its rel_err per option), then the
//                heuristic.
//   layer-type, first-last-fp8, random, uniform-<option>: no stats; the
//                heuristic on the layer shapes (FLOPs ∝ in·out).
//   bf16         the controller is inactive: nothing is quantized
//                (precision.recipe = R is an alias of uniform-R, see
//                resolve_precision_alias; with any other policy it is a
//                UserError).
// Every decision (warmup, plan, final) is saved as plans/step-s.json: the
// planner's plan JSON (cost_table.h) plus "step", "policy", "phase"
// ("warmup" | "plan" | "final") and, when stats exist, "q_table"
// {layer: {option: Q}} and "rel_err_fprop" {layer: {option: rel}}.
//
// A decision is a PrecisionAssignment (assignment.h): per layer {quantizer
// of the option, train.gemm_dtype}; one quantizer per option, shared by the
// layers; "bf16" = no quantizer. The controller never writes a layer's
// precision: the caller installs assignment() (install_precision) at the
// step boundary. With several data-parallel ranks, rank 0 decides and every
// rank takes rank 0's assignment (set_comm).
#pragma once

#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "snip/config/config.h"
#include "snip/dist/world.h"
#include "snip/method/assignment.h"
#include "snip/model/linear.h"
#include "snip/method/stats.h"
#include "snip/plan/gemm_times.h"
#include "snip/plan/planner.h"

namespace snip {

/// Where a step sits in the schedule; kNone before the first decision.
/// Written as "warmup", "plan", "final" in plans, metrics and checkpoints.
enum class Phase { kNone, kWarmup, kPlan, kFinal };
/// "warmup", "plan", "final" ("" for kNone).
const char* to_string(Phase p);
/// Inverse of to_string. Throws UserError naming `what`.
Phase parse_phase(const std::string& s, const std::string& what);

/// The re-planning schedule in steps (header comment).
struct PrecisionSchedule {
  int64_t max_steps = 0;       ///< S, steps
  int64_t warmup_end = 0;      ///< W: first plan step (steps before it are warmup)
  int64_t final_start = 0;     ///< E: first step of the final high-precision phase
  double initial_interval = 0; ///< I0, steps
  double final_interval = 0;   ///< I1, steps

  /// From the [precision] options and train.max_steps. UserError on bad values.
  static PrecisionSchedule from_config(const RunConfig& cfg);
  static PrecisionSchedule from_config(const Config& cfg) { return from_config(RunConfig::from(cfg)); }
  /// Re-plan interval after a plan at step s: max(1, round(I0 + (I1−I0)·s/S)).
  int64_t interval_at(int64_t s) const;
  /// Every plan step p_0 < p_1 < ... < E.
  std::vector<int64_t> plan_steps() const;
  /// The phase of the step about to run (never kNone).
  Phase phase_at(int64_t s) const;
};

/// What begin_step() did, for the step's metrics record.
struct PrecisionEvent {
  bool decided = false;   ///< a plan (warmup, re-plan or final) was made at this boundary
  nlohmann::json metrics = nlohmann::json::object();  ///< keys to merge into the metrics record
};

/// One way to quantize every layer: `precision.recipe = R` under policy none
/// is an alias of `precision.policy = "uniform-R"` with no warmup and no final
/// phase (precision.warmup_steps = 0, final_high_precision_fraction = 0,
/// unless set explicitly), i.e. R on every layer at every step, as the recipe
/// always ran; R = bf16 is policy none. Rewrites `cfg` (precision.recipe
/// becomes "none") and returns the one-line notice to print, or "" when there
/// is no alias. Throws UserError for a recipe `recipes` (the run's: the
/// built-ins and precision.recipe_file's) does not hold. Call before
/// constructing a PrecisionController.
std::string resolve_precision_alias(Config& cfg, const recipes::RecipeSet& recipes);

/// Decides and applies each layer's precision at step boundaries.
class PrecisionController {
 public:
  /// Validates every [precision] option against `layers` (policy name,
  /// options, pins, budget feasibility by running the planner on the layer
  /// list), so a bad configuration fails before anything is written.
  /// `layers` in forward order (LlamaForCausalLMImpl::linear_layers()).
  /// Throws UserError (the planner's message for an infeasible budget).
  PrecisionController(const RunConfig& cfg, std::vector<QuantLinear> layers, at::ScalarType gemm_dtype);
  PrecisionController(const Config& cfg, std::vector<QuantLinear> layers, at::ScalarType gemm_dtype)
      : PrecisionController(RunConfig::from(cfg), std::move(layers), gemm_dtype) {}
  /// A controller of layers it does not hold (the Python controller's,
  /// src/python/ops.cpp): the same checks and decisions; its stats steps
  /// come from the caller (begin_step with a StatsMeasure).
  PrecisionController(const RunConfig& cfg, std::vector<LayerShape> layers, at::ScalarType gemm_dtype);

  /// False for policy none: begin_step() does nothing.
  bool active() const { return active_; }
  /// The policy as configured ("snip", "uniform-fp8", ...).
  const std::string& policy() const { return policy_; }
  const PrecisionSchedule& schedule() const { return sched_; }

  /// Where plans/ and stats/ go ("" = nowhere, e.g. tests), and whether the
  /// plan table is printed (stderr) at every decision.
  void set_output(const std::string& run_dir, bool verbose);
  /// True when the run plans with a GEMM-times table at all: budget_unit
  /// time (docs/method.md "Budget in measured time"; the constructor then
  /// leaves the budget's feasibility to set_gemm_times), or a
  /// precision.gemm_times file given (then plans record predicted GEMM
  /// seconds under any budget unit), and the policy is not none (it makes no
  /// plans; snip train warns that the options have no effect). The trainer
  /// and snip.Controller load or calibrate a table when this holds.
  bool uses_gemm_times() const { return active_ && (pc_.budget_unit == "time" || !pc_.gemm_times.empty()); }
  /// The measured GEMM seconds (plan/gemm_times.h) for the run's micro-batch
  /// of `tokens` rows (B·T) and `micro_batches` micro-batches per step per
  /// rank (train.grad_accum): every plan item gets PlanItem::seconds for
  /// every option the controller knows, so plans report their predicted GEMM
  /// time (any budget unit) and a time budget plans in seconds. Re-runs the
  /// constructor's feasibility check. set_output then writes the table to
  /// RUN/gemm_times.json. Throws UserError naming the table's file and the
  /// missing entry, or the planner's message for an infeasible budget.
  void set_gemm_times(plan::GemmTimes table, int64_t tokens, double micro_batches);
  /// The layers as the time model sees them (name, in, out features).
  std::vector<plan::TimedLayer> timed_layers() const;
  /// Every option a plan or phase can choose (precision.options, warmup,
  /// final and uniform options, bf16), name order: what to calibrate.
  std::vector<std::string> known_options() const;
  /// Data-parallel ranks (docs/distributed.md "Precision plans on every
  /// rank"); nullptr (the default) = one process. With `comm`:
  ///  - the stats step first checks that every rank measured every layer
  ///    (StatsOptions::all_gather), then sums its float64 buffer over the
  ///    ranks (StatsOptions::all_reduce_sum), so every rank holds
  ///    bit-identical statistics (and saves them in its smoothed state);
  ///  - at every decision (warmup, plan, final) rank 0 alone runs the planner
  ///    (the ILP under policy snip) and broadcasts the assignment as JSON
  ///    bytes with their CRC-32; every rank checks the CRC of what it
  ///    received before applying it. A planner error on rank 0 (an
  ///    infeasible re-plan) reaches every rank the same way, so every rank
  ///    stops with the same UserError "precision plan at step s: ...".
  /// Every rank must call begin_step at the same steps (the schedule is the
  /// same on every rank). `comm` must outlive the controller.
  void set_comm(dist::Communicator* comm) { comm_ = comm; }
  /// Pipeline stages (dist/pipeline.h; docs/distributed.md "Pipeline
  /// stages"): `stage_of_layer` [layers] the stage of every layer (forward
  /// order), `my_stage` this rank's, `boundary_option` the option pinned on
  /// every stage's first and last layer ("" or "none" = no such pins). From
  /// then on every plan has a budget row per stage (each stage meets
  /// precision.budget alone) and its items carry their stage; the stats step
  /// measures this stage's layers only (set_stats_pass runs its passes) and
  /// the sums of all stages meet in the reduction over set_comm's ranks
  /// (every rank of the world). Re-checks the budget's feasibility per stage
  /// (UserError as the constructor).
  void set_pipeline(std::vector<int> stage_of_layer, int my_stage, const std::string& boundary_option);
  /// The pass runner of the next stats step under pipeline stages
  /// (StatsOptions::pass_fn); the pipeline step sets it before begin_step.
  void set_stats_pass(std::function<void(const std::vector<torch::Tensor>&)> f) { stats_pass_ = std::move(f); }
  /// A frozen base (LoRA, model/lora.h): every stats step measures the loss
  /// divergence alone (StatsOptions::frozen; WD = 0, alpha taken as 1) and
  /// calls `before_stats` first (which puts the FP32 base weights back into
  /// the layers: FrozenBase::materialize). Budgets, pins and the schedule
  /// are unchanged.
  void set_frozen_base(std::function<void()> before_stats) {
    frozen_ = true;
    before_stats_ = std::move(before_stats);
  }
  /// The "quantizers" object of state() alone: per option with some state,
  /// its delayed-scaling histories and error-feedback residuals.
  nlohmann::json quantizer_state() const;
  /// Replaces every quantizer's state (delayed-scaling amax histories,
  /// error-feedback residuals) by `qs` (the "quantizers" object of state(),
  /// an option absent = no state). Pipeline stages: every rank gets the
  /// other stages' state before it evaluates the whole model. Throws
  /// UserError naming `what` for a malformed state.
  void restore_quantizers(const nlohmann::json& qs, const std::string& what);
  /// Stage of every layer (empty without pipeline stages).
  const std::vector<int>& stage_of_layer() const { return stage_of_layer_; }
  /// ZeRO (dist/zero.h): the stats step reads every layer's AdamW m and v,
  /// which only their owner holds; when set, a stats step calls `f`
  /// (collective on every rank) for an AdamW holding every parameter's state
  /// and the current lr, and reads that instead of begin_step's `opt`.
  void set_stats_optimizer(std::function<std::unique_ptr<torch::optim::AdamW>()> f) {
    stats_optimizer_ = std::move(f);
  }

  /// Call at the boundary before step `s` runs, after the LR is set and before
  /// its first forward. `loss_fn` evaluates the step's first micro-batch
  /// (deterministic; used only by a stats step). May run a stats step (under
  /// the precision installed now) and the planner; when the event says
  /// `decided`, assignment() is the new decision, for the caller to install
  /// (install_precision) before the step's first forward. Throws UserError at
  /// an infeasible re-plan or non-finite statistics.
  PrecisionEvent begin_step(int64_t s, const std::function<torch::Tensor()>& loss_fn,
                            torch::optim::AdamW& opt);
  /// Measures a stats step with the given options (run_stats_step, or the
  /// same passes run elsewhere and derive_stats()).
  using StatsMeasure = std::function<StatsStep(const StatsOptions&)>;
  /// begin_step with the stats step delegated to `measure` (called at most
  /// once, only when stats_due(s)).
  PrecisionEvent begin_step(int64_t s, const StatsMeasure& measure);
  /// Whether begin_step(s) would decide, and whether that decision runs a
  /// stats step (a plan-phase decision under policy snip or min-rel-err).
  bool decision_due(int64_t s) const;
  bool stats_due(int64_t s) const;
  /// The options of this controller's stats steps (without the
  /// distributed and pipeline hooks, which begin_step adds).
  StatsOptions stats_options() const;
  /// The plan JSON of the last decision (as saved in plans/step-s.json;
  /// null before the first, and on ranks other than 0 of set_comm).
  const nlohmann::json& last_plan() const { return last_plan_; }
  /// Sets the seconds a caller spent measuring outside `measure` (the
  /// Python controller's passes) before its begin_step: added to the next
  /// stats step's "stats_seconds".
  void set_outside_stats_seconds(double s) { extra_stats_s_ = s; }
  /// precision.granularity = "gemm".
  bool per_gemm() const { return gran_ == plan::Granularity::gemm; }
  /// The layers, in forward order.
  const std::vector<LayerShape>& layer_shapes() const { return shapes_; }

  /// FLOPs share of the low option (precision.low_option, "fp4" by default)
  /// in the current assignment, fraction.
  double fp4_share() const;
  /// The current decision (empty before the first one): its items are the
  /// layers, or their GEMMs with precision.granularity = gemm.
  const PrecisionAssignment& assignment() const { return current_; }
  /// The smoothed statistics (no layers before the first stats step).
  const StatsStep& smoothed() const { return smoothed_; }

  // ---- the guard's levers (train/guard.h)
  /// "replan": lowers the FP4 budget by `budget_step` (FLOPs share, floored
  /// at 0), raises the smoothing to at least `smoothing`, and asks for a plan
  /// at the next begin_step (a stats step and the ILP under policy snip)
  /// when the schedule is in its plan phase; in warmup or the final phase the
  /// new budget applies from the next scheduled plan. Kept in state().
  void raise_precision(double budget_step, double smoothing);
  /// "fp8-layer": every plan item of `layers` runs `option` from the next
  /// step until the next decision (which plans afresh): assignment() changes,
  /// for the caller to install. Returns the layers that changed (those
  /// already at `option` are left out). Throws
  /// UserError for a layer name the model does not have. Needs a decision
  /// made before (no-op returning {} otherwise).
  std::vector<std::string> force_option(const std::vector<std::string>& layers, const std::string& option);
  /// Layers running below FP8: some GEMM operand of their current option has
  /// fewer than 8 element bits (fp4, mxfp4, nvfp4, ...). Empty before the
  /// first decision or when inactive.
  std::vector<std::string> layers_below_fp8() const;
  /// The element format (registry name: "e2m1", "e4m3", ...) of each
  /// operand of `layer` (by Operand) under the assignment in force; "" where
  /// the option is the reference (not quantized), before the first decision
  /// and when inactive. Throws UserError for a layer the model does not have.
  std::array<std::string, kNumOperands> operand_formats(const std::string& layer) const;
  /// The FP4 budget and smoothing in force (precision.budget and
  /// precision.smoothing, or what raise_precision made of them).
  double budget() const { return pc_.budget; }
  double smoothing() const { return pc_.smoothing; }

  /// Everything resume needs (phase, last decision step, assignment, smoothed
  /// stats, the guard's budget with its unit, smoothing and a pending
  /// re-plan), as JSON; restore() makes it the controller's state exactly
  /// (except, with a warning, a state of another policy, which plans afresh,
  /// or a budget in the other precision.budget_unit, where the configured
  /// budget stands), and the caller installs assignment() on the layers.
  nlohmann::json state() const;
  /// Throws UserError naming `what` for a malformed state.
  void restore(const nlohmann::json& st, const std::string& what);

 private:
  dist::Communicator* comm_ = nullptr;
  std::function<std::unique_ptr<torch::optim::AdamW>()> stats_optimizer_;  // set_stats_optimizer
  /// Several ranks: rank 0's `assign` (or its planner error `error`, "" =
  /// none) on every rank, checked by CRC-32 (set_comm). One rank: `assign`.
  std::map<PlanKey, std::string> agree(int64_t s, const std::map<PlanKey, std::string>& assign,
                                       const std::string& error);
  /// The assignment of `options` (one option per plan item): each layer's
  /// quantizer (a composite when its GEMMs differ) and gemm_dtype_.
  PrecisionAssignment make_assignment(std::map<PlanKey, std::string> options);
  /// Plan items: the layers, or their three GEMMs each.
  std::vector<PlanKey> item_keys() const;
  plan::PlanProblem shape_only_problem() const { return shape_only_problem(gran_); }
  plan::PlanProblem shape_only_problem(plan::Granularity g) const;
  plan::PlanOptions plan_options(bool with_pins) const;
  void decide(int64_t s, Phase phase, const StatsMeasure& measure, PrecisionEvent& ev);
  std::shared_ptr<const OperandQuantizer> quantizer(const std::string& option) const;
  /// Quantizers of options outside the planner's view (guard.raise_option
  /// when no other setting names it): kept apart from quant_ so the plans'
  /// tables are unchanged.
  std::map<std::string, std::shared_ptr<const OperandQuantizer>> extra_quant_;
  bool replan_requested_ = false;  // raise_precision: decide at the next plan-phase boundary
  std::vector<int> stage_of_layer_;  // set_pipeline; empty = no stages
  int my_stage_ = 0;
  std::string stage_boundary_;       // "" = no stage-boundary pins
  std::function<void(const std::vector<torch::Tensor>&)> stats_pass_;
  bool frozen_ = false;                      // set_frozen_base
  std::function<void()> before_stats_;       // set_frozen_base
  /// Items get their layer's stage (no-op without stages).
  void add_stages(plan::PlanProblem& p) const;
  /// Items get PlanItem::seconds from times_ (no-op without a table).
  void add_times(plan::PlanProblem& p) const;
  /// The constructor's planner check on placeholder Q (feasibility, pins).
  void check_plannable();
  std::optional<plan::GemmTimes> times_;  // set_gemm_times
  int64_t times_tokens_ = 0;
  double times_micro_batches_ = 1;

  bool active_ = false;
  PrecisionConfig pc_;
  recipes::RecipeSet recipes_;  // the run's (RunConfig::recipes)
  std::string policy_;  // pc_.policy_name()
  std::vector<LayerShape> shapes_;   // every controlled layer, forward order
  std::vector<QuantLinear> layers_;  // the modules the C++ stats step measures (empty: shapes only)
  nlohmann::json last_plan_;
  double extra_stats_s_ = 0;  // set_outside_stats_seconds
  at::ScalarType gemm_dtype_;
  PrecisionSchedule sched_;
  std::set<int64_t> plan_steps_;
  uint64_t stats_seed_ = 0;  // train.seed
  std::vector<plan::Pin> pins_;
  std::map<std::string, std::shared_ptr<const OperandQuantizer>> quant_;
  std::map<std::string, std::shared_ptr<const OperandQuantizer>> per_gemm_quant_;  // "fprop/dgrad/wgrad" options
  plan::Granularity gran_ = plan::Granularity::layer;
  std::string low_ = "fp4";  // precision.low_option: the option the budget and fp4_share count
  std::string run_dir_;
  bool verbose_ = false;
  bool table_shown_ = false;  // the full plan table once per process; later plan-phase re-plans print their changes
  // state (saved in checkpoints)
  Phase phase_ = Phase::kNone;
  int64_t decided_at_ = -1;
  PrecisionAssignment current_;
  StatsStep smoothed_;
};

}  // namespace snip
