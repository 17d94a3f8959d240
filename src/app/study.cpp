// The correlation study of docs/method.md section 7 (see study.h).
#include "snip/hw/platform.h"
#include "snip/train/memory.h"
#include "snip/app/study.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <regex>
#include <sstream>

#include "snip/config/config.h"
#include "snip/model/hf.h"
#include "snip/model/llama.h"
#include "snip/model/matmul.h"
#include "snip/model/quantizers.h"
#include "snip/recipes/recipe_file.h"
#include "snip/method/stats.h"
#include "snip/train/checkpoint.h"
#include "snip/train/model_session.h"
#include "snip/train/optimizer.h"
#include "snip/train/step.h"
#include "snip/train/trainer.h"
#include "snip/data/loader.h"
#include "snip/io/atomic_file.h"
#include "snip/io/safetensors.h"
#include "snip/plan/planner.h"
#include "snip/report/report.h"
#include "snip/run/trainer_state.h"
#include "snip/core/error.h"
#include "snip/core/statistics.h"

namespace snip {

namespace fs = std::filesystem;
using json = nlohmann::json;

CorrelationResult correlation_study(const CorrelationOptions& o) {
  using clock = std::chrono::steady_clock;
  const auto t_start = clock::now();
  if (o.steps < 1) fail("--steps: expected >= 1 training steps per arm, got ", o.steps);
  if (o.repeats < 1) fail("--repeats: expected >= 1 repeats, got ", o.repeats);
  const fs::path run(o.run_dir);
  if (!fs::is_regular_file(run / "config.toml"))
    fail("--run: ", (run / "config.toml").string(), " does not exist (expected a run of `snip train`)");
  Config cfg;
  cfg.load_toml_file((run / "config.toml").string());
  const RunConfig rc = RunConfig::from(cfg);  // rc.recipes: --option may name one of precision.recipe_file's
  const TrainConfig& tc = rc.train;
  std::string ckpt;
  if (o.step >= 0) {
    for (const auto& [s, dir] : complete_checkpoints((run / "checkpoints").string(), /*warn=*/false))
      if (s == o.step) ckpt = dir;  // step-N, or step-N.old standing for it
    if (ckpt.empty())
      fail("--step: ", (run / "checkpoints" / ("step-" + std::to_string(o.step))).string(), " does not exist (list ",
           (run / "checkpoints").string(), ")");
  } else {
    ckpt = latest_checkpoint(o.run_dir);
    if (ckpt.empty()) fail("--run: no complete checkpoint in ", (run / "checkpoints").string());
  }
  if (rc.lora.enabled() || fs::exists(fs::path(ckpt) / "adapter_config.json"))
    fail("--run: ", o.run_dir, " trains LoRA adapters (lora.rank = ", rc.lora.rank, "): snip correlate studies full "
         "training only (write the adapted model with `snip export --merge`, train from it with --init-from, and "
         "study that run)");
  if (o.option == "bf16" || o.option == "none")
    fail("--option: expected a quantizing recipe (e.g. fp4, mxfp4), got the reference '", o.option, "'");
  std::shared_ptr<const OperandQuantizer> quant;
  try {
    quant = make_recipe_quantizer(rc.recipes, o.option);
  } catch (const UserError& e) {
    std::string m = e.what();
    const std::string pre = "precision.recipe: ";
    if (m.rfind(pre, 0) == 0) m = m.substr(pre.size());
    fail("--option: ", m);
  }
  if (o.step < -1) fail("--step: expected a checkpoint step >= 0, got ", o.step);

  const std::string val_bin = (fs::path(rc.data.dir) / "val.bin").string();
  // One step of the run in one process: the micro-batches of every rank of
  // the run, which is the same step bit for bit (train/model_session.h).
  ModelSession ms = open_checkpoint_session(rc, ckpt, "snip correlate");
  LlamaForCausalLM& model = ms.model;
  data::TokenLoader& loader = *ms.loader;
  std::unique_ptr<torch::optim::AdamW>& opt = ms.optimizer;  // reset() makes a new one
  const int64_t B = ms.B, T = ms.T, accum = ms.accum, step0 = ms.step;
  const at::ScalarType gemm = ms.gemm;
  const data::LoaderState loader0 = ms.loader0;
  const uint64_t seed = uint64_t(tc.seed);
  const int64_t eval_batches = o.eval_batches >= 0 ? o.eval_batches : tc.eval_batches;
  auto lr_of = [&](int64_t step) { return lr_at(step, tc.max_steps, tc.warmup_steps, tc.lr, tc.min_lr_ratio); };
  auto reset = [&] { ms.reset(); };

  // The layers to study.
  std::vector<QuantLinear> all = model->linear_layers(), studied;
  std::vector<plan::Pin> pins;
  for (const auto& g : o.layers) pins.push_back(plan::parse_pin(g + "=" + o.option));
  for (const auto& l : all) {
    plan::PlanItem it;
    it.name = it.layer = l->name;
    bool take = pins.empty();
    for (const auto& p : pins) take = take || plan::pin_matches(p, it, plan::Granularity::layer);
    if (take) studied.push_back(l);
  }
  for (size_t i = 0; i < pins.size(); ++i) {
    bool any = false;
    for (const auto& l : all) {
      plan::PlanItem it;
      it.name = it.layer = l->name;
      any = any || plan::pin_matches(pins[i], it, plan::Granularity::layer);
    }
    if (!any) fail("--layers: pattern '", o.layers[i], "' matches no quantizable layer");
  }
  if (studied.size() < 2) fail("--layers: expected at least 2 layers to correlate, got ", studied.size());

  CorrelationResult res;
  res.step = step0;
  res.steps = o.steps;
  res.option = o.option;
  res.repeats = o.repeats;

  // After every cheap check, before hours of training: the output folder.
  if (!o.out_dir.empty()) io::ensure_writable_dir(o.out_dir);

  // 1. prediction: the stats step on the next step's first micro-batch.
  std::vector<int32_t> in, tg;
  StatsStep pred;
  {
    set_lr(*opt, lr_of(step0));
    model->set_step(seed, step0);
    loader.next(in, tg);
    const torch::Tensor ids = to_ids(in, B, T), targets = to_ids(tg, B, T);
    StatsOptions so;
    so.recipes = rc.recipes;
    so.options = {o.option};
    if (o.option != "fp8") so.options.push_back("fp8");
    so.low_option = o.option;
    so.alpha = rc.precision.alpha;
    so.first_order = rc.precision.first_order;
    so.curvature_probes = int(rc.precision.curvature_probes);
    so.seed = seed;
    if (!o.quiet) spdlog::info("correlation study: stats step at step {} of {}", step0, o.run_dir);
    pred = run_stats_step(all, [&] { return LlamaForCausalLMImpl::loss(model(ids), targets); }, *opt, so, step0);
    loader.restore(loader0);
  }

  // 2./3. K training steps per arm; repeat r: SR seed + r, data r·K steps on.
  auto run_arm = [&](QuantLinear* only, int64_t r) -> std::pair<double, double> {
    reset();
    for (int64_t k = 0; k < r * o.steps * accum; ++k) loader.next(in, tg);
    if (only) (*only)->precision = LinearPrecision{quant, gemm};
    StepContext sc{model, *opt, loader, B, T, accum, tc.grad_clip, seed + uint64_t(r), nullptr};
    double train_sum = 0;
    for (int64_t k = 0; k < o.steps; ++k) train_sum += train_step(sc, step0 + k, lr_of(step0 + k)).loss;
    const double v = evaluate(model, val_bin, B, T, eval_batches);
    if (!std::isfinite(v)) fail("correlation study: the validation loss is ", v, " (training diverged)");
    return {v, train_sum / double(o.steps)};
  };
  auto t0 = clock::now();
  std::vector<double> base_train;
  for (int64_t r = 0; r < o.repeats; ++r) {
    const auto [v, t] = run_arm(nullptr, r);
    res.base_val_losses.push_back(v);
    base_train.push_back(t);
  }
  res.base_val_loss = summarize(res.base_val_losses).mean;
  res.base_train_loss = summarize(base_train).mean;
  if (!o.quiet)
    spdlog::info("baseline (unquantized, {} steps from step {}, {} repeat{}): val {:.5f}, train {:.5f} ({:.1f} s per arm)",
                 o.steps, step0, o.repeats, o.repeats == 1 ? "" : "s", res.base_val_loss, res.base_train_loss,
                 std::chrono::duration<double>(clock::now() - t0).count() / double(o.repeats));
  for (size_t i = 0; i < studied.size(); ++i) {
    QuantLinear& l = studied[i];
    CorrelationLayer cl;
    cl.name = l->name;
    const LayerStats* ls = nullptr;
    for (const auto& x : pred.layers)
      if (x.name == l->name) ls = &x;
    SNIP_CHECK(ls, "no stats for ", l->name);
    const OptionStats& os = ls->options.at(o.option);
    cl.q = os.q, cl.ld = os.ld, cl.wd = os.wd_own + os.wd_upstream;
    cl.ld_first_order = os.ld_first_order, cl.ld_curvature = os.ld_curvature, cl.wd_own = os.wd_own, cl.wd_upstream = os.wd_upstream;
    cl.rel_err_fprop = os.rel_err[Gemm::kFprop];
    std::vector<double> vals, trains, dts;
    for (int64_t r = 0; r < o.repeats; ++r) {
      const auto [v, t] = run_arm(&l, r);
      vals.push_back(v);
      trains.push_back(t);
      cl.delta_val_repeats.push_back(v - res.base_val_losses[size_t(r)]);
      dts.push_back(t - base_train[size_t(r)]);
    }
    cl.val_loss = summarize(vals).mean;
    cl.train_loss = summarize(trains).mean;
    const SampleSummary dv = summarize(cl.delta_val_repeats), dt = summarize(dts);
    cl.delta_val = dv.mean;
    cl.delta_train = dt.mean;
    cl.delta_val_se = dv.se();
    cl.delta_train_se = dt.se();
    if (!o.quiet)
      spdlog::info("[{}/{}] {}: Q {:.4g}  measured dval {:+.5f}{} dtrain {:+.5f}", i + 1, studied.size(), cl.name,
                   cl.q, cl.delta_val, o.repeats > 1 ? fmt::format(" (se {:.5f})", cl.delta_val_se) : std::string(),
                   cl.delta_train);
    res.layers.push_back(cl);
  }
  model->set_precision(LinearPrecision{nullptr, gemm});

  // Correlations.
  std::vector<double> dv, dt;
  for (const auto& cl : res.layers) dv.push_back(cl.delta_val), dt.push_back(cl.delta_train);
  for (const auto& name : predictor_names()) {
    const std::vector<double> x = predictor_values(res, name);
    res.correlations[name] = {{"pearson", pearson(x, dv)}, {"spearman", spearman(x, dv)}};
    res.correlations[name + "/train"] = {{"pearson", pearson(x, dt)}, {"spearman", spearman(x, dt)}};
  }
  if (o.repeats >= 2) add_bootstrap_intervals(res);
  res.seconds = std::chrono::duration<double>(clock::now() - t_start).count();

  if (!o.out_dir.empty()) {
    io::ensure_writable_dir(o.out_dir);
    json j = to_json(res);
    j["run"] = o.run_dir;
    j["checkpoint"] = ckpt;
    io::write_file_atomic((fs::path(o.out_dir) / "correlation.json").string(), j.dump(2) + "\n");
    std::ostringstream csv;
    csv << "layer,q,ld,wd,ld_first_order,ld_curvature,wd_own,wd_upstream,rel_err_fprop,val_loss,train_loss,delta_val,"
           "delta_train,delta_val_se,delta_train_se";
    for (int64_t r = 0; r < res.repeats; ++r) csv << ",delta_val_r" << r;
    csv << "\n";
    csv.precision(10);
    for (const auto& c : res.layers) {
      csv << c.name << "," << c.q << "," << c.ld << "," << c.wd << "," << c.ld_first_order << "," << c.ld_curvature << ","
          << c.wd_own << "," << c.wd_upstream << "," << c.rel_err_fprop << "," << c.val_loss << "," << c.train_loss << ","
          << c.delta_val << "," << c.delta_train << "," << c.delta_val_se << "," << c.delta_train_se;
      for (double d : c.delta_val_repeats) csv << "," << d;
      csv << "\n";
    }
    io::write_file_atomic((fs::path(o.out_dir) / "correlation.csv").string(), csv.str());
  }
  return res;
}

std::vector<std::string> predictor_names() {
  std::vector<std::string> names = {"q", "ld", "wd", "wd_own", "rel_err_fprop"};
  for (const std::string fo : {"abs", "signed", "drop"}) {
    names.push_back("ld[" + fo + "]");
    for (const char* a : {"0", "0.25", "0.5", "0.75", "1"}) names.push_back("q[" + fo + ",a=" + a + "]");
  }
  return names;
}

void add_bootstrap_intervals(CorrelationResult& r) {
  std::vector<double> dv;
  for (const auto& c : r.layers) dv.push_back(c.delta_val);
  for (const auto& name : predictor_names()) {
    const std::vector<double> x = predictor_values(r, name);
    const BootstrapInterval p = bootstrap_interval(x, dv, pearson), s = bootstrap_interval(x, dv, spearman);
    auto& m = r.correlations[name];
    m["pearson"] = p.value;
    m["spearman"] = s.value;
    m["pearson_lo"] = p.lo, m["pearson_hi"] = p.hi, m["spearman_lo"] = s.lo, m["spearman_hi"] = s.hi;
  }
}

std::vector<double> predictor_values(const CorrelationResult& r, const std::string& name) {
  std::vector<double> v;
  auto col = [&](double CorrelationLayer::*f) {
    for (const auto& c : r.layers) v.push_back(c.*f);
    return v;
  };
  if (name == "q") return col(&CorrelationLayer::q);
  if (name == "ld") return col(&CorrelationLayer::ld);
  if (name == "wd") return col(&CorrelationLayer::wd);
  if (name == "wd_own") return col(&CorrelationLayer::wd_own);
  if (name == "rel_err_fprop") return col(&CorrelationLayer::rel_err_fprop);
  std::smatch m;
  static const std::regex re(R"((ld|q)\[(abs|signed|drop)(,a=([0-9.]+))?\])");
  if (!std::regex_match(name, m, re) || (m[1] == "q") != m[3].matched)
    fail("--predictor: unknown predictor '", name, "' (expected q, ld, wd, wd_own, rel_err_fprop, ld[abs|signed|drop] "
         "or q[drop,a=0.5])");
  const std::string fo = m[2];
  std::vector<double> ld, wd;
  for (const auto& c : r.layers) {
    const double F = fo == "abs" ? std::abs(c.ld_first_order) : fo == "signed" ? c.ld_first_order : 0.0;
    ld.push_back(std::max(0.0, F + c.ld_curvature));
    wd.push_back(c.wd);
  }
  if (m[1] == "ld") return ld;
  const double a = std::stod(m[4]);
  if (!(a >= 0 && a <= 1)) fail("--predictor: alpha must be in [0, 1], got ", a);
  const double ls = std::accumulate(ld.begin(), ld.end(), 0.0), ws = std::accumulate(wd.begin(), wd.end(), 0.0);
  for (size_t i = 0; i < ld.size(); ++i)
    v.push_back(a * (ls > 0 ? ld[i] / ls : ld[i]) + (1 - a) * (ws > 0 ? wd[i] / ws : wd[i]));
  return v;
}

CorrelationResult correlation_from_json(const json& j, const std::string& what) {
  CorrelationResult r;
  try {
    r.step = j.at("step").get<int64_t>();
    r.steps = j.at("steps").get<int64_t>();
    r.option = j.at("option").get<std::string>();
    r.base_val_loss = j.at("base_val_loss").get<double>();
    r.base_train_loss = j.at("base_train_loss").get<double>();
    r.repeats = j.value("repeats", int64_t{1});
    r.base_val_losses = j.contains("base_val_losses") ? j.at("base_val_losses").get<std::vector<double>>()
                                                      : std::vector<double>{r.base_val_loss};
    for (const json& l : j.at("layers")) {
      CorrelationLayer c;
      c.name = l.at("name").get<std::string>();
      for (auto [k, f] : std::initializer_list<std::pair<const char*, double CorrelationLayer::*>>{
               {"q", &CorrelationLayer::q}, {"ld", &CorrelationLayer::ld}, {"wd", &CorrelationLayer::wd},
               {"ld_first", &CorrelationLayer::ld_first_order}, {"ld_second", &CorrelationLayer::ld_curvature},
               {"wd_own", &CorrelationLayer::wd_own}, {"wd_up", &CorrelationLayer::wd_upstream},
               {"rel_err_fprop", &CorrelationLayer::rel_err_fprop}, {"val_loss", &CorrelationLayer::val_loss},
               {"train_loss", &CorrelationLayer::train_loss}, {"delta_val", &CorrelationLayer::delta_val},
               {"delta_train", &CorrelationLayer::delta_train}})
        c.*f = l.at(k).get<double>();
      // Written since --repeats exists; older files have one repeat.
      for (auto [k, f] : std::initializer_list<std::pair<const char*, double CorrelationLayer::*>>{
               {"delta_val_se", &CorrelationLayer::delta_val_se}, {"delta_train_se", &CorrelationLayer::delta_train_se}})
        if (l.contains(k) && l.at(k).is_number()) c.*f = l.at(k).get<double>();
      if (l.contains("delta_val_repeats")) c.delta_val_repeats = l.at("delta_val_repeats").get<std::vector<double>>();
      else c.delta_val_repeats = {c.delta_val};
      r.layers.push_back(c);
    }
  } catch (const json::exception& e) {
    fail(what, ": expected a correlation.json written by `snip correlate` (", e.what(), ")");
  }
  return r;
}

json to_json(const CorrelationResult& r) {
  json layers = json::array();
  for (const auto& c : r.layers)
    layers.push_back({{"name", c.name}, {"q", c.q}, {"ld", c.ld}, {"wd", c.wd}, {"ld_first", c.ld_first_order},
                      {"ld_second", c.ld_curvature}, {"wd_own", c.wd_own}, {"wd_up", c.wd_upstream},
                      {"rel_err_fprop", c.rel_err_fprop}, {"val_loss", c.val_loss}, {"train_loss", c.train_loss},
                      {"delta_val", c.delta_val}, {"delta_train", c.delta_train},
                      {"delta_val_se", std::isfinite(c.delta_val_se) ? json(c.delta_val_se) : json(nullptr)},
                      {"delta_train_se", std::isfinite(c.delta_train_se) ? json(c.delta_train_se) : json(nullptr)},
                      {"delta_val_repeats", c.delta_val_repeats}});
  json corr = json::object();
  for (const auto& [k, m] : r.correlations)
    for (const auto& [kk, v] : m) corr[k][kk] = std::isfinite(v) ? json(v) : json(nullptr);
  return {{"step", r.step}, {"steps", r.steps}, {"option", r.option}, {"repeats", r.repeats},
          {"base_val_losses", r.base_val_losses}, {"base_val_loss", r.base_val_loss},
          {"base_train_loss", r.base_train_loss}, {"layers", layers}, {"correlations", corr},
          {"seconds", r.seconds}};
}

}  // namespace snip
