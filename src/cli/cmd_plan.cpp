// cmd_plan.cpp: `snip plan`, the offline precision planner (METHOD.md
// section 4; user doc: docs/planner.md).
//
//   snip plan --costs FILE --budget B [--per-gemm] [--pin GLOB=OPTION ...]
//             [--stages N] [--cost-budget C] [--json] [--out FILE]
//             [--method auto|milp|mckp] [--time-limit S] [--core-time-limit S]
//   snip plan --costs FILE --sweep [--steps N]
//   snip plan --costs FILE --budget B --heuristic min-rel-err
//   snip plan show runs/NAME [--step N] [--json]   (a plan `snip train` saved)
//
// Prints a table (item, option, FLOPs share, Q per option) and a summary
// (achieved FP4 share, Σ Q, its lower bound and gap, cost, solver status,
// solve time), or JSON.
// Every input problem ends as a snip::UserError (one line, exit status 2).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "commands.h"
#include "snip/policy/plan_file.h"
#include "snip/policy/cost_table.h"
#include "snip/policy/planner.h"
#include "snip/io/json.h"
#include "snip/util/error.h"

namespace snip::cli {

namespace {

using namespace snip::policy;

struct PlanArgs {
  std::string costs;
  std::string stats;
  double budget = 0;
  double cost_budget = 0;
  bool has_budget = false;       // --budget given
  bool has_cost_budget = false;  // --cost-budget given
  std::vector<std::string> cost_overrides;  // OPTION=COST
  bool per_gemm = false;
  std::vector<std::string> pins;
  bool conservative = false;
  int stages = 0;
  std::string stage_boundary = "fp8";
  std::vector<std::string> allowed;
  std::string low = "fp4";
  std::string heuristic = "ilp";
  uint64_t seed = 0;
  bool do_sweep = false;
  int steps = 20;
  bool json = false;
  std::string out;
  double time_limit = 60;
  double core_time_limit = 3;
  std::string method = "auto";
  int verbose = 0;
};

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// Column order: the low option, then known costs ascending, then names.
std::vector<std::string> option_columns(const PlanProblem& p, const PlanOptions& o) {
  std::set<std::string> all;
  for (const PlanItem& it : p.items)
    for (const auto& kv : it.q) all.insert(kv.first);
  std::vector<std::string> cols(all.begin(), all.end());
  auto cost = [&](const std::string& s) {
    auto it = o.budget.cost_per_flop.find(s);
    return it == o.budget.cost_per_flop.end() ? 1e300 : it->second;
  };
  std::stable_sort(cols.begin(), cols.end(), [&](const std::string& a, const std::string& b) {
    if ((a == o.low_option) != (b == o.low_option)) return a == o.low_option;
    return cost(a) < cost(b);
  });
  return cols;
}

void print_plan(std::ostream& os, const PlanProblem& p, const PlanOptions& o,
                const PlanResult& r) {
  const std::vector<std::string> cols = option_columns(p, o);
  size_t w = 4;
  for (const PlanChoice& c : r.items) w = std::max(w, c.name.size());
  double total = 0;
  for (const PlanChoice& c : r.items) total += c.flops;
  const bool stages = !r.stage_fp4_share.empty();
  auto pad = [](const std::string& s, size_t n) {
    return s.size() >= n ? s : s + std::string(n - s.size(), ' ');
  };
  auto lpad = [](const std::string& s, size_t n) {
    return s.size() >= n ? s : std::string(n - s.size(), ' ') + s;
  };
  os << pad("item", w) << "  " << pad("option", 8) << lpad("FLOPs %", 9);
  if (stages) os << lpad("stage", 7);
  for (const std::string& c : cols) os << lpad("Q(" + c + ")", 13);
  os << "\n";
  for (size_t i = 0; i < r.items.size(); ++i) {
    const PlanChoice& c = r.items[i];
    os << pad(c.name, w) << "  " << pad(c.option, 8)
       << lpad(fmt("%.2f%%", 100.0 * c.flops / total), 9);
    if (stages) os << lpad(std::to_string(c.stage), 7);
    for (const std::string& col : cols) {
      auto q = p.items[i].q.find(col);
      os << lpad(q == p.items[i].q.end() ? "-" : fmt("%.4g", q->second), 13);
    }
    os << "\n";
  }
  const std::string low = r.low_option;
  std::string up = low;
  for (char& ch : up) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  os << "\n";
  if (r.budget.kind == Budget::Kind::fp4_share)
    os << "budget:    " << up << " FLOPs share >= " << fmt("%.4g", r.budget.value)
       << (o.per_stage_budget ? " in every stage" : "") << "\n";
  else
    os << "budget:    cost <= " << fmt("%.4g", r.budget.value) << " per FLOP"
       << (o.per_stage_budget ? " in every stage" : "") << "\n";
  os << "achieved:  " << up << " share " << fmt("%.4f", r.fp4_share);
  if (std::isfinite(r.cost_per_flop)) os << ", cost " << fmt("%.4f", r.cost_per_flop) << " per FLOP";
  os << "\n";
  if (stages) {
    os << "stages:   ";
    for (size_t s = 0; s < r.stage_fp4_share.size(); ++s)
      os << " " << s << ":" << fmt("%.4f", r.stage_fp4_share[s]);
    os << " (" << up << " share per stage)\n";
  }
  os << "objective: sum Q = " << fmt("%.6g", r.objective) << "\n";
  if (r.method == "ilp") {
    os << "bound:     sum Q >= " << fmt("%.6g", r.lower_bound) << " (gap " << fmt("%.3g", r.gap)
       << ", " << fmt("%.3g", 100.0 * r.relative_gap) << "%)\n";
    os << "solver:    " << (r.algorithm.empty() ? o.solver : r.algorithm) << " " << r.status
       << (r.proven_optimal ? " (proven)" : " (NOT proven optimal)") << " in "
       << fmt("%.3f", r.solve_seconds) << " s\n";
  }
  else
    os << "method:    heuristic " << r.method << " in " << fmt("%.3f", r.solve_seconds) << " s\n";
}

void print_sweep(std::ostream& os, const std::vector<ParetoPoint>& pts) {
  std::string up = pts.empty() ? "FP4" : pts[0].plan.low_option;
  for (char& ch : up) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  os << "Pareto front: quality loss (sum Q) vs " << up << " FLOPs share\n";
  char line[160];
  std::snprintf(line, sizeof line, "%8s  %10s  %14s  %10s  %9s  %-10s %8s\n", "budget",
                (up + " share").c_str(), "sum Q", "cost/FLOP", "gap %", "status", "seconds");
  os << line;
  for (const ParetoPoint& p : pts) {
    std::snprintf(line, sizeof line, "%8.4f  %10.4f  %14.6g  %10.4f  %9.3g  %-10s %8.3f\n",
                  p.budget, p.plan.fp4_share, p.plan.objective, p.plan.cost_per_flop,
                  100.0 * p.plan.relative_gap, p.plan.status.c_str(), p.plan.solve_seconds);
    os << line;
  }
}

void run_plan(const PlanArgs& a) {
  // --- input: a cost table, or a saved stats step --------------------------
  // A stats file (runs/NAME/stats/step-N.json, core/stats.h to_json) is a cost
  // table at its top level; its "details.options" are the candidates the run
  // measured, which are the default --options (not the bf16 reference, whose
  // Q = 0 would otherwise take every layer the budget leaves free).
  if (a.costs.empty() == a.stats.empty())
    fail("snip plan: expected exactly one of --costs FILE or --stats FILE, got ",
         a.costs.empty() ? "neither" : "both");
  const std::string source = a.costs.empty() ? a.stats : a.costs;
  const CostTable table = load_cost_table(source);
  PlanProblem problem =
      make_problem(table, a.per_gemm ? Granularity::gemm : Granularity::layer);

  // --- options -----------------------------------------------------------
  PlanOptions o;
  o.low_option = a.low;
  o.allowed_options = a.allowed;
  if (!a.stats.empty() && o.allowed_options.empty()) {
    std::ifstream in(a.stats);
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("details") && j["details"].is_object() &&
        j["details"].contains("options") && j["details"]["options"].is_array())
      for (const auto& v : j["details"]["options"])
        if (v.is_string()) o.allowed_options.push_back(v.get<std::string>());
  }
  // An option no item offers is a typo (--options fp4,fp8x): refuse it
  // rather than plan without it.
  for (const std::string& opt : o.allowed_options) {
    bool offered = false;
    std::set<std::string> all;
    for (const PlanItem& it : problem.items) {
      offered = offered || it.q.count(opt);
      for (const auto& kv : it.q) all.insert(kv.first);
    }
    if (!offered) {
      std::string list;
      for (const std::string& x : all) list += (list.empty() ? "" : ", ") + x;
      fail("--options: expected options the cost table ", source, " gives a Q for (", list, "), got '", opt, "'");
    }
  }
  o.time_limit_s = a.time_limit;
  o.core_time_limit_s = a.core_time_limit;
  o.method = parse_plan_method(a.method);
  o.verbosity = a.verbose;
  const bool is_uniform = a.heuristic.rfind("uniform-", 0) == 0;
  if (a.has_budget && a.has_cost_budget)
    fail("snip plan: expected one of --budget or --cost-budget, got both");
  if (a.has_cost_budget) {
    o.budget = Budget::cost(a.cost_budget);
  } else if (a.has_budget) {
    o.budget = Budget::share(a.budget);
  } else if (a.do_sweep || is_uniform) {
    o.budget = Budget::share(0.0);
  } else {
    fail("snip plan: expected --budget B (FP4 FLOPs share in [0,1]) or --cost-budget C, got "
         "neither");
  }
  for (const std::string& c : a.cost_overrides) {
    const size_t eq = c.rfind('=');
    double v = 0;
    size_t used = 0;
    bool ok = eq != std::string::npos && eq > 0;
    if (ok) {
      try {
        v = std::stod(c.substr(eq + 1), &used);
      } catch (const std::exception&) {
        ok = false;
      }
      ok = ok && used == c.size() - eq - 1 && std::isfinite(v) && v >= 0;
    }
    if (!ok) fail("--cost: expected OPTION=COST with COST >= 0 (e.g. fp8=2), got '", c, "'");
    o.budget.cost_per_flop[c.substr(0, eq)] = v;
  }
  for (const std::string& s : a.pins) o.pins.push_back(parse_pin(s));
  if (a.conservative) {
    int last = -1;
    for (const PlanItem& it : problem.items) last = std::max(last, block_index(it.layer));
    if (last < 0)
      fail("--conservative: expected layer names with a block index (model.layers.N...), "
           "got none");
    for (const Pin& p : conservative_pins(last)) o.pins.push_back(p);
  }
  if (a.stages > 0) {
    size_t with = 0;
    int max_stage = -1;
    for (const PlanItem& it : problem.items) {
      with += it.stage >= 0;
      max_stage = std::max(max_stage, it.stage);
    }
    if (with == 0) {
      assign_stages(problem, a.stages);
    } else if (with != problem.items.size()) {
      fail(source, ": expected \"stage\" on every layer or on none, got it on ", with, " of ",
           problem.items.size(), " items");
    } else if (max_stage + 1 != a.stages) {
      fail("--stages ", a.stages, ": the cost table ", source, " assigns ", max_stage + 1,
           " stages; expected the same number");
    }
    o.per_stage_budget = true;
    if (a.stage_boundary != "none") o.stage_boundary_option = a.stage_boundary;
  } else if (a.stages < 0) {
    fail("--stages: expected a positive number of stages, got ", a.stages);
  }

