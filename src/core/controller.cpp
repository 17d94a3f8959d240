// The precision controller: schedule, stats steps, planning and applying
// plans inside the training loop (see controller.h).
#include "snip/core/controller.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <sstream>

#include "snip/core/quantizers.h"
#include "snip/io/atomic_file.h"
#include "snip/policy/cost_table.h"
#include "snip/util/error.h"

namespace snip {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const char* kReference = "bf16";

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream is(s);
  while (std::getline(is, cur, ',')) {
    const auto b = cur.find_first_not_of(" \t"), e = cur.find_last_not_of(" \t");
    if (b != std::string::npos) out.push_back(cur.substr(b, e - b + 1));
  }
  return out;
}

bool is_heuristic_policy(const std::string& p) {
  return p == "min-rel-err" || p == "layer-type" || p == "first-last-fp8" || p == "random";
}

bool is_uniform_policy(const std::string& p) { return p.rfind("uniform-", 0) == 0 && p.size() > 8; }

bool needs_stats(const std::string& p) { return p == "snip" || p == "min-rel-err"; }

// Per-GEMM precision of one layer: the quantizer of the option chosen for the
// GEMM an operand belongs to (fprop.x/w -> fprop, dgrad.dy/w -> dgrad,
// wgrad.dy/x -> wgrad; Operand's order, linear.h). nullptr = identity.
class PerGemmQuantizer : public OperandQuantizer {
 public:
  PerGemmQuantizer(std::array<std::shared_ptr<const OperandQuantizer>, 3> q, std::string name)
      : q_(std::move(q)), name_(std::move(name)) {}
  torch::Tensor quantize(const torch::Tensor& t, const QuantKey& key) const override {
    const auto& q = q_[size_t(int(key.operand) / 2)];
    return q ? q->quantize(t, key) : t;
  }
  std::string name() const override { return name_; }

 private:
  std::array<std::shared_ptr<const OperandQuantizer>, 3> q_;
  std::string name_;
};

double fraction(const Config& cfg, const char* key) {
  const double v = cfg.get_float(key);
  if (!(v >= 0 && v <= 1)) fail("config: ", key, ": expected a fraction in [0, 1], got ", v);
  return v;
}

}  // namespace

// ---------------------------------------------------------------------------
// Schedule

PrecisionSchedule PrecisionSchedule::from_config(const Config& cfg) {
  PrecisionSchedule s;
  s.max_steps = cfg.get_int("train.max_steps");
  const double N = double(s.max_steps);
  const int64_t ws = cfg.get_int("precision.warmup_steps");
  if (ws < -1) fail("config: precision.warmup_steps: expected -1 (use warmup_fraction) or >= 0, got ", ws);
  s.warmup_end = ws >= 0 ? ws : std::llround(fraction(cfg, "precision.warmup_fraction") * N);
  auto interval = [&](const char* key, const char* frac_key) {
    const int64_t v = cfg.get_int(key);
    if (v == -1) {
      const double f = fraction(cfg, frac_key);
      if (!(f > 0)) fail("config: ", frac_key, ": expected a fraction in (0, 1], got ", f);
      return f * N;
    }
    if (v < 1) fail("config: ", key, ": expected -1 (use ", frac_key, ") or >= 1 steps, got ", v);
    return double(v);
  };
  s.initial_interval = interval("precision.initial_interval", "precision.initial_interval_fraction");
  s.final_interval = interval("precision.final_interval", "precision.final_interval_fraction");
  s.final_start =
      s.max_steps - std::llround(fraction(cfg, "precision.final_high_precision_fraction") * N);
  return s;
}

int64_t PrecisionSchedule::interval_at(int64_t s) const {
  const double N = std::max<double>(1.0, double(max_steps));
  const double v = initial_interval + (final_interval - initial_interval) * double(s) / N;
  return std::max<int64_t>(1, std::llround(v));
}

std::vector<int64_t> PrecisionSchedule::plan_steps() const {
  std::vector<int64_t> out;
  for (int64_t s = warmup_end; s < final_start && s < max_steps; s += interval_at(s)) out.push_back(s);
  return out;
}

std::string PrecisionSchedule::phase_at(int64_t s) const {
  if (s >= final_start) return "final";
  if (s < warmup_end) return "warmup";
  return "plan";
}

// ---------------------------------------------------------------------------
// Controller

