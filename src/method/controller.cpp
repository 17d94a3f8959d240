// The precision controller: schedule, stats steps, planning and applying
// plans inside the training loop (see controller.h).
#include "snip/method/controller.h"

#include "snip/dist/broadcast_text.h"

#include "snip/plan/plan_file.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <regex>
#include <sstream>

#include "snip/model/quantizers.h"
#include "snip/io/atomic_file.h"
#include "snip/model/matmul.h"
#include "snip/plan/cost_table.h"
#include "snip/recipes/recipe.h"
#include "snip/io/json.h"
#include "snip/run/checkpoint_files.h"
#include "snip/core/error.h"
#include "snip/core/kill_point.h"

namespace snip {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const char* kReference = "bf16";


std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}

// A recipe whose fprop operands are 4-bit elements (E2M1, E1M2, INT4, ...).
bool is_4bit_option(const recipes::RecipeSet& recipes, const std::string& name) {
  return name != kReference && recipes.find(name)[Operand::kFpropX].element.bits <= 4;
}

// Per-GEMM precision of one layer: the quantizer of the option chosen for the
// GEMM an operand belongs to (fprop.x/w -> fprop, dgrad.dy/w -> dgrad,
// wgrad.dy/x -> wgrad; Operand's order, linear.h). nullptr = identity.
class PerGemmQuantizer : public OperandQuantizer {
 public:
  PerGemmQuantizer(PerGemm<std::shared_ptr<const OperandQuantizer>> q, std::string name)
      : q_(std::move(q)), name_(std::move(name)) {}
  torch::Tensor quantize(const torch::Tensor& t, const QuantKey& key) const override {
    const auto& q = q_[gemm_of(key.operand)];
    return q ? q->quantize(t, key) : t;
  }
  torch::Tensor quantize_for_gemm(const torch::Tensor& t, const QuantKey& key,
                                  at::ScalarType gemm_dtype) const override {
    const auto& q = q_[gemm_of(key.operand)];
    return q ? q->quantize_for_gemm(t, key, gemm_dtype) : gemm_operand(t, gemm_dtype);
  }
  std::string name() const override { return name_; }

 private:
  PerGemm<std::shared_ptr<const OperandQuantizer>> q_;
  std::string name_;
};

// What a plan-phase re-plan at step `s` changed, for the log: one line with
// the count and the FP4 share, then up to kShown "  item: old -> new" lines
// (the rest counted; the whole plan is in run_dir/plans/step-S.json).
std::string format_plan_changes(int64_t s, const std::map<PlanKey, std::string>& before,
                                const std::map<PlanKey, std::string>& after, double fp4_share,
                                const std::string& run_dir) {
  constexpr size_t kShown = 12;
  std::vector<std::string> lines;
  for (const auto& [item, option] : after) {
    const auto it = before.find(item);
    const std::string was = it == before.end() ? "-" : it->second;
    if (was != option) lines.push_back(fmt::format("  {}: {} -> {}\n", item.str(), was, option));
  }
  std::string out = fmt::format("precision at step {}: re-plan changed {} of {} items (FP4 share {:.4f}){}\n", s,
                                lines.size(), after.size(), fp4_share,
                                run_dir.empty() ? "" : fmt::format("; the whole plan: snip plan show {} --step {}",
                                                                   run_dir, s));
  for (size_t i = 0; i < lines.size() && i < kShown; ++i) out += lines[i];
  if (lines.size() > kShown) out += fmt::format("  ... and {} more\n", lines.size() - kShown);
  return out;
}

}  // namespace

std::string resolve_precision_alias(Config& cfg, const recipes::RecipeSet& recipes) {
  const std::string recipe = cfg.get_string("precision.recipe");
  if (recipe.empty()) cfg.set("precision.recipe", std::string("none"), "precision.recipe");  // "" means none
  if (recipe.empty() || recipe == "none" || cfg.get_string("precision.policy") != "none") return "";
  const std::string what = "precision.recipe = '" + recipe + "'";
  cfg.set("precision.recipe", std::string("none"), what);
  if (recipe == kReference) return what + " is read as precision.policy = 'none' (nothing quantized)";
  make_recipe_quantizer(recipes, recipe);  // UserError "precision.recipe: unknown recipe ..."
  std::string note = what + " is read as precision.policy = 'uniform-" + recipe + "'";
  cfg.set("precision.policy", "uniform-" + recipe, what);
  // Every layer, every step, as the recipe always ran: no warmup, no final phase.
  for (const auto& [key, value] : std::initializer_list<std::pair<const char*, OptionValue>>{
           {"precision.warmup_steps", int64_t{0}}, {"precision.final_high_precision_fraction", 0.0}})
    if (!cfg.values().count(key)) {
      cfg.set(key, value, what);
      note += std::string(", ") + key + " = " + format_option_value(value);
    }
  return note;
}

// ---------------------------------------------------------------------------
// Schedule