  // --- solve -------------------------------------------------------------
  nlohmann::json out;
  if (a.do_sweep) {
    if (a.heuristic != "ilp") fail("--sweep: works with the ILP planner only, got --heuristic ",
                                   a.heuristic);
    const std::vector<ParetoPoint> pts = sweep(problem, o, budget_steps(a.steps));
    out = sweep_to_json(pts);
    if (a.json)
      std::cout << out.dump(2) << "\n";
    else
      print_sweep(std::cout, pts);
  } else {
    const PlanResult r = a.heuristic == "ilp" ? plan(problem, o)
                                               : run_heuristic(a.heuristic, problem, o, a.seed);
    if (r.method == "ilp" && !r.proven_optimal)
      std::cerr << "snip: warning: the plan meets the budget but is not proven optimal ("
                << r.status << "): sum Q " << fmt("%.6g", r.objective) << " is within "
                << fmt("%.3g", r.gap) << " (" << fmt("%.3g", 100.0 * r.relative_gap)
                << "%) of the optimum"
                << (r.status == "time_limit_feasible" ? "; raise --time-limit / --core-time-limit"
                                                       : "")
                << "\n";
    for (const std::string& w : r.warnings) std::cerr << "snip: warning: " << w << "\n";
    out = plan_to_json(r);
    if (a.json)
      std::cout << out.dump(2) << "\n";
    else
      print_plan(std::cout, problem, o, r);
  }
  if (!a.out.empty()) io::save_json_atomic(out, a.out);
}

}  // namespace

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
  refuse_empty_numbers(*sub);
  CLI::Option* budget_opt = sub->get_option("--budget");
  CLI::Option* cost_budget_opt = sub->get_option("--cost-budget");

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
  show->add_option("--step", sa->step, "The plan in force at step N: the newest made at or before N (default: the latest plan)");
  show->add_flag("--json", sa->json, "Print the plan JSON instead of the table");
  show->callback([sa] {
    const std::string path = find_plan_file(sa->run, sa->step);
    const nlohmann::json j = io::read_json_file(path, "plan");
    if (sa->json)
      std::cout << j.dump(2) << "\n";
    else
      std::cout << path << "\n" << format_plan_table(j);
  });

  sub->callback([a, budget_opt, cost_budget_opt, show] {
    if (show->parsed()) return;  // `snip plan show` ran instead
    a->has_budget = budget_opt->count() > 0;
    a->has_cost_budget = cost_budget_opt->count() > 0;
    run_plan(*a);
  });
}

}  // namespace snip::cli
