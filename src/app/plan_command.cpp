// src/app/plan_command.cpp: what `snip plan` does, the offline precision planner (docs/method.md
// section 4; user doc: docs/planner.md).
//
//   snip plan --costs FILE --budget B [--per-gemm] [--pin GLOB=OPTION ...]
//             [--stages N] [--cost-budget C] [--json] [--out FILE]
//             [--method auto|milp|mckp] [--time-limit S] [--core-time-limit S]
//   snip plan --costs FILE --sweep [--steps N]
//   snip plan --costs FILE --budget B --heuristic min-rel-err
//   snip plan show runs/NAME [--step N] [--json]   (a plan `snip train` saved)
//   snip plan --config MODEL.toml [--tokens-per-step N] [--budget B] [--pin ...]
//             [--stats FILE | --init-from HF_DIR --data DIR [--stats-batch N] [--stats-out FILE]]
//             (a model from its shapes: FLOPs per layer type and the budget's
//             feasibility; with Q from a stats file carried over by role and
//             depth, or measured by one stats step, a plan; docs/planner.md)
//
// Prints a table (item, option, FLOPs share, Q per option) and a summary
// (achieved FP4 share, Σ Q, its lower bound and gap, cost, solver status,
// solve time), or JSON.
// Every input problem ends as a snip::UserError (one line, exit status 2).
// The command line itself is src/cli/cmd_plan.cpp.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "snip/app/plan_command.h"
#include "plan_measure.h"
#include "snip/config/config.h"
#include "snip/config/llama_config.h"
#include "snip/plan/model_plan.h"
#include "snip/plan/plan_file.h"
#include "snip/plan/cost_table.h"
#include "snip/plan/planner.h"
#include "snip/plan/gemm_times.h"
#include "snip/io/json.h"
#include "snip/core/error.h"

