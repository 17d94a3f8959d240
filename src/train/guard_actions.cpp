// The guard's decisions carried out (session.h GuardActions; train/guard.h
// "Actions").
#include "session.h"

#include <fmt/ranges.h>

#include "snip/recipes/recipe.h"
#include "snip/recipes/gemm.h"
#include "snip/train/checkpoint.h"
#include "snip/core/error.h"

namespace snip {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// The guard's rollback target: the checkpoint last_good.json names. A marker
// that cannot be read or names a missing folder is a warning, and the
// newest checkpoint of good.json that exists is taken instead ("" = none).
std::string rollback_target(const std::string& run_dir) {
  const std::string t = last_good_checkpoint(run_dir);
  const fs::path root = fs::path(run_dir) / "checkpoints";
  if (!t.empty() || !fs::exists(root / "last_good.json")) return t;
  std::string fallback;
  for (int64_t s : good_checkpoint_steps(run_dir))
    if (fs::exists(root / ("step-" + std::to_string(s)) / "trainer_state.json"))
      fallback = (root / ("step-" + std::to_string(s))).string();
  spdlog::warn("guard: {} cannot be read or names a checkpoint that is gone; rolling back to {}",
               (root / "last_good.json").string(), fallback.empty() ? "nothing" : fallback);
  return fallback;
}

// What the guard observes of step `r`: its loss, gradient norm, throughput
// and each quantized operand's per-step error with the element format it
// ran (the controller's assignment in force: the step ran under it).
GuardObservation observe(const StepResult& r, int64_t step, double tokens_per_s,
                         const std::vector<QuantLinear>& layers, const PrecisionController& ctl) {
  GuardObservation obs;
  obs.step = step;
  obs.loss = r.loss;
  obs.grad_norm = r.grad_norm;
  obs.tokens_per_s = tokens_per_s;
  for (size_t l = 0; l < r.operand_errors.size() && l < layers.size(); ++l) {
    std::array<std::string, kNumOperands> formats;
    bool any = false;
    for (const formats::ErrorNorms& n : r.operand_errors[l]) any = any || n.calls > 0;
    if (!any) continue;
    formats = ctl.operand_formats(layers[l]->name);
    for (int o = 0; o < kNumOperands; ++o) {
      const formats::ErrorNorms& n = r.operand_errors[l][size_t(o)];
      if (n.calls > 0)
        obs.quant_error.push_back({layers[l]->name, operand_name(Operand(o)), formats[size_t(o)], n.rel_error()});
    }
  }
  return obs;
}

}  // namespace

GuardActions::GuardActions(TrainSession& s, History& h, Checkpointer& ck) : s_(s), h_(h), ck_(ck) {}

// Returns to the last good checkpoint (guard.h "rollback"); the outcome line.
std::pair<int64_t, std::string> GuardActions::rollback(const std::string& target, const json& st) {
  TrainSession& s = s_;
  data::TokenLoader& loader = *s.loader;
  const std::string what = (fs::path(target) / "trainer_state.json").string();
  const TrainerState ts = TrainerState::from_json(st, what);
  const int64_t to = ts.step;
  load_training_state(s, target, st, to, /*resume=*/false);
  // The data since the checkpoint is skipped: the loader keeps its position
  // (loader_base records it for the loader check of a later resume).
  const data::LoaderState ls = loader.state();
  const uint64_t now = ls.epoch * loader.windows_per_epoch() + ls.cursor;
  const data::LoaderState then = checkpoint_position(s, st, ts, what);
  const uint64_t skipped = now - (then.epoch * loader.windows_per_epoch() + then.cursor);
  s.loader_base = {{"step", to}, {"windows", now}};
  const int64_t from = s.step;
  s.step = to;
  s.tokens_trained = ts.tokens.value_or(to * s.tokens_per_step);
  h_.rollback_to(to, ts.val_loss.value_or(std::nan("")));
  std::string dropped;
  if (s.writer)
    for (int64_t k : discard_checkpoints_after(s.opts.run_dir, to))
      dropped += (dropped.empty() ? "" : ", ") + std::to_string(k);
  if (s.comm) {
    dist::check_same_weights(*s.comm, s.param_names, s.params, str_cat("rollback to step ", to));
    s.comm->barrier();
  }
  s.guard->reset_windows();
  if (s.exporter) s.exporter->set_operand_streaks(s.guard->quant_streaks());  // emptied with the guard's
  ++s.guard->rollbacks;
  s.guard->rolled_back_steps += from - to;
  return {to, fmt::format("rolled back from step {} to {} ({}), skipping the {} windows read since{}", from, to,
                          target, skipped, dropped.empty() ? "" : "; deleted the later checkpoints " + dropped)};
}

// "replan": budget down, smoothing up, a plan at the next boundary.
std::string GuardActions::raise() {
  PrecisionController& ctl = *s_.ctl;
  if (!ctl.active()) return std::string("no precision plan to raise (precision.policy = none)");
  const double b0 = ctl.budget(), s0 = ctl.smoothing();
  ctl.raise_precision(s_.rc.guard.budget_step, s_.rc.guard.smoothing);
  ++s_.guard->raises;
  return fmt::format("precision.budget {:.3g} -> {:.3g}, smoothing {:.3g} -> {:.3g}, re-plan before step {}", b0,
                     ctl.budget(), s0, ctl.smoothing(), s_.step + 1);
}

