// snip/plan/plan_file.h: saved plans (RUN/plans/step-N.json, written by
// the precision controller, method/controller.h) as a person reads them, and
// where to find them. LibTorch-free: `snip plan show`, the controller and the
// tests share it.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace snip {

/// The plan table the planner CLI prints (item, option, FLOPs %, Q per option,
/// fprop rel. error at the chosen option when known) and a summary (step,
/// policy, phase, budget, achieved FP4 share, sum Q, solver status), from a
/// saved plans/step-N.json object. Throws UserError for a malformed plan.
std::string format_plan_table(const nlohmann::json& plan);

/// The plan file of RUN in force at `step` (optimizer steps from 0): the
/// newest RUN/plans/step-S.json with S <= step; when step < 0 the newest plan
/// made in the plan phase (the newest decision of any phase if there is
/// none, e.g. uniform runs). Throws UserError when RUN does not exist, has no
/// plans, or none was in force at `step` (the message lists the steps that
/// have one).
std::string find_plan_file(const std::string& run_dir, int64_t step = -1);

/// The measured step time of the plan RUN/plans/step-S.json was in force
/// for: the median "step_s" (seconds, whole training step, GEMMs and all
/// else) of RUN/metrics.jsonl records with S < step <= the next plan's S (or
/// the end). Sets `n` to the number of records used; NaN when none (a run
/// without metrics, or still at that step). Unreadable lines are skipped.
double measured_step_seconds(const std::string& run_dir, int64_t plan_step, int64_t& n);

}  // namespace snip
