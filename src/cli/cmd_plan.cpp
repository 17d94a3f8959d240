// cmd_plan.cpp: the command line of `snip plan` (docs/planner.md): its
// options bound to app::PlanArgs and run by app::run_plan
// (snip/app/plan_command.h), and `snip plan show RUN`.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "commands.h"
#include "snip/app/plan_command.h"
#include "snip/io/json.h"
#include "snip/plan/plan_file.h"
#include "snip/core/error.h"

namespace snip::cli {

using app::PlanArgs;
using app::run_plan;

void add_plan_commands(CLI::App& app) {
  auto a = std::make_shared<PlanArgs>();
  CLI::App* sub = app.add_subcommand(
      "plan", "Choose a precision per layer (or per GEMM) with the ILP planner; see docs/planner.md");
  sub->add_option("--costs", a->costs, "Cost table JSON: per layer FLOPs and quality loss Q per option");
  sub->add_option("--stats", a->stats,
                  "Saved stats step to plan from (runs/NAME/stats/step-N.json; default --options: the options it measured)");
  sub->add_option("--budget", a->budget, "FP4 FLOPs share to reach, a fraction in [0, 1]");
  sub->add_option("--cost-budget", a->cost_budget,
                  "Instead of --budget: mean cost per FLOP allowed (fp4=1, fp8=2, bf16=4)");
  sub->add_option("--time-budget", a->time_budget,
                  "Instead of --budget: the plan's linear-GEMM seconds per step at most this ratio to the same GEMMs "
                  "in bf16 (0.8 = 0.8x; needs --config and --gemm-times)");
  sub->add_option("--gemm-times", a->gemm_times,
                  "With --config: measured GEMM-times table (snip doctor --calibrate's RUN/gemm_times.json): the "
                  "plan predicts its GEMM seconds per step (and --time-budget limits them)")
      ->type_name("FILE");
  sub->add_option("--cost", a->cost_overrides, "Cost per FLOP of an option, OPTION=COST (repeatable)");
  sub->add_flag("--per-gemm", a->per_gemm, "Choose fprop/dgrad/wgrad separately (needs \"gemms\" costs)");
  sub->add_option("--pin", a->pins, "Force an option: GLOB=OPTION, e.g. '*.down_proj=fp8' (repeatable)");
  sub->add_flag("--conservative", a->conservative,
                "Add the conservative preset: every down_proj, v_proj and the last block's MLP at fp8");
  sub->add_option("--stages", a->stages,
                  "Pipeline stages: each stage meets the budget alone; stage ends pinned (see --stage-boundary)");
  sub->add_option("--stage-boundary", a->stage_boundary,
                  "Option for the first and last layer of each stage, or 'none'")
      ->capture_default_str();
  sub->add_option("--options", a->allowed, "Only these options, comma-separated (e.g. fp4,fp8)")
      ->delimiter(',');
  sub->add_option("--low-option", a->low, "The option the share budget counts")->capture_default_str();
  sub->add_option("--heuristic", a->heuristic,
                  "ilp, or a baseline: min-rel-err, layer-type, first-last-fp8, random, uniform-<option>")
      ->capture_default_str();
  sub->add_option("--seed", a->seed, "Seed of the random heuristic")->capture_default_str();
  sub->add_flag("--sweep", a->do_sweep, "Print the Pareto front (sum Q vs FP4 share) over budgets 0..1");
  sub->add_option("--steps", a->steps, "Budget steps of --sweep")->capture_default_str();
  sub->add_flag("--json", a->json, "Print JSON instead of the table");
  sub->add_option("--out", a->out, "Also write the plan (or sweep) JSON to this file, atomically");
  sub->add_option("--time-limit", a->time_limit, "Solver time limit, seconds")->capture_default_str();
  sub->add_option("--method", a->method,
                  "auto (whole-model MILP up to 2000 free items, mckp above), milp, or mckp "
                  "(LP hull bound + rounding + CBC on the core; states its gap)")
      ->capture_default_str();
  sub->add_option("--core-time-limit", a->core_time_limit,
                  "mckp: time limit of CBC on the core, seconds (the plan keeps its stated gap)")
      ->capture_default_str();
  sub->add_flag("-v,--verbose", a->verbose, "Solver summary (-v) or full solver log (-vv) on stderr");
  sub->add_option("--config", a->config,
                  "Plan a model from its shapes (a run config, e.g. configs/tinyllama-1.1b.toml): FLOPs per layer "
                  "type, the budget's feasibility under the pins; with --stats or --init-from, a plan");
  sub->add_option("--set", a->sets, "With --config: override a config option, section.key=value (repeatable)");
  sub->add_option("--tokens-per-step", a->tokens_per_step,
                  "With --config: tokens per training step T (default batch_size x seq_len x grad_accum)");
  sub->add_option("--init-from", a->init_from,
                  "With --config: measure Q by one stats step on this Hugging Face folder (needs --data)");
  sub->add_option("--data", a->data, "With --init-from: prepared data folder whose train.bin is measured on");
  sub->add_option("--stats-batch", a->stats_batch,
                  "With --init-from: sequences of train.seq_len tokens in the measured micro-batch")
      ->capture_default_str();
  sub->add_option("--stats-out", a->stats_out,
                  "With --init-from: also write the measured statistics to this file (the format of "
                  "RUN/stats/step-N.json: plan again from it with --stats FILE)");
  sub->add_flag("--allow-other-tokenizer", a->allow_other_tokenizer,
                "With --init-from: measure on data tokenized by another tokenizer than the folder's");
  refuse_empty_numbers(*sub);
  CLI::Option* budget_opt = sub->get_option("--budget");
  CLI::Option* cost_budget_opt = sub->get_option("--cost-budget");
  CLI::Option* time_budget_opt = sub->get_option("--time-budget");
  CLI::Option* low_opt = sub->get_option("--low-option");
  CLI::Option* tokens_opt = sub->get_option("--tokens-per-step");
  CLI::Option* stats_batch_opt = sub->get_option("--stats-batch");

  // `snip plan show RUN [--step N]`: a plan that `snip train` saved.
  struct ShowArgs {
    std::string run;
    int64_t step = -1;
    bool json = false;
  };
  auto sa = std::make_shared<ShowArgs>();
  CLI::App* show = sub->add_subcommand(
      "show", "Print a plan `snip train` saved (RUN/plans/step-N.json): the table printed at the re-plan");
  show->add_option("run", sa->run, "Run directory (runs/NAME)")->required();
  show->add_option("--step", sa->step, "The plan in force at step N: the newest made at or before N (default: the newest plan of the plan phase, or of any phase when it had none)");
  show->add_flag("--json", sa->json, "Print the plan JSON instead of the table");
  auto step_opt = show->get_option("--step");
  show->callback([sa, step_opt] {
    if (step_opt->count() > 0 && sa->step < 0) fail("--step: expected a step >= 0, got ", sa->step);
    const std::string path = find_plan_file(sa->run, sa->step);
    nlohmann::json j = io::read_json_file(path, "plan");
    // The measured step time under this plan (metrics.jsonl step_s), beside
    // the plan's predicted GEMM time when it has one.
    int64_t n_steps = 0;
    const double measured =
        j.contains("step") && j["step"].is_number_integer()
            ? measured_step_seconds(sa->run, j["step"].get<int64_t>(), n_steps)
            : std::nan("");
    if (sa->json) {
      if (std::isfinite(measured)) j["measured_step_seconds"] = measured, j["measured_steps"] = n_steps;
      std::cout << j.dump(2) << "\n";
    } else {
      std::cout << path << "\n" << format_plan_table(j);
      if (std::isfinite(measured)) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "measured:  %.4g ms/step (median step_s of %lld steps under this plan: the "
                      "whole step, not only its linear GEMMs)\n", 1e3 * measured, (long long)n_steps);
        std::cout << buf;
      }
    }
  });

  sub->callback([a, budget_opt, cost_budget_opt, time_budget_opt, low_opt, tokens_opt, stats_batch_opt, show] {
    if (show->parsed()) return;  // `snip plan show` ran instead
    a->has_budget = budget_opt->count() > 0;
    a->has_cost_budget = cost_budget_opt->count() > 0;
    a->has_time_budget = time_budget_opt->count() > 0;
    a->low_given = low_opt->count() > 0;
    a->tokens_given = tokens_opt->count() > 0;
    a->stats_batch_given = stats_batch_opt->count() > 0;
    run_plan(*a);
  });
}

}  // namespace snip::cli