PrecisionController::PrecisionController(const Config& cfg, std::vector<QuantLinear> layers,
                                         at::ScalarType gemm_dtype)
    : layers_(std::move(layers)), gemm_dtype_(gemm_dtype) {
  policy_ = cfg.get_string("precision.policy");
  const std::string recipe = cfg.get_string("precision.recipe");
  // Checked for every policy, so a run's config.toml never carries a value a
  // later resume or `snip correlate` would reject.
  const std::string gran = cfg.get_string("precision.granularity");
  if (gran == "layer") gran_ = policy::Granularity::layer;
  else if (gran == "gemm") gran_ = policy::Granularity::gemm;
  else fail("config: precision.granularity: expected layer or gemm, got '", gran, "'");
  first_order_ = cfg.get_string("precision.first_order");
  if (first_order_ != "abs" && first_order_ != "signed" && first_order_ != "drop")
    fail("config: precision.first_order: expected abs, signed or drop, got '", first_order_, "'");
  probes_ = cfg.get_int("precision.curvature_probes");
  if (probes_ < 0 || probes_ > 64)
    fail("config: precision.curvature_probes: expected 0..64 probes, got ", probes_);
  stats_seed_ = uint64_t(cfg.get_int("train.seed"));
  warmup_precision_ = cfg.get_string("precision.warmup_precision");
  final_precision_ = cfg.get_string("precision.final_precision");
  low_ = cfg.get_string("precision.low_option");
  if (low_.empty() || low_ == kReference)
    fail("config: precision.low_option: expected the name of a quantizing option (e.g. fp4, mxfp4), got '", low_, "'");
  if (policy_ == "bf16") return;  // inactive: the trainer applies precision.recipe (or nothing)
  if (policy_ != "snip" && !is_heuristic_policy(policy_) && !is_uniform_policy(policy_))
    fail("config: precision.policy: expected bf16, uniform-<option> (e.g. uniform-fp8), snip, min-rel-err, "
         "layer-type, first-last-fp8 or random, got '", policy_, "'");
  if (recipe != "none" && !recipe.empty())
    fail("config: precision.recipe = '", recipe, "' applies one recipe to every layer and cannot be combined "
         "with precision.policy = '", policy_, "'; set precision.recipe = \"none\" (or use policy uniform-",
         recipe, ")");
  active_ = true;
  SNIP_CHECK(!layers_.empty(), "no quantizable layers");
  sched_ = PrecisionSchedule::from_config(cfg);
  for (int64_t p : sched_.plan_steps()) plan_steps_.insert(p);
  budget_ = cfg.get_float("precision.budget");
  smoothing_ = fraction(cfg, "precision.smoothing");
  alpha_ = fraction(cfg, "precision.alpha");
  seed_ = uint64_t(cfg.get_int("precision.seed"));
  options_ = split_list(cfg.get_string("precision.options"));
  if (options_.empty()) fail("config: precision.options: expected a comma-separated list of options, got none");
  {
    std::set<std::string> seen;
    for (const auto& o : options_)
      if (!seen.insert(o).second) fail("config: precision.options: expected unique names, got '", o, "' twice");
    if (!is_uniform_policy(policy_) && !seen.count(low_))
      fail("config: precision.options: expected a list containing ", low_,
           " (precision.low_option, the option the budget counts), got '",
           cfg.get_string("precision.options"), "'");
  }
  // One quantizer per option (UserError for an unknown recipe name).
  auto add = [&](const std::string& name, const char* key) {
    if (quant_.count(name)) return;
    if (name == kReference) {
      quant_[name] = nullptr;
      return;
    }
    try {
      quant_[name] = make_recipe_quantizer(name);
    } catch (const UserError& e) {
      std::string m = e.what();
      const std::string pre = "precision.recipe: ";
      if (m.rfind(pre, 0) == 0) m = m.substr(pre.size());
      fail("config: ", key, ": option '", name, "': ", m);
    }
    if (!quant_[name]) fail("config: ", key, ": expected an option name, got '", name, "'");
  };
  for (const auto& o : options_) add(o, "precision.options");
  add(warmup_precision_, "precision.warmup_precision");
  add(final_precision_, "precision.final_precision");
  if (is_uniform_policy(policy_)) add(policy_.substr(8), "precision.policy");
  add(kReference, "precision.options");
  for (const auto& p : split_list(cfg.get_string("precision.pins"))) {
    try {
      pins_.push_back(policy::parse_pin(p));
    } catch (const UserError& e) {
      fail("config: precision.pins: ", e.what());
    }
  }
  // Everything the planner can check on the layer list alone (pins that match
  // nothing, conflicting pins, options, budget feasibility): run the very
  // decision a plan step will make, on placeholder Q values.
  policy::PlanProblem prob = shape_problem();
  if (policy_ == "snip") {
    policy::plan(prob, plan_options(true));
  } else {
    policy::PlanOptions o = plan_options(true);
    if (is_uniform_policy(policy_)) o.allowed_options.clear();
    policy::run_heuristic(policy_, prob, o, seed_);
  }
}