PrecisionSchedule PrecisionSchedule::from_config(const RunConfig& rc) {
  const PrecisionConfig& p = rc.precision;
  PrecisionSchedule s;
  s.max_steps = rc.train.max_steps;
  const double N = double(s.max_steps);
  s.warmup_end = p.warmup_steps >= 0 ? p.warmup_steps : std::llround(p.warmup_fraction * N);
  auto interval = [&](int64_t v, double f, const char* key, const char* frac_key) {
    if (v == -1) {
      if (!(f > 0)) fail("config: ", frac_key, ": expected a fraction in (0, 1], got ", f);
      return f * N;
    }
    if (v < 1) fail("config: ", key, ": expected -1 (use ", frac_key, ") or >= 1 steps, got ", v);
    return double(v);
  };
  s.initial_interval = interval(p.initial_interval, p.initial_interval_fraction, "precision.initial_interval",
                                "precision.initial_interval_fraction");
  s.final_interval = interval(p.final_interval, p.final_interval_fraction, "precision.final_interval",
                              "precision.final_interval_fraction");
  s.final_start = s.max_steps - std::llround(p.final_high_precision_fraction * N);
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

Phase PrecisionSchedule::phase_at(int64_t s) const {
  if (s >= final_start) return Phase::kFinal;
  if (s < warmup_end) return Phase::kWarmup;
  return Phase::kPlan;
}

const char* to_string(Phase p) {
  switch (p) {
    case Phase::kNone: return "";
    case Phase::kWarmup: return "warmup";
    case Phase::kPlan: return "plan";
    case Phase::kFinal: return "final";
  }
  return "?";
}

Phase parse_phase(const std::string& s, const std::string& what) {
  for (Phase p : {Phase::kNone, Phase::kWarmup, Phase::kPlan, Phase::kFinal})
    if (s == to_string(p)) return p;
  fail(what, ": expected a phase (warmup, plan or final), got '", s, "'");
}

// ---------------------------------------------------------------------------
// Controller

namespace {
std::vector<LayerShape> shapes_of(const std::vector<QuantLinear>& layers) {
  std::vector<LayerShape> out;
  for (const auto& l : layers) out.push_back(LayerShape{l->name, l->layer_index, l->in_features, l->out_features});
  return out;
}
}  // namespace

PrecisionController::PrecisionController(const RunConfig& rc, std::vector<QuantLinear> layers,
                                         at::ScalarType gemm_dtype)
    : PrecisionController(rc, shapes_of(layers), gemm_dtype) {
  layers_ = std::move(layers);
}

PrecisionController::PrecisionController(const RunConfig& rc, std::vector<LayerShape> layers,
                                         at::ScalarType gemm_dtype)
    : pc_(rc.precision), recipes_(rc.recipes), shapes_(std::move(layers)), gemm_dtype_(gemm_dtype) {
  // Ranges and words were checked by RunConfig::from for every policy, so a
  // run's config.toml never carries a value a later resume or `snip correlate`
  // would reject; what follows needs the layers or the run's recipes.
  policy_ = pc_.policy_name();
  // TE's AutoswitchGemm decides per GEMM whatever precision.granularity says.
  gran_ = pc_.per_gemm || pc_.policy == Policy::kAutoswitch ? plan::Granularity::gemm : plan::Granularity::layer;
  stats_seed_ = uint64_t(rc.train.seed);
  low_ = pc_.low_option;
  if (low_.empty() || low_ == kReference)
    fail("config: precision.low_option: expected the name of a quantizing option (e.g. fp4, mxfp4), got '", low_, "'");
  const std::string& recipe = pc_.recipe;
  SNIP_CHECK(pc_.policy != Policy::kNone || recipe == "none" || recipe.empty(),
             "precision.recipe = ", recipe, " reached the controller: call resolve_precision_alias() first");
  if (pc_.policy != Policy::kNone && recipe != "none" && !recipe.empty())
    fail("config: precision.recipe = '", recipe, "' applies one recipe to every layer and cannot be combined "
         "with precision.policy = '", policy_, "'; set precision.recipe = \"none\" (or use policy uniform-",
         recipe, ")");
  SNIP_CHECK(!shapes_.empty(), "no quantizable layers");
  // Checked for every policy (none too): the schedule, the options, the pins.
  sched_ = PrecisionSchedule::from_config(rc);
  const std::vector<std::string>& options = pc_.options;
  if (options.empty()) fail("config: precision.options: expected a comma-separated list of options, got none");
  {
    std::set<std::string> seen;
    for (const auto& o : options)
      if (!seen.insert(o).second) fail("config: precision.options: expected unique names, got '", o, "' twice");
    if (pc_.policy != Policy::kUniform && !seen.count(low_))
      fail("config: precision.options: expected a list containing ", low_,
           " (precision.low_option, the option the budget counts), got '", join(options), "'");
  }
  // One quantizer per option (UserError for an unknown recipe name).
  auto add = [&](const std::string& name, const char* key,
                 std::map<std::string, std::shared_ptr<const OperandQuantizer>>& into) {
    if (quant_.count(name) || into.count(name)) return;
    if (name == kReference) {
      into[name] = nullptr;
      return;
    }
    try {
      into[name] = make_recipe_quantizer(recipes_, name);
    } catch (const UserError& e) {
      std::string m = e.what();
      const std::string pre = "precision.recipe: ";
      if (m.rfind(pre, 0) == 0) m = m.substr(pre.size());
      fail("config: ", key, ": option '", name, "': ", m);
    }
    if (!into[name]) fail("config: ", key, ": expected an option name, got '", name, "'");
  };
  for (const auto& o : options) add(o, "precision.options", quant_);
  add(pc_.warmup_precision, "precision.warmup_precision", quant_);
  add(pc_.final_precision, "precision.final_precision", quant_);
  if (pc_.policy == Policy::kUniform) {
    add(pc_.uniform_option, "precision.policy", quant_);
    // A uniform 4-bit policy counts its own option in the FP4 share:
    // uniform-mxfp4 runs every GEMM in 4 bits whatever low_option names.
    if (is_4bit_option(recipes_, pc_.uniform_option)) low_ = pc_.uniform_option;
  }
  add(kReference, "precision.options", quant_);
  for (const auto& p : pc_.pins) {
    try {
      pins_.push_back(plan::parse_pin(p));
    } catch (const UserError& e) {
      fail("config: precision.pins: ", e.what());
    }
  }
  // Pins name layers and options: one that matches no layer, conflicts with
  // another or picks an option the layers do not offer is refused whatever
  // the policy (with bf16, pins = "x[=fp8" would otherwise be accepted silently).
  if (!pins_.empty()) {
    try {
      plan::resolve_pins(shape_only_problem(), plan_options(true));
    } catch (const UserError& e) {
      fail("config: precision.pins: ", e.what());
    }
  }
  if (pc_.policy == Policy::kAutoswitch || pc_.policy == Policy::kBf16Tail || pc_.policy == Policy::kFirstLastN) {
    if (std::none_of(options.begin(), options.end(), [&](const std::string& o) { return o != low_; }))
      fail("config: precision.options: policy ", policy_, " keeps layers off ", low_,
           " and needs another option to keep them at (e.g. fp8), got '", join(options), "'");
    if (pc_.budget_unit == "time" || !pc_.gemm_times.empty())
      spdlog::warn("precision.policy = {} follows its rule and reads no budget: precision.budget, "
                   "precision.budget_unit and precision.gemm_times have no effect on its plans", policy_);
  }
  if (pc_.policy == Policy::kNone) return;  // inactive: nothing is quantized, planned or timed
  if (rc.guard.enabled) add(rc.guard.raise_option, "guard.raise_option", extra_quant_);
  if (rc.guard.enabled && rc.guard.raise_option != kReference)
    for (const auto& spec : recipes_.find(rc.guard.raise_option).operands)
      if (spec.element.bits < 8)
        fail("config: guard.raise_option: expected an option of 8 bits or more (fp8, bf16, ...), got '",
             rc.guard.raise_option, "' (", spec.element.bits, "-bit elements)");
  active_ = true;
  for (int64_t p : sched_.plan_steps()) plan_steps_.insert(p);
  // Everything the planner can check on the layer list alone (pins that match
  // nothing, conflicting pins, options, budget feasibility): run the very
  // decision a plan step will make, on placeholder Q values. A time budget
  // needs the measured times first: set_gemm_times checks then.
  if (pc_.budget_unit != "time") check_plannable();
}

void PrecisionController::check_plannable() {
  plan::PlanProblem prob = shape_only_problem();
  if (pc_.policy == Policy::kSnip) {
    plan::solve(prob, plan_options(true));
  } else {
    plan::PlanOptions o = plan_options(true);
    if (pc_.policy == Policy::kUniform) o.allowed_options.clear();
    plan::run_heuristic(policy_, prob, o, uint64_t(pc_.seed));
  }
}

std::vector<plan::TimedLayer> PrecisionController::timed_layers() const {
  std::vector<plan::TimedLayer> out;
  for (const auto& l : shapes_) out.push_back(plan::TimedLayer{l.name, l.in_features, l.out_features});
  return out;
}

std::vector<std::string> PrecisionController::known_options() const {
  std::set<std::string> o;
  for (const auto& kv : quant_) o.insert(kv.first);
  for (const auto& kv : extra_quant_) o.insert(kv.first);  // guard.raise_option
  o.insert(kReference);
  return {o.begin(), o.end()};
}

void PrecisionController::set_gemm_times(plan::GemmTimes table, int64_t tokens, double micro_batches) {
  times_ = std::move(table);
  times_tokens_ = tokens;
  times_micro_batches_ = micro_batches;
  plan::PlanProblem probe = shape_only_problem();  // every entry there (UserError naming the file otherwise)
  (void)probe;
  if (active_ && pc_.budget_unit == "time") check_plannable();
}

void PrecisionController::add_times(plan::PlanProblem& p) const {
  if (!times_) return;
  plan::apply_gemm_times(p, *times_, timed_layers(), times_tokens_, times_micro_batches_, known_options());
}

void PrecisionController::set_output(const std::string& run_dir, bool verbose) {
  run_dir_ = run_dir;
  verbose_ = verbose;
  if (times_ && !run_dir_.empty()) plan::save_gemm_times(*times_, (fs::path(run_dir_) / "gemm_times.json").string());
}

std::shared_ptr<const OperandQuantizer> PrecisionController::quantizer(const std::string& option) const {
  auto it = quant_.find(option);
  if (it != quant_.end()) return it->second;
  it = extra_quant_.find(option);
  SNIP_CHECK(it != extra_quant_.end(), "no quantizer for option ", option);
  return it->second;
}

void PrecisionController::raise_precision(double budget_step, double smoothing) {
  if (!active_) return;
  // A time budget is a ceiling: more precision = more time allowed.
  pc_.budget = pc_.budget_unit == "time" ? pc_.budget + budget_step
                                         : std::max(0.0, pc_.budget - budget_step);
  pc_.smoothing = std::max(pc_.smoothing, smoothing);
  replan_requested_ = true;
}

std::vector<std::string> PrecisionController::force_option(const std::vector<std::string>& layers,
                                                           const std::string& option) {
  std::vector<std::string> changed;
  if (!active_ || current_.empty()) return changed;
  (void)quantizer(option);  // known (SNIP_CHECK)
  std::map<PlanKey, std::string> a = current_.options;
  for (const std::string& layer : layers) {
    bool found = false, moved = false;
    for (const auto& l : shapes_)
      if (l.name == layer) found = true;
    if (!found) fail("guard: no linear layer named '", layer, "'");
    for (const PlanKey& item : item_keys())
      if (item.layer == layer) {
        moved = moved || current_.layer_options(layer).v != std::array<std::string, 3>{option, option, option};
        a[item] = option;
        if (!item.gemm)  // the layer's GEMM keys (a forward-only final phase) give way to the layer key
          for (Gemm g : kAllGemms) a.erase(PlanKey{layer, g});
      }
    if (moved) changed.push_back(layer);
  }
  current_ = make_assignment(std::move(a));
  return changed;
}

std::vector<std::string> PrecisionController::layers_below_fp8() const {
  std::vector<std::string> out;
  if (!active_ || current_.empty()) return out;
  std::map<std::string, bool> low;  // option -> some operand has fewer than 8 element bits
  auto is_low = [&](const std::string& o) {
    auto it = low.find(o);
    if (it != low.end()) return it->second;
    bool b = false;
    if (o != kReference)
      for (const auto& spec : recipes_.find(o).operands) b = b || spec.element.bits < 8;
    return low[o] = b;
  };
  for (const auto& l : shapes_) {
    bool b = false;
    for (const std::string& o : current_.layer_options(l.name).v) b = b || is_low(o);
    if (b) out.push_back(l.name);
  }
  return out;
}

std::array<std::string, kNumOperands> PrecisionController::operand_formats(const std::string& layer) const {
  std::array<std::string, kNumOperands> out;
  if (std::none_of(shapes_.begin(), shapes_.end(), [&](const LayerShape& l) { return l.name == layer; }))
    fail("operand_formats: '", layer, "' is not a linear layer of this model");
  if (!active_ || current_.empty()) return out;
  const PerGemm<std::string> opts = current_.layer_options(layer);
  for (int o = 0; o < kNumOperands; ++o) {
    const std::string& option = opts[gemm_of(Operand(o))];
    if (option != kReference) out[size_t(o)] = recipes_.find(option)[Operand(o)].element.name;
  }
  return out;
}

// Items with FLOPs 6·in·out per token (per step up to a common factor, which
// shares ignore) and placeholder Q (1 at the low option, 0 elsewhere) for
// every option the controller knows.
plan::PlanProblem PrecisionController::shape_only_problem(plan::Granularity gran) const {
  plan::PlanProblem p;
  p.granularity = gran;
  for (const auto& l : shapes_) {
    plan::PlanItem it;
    it.name = it.layer = l.name;
    it.flops = 6.0 * double(l.in_features) * double(l.out_features);
    for (const auto& kv : quant_) it.q[kv.first] = kv.first == low_ ? 1.0 : 0.0;
    it.rel_err[low_] = 1.0;
    it.mse[low_] = it.underflow[low_] = 0.0;  // autoswitch's placeholders: every item low
    if (gran == plan::Granularity::layer) {
      p.items.push_back(std::move(it));
      continue;
    }
    for (Gemm g : kAllGemms) {
      plan::PlanItem gi = it;
      gi.name = plan_item_key(l.name, g);
      gi.gemm = gemm_name(g);
      gi.flops = it.flops / 3.0;
      p.items.push_back(std::move(gi));
    }
  }
  add_stages(p);
  add_times(p);
  return p;
}

plan::PlanOptions PrecisionController::plan_options(bool with_pins) const {
  plan::PlanOptions o;
  o.budget = pc_.budget_unit == "time" ? plan::Budget::time(pc_.budget) : plan::Budget::share(pc_.budget);
  o.low_option = low_;
  o.allowed_options = pc_.options;
  o.tail_fraction = pc_.tail_fraction;
  o.first_last_n = int(std::min<int64_t>(pc_.first_last_n, std::numeric_limits<int>::max()));
  o.autoswitch_mse = pc_.autoswitch_mse;
  o.autoswitch_underflow = pc_.autoswitch_underflow;
  if (with_pins) o.pins = pins_;
  if (with_pins && !stage_of_layer_.empty()) {
    o.per_stage_budget = true;
    o.stage_boundary_option = stage_boundary_;
  }
  return o;
}

void PrecisionController::add_stages(plan::PlanProblem& p) const {
  if (stage_of_layer_.empty()) return;
  std::map<std::string, int> stage;
  for (size_t i = 0; i < shapes_.size(); ++i) stage[shapes_[i].name] = stage_of_layer_[i];
  for (plan::PlanItem& it : p.items) it.stage = stage.at(it.layer);
}

void PrecisionController::set_pipeline(std::vector<int> stage_of_layer, int my_stage,
                                       const std::string& boundary_option) {
  SNIP_CHECK(stage_of_layer.size() == shapes_.size(), "set_pipeline: ", stage_of_layer.size(), " stages for ",
             shapes_.size(), " layers");
  stage_of_layer_ = std::move(stage_of_layer);
  my_stage_ = my_stage;
  stage_boundary_ = boundary_option == "none" ? "" : boundary_option;
  if (!active_) return;
  // The checks of the constructor, with a budget row per stage.
  plan::PlanProblem prob = shape_only_problem();
  try {
    if (pc_.policy == Policy::kSnip) {
      plan::solve(prob, plan_options(true));
    } else {
      plan::PlanOptions o = plan_options(true);
      if (pc_.policy == Policy::kUniform) o.allowed_options.clear(), o.per_stage_budget = false,
                                          o.stage_boundary_option.clear();
      plan::run_heuristic(policy_, prob, o, uint64_t(pc_.seed));
    }
  } catch (const UserError& e) {
    fail("dist.pipeline_stages with dist.stage_boundary = ", boundary_option, ": ", e.what());
  }
}

std::vector<PlanKey> PrecisionController::item_keys() const {
  std::vector<PlanKey> out;
  for (const auto& l : shapes_) {
    if (gran_ == plan::Granularity::layer) out.push_back(PlanKey{l.name, std::nullopt});
    else
      for (Gemm g : kAllGemms) out.push_back(PlanKey{l.name, g});
  }
  return out;
}

PrecisionAssignment PrecisionController::make_assignment(std::map<PlanKey, std::string> options) {
  PrecisionAssignment a;
  a.options = std::move(options);
  for (auto& l : shapes_) {
    const PerGemm<std::string> o = a.layer_options(l.name);
    const std::string& f = o[Gemm::kFprop], &d = o[Gemm::kDgrad], &w = o[Gemm::kWgrad];
    std::shared_ptr<const OperandQuantizer> q;
    if (f == d && d == w) {
      q = quantizer(f);
    } else {  // per-GEMM options differ: one composite per distinct triple
      const std::string key = f + "/" + d + "/" + w;
      auto it = per_gemm_quant_.find(key);
      if (it == per_gemm_quant_.end())
        it = per_gemm_quant_
                 .emplace(key, std::make_shared<PerGemmQuantizer>(
                                   PerGemm<std::shared_ptr<const OperandQuantizer>>{
                                       {quantizer(f), quantizer(d), quantizer(w)}},
                                   key))
                 .first;
      q = it->second;
    }
    a.layer_names.push_back(l.name);
    a.precision.push_back(LinearPrecision{q, gemm_dtype_});
  }
  return a;
}

double PrecisionController::fp4_share() const {
  if (current_.empty()) return 0.0;
  double low = 0, total = 0;
  for (const auto& l : shapes_) {
    const double f = double(l.in_features) * double(l.out_features);
    total += f;
    int n = 0;  // GEMMs of this layer at the low option (a third of its FLOPs each)
    for (const std::string& o : current_.layer_options(l.name).v) n += o == low_;
    low += f * double(n) / 3.0;
  }
  return total > 0 ? low / total : 0.0;
}

bool PrecisionController::decision_due(int64_t s) const {
  if (!active_) return false;
  const Phase ph = sched_.phase_at(s);
  return ph == Phase::kPlan ? (plan_steps_.count(s) > 0 || phase_ != Phase::kPlan || replan_requested_)
                            : phase_ != ph;
}

bool PrecisionController::stats_due(int64_t s) const {
  return decision_due(s) && sched_.phase_at(s) == Phase::kPlan && pc_.needs_stats();
}

StatsOptions PrecisionController::stats_options() const {
  StatsOptions so;
  so.recipes = recipes_;
  so.options.clear();
  for (const auto& o : pc_.options)
    if (o != kReference) so.options.push_back(o);
  so.low_option = low_;
  so.reference = kReference;
  so.alpha = pc_.alpha;
  so.seed = stats_seed_;
  so.first_order = pc_.first_order;
  so.curvature_probes = int(pc_.curvature_probes);
  so.frozen = frozen_;
  return so;
}

PrecisionEvent PrecisionController::begin_step(int64_t s, const std::function<torch::Tensor()>& loss_fn,
                                               torch::optim::AdamW& opt) {
  return begin_step(s, [&](const StatsOptions& so) {
    SNIP_CHECK(!layers_.empty(), "a stats step on a controller without modules (use the StatsMeasure overload)");
    std::unique_ptr<torch::optim::AdamW> gathered;  // ZeRO: every layer's state from its owner
    if (stats_optimizer_) gathered = stats_optimizer_();
    return run_stats_step(layers_, loss_fn, gathered ? *gathered : opt, so, s);
  });
}

PrecisionEvent PrecisionController::begin_step(int64_t s, const StatsMeasure& measure) {
  PrecisionEvent ev;
  if (!decision_due(s)) return ev;
  const Phase ph = sched_.phase_at(s);
  if (ph == Phase::kPlan && replan_requested_) ev.metrics["guard_replan"] = true;
  decide(s, ph, measure, ev);
  if (ph == Phase::kPlan) replan_requested_ = false;
  return ev;
}

void PrecisionController::decide(int64_t s, Phase phase, const StatsMeasure& measure, PrecisionEvent& ev) {
  using clock = std::chrono::steady_clock;
  const bool root = !comm_ || comm_->rank() == 0;
  std::string plan_error;
  plan::PlanResult r;
  plan::PlanProblem prob;
  StatsStep fresh;
  bool have_stats = false;
  double stats_s = 0;
  const std::string& every_layer = phase == Phase::kWarmup ? pc_.warmup_precision : pc_.final_precision;
  // precision.final_phase_gemms = fprop: the final phase raises the forward
  // GEMMs only; dgrad and wgrad keep the options they ran under before it.
  const bool fprop_only = phase == Phase::kFinal && pc_.final_fprop_only && !current_.empty();
  if (fprop_only) {
    prob = shape_only_problem(plan::Granularity::gemm);
    plan::PlanOptions o = plan_options(false);
    o.allowed_options.clear();
    std::map<std::string, PerGemm<std::string>> was;
    for (const auto& l : shapes_) {
      was[l.name] = current_.layer_options(l.name);
      for (Gemm g : {Gemm::kDgrad, Gemm::kWgrad}) o.pins.push_back(plan::Pin{plan_item_key(l.name, g), was[l.name][g]});
    }
    for (plan::PlanItem& it : prob.items)  // a guard's raise option may be outside the configured ones
      if (it.gemm != "fprop") it.q.emplace(was[it.layer][it.gemm == "dgrad" ? Gemm::kDgrad : Gemm::kWgrad], 0.0);
    r = plan::heuristic_uniform(prob, o, every_layer);
  } else if (phase != Phase::kPlan) {
    prob = shape_only_problem();
    plan::PlanOptions o = plan_options(false);  // "every layer": pins do not apply
    o.allowed_options.clear();
    r = plan::heuristic_uniform(prob, o, every_layer);
  } else if (pc_.needs_stats()) {
    const auto t0 = clock::now();
    StatsOptions so = stats_options();
    if (!stage_of_layer_.empty()) {  // pipeline stages: this stage's layers; every stage sums into one buffer
      so.local.assign(shapes_.size(), 0);
      for (size_t i = 0; i < shapes_.size(); ++i) so.local[i] = stage_of_layer_[i] == my_stage_;
      so.count_weight = my_stage_ == 0 ? 1.0 : 0.0;
      so.pass_fn = stats_pass_;
      SNIP_CHECK(so.pass_fn, "pipeline stats step without a pass runner (set_stats_pass)");
    }
    if (comm_) {
      so.all_reduce_sum = [c = comm_](torch::Tensor& t) {
        std::vector<torch::Tensor> v{t};
        c->allreduce_sum(v);
      };
      so.all_gather = [c = comm_](const torch::Tensor& t) { return c->allgather(t); };
    }
    if (frozen_ && before_stats_) before_stats_();  // LoRA: the FP32 base back into the layers
    fresh = measure(so);
    smooth(smoothed_, fresh, pc_.smoothing);
    smoothed_.step = s;
    have_stats = true;
    stats_s = std::chrono::duration<double>(clock::now() - t0).count() + extra_stats_s_;
    extra_stats_s_ = 0;
    if (!run_dir_.empty()) {
      fs::create_directories(fs::path(run_dir_) / "stats");
      const bool pg = gran_ == plan::Granularity::gemm;
      json j = to_json(smoothed_, pg);
      if (!stage_of_layer_.empty())  // `snip plan --stages S` on this file plans with the run's split
        for (size_t i = 0; i < shapes_.size() && i < j["layers"].size(); ++i) j["layers"][i]["stage"] = stage_of_layer_[i];
      j["smoothing"] = pc_.smoothing;
      j["measured"] = to_json(fresh, pg);
      io::save_json_atomic(j, (fs::path(run_dir_) / "stats" / ("step-" + std::to_string(s) + ".json")).string());
    }
    prob = to_plan_problem(smoothed_, gran_);
    add_stages(prob);
    add_times(prob);
    const plan::PlanOptions o = plan_options(true);
    if (root) {  // several ranks: rank 0 alone solves; agree() hands its plan (or error) to the others
      test_kill_point("plan@" + std::to_string(s));  // tests/cli/kill_resume.py
      try {
        r = pc_.policy == Policy::kSnip ? plan::solve(prob, o)
                                        : plan::run_heuristic(policy_, prob, o, uint64_t(pc_.seed));
      } catch (const UserError& e) {
        plan_error = e.what();
      }
    }
  } else {
    prob = shape_only_problem();
    plan::PlanOptions o = plan_options(true);
    if (pc_.policy == Policy::kUniform) {  // one option everywhere: no stage rows, no stage-boundary pins
      o.allowed_options.clear();
      o.per_stage_budget = false;
      o.stage_boundary_option.clear();
    }
    r = plan::run_heuristic(policy_, prob, o, uint64_t(pc_.seed));
  }
  std::map<PlanKey, std::string> planned;
  if (root)
    for (const auto& [item, option] : r.assignments()) planned[parse_plan_key(item, "the plan")] = option;
  std::map<PlanKey, std::string> assign = agree(s, planned, plan_error);
  if (root)
    for (const std::string& w : r.warnings) spdlog::warn("precision plan at step {}: {}", s, w);
  const bool changed = assign != current_.options || phase != phase_;
  const std::map<PlanKey, std::string> before = current_.options;
  const Phase phase_before = phase_;
  current_ = make_assignment(std::move(assign));
  phase_ = phase;
  decided_at_ = s;

  json rel_chosen = json::object(), rel = json::object();
  if (have_stats)
    for (const LayerStats& ls : fresh.layers) {
      json m = json::object();
      for (const auto& [name, os] : ls.options) m[name] = os.rel_err[Gemm::kFprop];
      m[kReference] = 0.0;
      const std::string chosen = current_.layer_options(ls.name)[Gemm::kFprop];
      if (m.contains(chosen)) rel_chosen[ls.name] = m[chosen];
      rel[ls.name] = std::move(m);
    }
  if (root) {  // with several ranks the plan is rank 0's: it alone saves and prints it
    json pj = plan::plan_to_json(r);
    pj["step"] = s;
    pj["policy"] = policy_;
    pj["phase"] = to_string(phase);
    if (phase == Phase::kFinal) pj["final_phase_gemms"] = fprop_only ? "fprop" : "all";
    if (have_stats) {
      json qt = json::object();
      for (const auto& it : prob.items) qt[it.name] = it.q;
      pj["q_table"] = std::move(qt);
      pj["rel_err_fprop"] = std::move(rel);
      pj["stats_seconds"] = stats_s;
    }
    if (!run_dir_.empty()) {
      fs::create_directories(fs::path(run_dir_) / "plans");
      io::save_json_atomic(pj, (fs::path(run_dir_) / "plans" / ("step-" + std::to_string(s) + ".json")).string());
    }
    last_plan_ = pj;
    if (verbose_) {
      if (!changed)  // a re-plan that changes nothing: one line, not the table again
        std::fprintf(stderr, "precision at step %ld: plan unchanged (FP4 share %.4f)\n", long(s), r.fp4_share);
      else if (phase == Phase::kPlan && table_shown_ && phase_before == Phase::kPlan)
        // The table once per process; a later re-plan prints what it changed.
        std::fprintf(stderr, "%s", format_plan_changes(s, before, current_.options, r.fp4_share, run_dir_).c_str());
      else if (phase == Phase::kPlan) {
        std::fprintf(stderr, "\n%s", format_plan_table(pj).c_str());
        table_shown_ = true;
      }
      else  // every layer at one option: one line instead of the table
        std::fprintf(stderr, "\nprecision at step %ld: %s phase, %s %s (FP4 share %.4f)\n", long(s),
                     to_string(phase),
                     fprop_only ? "dgrad/wgrad as planned, the fprop GEMM of every layer" : "every layer",
                     every_layer == kReference ? (gemm_dtype_ == at::kFloat ? "unquantized (fp32 GEMMs)"
                                                                           : "unquantized (bf16 GEMMs)")
                                               : every_layer.c_str(),
                     r.fp4_share);
    }
  }

  ev.decided = true;
  ev.metrics["precision"] = current_.to_json();  // per item; a forward-only final phase per GEMM
  ev.metrics["plan_step"] = s;
  ev.metrics["phase"] = to_string(phase);
  if (have_stats) ev.metrics["rel_err_fprop"] = std::move(rel_chosen);
  if (have_stats) ev.metrics["stats_seconds"] = stats_s;
  if (root) {  // the plan's solver outcome (rank 0 solved it)
    ev.metrics["plan_status"] = r.status;
    ev.metrics["plan_solve_seconds"] = r.solve_seconds;
  }
}

std::map<PlanKey, std::string> PrecisionController::agree(int64_t s, const std::map<PlanKey, std::string>& assign,
                                                          const std::string& error) {
  if (!comm_ || comm_->size() == 1) {
    if (!error.empty()) fail("precision plan at step ", s, ": ", error);
    return assign;
  }
  // Rank 0's payload {"assign": {...}} or {"error": "..."} (dist/broadcast_text.h).
  const bool root = comm_->rank() == 0;
  std::string bytes;
  if (root) bytes = (error.empty() ? json{{"assign", PrecisionAssignment{assign, {}, {}}.to_json()}}
                                  : json{{"error", error}}).dump();
  bytes = dist::broadcast_text(*comm_, bytes, 0, str_cat("the precision plan decided before step ", s));
  const json j = io::parse_json(bytes, "the plan broadcast by rank 0");
  if (j.contains("error")) fail("precision plan at step ", s, ": ", j.at("error").get<std::string>());
  std::map<PlanKey, std::string> got = PrecisionAssignment::options_from_json(j.at("assign"), "the plan broadcast");
  if (root) SNIP_CHECK(got == assign, "plan broadcast: rank 0's plan changed in its own JSON round trip");
  return got;
}

json PrecisionController::state() const {
  json st = {{"policy", policy_}, {"phase", to_string(phase_)}, {"decided_at", decided_at_},
             {"assignments", current_.to_json()}};
  st["smoothed"] = smoothed_.layers.empty() ? json(nullptr) : to_json(smoothed_);
  st["quantizers"] = quantizer_state();
  // The guard's levers (raise_precision), so a resumed run keeps them.
  st["budget"] = pc_.budget;
  st["budget_unit"] = pc_.budget_unit;
  st["smoothing"] = pc_.smoothing;
  st["replan_requested"] = replan_requested_;
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
    phase_ = parse_phase(st.at("phase").get<std::string>(), what + ": precision.phase");
    // Written by the guard's replan (absent before snip had a guard): the
    // lower of the saved and configured budget, the higher smoothing.
    // A budget saved under the other precision.budget_unit (a ratio of GEMM
    // time against an FP4 FLOPs share) means nothing now: the configured one
    // stands from the next plan on. States written before the unit was saved
    // carry none: a budget above 1 can only be a time ratio there.
    std::string saved_unit = st.value("budget_unit", std::string());
    if (saved_unit.empty() && st.contains("budget") && st.at("budget").is_number() &&
        st.at("budget").get<double>() > 1)
      saved_unit = "time";
    if (st.contains("budget") && !saved_unit.empty() && saved_unit != pc_.budget_unit) {
      const double sm = st.at("smoothing").get<double>();
      if (!(sm >= 0 && sm <= 1))
        fail(what, ": precision.smoothing: expected a fraction in [0, 1], got ", sm);
      spdlog::warn("{}: the saved precision budget {} is in {} and precision.budget_unit is now {}: the next plan "
                   "uses the configured budget {} (the guard's raises of the saved one are dropped)",
                   what, st.at("budget").dump(), saved_unit, pc_.budget_unit, pc_.budget);
      pc_.smoothing = std::max(pc_.smoothing, sm);  // a fraction in either unit
      replan_requested_ = st.at("replan_requested").get<bool>();
    } else if (st.contains("budget")) {
      const double b = st.at("budget").get<double>(), sm = st.at("smoothing").get<double>();
      const bool time = pc_.budget_unit == "time";
      if (!(time ? b > 0 && std::isfinite(b) : b >= 0 && b <= 1) || !(sm >= 0 && sm <= 1))
        fail(what, ": precision.budget / smoothing: expected ", time ? "a positive time ratio" : "a fraction in [0, 1]",
             " / a fraction in [0, 1], got ", b, " / ", sm);
      // The more conservative of the two (a time budget is a ceiling).
      pc_.budget = time ? std::max(pc_.budget, b) : std::min(pc_.budget, b);
      pc_.smoothing = std::max(pc_.smoothing, sm);
      replan_requested_ = st.at("replan_requested").get<bool>();
    }
    decided_at_ = st.at("decided_at").get<int64_t>();
    std::map<PlanKey, std::string> assign =
        PrecisionAssignment::options_from_json(st.at("assignments"), what + ": precision.assignments");
    smoothed_ = st.at("smoothed").is_null() ? StatsStep{} : stats_from_json(st.at("smoothed"), what + ": smoothed");
    // Checkpoints written before quantizer state was saved have no
    // "quantizers": their delayed-scaling histories restart (warned).
    if (!st.contains("quantizers") || st.at("quantizers").is_null()) {
      bool delayed = false;
      for (const auto& [name, q] : quant_)
        if (q)
          for (const auto& spec : recipes_.find(name).operands)
            delayed = delayed || spec.rule == formats::ScaleRule::kDelayed;
      if (delayed)
        spdlog::warn("{}: no quantizer state (written by an older snip): delayed-scaling amax histories "
                     "restart empty, so the resumed steps are not bit-identical to an uninterrupted run", what);
    }
    const json qs = st.contains("quantizers") && !st.at("quantizers").is_null() ? st.at("quantizers") : json::object();
    if (!qs.is_object()) fail(what, ": precision.quantizers: expected an object, got ", qs.type_name());
    // State of an option the configuration no longer lists: dropped, as a
    // changed policy is (its histories only matter if the option returns).
    for (auto it = qs.begin(); it != qs.end(); ++it)
      if (!quant_.count(it.key()) || !quant_.at(it.key()))
        spdlog::warn("{}: precision.quantizers: state for option '{}', which is no longer configured: dropped",
                     what, it.key());
    restore_quantizers(qs, what);
    if (phase_ != Phase::kNone) {
      // A final phase decided with final_phase_gemms = fprop holds a layer
      // item as its three GEMMs (kept to the end if the option changed since).
      auto covered = [&](const PlanKey& k) {
        if (assign.count(k)) return true;
        if (k.gemm || phase_ != Phase::kFinal) return false;
        for (Gemm g : kAllGemms)
          if (!assign.count(PlanKey{k.layer, g})) return false;
        return true;
      };
      for (const PlanKey& k : item_keys())
        if (!covered(k))
          fail(what, ": precision.assignments: no option for '", k.str(), "' (precision.granularity changed?)");
      for (const auto& kv : assign)
        if (!quant_.count(kv.second) && !extra_quant_.count(kv.second))
          fail(what, ": precision.assignments: layer '", kv.first.str(), "': option '", kv.second,
               "' is not among the configured options");
      current_ = make_assignment(std::move(assign));
    }
  } catch (const json::exception& e) {
    fail(what, ": malformed precision state (", e.what(), ")");
  }
}

json PrecisionController::quantizer_state() const {
  json qs = json::object();  // delayed scaling's amax histories, error-feedback residuals, per option
  for (const auto& [name, q] : quant_)
    if (q)
      if (json j = q->state(); !j.is_null()) qs[name] = std::move(j);
  return qs;
}

void PrecisionController::restore_quantizers(const json& qs, const std::string& what) {
  for (const auto& [name, q] : quant_)
    if (q)
      q->restore_state(qs.contains(name) ? qs.at(name) : json(nullptr), what + ": precision.quantizers." + name,
                       int64_t(shapes_.size()));
}

}  // namespace snip
