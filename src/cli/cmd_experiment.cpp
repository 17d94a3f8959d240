// `snip experiment` (app/experiment.h) and `snip correlate` (app/study.h):
// their options; the work is in src/app.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <optional>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "snip/config/config.h"
#include "snip/model/quantizers.h"
#include "snip/recipes/recipe_file.h"
#include "snip/app/experiment.h"
#include "snip/app/study.h"
#include "snip/io/dir_lock.h"
#include "snip/io/json.h"
#include "snip/core/error.h"

extern char** environ;

namespace snip::cli {

namespace fs = std::filesystem;
using json = nlohmann::json;

void add_experiment_commands(CLI::App& app) {
  auto a = std::make_shared<ExperimentOptions>();
  CLI::App* ex = app.add_subcommand(
      "experiment",
      "train one model under several precision policies (same seed and data order) and compare them: "
      "table of final validation loss, gap to the unquantized arm (policy none), FP4 share, time, tokens/s, and a validation-loss chart");
  ex->add_option("--config,-c", a->config,
                 "TOML run configuration shared by every arm (e.g. configs/experiment.toml); required unless "
                 "--no-train");
  ex->add_option("--out", a->out, "experiment folder: one run per arm in OUT/<arm>/, results in OUT/results.*")
      ->capture_default_str();
  CLI::Option* arms_opt =
      ex->add_option("--arms", a->arms,
                     "comma-separated arms: <policy> or <policy>-<budget>, e.g. snip-0.75, uniform-fp4, none; "
                     "<policy>-gemm-<budget> plans per GEMM; +fprop raises only the forward GEMMs in the final "
                     "phase, +nofinal runs without a final phase, +time reads the budget in measured GEMM time (e.g. snip-0.75+fprop, snip-0.8+time); "
                     "rivals: autoswitch, bf16-tail, first-last-n (no budget) (the first arm is the reference of the gap column; "
                     "with --no-train the default is the arms found in OUT)")
          ->capture_default_str();
  ex->add_option("--set", a->sets, "override one option of every arm: section.key=value (repeatable)");
  ex->add_option("--seeds", a->seeds,
                 "train each arm with N seeds S, S+1, ..., S+N-1 (S = the config's train.seed; each run sets "
                 "train.seed and precision.seed to its seed) in OUT/<arm>/seed-<s>/, and tabulate every seed "
                 "trained in OUT: mean, standard deviation, per-seed values, paired comparisons with 95% "
                 "intervals")
      ->check(CLI::Range(int64_t{1}, int64_t{1000}));
  ex->add_flag("--no-train", a->no_train,
               "only tabulate the arms already trained in OUT, each with its own OUT/<arm>/config.toml "
               "(--config and --set are not needed)");
  ex->add_option("--progress-interval", a->progress_s,
                 "seconds between two progress lines of an arm when stderr is not a terminal (the arm's last "
                 "step is always shown; on a terminal the line is rewritten at each new record of the arm's metrics.jsonl)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e9));
  ex->callback([a, arms_opt] {
    a->arms_given = arms_opt->count() > 0;
    run_experiment(*a);
  });

  struct CorrArgs {
    std::string run, out, option = "fp4", layers, replot, predictor = "q";
    int64_t step = -1, steps = 20, eval_batches = -1, repeats = 1;
  };
  auto c = std::make_shared<CorrArgs>();
  CLI::App* co = app.add_subcommand(
      "correlate",
      "correlation study (docs/method.md section 7): from one checkpoint, quantize one layer at a time for K steps and "
      "correlate the measured loss change with the stats step's predicted Q");
  co->add_option("--run", c->run, "a run of `snip train` (its config, data and checkpoints)");
  co->add_option("--step", c->step, "checkpoint step (default: the newest)");
  co->add_option("--steps", c->steps, "K: training steps per arm")->capture_default_str();
  co->add_option("--option", c->option, "option the studied layer runs")->capture_default_str();
  co->add_option("--layers", c->layers, "comma-separated glob patterns of layers to study (default: all)");
  co->add_option("--eval-batches", c->eval_batches, "validation micro-batches (default: the run's)");
  co->add_option("--repeats", c->repeats,
                 "R: run the baseline and every layer R times (repeat r: stochastic-rounding seed train.seed + r, "
                 "the K steps' data r*K steps further on) and correlate the mean change; R >= 2 adds standard "
                 "errors and 95% bootstrap intervals of the correlations")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{100}));
  co->add_option("--out", c->out, "results folder (default: RUN/correlation, or the --replot file's folder)");
  co->add_option("--replot", c->replot, "no training: re-plot a correlation.json with another --predictor");
  co->add_option("--predictor", c->predictor,
                 "what the scatter plot puts on x: q, ld, wd, wd_own, rel_err_fprop, ld[drop], q[drop,a=0.5], ...")
      ->capture_default_str();
  co->callback([c] {
    CorrelationResult r;
    std::string out_dir = c->out;
    if (!c->replot.empty()) {
      if (!c->run.empty()) fail("--replot and --run: give one of them");
      const json j = io::read_json_file(c->replot, "correlation study");
      r = correlation_from_json(j, c->replot);
      if (out_dir.empty()) out_dir = fs::path(c->replot).parent_path().string();
      if (out_dir.empty()) out_dir = ".";
    } else {
      if (c->run.empty()) fail("--run RUN is required (or --replot correlation.json)");
      CorrelationOptions o;
      o.run_dir = c->run;
      o.step = c->step;
      o.steps = c->steps;
      o.option = c->option;
      o.eval_batches = c->eval_batches;
      o.repeats = c->repeats;
      o.out_dir = out_dir.empty() ? (fs::path(c->run) / "correlation").string() : out_dir;
      out_dir = o.out_dir;
      std::stringstream ss(c->layers);
      for (std::string t; std::getline(ss, t, ',');)
        if (!t.empty()) o.layers.push_back(t);
      r = correlation_study(o);
    }
    present_correlation(r, c->predictor, out_dir, !c->replot.empty(), std::cout);
  });
}

}  // namespace snip::cli