void PrecisionController::set_output(const std::string& run_dir, bool verbose) {
  run_dir_ = run_dir;
  verbose_ = verbose;
}

std::shared_ptr<const OperandQuantizer> PrecisionController::quantizer(const std::string& option) const {
  auto it = quant_.find(option);
  SNIP_CHECK(it != quant_.end(), "no quantizer for option ", option);
  return it->second;
}

// Items with FLOPs 6·in·out per token (per step up to a common factor, which
// shares ignore) and placeholder Q (1 at the low option, 0 elsewhere) for
// every option the controller knows.
policy::PlanProblem PrecisionController::shape_problem() const {
  policy::PlanProblem p;
  p.granularity = gran_;
  for (const auto& l : layers_) {
    policy::PlanItem it;
    it.name = it.layer = l->name;
    it.flops = 6.0 * double(l->in_features) * double(l->out_features);
    for (const auto& kv : quant_) it.q[kv.first] = kv.first == low_ ? 1.0 : 0.0;
    it.rel_err[low_] = 1.0;
    if (gran_ == policy::Granularity::layer) {
      p.items.push_back(std::move(it));
      continue;
    }
    for (const char* g : policy::kGemmNames) {
      policy::PlanItem gi = it;
      gi.name = l->name + ":" + g;
      gi.gemm = g;
      gi.flops = it.flops / 3.0;
      p.items.push_back(std::move(gi));
    }
  }
  return p;
}

policy::PlanOptions PrecisionController::plan_options(bool with_pins) const {
  policy::PlanOptions o;
  o.budget = policy::Budget::share(budget_);
  o.low_option = low_;
  o.allowed_options = options_;
  if (with_pins) o.pins = pins_;
  return o;
}

std::vector<std::string> PrecisionController::item_names() const {
  std::vector<std::string> out;
  for (const auto& l : layers_) {
    if (gran_ == policy::Granularity::layer) out.push_back(l->name);
    else
      for (const char* g : policy::kGemmNames) out.push_back(l->name + ":" + g);
  }
  return out;
}

std::array<std::string, 3> PrecisionController::layer_options(const std::map<std::string, std::string>& assign,
                                                              const std::string& layer) const {
  std::array<std::string, 3> o;
  for (int g = 0; g < 3; ++g) {
    const std::string key = gran_ == policy::Granularity::layer ? layer : layer + ":" + policy::kGemmNames[g];
    auto it = assign.find(key);
    SNIP_CHECK(it != assign.end(), "plan has no option for ", key);
    o[size_t(g)] = it->second;
  }
  return o;
}

void PrecisionController::apply(const std::map<std::string, std::string>& assign) {
  for (auto& l : layers_) {
    const std::array<std::string, 3> o = layer_options(assign, l->name);
    std::shared_ptr<const OperandQuantizer> q;
    if (o[0] == o[1] && o[1] == o[2]) {
      q = quantizer(o[0]);
    } else {  // per-GEMM options differ: one composite per distinct triple
      const std::string key = o[0] + "/" + o[1] + "/" + o[2];
      auto it = per_gemm_quant_.find(key);
      if (it == per_gemm_quant_.end())
        it = per_gemm_quant_
                 .emplace(key, std::make_shared<PerGemmQuantizer>(
                                   std::array<std::shared_ptr<const OperandQuantizer>, 3>{
                                       quantizer(o[0]), quantizer(o[1]), quantizer(o[2])},
                                   key))
                 .first;
      q = it->second;
    }
    l->precision = LinearPrecision{q, gemm_dtype_};
  }
  assign_ = assign;
}

double PrecisionController::fp4_share() const {
  if (assign_.empty()) return 0.0;
  double low = 0, total = 0;
  for (const auto& l : layers_) {
    const double f = double(l->in_features) * double(l->out_features);
    total += f;
    int n = 0;  // GEMMs of this layer at the low option (a third of its FLOPs each)
    for (const std::string& o : layer_options(assign_, l->name)) n += o == low_;
    low += f * double(n) / 3.0;
  }
  return total > 0 ? low / total : 0.0;
}