GuardOutcome GuardActions::after_step(const StepResult& r, StepRecord& rec, double dt, int64_t steps_done) {
  TrainSession& s = s_;
  Guard& guard = *s.guard;
  const GuardConfig& gc = s.rc.guard;
  GuardOutcome out;
  if (r.skipped) {
    ++guard.skipped_steps;
    rec.skipped = true;
    // An error-feedback residual never carries a non-finite value into the next step.
    for (torch::Tensor& e : s.gcomm.residuals) e.nan_to_num_(0.0, 0.0, 0.0);
  }
  // Throughput of plain steps only: not the first of an invocation (warm-up),
  // not a stats step (extra passes).
  const bool plain = steps_done > 1 && !r.precision.metrics.contains("stats_seconds");
  std::vector<GuardEvent> events =
      guard.observe(observe(r, s.step, plain ? double(s.tokens_per_step) / dt : 0.0, s.model->linear_layers(), *s.ctl));
  if (!r.nonfinite_stats.empty())
    for (GuardEvent& e : events)
      if (e.condition == "nonfinite") e.reason = r.nonfinite_stats + " (the step was skipped)";
  consecutive_skips_ = r.skipped ? consecutive_skips_ + 1 : 0;
  if (events.empty()) return out;
  const GuardAction asked = Guard::strongest(events);
  GuardAction act = asked;
  std::string outcome;
  if (act == GuardAction::kRollback && guard.rollbacks >= gc.max_rollbacks) {
    act = GuardAction::kStop;
    outcome = fmt::format("guard.max_rollbacks = {} reached: stopping instead of rolling back; ", gc.max_rollbacks);
  }
  std::string target;
  if (act == GuardAction::kRollback) {
    target = rollback_target(s.opts.run_dir);
    // Nothing to return to and nothing to raise: a run that cannot get
    // better stops rather than skipping step after step.
    if (target.empty() && !s.ctl->active()) {
      act = GuardAction::kStop;
      outcome = "no good checkpoint yet to roll back to and no precision plan to raise: ";
    }
  }
  // A skipped update leaves the weights as they were: a run that stays
  // non-finite would skip to its end. Only a real rollback changes that.
  if (consecutive_skips_ >= kMaxConsecutiveSkips && act != GuardAction::kStop &&
      !(act == GuardAction::kRollback && !target.empty())) {
    act = GuardAction::kStop;
    outcome = fmt::format("{} steps in a row were not finite: ", consecutive_skips_);
  }
  if (act == GuardAction::kRollback && target.empty()) {
    outcome = "no good checkpoint yet to roll back to: " + raise();
    guard.state = GuardState::kRaised;
  } else if (act == GuardAction::kRollback) {
    json st;
    std::pair<int64_t, std::string> back;
    try {
      st = verify_checkpoint(target);
      back = rollback(target, st);
    } catch (const UserError& e) {  // the target was damaged since it was written
      fail("guard: rolling back after step ", s.step, " to ", target, ": ", e.what());
    }
    const json validated = st.value("validation", json(nullptr));
    const auto& [to, line] = back;
    rec.rollback_to = to;
    outcome = line + "; " + raise();
    out.rolled_back = true;
    consecutive_skips_ = 0;
    guard.state = GuardState::kRolledBack;
    out.rollback_checkpoint = validated.is_null() ? json::object() : validated;
  } else if (act == GuardAction::kReplan) {
    outcome = raise();
    guard.state = GuardState::kRaised;
  } else if (act == GuardAction::kFp8Layer) {
    std::vector<std::string> layers;
    for (const GuardEvent& e : events) layers.insert(layers.end(), e.layers.begin(), e.layers.end());
    if (layers.empty()) layers = s.ctl->layers_below_fp8();
    const std::vector<std::string> moved = s.ctl->force_option(layers, gc.raise_option);
    install_precision(s.model->linear_layers(), s.ctl->assignment());
    outcome = moved.empty() ? std::string("no layer to move (none below FP8, or no plan yet)")
                            : fmt::format("{} moved to {} until the next plan", fmt::join(moved, ", "), gc.raise_option);
    guard.state = GuardState::kRaised;
  } else if (act == GuardAction::kStop) {
    const std::string last = ck_.last.empty() ? latest_checkpoint(s.opts.run_dir) : ck_.last;
    outcome += last.empty() ? std::string("stopping the run; no checkpoint was written yet")
                            : "stopping the run; its last checkpoint is " + last;
    guard.state = GuardState::kStopped;
  } else {
    outcome = "warned";
    if (guard.state == GuardState::kIdle) guard.state = GuardState::kWarned;
  }
  for (GuardEvent& e : events) {
    e.outcome = e.action == asked ? outcome : std::string("(") + to_string(act) + " ran instead)";
    rec.guard.push_back(e);
    guard.remember(e);
    if (s.writer)
      spdlog::warn("guard at step {}: {}: {} -> {}: {}", e.step, e.condition, e.reason, to_string(e.action), e.outcome);
  }
  if (act == GuardAction::kStop)
    out.stop_reason = events.front().condition + ": " + events.front().reason + " -> " + outcome;
  return out;
}

}  // namespace snip