namespace snip::app {

namespace {

using namespace snip::plan;



std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// "fp4" -> "FP4": an option's name as the summaries print it.
std::string upper(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return s;
}

// Column order: the low option, then known costs ascending, then names.
std::vector<std::string> option_columns(const PlanProblem& p, const PlanOptions& o) {
  // Only the options the plan chose among (--options, or a stats file's
  // measured ones): not the bf16 reference's column of zeros.
  std::set<std::string> all;
  for (const PlanItem& it : p.items)
    for (const auto& kv : it.q)
      if (o.allowed_options.empty() ||
          std::find(o.allowed_options.begin(), o.allowed_options.end(), kv.first) != o.allowed_options.end())
        all.insert(kv.first);
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
  const std::string up = upper(r.low_option);
  os << "\n";
  if (r.budget.kind == Budget::Kind::fp4_share)
    os << "budget:    " << up << " FLOPs share >= " << fmt("%.4g", r.budget.value)
       << (o.per_stage_budget ? " in every stage" : "") << "\n";
  else if (r.budget.kind == Budget::Kind::time)
    os << "budget:    linear-GEMM time <= " << fmt("%.4g", r.budget.value) << "x the same GEMMs in "
       << r.budget.time_reference << (o.per_stage_budget ? " in every stage" : "") << " (measured table)\n";
  else
    os << "budget:    cost <= " << fmt("%.4g", r.budget.value) << " per FLOP"
       << (o.per_stage_budget ? " in every stage" : "") << "\n";
  os << "achieved:  " << up << " share " << fmt("%.4f", r.fp4_share);
  if (std::isfinite(r.cost_per_flop)) os << ", cost " << fmt("%.4f", r.cost_per_flop) << " per FLOP";
  if (std::isfinite(r.seconds) && std::isfinite(r.reference_seconds))
    os << ", linear GEMMs " << fmt("%.4g", 1e3 * r.seconds) << " ms/step predicted = " << fmt("%.4f", r.time_ratio)
       << "x " << r.budget.time_reference << " (" << fmt("%.4g", 1e3 * r.reference_seconds) << " ms)";
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
  const std::string up = pts.empty() ? "FP4" : upper(pts[0].plan.low_option);
  os << "Pareto front: quality loss (sum Q) vs " << up << " FLOPs share\n";
  // With --gemm-times each point's predicted GEMM time, as a ratio to bf16.
  bool timed = false;
  for (const ParetoPoint& p : pts) timed = timed || std::isfinite(p.plan.time_ratio);
  char line[192];
  std::snprintf(line, sizeof line, "%8s  %10s  %14s  %10s  %9s  %-10s %8s%s\n", "budget",
                (up + " share").c_str(), "sum Q", "cost/FLOP", "gap %", "status", "seconds",
                timed ? "  GEMM time x bf16" : "");
  os << line;
  for (const ParetoPoint& p : pts) {
    std::snprintf(line, sizeof line, "%8.4f  %10.4f  %14.6g  %10.4f  %9.3g  %-10s %8.3f", p.budget,
                  p.plan.fp4_share, p.plan.objective, p.plan.cost_per_flop, 100.0 * p.plan.relative_gap,
                  p.plan.status.c_str(), p.plan.solve_seconds);
    os << line;
    if (timed) os << "  " << fmt("%17.4f", p.plan.time_ratio);
    os << "\n";
  }
}

// The options a stats file measured (its "details.options"), empty when it
// says none: the default --options of a plan from it (not the bf16
// reference, whose Q = 0 would otherwise take every layer the budget leaves
// free).
std::vector<std::string> stats_options(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("details") && j["details"].is_object() &&
      j["details"].contains("options") && j["details"]["options"].is_array())
    for (const auto& v : j["details"]["options"])
      if (v.is_string()) out.push_back(v.get<std::string>());
  return out;
}

// At most one of --budget, --cost-budget and --time-budget.
void check_one_budget(const PlanArgs& a) {
  if (int(a.has_budget) + int(a.has_cost_budget) + int(a.has_time_budget) > 1)
    fail("snip plan: expected one of --budget, --cost-budget or --time-budget, got ",
         a.has_budget && a.has_cost_budget ? "--budget and --cost-budget"
                                           : a.has_budget ? "--budget and --time-budget" : "--cost-budget and --time-budget");
}

// Plans `table` (read from `source`) with the options of `a`; `default_options`
// are the candidates when --options is not given (empty: every option).
// Returns what it printed as JSON (the plan file, or the sweep).
nlohmann::json plan_table(const PlanArgs& a, const CostTable& table, const std::string& source,
                const std::vector<std::string>& default_options) {
  PlanProblem problem =
      make_problem(table, a.per_gemm ? Granularity::gemm : Granularity::layer);

  // --- options -----------------------------------------------------------
  PlanOptions o;
  o.low_option = a.low;
  o.allowed_options = a.allowed.empty() ? default_options : a.allowed;
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
  check_one_budget(a);
  if (a.has_time_budget) {
    if (a.do_sweep) fail("--sweep: sweeps FP4 FLOPs shares; drop --time-budget (the points carry GEMM seconds with --gemm-times)");
    o.budget = Budget::time(a.time_budget);
  } else if (a.has_cost_budget) {
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
  // --gemm-times (run_model_plan filled the shapes): each item's seconds per
  // option, the allowed ones and the bf16 reference.
  if (!a.timed_layers.empty()) {
    std::set<std::string> opts{"bf16"};
    for (const PlanItem& it : problem.items)
      for (const auto& kv : it.q)
        if (o.allowed_options.empty() ||
            std::find(o.allowed_options.begin(), o.allowed_options.end(), kv.first) != o.allowed_options.end())
          opts.insert(kv.first);
    apply_gemm_times(problem, *a.timed_table, a.timed_layers, a.timed_rows, a.timed_micro_batches,
                     std::vector<std::string>(opts.begin(), opts.end()));
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
    const PlanResult r = a.heuristic == "ilp" ? solve(problem, o)
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
  return out;
}

// `snip plan --config MODEL.toml`: the model's FLOPs from its shapes; with Q
// (--stats FILE carried over by role and depth, or --init-from HF_DIR --data
// DIR measured) a plan, without it the budget's feasibility under the pins.
void run_model_plan(const PlanArgs& given) {
  PlanArgs a = given;
  check_one_budget(a);
  // The same range as precision.budget under budget_unit = time.
  if (a.has_time_budget && !(a.time_budget > 0 && a.time_budget <= 1e6))
    fail("--time-budget: expected a ratio to the bf16 GEMM time in (0, 1e6], got ", a.time_budget);
  if (!a.costs.empty())
    fail("snip plan: expected one of --costs FILE or --config MODEL.toml, got both (a cost table has its own "
         "FLOPs; plan a model with --config and --stats FILE or --init-from HF_DIR --data DIR)");
  if (!a.stats.empty() && !a.init_from.empty())
    fail("snip plan: expected one of --stats FILE or --init-from HF_DIR (where Q comes from), got both");
  if (a.init_from.empty() != a.data.empty())
    fail(a.init_from.empty() ? "--data: needs --init-from HF_DIR (the checkpoint to measure Q on)"
                             : "--init-from: needs --data DIR (the prepared text to measure Q on)");
  // 2^50 tokens per step is far past any run (Llama 3 trained on 2^53
  // tokens in all); larger values are typos, and CLI11 saturates overflow.
  if (a.tokens_given && (a.tokens_per_step < 1 || a.tokens_per_step > (int64_t{1} << 50)))
    fail("--tokens-per-step: expected a number of tokens per training step in [1, 2^50], got ", a.tokens_per_step);
  if (a.stats_batch < 1 || a.stats_batch > 4096)
    fail("--stats-batch: expected 1 to 4096 sequences, got ", a.stats_batch);
  if (a.init_from.empty() && (a.stats_batch_given || a.allow_other_tokenizer || !a.stats_out.empty()))
    fail(a.stats_batch_given ? "--stats-batch" : !a.stats_out.empty() ? "--stats-out" : "--allow-other-tokenizer",
         ": needs --init-from HF_DIR --data DIR (it is about the measured stats step)");
  if (a.has_budget && !(a.budget >= 0 && a.budget <= 1))
    fail("budget: expected an FP4 FLOPs share in [0, 1], got ", a.budget);
  if (!a.out.empty()) {
    // --out must not overwrite what the plan is made from.
    std::error_code ec;
    for (const std::string& in : {a.stats, a.config})
      if (!in.empty() && std::filesystem::exists(a.out, ec) && std::filesystem::equivalent(a.out, in, ec))
        fail("--out ", a.out, ": is the input ", in, "; write the plan to another file");
  }

  if (a.stats.empty() && a.init_from.empty() && (a.do_sweep || a.heuristic != "ilp"))
    fail(a.do_sweep ? "--sweep" : "--heuristic " + a.heuristic,
         ": needs Q, per layer and option: add --stats RUN/stats/step-N.json or --init-from HF_DIR --data DIR");
  Config cfg;
  cfg.load_toml_file(a.config);
  for (const std::string& s : a.sets) cfg.set_override(s);
  cfg.validate();
  if (!a.per_gemm) a.per_gemm = cfg.get_string("precision.granularity") == "gemm";
  if (!a.low_given) a.low = cfg.get_string("precision.low_option");
  std::vector<std::string> pins = split_list(cfg.get_string("precision.pins"));
  pins.insert(pins.end(), a.pins.begin(), a.pins.end());
  a.pins = pins;
  std::string budget_from = "--budget";
  if (!a.has_budget && !a.has_cost_budget && !a.has_time_budget && !a.do_sweep) {
    // The config's budget, in its unit.
    (cfg.get_string("precision.budget_unit") == "time" ? a.has_time_budget : a.has_budget) = true;
    (a.has_time_budget ? a.time_budget : a.budget) = cfg.get_float("precision.budget");
    budget_from = "precision.budget of " + a.config;
  }
  if (a.gemm_times.empty()) a.gemm_times = cfg.get_string("precision.gemm_times");
  // Who asked for the time budget, in its errors.
  const std::string time_from =
      budget_from == "--budget" ? "--time-budget" : "precision.budget_unit = time (" + a.config + ")";
  if (a.has_time_budget && a.gemm_times.empty())
    fail(time_from,
         ": needs the measured GEMM times: --gemm-times FILE (snip doctor --calibrate --config ", a.config,
         " --run DIR writes DIR/gemm_times.json)");

  // --- Q: measured on the checkpoint, or a stats file ----------------------
  CostTable source;
  std::vector<std::string> default_options;
  if (!a.init_from.empty()) {
    app::PlanMeasureRequest r;
    r.hf_dir = a.init_from;
    r.data_dir = a.data;
    r.batch = a.stats_batch;
    r.per_gemm = a.per_gemm;
    r.allow_other_tokenizer = a.allow_other_tokenizer;
    r.stats_out = a.stats_out;
    source = app::measure_plan_costs(cfg, r);  // adopts the folder's shapes into cfg
  } else if (!a.stats.empty()) {
    source = load_cost_table(a.stats);
    if (!cfg.values().count("precision.options")) default_options = stats_options(a.stats);
  }
  // The config's options, bf16 included when it lists it (as snip train
  // plans); a stats file's measured options when the config does not say.
  if (default_options.empty()) default_options = split_list(cfg.get_string("precision.options"));

  // --- the shapes -----------------------------------------------------------
  const int64_t B = cfg.get_int("train.batch_size"), T = cfg.get_int("train.seq_len"),
                acc = cfg.get_int("train.grad_accum");
  const int64_t tokens = a.tokens_given ? a.tokens_per_step : B * T * acc;
  const int64_t L = cfg.get_int("model.num_hidden_layers"), C = cfg.get_int("model.hidden_size"),
                F = cfg.get_int("model.intermediate_size"), NH = cfg.get_int("model.num_attention_heads"),
                NKV = cfg.get_int("model.num_key_value_heads");
  // model.vocab_size 0 means the tokenizer's: data.dir's meta.json says it
  // when that folder is prepared (else the vocabulary stays unknown).
  int64_t V = cfg.get_int("model.vocab_size");
  std::string vocab_from;
  if (V == 0) {
    const std::string meta = (std::filesystem::path(cfg.get_string("data.dir")) / "meta.json").string();
    std::error_code ec;
    if (std::filesystem::is_regular_file(meta, ec)) {
      const nlohmann::json m = io::read_json_file(meta, "data folder meta.json");
      if (m.is_object() && m.contains("vocab_size") && m["vocab_size"].is_number_integer() &&
          m["vocab_size"].get<int64_t>() > 0 && m["vocab_size"].get<int64_t>() <= (int64_t{1} << 31) - 1) {
        V = m["vocab_size"].get<int64_t>();
        vocab_from = " (the tokenizer's: " + meta + ")";
      }
    }
  }
  const std::vector<LinearLayerShape> shapes =
      llama_linear_layers(int(L), C, F, int(NH), int(NKV), tokens);
  if (!a.gemm_times.empty()) {
    // The table times one micro-batch of batch_size x seq_len rows; a step
    // runs tokens / (batch_size x seq_len) of them, a whole number.
    if (tokens % (B * T) != 0)
      fail("--tokens-per-step ", tokens, ": with --gemm-times, expected a multiple of batch_size x seq_len = ", B * T,
           " (the rows the table's GEMMs were timed at: whole micro-batches per step)");
    auto table = std::make_shared<GemmTimes>(load_gemm_times(a.gemm_times));
    // Planned with the config's GEMM dtype: a table of another dtype times
    // other GEMMs. Another device is allowed (planning a GPU run here).
    const std::string dtype = cfg.get_string("train.gemm_dtype");
    if (table->gemm_dtype != dtype)
      fail(a.gemm_times, ": gemm_dtype: expected \"", dtype, "\" (train.gemm_dtype of ", a.config, "), got \"",
           table->gemm_dtype, "\"");
    std::cerr << "snip: note: GEMM times from " << a.gemm_times << ", measured on " << table->device
              << (table->machine.empty() ? std::string() : " (" + table->machine + ")") << " at " << B * T
              << " rows per micro-batch, " << tokens / (B * T) << " micro-batch(es) per step\n";
    a.timed_table = std::move(table);
    for (const LinearLayerShape& l : shapes) a.timed_layers.push_back({l.name, l.in_features, l.out_features});
    a.timed_rows = B * T;
    a.timed_micro_batches = double(tokens / (B * T));
  }
  const std::vector<RoleFlops> roles = role_flops(shapes);
  double linear = 0;
  for (const RoleFlops& r : roles) linear += r.flops;
  // The model's training FLOPs (PaLM convention, LlamaConfig) when the
  // vocabulary is known: the planned layers' part of them.
  double model_flops = 0;
  int64_t params = 0;
  if (V > 0) {
    const LlamaConfig m = LlamaConfig::from_run_config(cfg, V);
    model_flops = m.train_flops_per_token(T) * double(tokens);
    params = m.num_parameters();
  }

  nlohmann::json jm = {{"config", a.config},
                       {"num_hidden_layers", L},
                       {"hidden_size", C},
                       {"intermediate_size", F},
                       {"num_attention_heads", NH},
                       {"num_key_value_heads", NKV},
                       {"vocab_size", V > 0 ? nlohmann::json(V) : nlohmann::json(nullptr)},
                       {"parameters", V > 0 ? nlohmann::json(params) : nlohmann::json(nullptr)}};
  nlohmann::json jroles = nlohmann::json::array();
  for (const RoleFlops& r : roles)
    jroles.push_back({{"role", r.role},
                      {"in_features", r.in_features},
                      {"out_features", r.out_features},
                      {"layers", r.count},
                      {"flops", r.flops},
                      {"share", r.share}});
  if (!a.json) {
    std::cout << "model:     " << a.config << ": " << L << " blocks, hidden " << C << ", MLP " << F << ", "
              << NH << "/" << NKV << " query/KV heads";
    if (V > 0) std::cout << ", vocabulary " << V << vocab_from << ", " << params << " parameters";
    else std::cout << ", vocabulary from the tokenizer (model.vocab_size = 0: parameters and lm_head not counted)";
    std::cout << "\n";
    std::cout << "tokens:    " << tokens << " per step"
              << (a.tokens_given ? std::string(" (--tokens-per-step)")
                                        : " (batch_size " + std::to_string(B) + " x seq_len " + std::to_string(T) +
                                              " x grad_accum " + std::to_string(acc) + ")")
              << "\n";
    std::cout << "FLOPs:     " << fmt("%.4g", linear) << " per step in the " << shapes.size()
              << " planned linear layers (3 GEMMs each: fprop, dgrad, wgrad, 2*T*in*out FLOPs per GEMM)";
    if (model_flops > 0)
      std::cout << "; " << fmt("%.1f", 100.0 * linear / model_flops) << "% of the model's "
                << fmt("%.4g", model_flops) << " training FLOPs (lm_head and attention products stay at train.gemm_dtype)";
    std::cout << "\n\n";
    size_t w = 4;
    for (const RoleFlops& r : roles) w = std::max(w, r.role.size());
    char line[256];
    std::snprintf(line, sizeof line, "%-*s  %15s  %6s  %14s  %8s\n", int(w), "role", "out x in", "layers",
                  "FLOPs/step", "share");
    std::cout << line;
    for (const RoleFlops& r : roles) {
      const std::string shape = std::to_string(r.out_features) + " x " + std::to_string(r.in_features);
      std::snprintf(line, sizeof line, "%-*s  %15s  %6d  %14.4g  %7.2f%%\n", int(w), r.role.c_str(), shape.c_str(),
                    r.count, r.flops, 100.0 * r.share);
      std::cout << line;
    }
    std::cout << "\n";
  }

  if (source.layers.empty() && a.has_time_budget)
    fail(time_from,
         ": needs Q, per layer and option: add --stats RUN/stats/step-N.json or --init-from HF_DIR --data DIR");
  if (source.layers.empty()) {
    // No Q: what the shapes and pins allow.
    std::vector<std::string> opts = default_options;
    for (const std::string& extra : {a.low, std::string("bf16")})
      if (std::find(opts.begin(), opts.end(), extra) == opts.end()) opts.push_back(extra);
    const PlanProblem problem =
        make_problem(shape_cost_table(shapes, opts), a.per_gemm ? Granularity::gemm : Granularity::layer);
    PlanOptions o;
    o.low_option = a.low;
    for (const std::string& s : a.pins) o.pins.push_back(parse_pin(s));
    if (a.conservative)
      for (const Pin& p : conservative_pins(int(L) - 1)) o.pins.push_back(p);
    const double max_share = max_fp4_share(problem, o);
    const std::string up = upper(a.low);
    const bool share_budget = a.has_budget && !a.has_cost_budget;
    const bool feasible = !share_budget || a.budget <= max_share + kBudgetTolerance;
    nlohmann::json j = {{"model", jm}, {"tokens_per_step", tokens}, {"linear_flops", linear},
                        {"model_flops", model_flops > 0 ? nlohmann::json(model_flops) : nlohmann::json(nullptr)},
                        {"roles", jroles}, {"low_option", a.low}, {"max_low_share", max_share},
                        {"pins", a.pins}, {"per_gemm", a.per_gemm}};
    if (share_budget) j["budget"] = a.budget, j["feasible"] = feasible;
    if (a.json) std::cout << j.dump(2) << "\n";
    else {
      std::cout << "pins:      " << (o.pins.empty() ? std::string("none") : std::to_string(o.pins.size()))
                << "; they allow an " << up << " FLOPs share of at most " << fmt("%.4f", max_share) << "\n";
      if (share_budget)
        std::cout << "budget:    " << up << " share >= " << fmt("%.4g", a.budget) << " (" << budget_from << "): "
                  << (feasible ? "feasible" : "INFEASIBLE") << "\n";
      std::cout << "Q:         not given, so no plan: add --stats RUN/stats/step-N.json (a stats step of a run of "
                   "any size, carried over by role and depth) or --init-from HF_DIR --data DIR (one stats step "
                   "on this model)\n";
    }
    if (!feasible) {  // nothing written (--out): planning failed
      PlanOptions po = o;
      po.budget = Budget::share(a.budget);
      solve(problem, po);  // throws the planner's message: the pins that cap the share
      fail("budget ", a.budget, " is infeasible: the pins allow at most ", fmt("%.4f", max_share));
    }
    if (!a.out.empty()) io::save_json_atomic(j, a.out);
    return;
  }

  // --- Q carried over (or from the same model, measured) -------------------
  const Transfer t = transfer_costs(source, shapes, a.low);
  const std::string from = a.init_from.empty() ? a.stats : "one stats step on " + a.init_from + " (" + a.data + ")";
  auto blocks = [](int n) { return std::to_string(n) + (n == 1 ? " block" : " blocks"); };
  const std::string scaled =
      t.scale != 1 ? "every Q scaled by " + fmt("%.4g", t.scale) + " so that its sum at " + a.low + " is 1"
                   : "Q kept as it is (its sum at " + a.low + " is " + fmt("%.6g", t.low_sum) + ")";
  if (t.source_blocks == t.target_blocks)
    std::cerr << "snip: note: Q from " << from << ", block for block (" << blocks(t.source_blocks) << "); " << scaled
              << "; FLOPs from the model's shapes at " << tokens << " tokens per step\n";
  else
    std::cerr << "snip: note: Q from " << from << " (" << blocks(t.source_blocks) << ") carried over to "
              << blocks(t.target_blocks) << " by role and relative depth: "
              << (t.target_blocks == 1 ? std::string("the model's one block takes block 0")
                                       : "model.layers.i.ROLE takes model.layers.j.ROLE, j = round(i*" +
                                             std::to_string(t.source_blocks - 1) + "/" +
                                             std::to_string(t.target_blocks - 1) + ")")
              << "; " << scaled << "; FLOPs from the model's shapes at " << tokens << " tokens per step\n";
  if (!(t.low_sum > 0) || !std::isfinite(t.low_sum))
    std::cerr << "snip: warning: " << from << ": the sum of Q at " << a.low << " is " << fmt("%.6g", t.low_sum)
              << ": every layer looks " << (t.low_sum > 0 ? "infinitely harmful" : "harmless")
              << " at " << a.low << ", so the plan says nothing about which layers are sensitive\n";
  const nlohmann::json plan = plan_table(a, t.table, from, default_options);
  if (a.json || a.do_sweep || !plan.contains("assignments")) return;
  // Per layer type, how many layers (or GEMMs) got each option: what a plan
  // for 22 blocks says at a glance.
  std::map<std::string, std::map<std::string, int>> by_role;
  std::map<std::string, int> total;
  for (const auto& [item, option] : plan["assignments"].items()) {
    const std::string layer = item.substr(0, item.find(':'));
    const std::string role = layer_role(layer).role + (item.size() > layer.size() ? item.substr(layer.size()) : "");
    by_role[role][option.get<std::string>()] += 1;
    total[role] += 1;
  }
  std::string head = "by type:   ";
  size_t w = 0;
  for (const auto& kv : total) w = std::max(w, kv.first.size());
  for (const RoleFlops& r : roles)
    for (const std::string& suffix : a.per_gemm ? std::vector<std::string>{":fprop", ":dgrad", ":wgrad"}
                                                : std::vector<std::string>{""}) {
      const std::string role = r.role + suffix;
      if (!total.count(role)) continue;
      std::cout << head << role << std::string(w + 2 - role.size(), ' ');
      head = std::string(head.size(), ' ');
      std::string sep;
      for (const auto& [option, n] : by_role[role]) {
        std::cout << sep << option << " " << n;
        sep = ", ";
      }
      std::cout << " of " << total[role] << "\n";
    }
}

}  // namespace

void run_plan(const PlanArgs& a) {
  if (!a.config.empty()) return run_model_plan(a);
  for (const auto& [flag, given] : {std::pair<const char*, bool>{"--init-from", !a.init_from.empty()},
                                    {"--data", !a.data.empty()},
                                    {"--tokens-per-step", a.tokens_given},
                                    {"--stats-batch", a.stats_batch_given},
                                    {"--stats-out", !a.stats_out.empty()},
                                    {"--allow-other-tokenizer", a.allow_other_tokenizer},
                                    {"--set", !a.sets.empty()},
                                    {"--time-budget", a.has_time_budget},
                                    {"--gemm-times", !a.gemm_times.empty()}})
    if (given) fail("snip plan: ", flag, " needs --config MODEL.toml (the model to plan)");
  // --- input: a cost table, or a saved stats step --------------------------
  // A stats file (runs/NAME/stats/step-N.json, core/stats.h to_json) is a cost
  // table at its top level; its "details.options" are the candidates the run
  // measured, which are the default --options.
  if (a.costs.empty() == a.stats.empty())
    fail("snip plan: expected exactly one of --costs FILE, --stats FILE or --config MODEL.toml, got ",
         a.costs.empty() ? "none" : "both --costs and --stats");
  const std::string source = a.costs.empty() ? a.stats : a.costs;
  plan_table(a, load_cost_table(source), source, a.stats.empty() ? std::vector<std::string>{} : stats_options(a.stats));
}


}  // namespace snip::app