PrecisionEvent PrecisionController::begin_step(int64_t s, const std::function<torch::Tensor()>& loss_fn,
                                               torch::optim::AdamW& opt) {
  PrecisionEvent ev;
  if (!active_) return ev;
  const std::string ph = sched_.phase_at(s);
  const bool need = ph == "plan" ? (plan_steps_.count(s) > 0 || phase_ != "plan") : phase_ != ph;
  if (need) decide(s, ph, loss_fn, opt, ev);
  return ev;
}

void PrecisionController::decide(int64_t s, const std::string& phase,
                                 const std::function<torch::Tensor()>& loss_fn, torch::optim::AdamW& opt,
                                 PrecisionEvent& ev) {
  using clock = std::chrono::steady_clock;
  policy::PlanResult r;
  policy::PlanProblem prob;
  StatsStep fresh;
  bool have_stats = false;
  double stats_s = 0;
  if (phase != "plan") {
    prob = shape_problem();
    policy::PlanOptions o = plan_options(false);  // "every layer": pins do not apply
    o.allowed_options.clear();
    r = policy::heuristic_uniform(prob, o, phase == "warmup" ? warmup_precision_ : final_precision_);
  } else if (needs_stats(policy_)) {
    const auto t0 = clock::now();
    StatsOptions so;
    so.options.clear();
    for (const auto& o : options_)
      if (o != kReference) so.options.push_back(o);
    so.low_option = low_;
    so.reference = kReference;
    so.alpha = alpha_;
    so.seed = stats_seed_;
    so.first_order = first_order_;
    so.curvature_probes = int(probes_);
    fresh = measure(layers_, loss_fn, opt, so, s);
    smooth(smoothed_, fresh, smoothing_);
    smoothed_.step = s;
    have_stats = true;
    stats_s = std::chrono::duration<double>(clock::now() - t0).count();
    if (!run_dir_.empty()) {
      fs::create_directories(fs::path(run_dir_) / "stats");
      const bool pg = gran_ == policy::Granularity::gemm;
      json j = to_json(smoothed_, pg);
      j["smoothing"] = smoothing_;
      j["measured"] = to_json(fresh, pg);
      policy::save_json_atomic(j, (fs::path(run_dir_) / "stats" / ("step-" + std::to_string(s) + ".json")).string());
    }
    prob = to_plan_problem(smoothed_, gran_);
    const policy::PlanOptions o = plan_options(true);
    try {
      r = policy_ == "snip" ? policy::plan(prob, o) : policy::run_heuristic(policy_, prob, o, seed_);
    } catch (const UserError& e) {
      fail("precision plan at step ", s, ": ", e.what());
    }
  } else {
    prob = shape_problem();
    policy::PlanOptions o = plan_options(true);
    if (is_uniform_policy(policy_)) o.allowed_options.clear();
    r = policy::run_heuristic(policy_, prob, o, seed_);
  }
  for (const std::string& w : r.warnings) spdlog::warn("precision plan at step {}: {}", s, w);
  apply(r.assignments());
  phase_ = phase;
  decided_at_ = s;

  json pj = policy::plan_to_json(r);
  pj["step"] = s;
  pj["policy"] = policy_;
  pj["phase"] = phase;
  json rel_chosen = json::object();
  if (have_stats) {
    json qt = json::object(), rel = json::object();
    for (const auto& it : prob.items) qt[it.name] = it.q;
    for (const LayerStats& ls : fresh.layers) {
      json m = json::object();
      for (const auto& [name, os] : ls.options) m[name] = os.rel_err[kStatsFprop];
      m[kReference] = 0.0;
      rel[ls.name] = m;
      const std::string& chosen = layer_options(assign_, ls.name)[kStatsFprop];
      if (m.contains(chosen)) rel_chosen[ls.name] = m[chosen];
    }
    pj["q_table"] = std::move(qt);
    pj["rel_err_fprop"] = std::move(rel);
    pj["stats_seconds"] = stats_s;
  }
  if (!run_dir_.empty()) {
    fs::create_directories(fs::path(run_dir_) / "plans");
    policy::save_json_atomic(pj, (fs::path(run_dir_) / "plans" / ("step-" + std::to_string(s) + ".json")).string());
  }
  if (verbose_) {
    if (phase == "plan")
      std::fprintf(stderr, "\n%s", format_plan_table(pj).c_str());
    else  // every layer at one option: one line instead of the table
      std::fprintf(stderr, "\nprecision at step %ld: %s phase, every layer %s (FP4 share %.4f)\n", long(s),
                   phase.c_str(), phase == "warmup" ? warmup_precision_.c_str() : final_precision_.c_str(),
                   r.fp4_share);
  }

  ev.decided = true;
  json prec = json::object();
  for (const std::string& n : item_names()) prec[n] = assign_.at(n);
  ev.metrics["precision"] = std::move(prec);
  ev.metrics["plan_step"] = s;
  ev.metrics["phase"] = phase;
  if (have_stats) ev.metrics["rel_err_fprop"] = std::move(rel_chosen);
}

json PrecisionController::state() const {
  json st = {{"policy", policy_}, {"phase", phase_}, {"decided_at", decided_at_},
             {"assignments", assign_}};
  st["smoothed"] = smoothed_.layers.empty() ? json(nullptr) : to_json(smoothed_);
  return st;
}

void PrecisionController::restore(const json& st, const std::string& what) {
  if (!active_) return;
  try {
    if (st.at("policy").get<std::string>() != policy_) {
      spdlog::warn("{}: precision state is for policy '{}', the configuration says '{}': planning afresh", what,
                   st.at("policy").get<std::string>(), policy_);
      return;
    }
    phase_ = st.at("phase").get<std::string>();
    decided_at_ = st.at("decided_at").get<int64_t>();
    const auto assign = st.at("assignments").get<std::map<std::string, std::string>>();
    smoothed_ = st.at("smoothed").is_null() ? StatsStep{} : stats_from_json(st.at("smoothed"), what + ": smoothed");
    if (!phase_.empty()) {
      for (const std::string& n : item_names())
        if (!assign.count(n))
          fail(what, ": precision.assignments: no option for '", n, "' (precision.granularity changed?)");
      for (const auto& kv : assign)
        if (!quant_.count(kv.second))
          fail(what, ": precision.assignments: layer '", kv.first, "': option '", kv.second,
               "' is not among the configured options");
      apply(assign);
    }
  } catch (const json::exception& e) {
    fail(what, ": malformed precision state (", e.what(), ")");
  }
}

// ---------------------------------------------------------------------------
// StatsStep from JSON

StatsStep stats_from_json(const json& j, const std::string& what) {
  StatsStep s;
  try {
    s.step = j.at("step").get<int64_t>();
    const json& d = j.at("details");
    s.options = d.at("options").get<std::vector<std::string>>();
    s.low_option = d.at("low_option").get<std::string>();
    s.reference = d.at("reference").get<std::string>();
    s.first_order = d.at("first_order").get<std::string>();
    s.alpha = d.at("alpha").get<double>();
    s.ld_sum_low = d.at("ld_sum_low").get<double>();
    s.wd_sum_low = d.at("wd_sum_low").get<double>();
    s.ranks = d.at("ranks").get<int64_t>();
    for (const json& l : d.at("layers")) {
      LayerStats ls;
      ls.name = l.at("name").get<std::string>();
      ls.layer_index = l.at("layer_index").get<int64_t>();
      ls.tokens = l.at("tokens").get<int64_t>();
      ls.in_features = l.at("in_features").get<int64_t>();
      ls.out_features = l.at("out_features").get<int64_t>();
      ls.gemm_flops = l.at("gemm_flops").get<double>();
      ls.curvature = l.at("curvature").get<double>();
      ls.up_sensitivity = l.at("up_sensitivity").get<double>();
      ls.n_upstream = l.at("n_upstream").get<int>();
      for (const auto& [name, o] : l.at("options").items()) {
        OptionStats os;
        os.ld = o.at("ld").get<double>();
        os.ld_first = o.at("ld_first").get<double>();
        os.ld_second = o.at("ld_second").get<double>();
        os.wd_own = o.at("wd_own").get<double>();
        os.wd_up = o.at("wd_up").get<double>();
        os.q = o.at("q").get<double>();
        const json& re = o.at("rel_err");
        os.rel_err = {re.at("fprop").get<double>(), re.at("dgrad").get<double>(), re.at("wgrad").get<double>()};
        ls.options[name] = os;
      }
      for (const auto& p : s.options)
        if (!ls.options.count(p)) fail(what, ": layer '", ls.name, "': expected stats for option '", p, "'");
      s.layers.push_back(std::move(ls));
    }
  } catch (const json::exception& e) {
    fail(what, ": malformed stats JSON (", e.what(), ")");
  }
  return s;
}

}  // namespace snip
