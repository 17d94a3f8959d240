// report.cpp: the run report (snip/report/report.h): reads a run directory
// and renders one self-contained HTML page from the SVG charts of svg.h.
#include "snip/report/report.h"
#include "snip/recipes/gemm.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <optional>
#include <regex>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "snip/config/config.h"
#include "snip/io/atomic_file.h"
#include "snip/io/json.h"
#include "snip/report/compare.h"
#include "snip/report/svg.h"
#include "snip/run/step_record.h"
#include "snip/core/error.h"
#include "snip/core/statistics.h"

namespace snip::report {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double num_or_nan(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : kNaN;
}

std::string fmt(const char* f, double v) {
  if (!std::isfinite(v)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string esc(const std::string& s) { return xml_escape(s); }

// "1h 02m 03s", "4m 05s", "12.3 s".
std::string duration(double s) {
  if (!std::isfinite(s)) return "-";
  if (s < 60) return fmt("%.1f s", s);
  const long t = std::lround(s);
  char buf[64];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh %02ldm %02lds", t / 3600, (t / 60) % 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%ldm %02lds", t / 60, t % 60);
  return buf;
}

// 4999424 -> "5.00M"
std::string si(double v) {
  if (!std::isfinite(v)) return "-";
  const double a = std::fabs(v);
  if (a >= 1e9) return fmt("%.2fG", v / 1e9);
  if (a >= 1e6) return fmt("%.2fM", v / 1e6);
  if (a >= 1e4) return fmt("%.1fk", v / 1e3);
  return fmt("%.0f", v);
}

// ---- model order --------------------------------------------------------

struct OrderKey {
  int64_t layer;  // decoder layer index; INT64_MAX when the name has none
  int proj;       // q k v o gate up down = 0..6, 7 otherwise
  int gemm;       // none -1, fprop 0, dgrad 1, wgrad 2, other 3
};

OrderKey order_key(const std::string& name) {
  OrderKey k{std::numeric_limits<int64_t>::max(), 7, -1};
  const size_t colon = name.find(':');
  const std::string base = name.substr(0, colon);
  if (colon != std::string::npos) {
    const std::string g = name.substr(colon + 1);
    k.gemm = g == "fprop" ? 0 : g == "dgrad" ? 1 : g == "wgrad" ? 2 : 3;
  }
  static const std::regex re_layer("(^|\\.)layers\\.([0-9]+)(\\.|$)");
  std::smatch m;
  if (std::regex_search(base, m, re_layer)) {
    try {
      k.layer = std::stoll(m[2]);
    } catch (...) {
    }
  }
  static const char* const kProj[7] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  const size_t dot = base.rfind('.');
  const std::string last = dot == std::string::npos ? base : base.substr(dot + 1);
  for (int p = 0; p < 7; ++p)
    if (last == kProj[p]) k.proj = p;
  return k;
}

// "model.layers.3.mlp.down_proj" -> "layers.3.mlp.down_proj" (row labels)
std::string row_label(const std::string& name) {
  return name.rfind("model.", 0) == 0 ? name.substr(6) : name;
}

// "model.layers.3.mlp.down_proj:fprop" -> "3.down_proj:fprop" (scatter labels)
std::string short_label(const std::string& name) {
  static const std::regex re("^(model\\.)?layers\\.([0-9]+)\\.(self_attn\\.|mlp\\.)?");
  return std::regex_replace(name, re, "$2.");
}

// ---- reading a run --------------------------------------------------------

json read_json_file(const std::string& path, const char* what) {
  try {
    return io::read_json_file(path, what);
  } catch (const UserError& e) {
    fail("snip report: ", e.what());
  }
}

// step-N.json files of a folder, by N.
std::map<int64_t, std::string> step_files(const fs::path& dir) {
  std::map<int64_t, std::string> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  static const std::regex re("step-([0-9]+)\\.json");
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string n = e.path().filename().string();
    if (std::regex_match(n, m, re)) {
      try {
        out[std::stoll(m[1])] = e.path().string();
      } catch (...) {
      }
    }
  }
  return out;
}

// One decision column of the maps.
struct DecisionCol {
  std::string phase;
  std::map<std::string, std::string> precision;  // item -> option
  std::map<std::string, double> rel;             // layer -> fprop rel. error at the chosen option
};

struct RunData {
  std::string dir, name;
  bool has_metrics = false;
  RunCurves curves;
  std::optional<json> summary;
  std::map<std::string, std::string> config;
  std::map<int64_t, json> plans;  // plan step -> plan JSON
  std::map<int64_t, std::string> plan_paths;
  std::optional<json> stats;      // the latest stats step
  std::string stats_path;
  std::map<int64_t, DecisionCol> decisions;
  std::string policy;
  std::string policy_label;  // policy, and for "none" its GEMM dtype: "none (fp32 GEMMs)"
  std::string gemm_dtype;    // train.gemm_dtype: "bf16", "fp32" or "" (unknown)
};

void require_dir(const std::string& dir) {
  std::error_code ec;
  if (dir.empty() || !fs::exists(dir, ec)) fail("snip report: ", dir.empty() ? "\"\"" : dir, " does not exist");
  if (!fs::is_directory(dir, ec)) fail("snip report: ", dir, " is not a folder (expected a run directory)");
  if (!fs::exists(fs::path(dir) / "config.toml", ec) && !fs::exists(fs::path(dir) / "metrics.jsonl", ec))
    fail("snip report: ", dir, " is not a run of `snip train` (no config.toml, no metrics.jsonl)");
}

// Reads a plan file's decision into col; UserError naming the file when the
// plan is malformed.
void plan_decision(const json& pj, const std::string& path, DecisionCol& col) {
  try {
    col.phase = pj.value("phase", std::string());
    for (const json& it : pj.at("items")) col.precision[it.at("name").get<std::string>()] = it.at("option").get<std::string>();
    if (pj.contains("rel_err_fprop") && pj["rel_err_fprop"].is_object()) {
      for (const auto& [layer, m] : pj["rel_err_fprop"].items()) {
        auto chosen = col.precision.find(layer);
        if (chosen == col.precision.end()) chosen = col.precision.find(plan_item_key(layer, Gemm::kFprop));
        if (chosen == col.precision.end() || !m.is_object()) continue;
        auto v = m.find(chosen->second);
        if (v != m.end() && v->is_number()) col.rel[layer] = v->get<double>();
      }
    }
  } catch (const json::exception& e) {
    fail("snip report: ", path, ": expected a plan file written by `snip train` (", e.what(), ")");
  }
}

// Reads a run directory; `full` = also plans, decisions and stats (the run
// the report is about), not only curves, summary and config (a reference).
RunData load_run(const std::string& dir, bool full) {
  require_dir(dir);
  RunData r;
  r.dir = dir;
  r.name = run_display_name(dir);
  const fs::path d(dir);
  std::error_code ec;
  if (fs::exists(d / "metrics.jsonl", ec)) {
    r.curves = read_metrics((d / "metrics.jsonl").string());
    r.has_metrics = true;
  }
  if (fs::exists(d / "summary.json", ec)) {
    r.summary = read_json_file((d / "summary.json").string(), "summary");
    if (!r.summary->is_object()) fail("snip report: ", (d / "summary.json").string(), ": expected a JSON object");
  }
  if (fs::exists(d / "config.toml", ec)) r.config = read_toml_display((d / "config.toml").string());
  if (full) {  // a reference run contributes its curves and summary only
    for (const auto& [step, path] : step_files(d / "plans")) {
      json pj = read_json_file(path, "plan");
      if (!pj.is_object()) fail("snip report: ", path, ": expected a plan file written by `snip train` (a JSON object)");
      plan_decision(pj, path, r.decisions[step]);
      r.plan_paths[step] = path;
      r.plans[step] = std::move(pj);
    }
    for (const Decision& dm : r.curves.decisions) {
      DecisionCol& col = r.decisions[dm.plan_step];
      if (col.phase.empty()) col.phase = dm.phase;
      for (const auto& [item, opt] : dm.precision) col.precision.emplace(item, opt);
      for (const auto& [layer, v] : dm.rel_err_fprop) col.rel.emplace(layer, v);
    }
    const auto stats = step_files(d / "stats");
    if (!stats.empty()) {
      r.stats_path = stats.rbegin()->second;
      r.stats = read_json_file(r.stats_path, "stats");
      if (!r.stats->is_object()) fail("snip report: ", r.stats_path, ": expected a stats file written by `snip train`");
    }
  }
  // Policy: summary, else the latest plan, else config.toml.
  if (r.summary && r.summary->contains("policy") && (*r.summary)["policy"].is_string())
    r.policy = (*r.summary)["policy"].get<std::string>();
  else if (!r.plans.empty() && r.plans.rbegin()->second.value("policy", json()).is_string())
    r.policy = r.plans.rbegin()->second["policy"].get<std::string>();
  else if (r.config.count("precision.policy"))
    r.policy = r.config["precision.policy"];
  else
    r.policy = "unknown";
  // The unquantized policy's earlier name (runs written before the rename).
  if (r.policy == "bf16") r.policy = "none";
  // The label says what the unquantized policy computed in: "none (bf16 GEMMs)".
  r.policy_label = r.policy;
  std::string g;
  if (r.summary && r.summary->contains("gemm_dtype") && (*r.summary)["gemm_dtype"].is_string())
    g = (*r.summary)["gemm_dtype"].get<std::string>();
  else if (r.config.count("train.gemm_dtype"))
    g = r.config["train.gemm_dtype"];
  if (g == "bfloat16") g = "bf16";
  if (g == "float32") g = "fp32";
  r.gemm_dtype = g;
  if (r.policy == "none" && !g.empty()) r.policy_label = "none (" + g + " GEMMs)";
  return r;
}

// ---- HTML pieces ----------------------------------------------------------

const char* kStyle = R"CSS(
:root { color-scheme: light; }
* { box-sizing: border-box; }
body { margin: 0; background: #F5F6F8; color: #1D1D1F; line-height: 1.45;
  font-family: system-ui, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif; font-size: 14px; }
main { max-width: 1240px; margin: 0 auto; padding: 20px 24px 40px; }
header h1 { margin: 8px 0 2px; font-size: 26px; font-weight: 650; }
header .sub { color: #555; margin: 0 0 14px; }
nav { display: flex; gap: 14px; flex-wrap: wrap; margin: 14px 0 8px; font-size: 13px; }
nav a { color: #0060A0; text-decoration: none; }
section { background: #FFF; border: 1px solid #E2E4E8; border-radius: 10px; padding: 16px 20px 18px; margin: 16px 0; }
section h2 { margin: 0 0 10px; font-size: 18px; font-weight: 650; }
section h3 { margin: 16px 0 6px; font-size: 15px; font-weight: 600; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(165px, 1fr)); gap: 10px; }
.card { background: #FFF; border: 1px solid #E2E4E8; border-radius: 8px; padding: 10px 12px; }
.card .k { color: #666; font-size: 12px; }
.card .v { font-size: 20px; font-weight: 620; font-variant-numeric: tabular-nums; }
.card .d { color: #666; font-size: 12px; }
.charts { display: flex; flex-wrap: wrap; gap: 18px; align-items: flex-start; }
figure { margin: 0; max-width: 100%; display: table; }
figcaption { color: #666; font-size: 12px; padding-top: 4px; display: table-caption; caption-side: bottom; }
svg.chart { display: block; max-width: 100%; height: auto; }
.scroll { overflow-x: auto; }
.note { color: #666; }
.empty { color: #666; font-style: italic; padding: 8px 0; }
table { border-collapse: collapse; font-size: 12.5px; font-variant-numeric: tabular-nums; }
th, td { padding: 3px 10px; border-bottom: 1px solid #EEE; text-align: right; white-space: nowrap; }
th { background: #F7F7F9; font-weight: 600; position: sticky; top: 0; }
td.name, th.name { text-align: left; font-family: ui-monospace, 'SF Mono', Menlo, Consolas, 'DejaVu Sans Mono', monospace; font-size: 12px; }
td.opt { text-align: left; }
td.wrap, th.wrap { text-align: left; white-space: normal; min-width: 16em; max-width: 40em; }
.chip { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 5px; vertical-align: -1px; }
dl.kv { display: grid; grid-template-columns: max-content auto; gap: 2px 14px; margin: 8px 0 12px; }
dl.kv dt { color: #666; } dl.kv dd { margin: 0; font-variant-numeric: tabular-nums; }
footer { color: #888; font-size: 12px; margin-top: 24px; }
.warning { background: #FFF1E6; border-left: 4px solid #D55E00; padding: 8px 12px; margin: 8px 0 12px; }
table.compare { margin: 4px 0 14px; }
table.compare tr.bad td { color: #A0400B; font-weight: 600; }
)CSS";

std::string card(const std::string& k, const std::string& v, const std::string& d = "") {
  return "<div class=\"card\"><div class=\"k\">" + esc(k) + "</div><div class=\"v\">" + esc(v) + "</div>" +
         (d.empty() ? "" : "<div class=\"d\">" + esc(d) + "</div>") + "</div>";
}

std::string figure(const std::string& svg, const std::string& caption = "") {
  return "<figure>" + svg + (caption.empty() ? "" : "<figcaption>" + esc(caption) + "</figcaption>") + "</figure>";
}

std::string empty_note(const std::string& text) { return "<p class=\"empty\">" + esc(text) + "</p>"; }

double last_finite(const std::vector<double>& v) {
  for (auto it = v.rbegin(); it != v.rend(); ++it)
    if (std::isfinite(*it)) return *it;
  return kNaN;
}

double min_finite(const std::vector<double>& v, size_t* at = nullptr) {
  double m = kNaN;
  for (size_t k = 0; k < v.size(); ++k)
    if (std::isfinite(v[k]) && !(v[k] >= m)) {
      m = v[k];
      if (at) *at = k;
    }
  return m;
}

// EMA span of the loss curves: n/60 steps (20 for a 1200-step run), in [1, 100].
double span_for(size_t n) { return std::clamp(double(n) / 60.0, 1.0, 100.0); }

// Below span 2 (fewer than 120 steps) the EMA is the raw curve (span 1) or
// next to it: the charts show the raw loss alone, with no EMA label.
constexpr double kMinEmaSpan = 2.0;
bool smooths(double span) { return span >= kMinEmaSpan; }

// The differences between the run and its reference (compare.h), one row
// each, under a warning when they make the losses incomparable (--force).
std::string comparison_html(const RunData& r, const RunData& ref, const std::vector<RunDifference>& diffs) {
  std::ostringstream os;
  if (incomparable(diffs)) {
    std::string what;
    for (const RunDifference& d : diffs)
      if (d.incomparable) what += (what.empty() ? "" : ", ") + d.what;
    os << "<div class=\"warning\" id=\"incomparable\"><b>The losses are not comparable</b>: " << esc(what)
       << " differ between " << esc(r.name) << " and the reference " << esc(ref.name)
       << " (losses per token of different tokenizers, or on different validation data). Overlaid because of "
          "<code>--force</code>.</div>";
  }
  if (diffs.empty()) {
    os << "<p class=\"note\" id=\"comparison\">Reference " << esc(ref.name)
       << ": same tokenizer, validation data, model, steps and tokens per step, as far as both runs record them.</p>";
    return os.str();
  }
  os << "<table class=\"compare\" id=\"comparison\" data-rows=\"" << diffs.size()
     << "\"><thead><tr><th class=\"name\">differs</th><th class=\"name\">" << esc(r.name) << "</th><th class=\"name\">"
     << esc(ref.name) << " (reference)</th></tr></thead><tbody>";
  for (const RunDifference& d : diffs)
    os << "<tr" << (d.incomparable ? " class=\"bad\"" : "") << "><td class=\"name\">" << esc(d.what)
       << "</td><td class=\"name\">" << esc(d.run) << "</td><td class=\"name\">" << esc(d.reference) << "</td></tr>";
  os << "</tbody></table>";
  return os.str();
}

std::string header_html(const RunData& r, const RunData* ref, const std::vector<RunDifference>& diffs) {
  std::ostringstream os;
  os << "<header><h1>" << esc(r.name) << "</h1><p class=\"sub\">policy <b>" << esc(r.policy_label) << "</b>";
  const auto& c = r.config;
  auto cfg = [&](const char* k) { auto it = c.find(k); return it == c.end() ? std::string() : it->second; };
  if (!cfg("model.hidden_size").empty()) {
    os << " · Llama C=" << esc(cfg("model.hidden_size")) << ", " << esc(cfg("model.num_hidden_layers")) << " layers";
    if (!cfg("model.num_attention_heads").empty())
      os << ", " << esc(cfg("model.num_attention_heads")) << "/" << esc(cfg("model.num_key_value_heads")) << " heads";
    if (!cfg("model.intermediate_size").empty()) os << ", SwiGLU " << esc(cfg("model.intermediate_size"));
  }
  if (!cfg("precision.budget").empty() && r.policy == "snip") os << " · budget " << esc(cfg("precision.budget"));
  if (!cfg("train.gemm_dtype").empty()) os << " · GEMMs " << esc(cfg("train.gemm_dtype"));
  if (ref) os << " · reference <b>" << esc(ref->name) << "</b> (" << esc(ref->policy_label) << ", dashed)";
  os << "</p>";
  if (ref) os << comparison_html(r, *ref, diffs);

  const RunCurves& cv = r.curves;
  os << "<div class=\"cards\">";
  const double best_val = min_finite(cv.val_loss);
  auto sum_num = [&](const char* k) { return r.summary ? num_or_nan(*r.summary, k) : kNaN; };
  if (r.summary) {
    const double fv = sum_num("final_val_loss");
    std::string delta;
    if (ref && std::isfinite(fv)) {
      double rv = ref->summary ? num_or_nan(*ref->summary, "final_val_loss") : kNaN;
      if (!std::isfinite(rv)) rv = last_finite(ref->curves.val_loss);
      if (std::isfinite(rv)) delta = fmt("%+.4f", fv - rv) + " vs reference";
    }
    os << card("final val loss", fmt("%.4f", fv), delta);
    os << card("final val perplexity", fmt("%.1f", sum_num("final_val_ppl")));
    os << card("best val loss", fmt("%.4f", best_val));
    os << card("final train loss", fmt("%.4f", sum_num("final_train_loss")));
    // A resumed run: tokens_total and elapsed_s cover every session (as do
    // steps, tokens, seconds and tokens_per_s since summary.json had them).
    const double tokens = std::isfinite(sum_num("tokens_total")) ? sum_num("tokens_total") : sum_num("tokens");
    const double seconds = std::isfinite(sum_num("elapsed_s")) ? sum_num("elapsed_s") : sum_num("seconds");
    std::string resumed;  // "2 sessions: resumed at step 20" ("" for one session or when not recorded)
    const json ra = r.summary->value("resumed_at", json());
    if (ra.is_array() && !ra.empty()) {
      std::string at;
      for (const json& v : ra) at += (at.empty() ? "" : ", ") + v.dump();
      resumed = std::to_string(ra.size() + 1) + " sessions: resumed at step" + (ra.size() > 1 ? "s " : " ") + at;
    }
    const double tps = seconds > 0 && std::isfinite(tokens / seconds) ? tokens / seconds : sum_num("tokens_per_s");
    os << card("throughput", fmt("%.0f", tps) + " tok/s", resumed.empty() ? "" : "over every session");
    os << card("steps", fmt("%.0f", sum_num("steps")), si(tokens) + " tokens");
    os << card("wall time", duration(seconds), resumed);
    if (std::isfinite(sum_num("parameters"))) os << card("parameters", si(sum_num("parameters")));
    // Pipeline stages (docs/distributed.md "Pipeline stages").
    const json pp = r.summary->value("pipeline", json());
    if (pp.is_object()) {
      os << card("pipeline", fmt("%.0f", num_or_nan(pp, "stages")) + " stages x " + fmt("%.0f", num_or_nan(pp, "replicas")),
                 esc(pp.value("schedule", std::string("?"))) + ", " + fmt("%.0f", num_or_nan(pp, "micro_batches")) +
                     " micro-batches");
      os << card("bubble", fmt("%.3f", num_or_nan(pp, "bubble")),
                 "measured; ideal (S-1)/(M+S-1) = " + fmt("%.3f", num_or_nan(pp, "ideal_bubble")));
      os << card("stage imbalance", fmt("%.3f", num_or_nan(pp, "stage_imbalance")), "slowest / mean stage, estimated");
      os << card("boundary bytes", si(num_or_nan(pp, "boundary_bytes_per_step")),
                 "per step, " + esc(pp.value("boundary_comm", std::string("?"))));
    }
    // SNIP-LoRA (docs/lora.md): what trained, and the frozen base as held.
    const json lo = r.summary->value("lora", json());
    if (lo.is_object()) {
      os << card("adapters", "r = " + fmt("%.0f", num_or_nan(lo, "rank")) + ", alpha " + fmt("%g", num_or_nan(lo, "alpha")),
                 si(num_or_nan(lo, "trainable_parameters")) + " trainable on " + fmt("%.0f", num_or_nan(lo, "adapted_layers")) +
                     " layers");
      os << card("frozen base", fmt("%.1f", 100.0 * num_or_nan(lo, "base_linear_saved_fraction")) + "% saved",
                 si(num_or_nan(lo, "base_linear_stored_bytes")) + "B held of " +
                     si(num_or_nan(lo, "base_linear_fp32_bytes")) + "B in FP32 (linear weights)");
    }
  } else {
    const double steps = cv.step.empty() ? kNaN : cv.step.back();
    os << card("status", "unfinished", "no summary.json");
    os << card("steps logged", fmt("%.0f", steps), cfg("train.max_steps").empty() ? "" : "of " + cfg("train.max_steps"));
    os << card("last train loss", fmt("%.4f", last_finite(cv.loss)));
    os << card("last val loss", fmt("%.4f", last_finite(cv.val_loss)));
    os << card("best val loss", fmt("%.4f", best_val));
    // Tokens over wall time since the first step (elapsed_s continues across
    // resumes); the last step's own rate when the tokens per step are unknown.
    const double per_step = std::atof(cfg("train.batch_size").c_str()) * std::atof(cfg("train.seq_len").c_str()) *
                            std::atof(cfg("train.grad_accum").c_str());
    const double el = last_finite(cv.elapsed_s);
    if (per_step > 0 && el > 0 && std::isfinite(steps))
      os << card("throughput", fmt("%.0f", per_step * steps / el) + " tok/s", "since the first step");
    else
      os << card("throughput", fmt("%.0f", last_finite(cv.tokens_per_s)) + " tok/s", "the last step's");
    os << card("elapsed", duration(el));
  }
  // Mean FP4 share over the logged steps (every step does the same FLOPs).
  double share_sum = 0;
  size_t share_n = 0;
  for (double v : cv.fp4_share)
    if (std::isfinite(v)) {
      share_sum += v;
      ++share_n;
    }
  if (share_n && (!r.decisions.empty() || share_sum > 0)) os << card("FP4 share", fmt("%.1f%%", 100 * share_sum / double(share_n)), "mean over steps; final " + fmt("%.1f%%", 100 * last_finite(cv.fp4_share)));
  os << "</div></header>";
  return os.str();
}

std::string loss_section(const RunData& r, const RunData* ref) {
  std::ostringstream os;
  os << "<section id=\"loss\"><h2>Loss</h2><div class=\"charts\">";
  const RunCurves& c = r.curves;
  std::vector<Series> s;
  const double span = span_for(c.step.size());
  const bool ema = smooths(span);
  if (ema) {
    s.push_back({"train loss (raw)", c.step, c.loss, "#0072B2", false, 0.25, 1.0});
    s.push_back({"train loss (EMA)", c.step, ema_smooth(c.loss, span), "#0072B2", false, 1.0, 2.0});
  } else {
    s.push_back({"train loss", c.step, c.loss, "#0072B2", false, 1.0, 2.0});
  }
  bool ref_ema = false;
  if (ref) {
    const RunCurves& rc = ref->curves;
    const double rspan = span_for(rc.step.size());
    ref_ema = smooths(rspan);
    if (ref_ema)
      s.push_back({ref->name + " train loss (EMA)", rc.step, ema_smooth(rc.loss, rspan), "#D55E00", true, 1.0, 2.0});
    else
      s.push_back({ref->name + " train loss", rc.step, rc.loss, "#D55E00", true, 1.0, 2.0});
  }
  LineChartOptions o;
  o.id = "loss";
  o.title = "Training loss";
  o.width = 560;
  o.x_label = "step";
  o.y_label = "loss (nats/token)";
  std::string caption =
      ema ? "Faint: every step's loss; solid: exponential moving average (span " + fmt("%.0f", span) + " steps)"
          : "Training loss at every step (" + std::to_string(c.step.size()) + " steps: too few for a moving average)";
  if (ref)
    caption += std::string("; dashed: the reference run") +
               (ref_ema == ema ? "" : ref_ema ? " (moving average)" : " (every step)");
  os << figure(svg_line_chart(s, o), caption + ".");
  bool any_val = !c.val_step.empty() || (ref && !ref->curves.val_step.empty());
  if (any_val) {
    std::vector<Series> v;
    // Markers on the evaluation points: a run evaluated once is a point, not an invisible zero-length line.
    v.push_back({"val loss", c.val_step, c.val_loss, "#0072B2", false, 1.0, 2.0, true});
    if (ref)
      v.push_back({ref->name + " val loss", ref->curves.val_step, ref->curves.val_loss, "#D55E00", true, 1.0, 2.0, true});
    LineChartOptions vo = o;
    vo.id = "val-loss";
    vo.title = "Validation loss";
    os << figure(svg_line_chart(v, vo), std::string("Held-out loss at the evaluation steps (one marker each") + (ref ? "; hollow: the reference run" : "") + ").");
  } else {
    os << empty_note("no validation loss recorded (train.eval_interval = 0 or no evaluation step yet)");
  }
  os << "</div></section>";
  return os.str();
}

// The guard's events (train/guard.h), when there were any.
std::string guard_section(const RunData& r) {
  if (r.curves.guard.empty()) return "";
  std::ostringstream os;
  os << "<section id=\"guard\"><h2>Guard</h2><p class=\"note\">What the in-process guard saw and did "
        "(metrics.jsonl \"guard\"; docs/operations.md \"The guard\").</p><div class=\"scroll\"><table class=\"guard\">"
        "<tr><th>step</th><th>condition</th><th>action</th><th class=\"wrap\">reason</th><th class=\"wrap\">outcome</th></tr>";
  // The reason and outcome are sentences: they wrap within the page width.
  for (const auto& e : r.curves.guard)
    os << "<tr><td>" << e.step << "</td><td>" << esc(e.condition) << "</td><td>" << esc(e.action)
       << "</td><td class=\"wrap\">" << esc(e.reason) << "</td><td class=\"wrap\">" << esc(e.outcome) << "</td></tr>";
  os << "</table></div></section>";
  return os.str();
}

std::string precision_section(const RunData& r, const RunData* ref) {
  std::ostringstream os;
  os << "<section id=\"precision\"><h2>Precision</h2>";
  if (r.decisions.empty()) {
    os << empty_note("no precision decisions (policy " + r.policy_label + ")");
    // A fixed recipe (policy none with precision.recipe) still logs its share.
    const double share = last_finite(r.curves.fp4_share);
    if (std::isfinite(share) && share > 0) os << "<p class=\"note\">FP4 share " << fmt("%.1f%%", 100 * share) << " (fixed recipe)</p>";
    os << "</section>";
    return os.str();
  }
  os << "<div class=\"charts\">";
  std::vector<Series> s;
  s.push_back({"FP4 share", r.curves.step, r.curves.fp4_share, "#D55E00", false, 1.0, 2.0});
  if (ref) {
    bool any = false;
    for (double v : ref->curves.fp4_share) any = any || (std::isfinite(v) && v > 0);
    if (any) s.push_back({ref->name + " FP4 share", ref->curves.step, ref->curves.fp4_share, "#0072B2", true, 1.0, 2.0});
  }
  LineChartOptions o;
  o.id = "fp4-share";
  o.title = "FP4 share of GEMM FLOPs";
  o.x_label = "step";
  o.y_label = "share";
  o.y_min = 0;
  o.y_max = 1;
  o.height = 260;
  os << figure(svg_line_chart(s, o), "Fraction of the linear layers' GEMM FLOPs that ran in FP4 at each step.");
  os << "</div>";

  // Columns: decision steps; rows: items in model order. When some decision
  // is per GEMM (precision.granularity = gemm, or a forward-only final phase
  // after per-layer plans), a per-layer decision fills its layer's three GEMM
  // rows, so every layer has one set of rows.
  bool per_gemm = false;
  for (const auto& [step, col] : r.decisions)
    for (const auto& kv : col.precision) per_gemm = per_gemm || kv.first.find(':') != std::string::npos;
  std::map<int64_t, std::map<std::string, std::string>> precision;  // step -> item -> option
  for (const auto& [step, col] : r.decisions)
    for (const auto& [item, option] : col.precision) {
      if (per_gemm && item.find(':') == std::string::npos)
        for (Gemm g : kAllGemms) precision[step][plan_item_key(item, g)] = option;
      else
        precision[step][item] = option;
    }
  std::vector<std::string> cols, items;
  std::set<std::string> item_set, layer_set;
  for (const auto& [step, col] : r.decisions) {
    cols.push_back(std::to_string(step));
    for (const auto& kv : precision[step]) item_set.insert(kv.first);
    for (const auto& kv : col.rel) layer_set.insert(kv.first);
  }
  items.assign(item_set.begin(), item_set.end());
  sort_model_order(items);
  std::vector<std::string> row_labels;
  for (const auto& n : items) row_labels.push_back(row_label(n));
  std::vector<std::vector<std::string>> cells(items.size(), std::vector<std::string>(cols.size()));
  size_t j = 0;
  for (const auto& [step, col] : r.decisions) {
    const auto& at = precision[step];
    for (size_t i = 0; i < items.size(); ++i) {
      auto it = at.find(items[i]);
      // The unquantized option is the recipe "bf16" in plans; with
      // train.gemm_dtype = fp32 its GEMMs ran in FP32: say so.
      if (it != at.end()) cells[i][j] = it->second == "bf16" && r.gemm_dtype == "fp32" ? "fp32" : it->second;
    }
    ++j;
  }
  std::string phases;
  for (const auto& [step, col] : r.decisions) phases += (phases.empty() ? "" : ", ") + std::to_string(step) + " " + (col.phase.empty() ? "?" : col.phase);
  HeatmapOptions ho;
  ho.id = "precision-map";
  ho.title = "Precision map";
  ho.x_label = "decision step";
  os << "<div class=\"scroll\">"
     << figure(svg_heatmap(row_labels, cols, cells, ho),
               std::to_string(items.size()) + " items × " + std::to_string(cols.size()) +
                   " decisions. A decision at step s applies from step s+1 on (1-based metrics steps). Phases: " + phases + ".")
     << "</div>";

  // Quantization error heat map.
  if (layer_set.empty()) {
    os << empty_note("no quantization error measurements: policy " + r.policy_label + " takes no stats steps");
  } else {
    std::vector<std::string> layers(layer_set.begin(), layer_set.end());
    sort_model_order(layers);
    std::vector<std::string> labels;
    for (const auto& n : layers) labels.push_back(row_label(n));
    std::vector<std::vector<double>> v(layers.size(), std::vector<double>(cols.size(), kNaN));
    size_t jj = 0;
    for (const auto& [step, col] : r.decisions) {
      for (size_t i = 0; i < layers.size(); ++i) {
        auto it = col.rel.find(layers[i]);
        if (it != col.rel.end()) v[i][jj] = it->second;
      }
      ++jj;
    }
    HeatmapOptions eo;
    eo.id = "error-map";
    eo.title = "Relative error of the fprop GEMM at the chosen option";
    eo.x_label = "decision step";
    eo.value_label = "‖Y−Ŷ‖/‖Y‖";
    os << "<div class=\"scroll\">"
       << figure(svg_heatmap(labels, cols, v, eo),
                 "Measured at each stats step (empty: no stats at that decision, e.g. warmup and final phases). "
                 "A layer left unquantized (" + std::string(r.gemm_dtype == "fp32" ? "fp32" : "bf16") +
                     " GEMMs) has error 0 (lowest colour).")
       << "</div>";
  }
  os << "</section>";
  return os.str();
}

// Option columns of a plan table: the options the plan could choose among
// (`allowed`; empty = not known) that have a Q anywhere in it, the low option
// first, then by cost, then name.
std::vector<std::string> plan_option_columns(const json& pj, const std::set<std::string>& allowed) {
  std::set<std::string> all;
  for (const json& it : pj.at("items"))
    if (it.contains("q") && it["q"].is_object())
      for (const auto& kv : it["q"].items()) all.insert(kv.key());
  if (pj.contains("q_table") && pj["q_table"].is_object())
    for (const auto& [layer, q] : pj["q_table"].items())
      if (q.is_object())
        for (const auto& kv : q.items()) all.insert(kv.key());
  std::vector<std::string> cols;
  for (const std::string& o : all)
    if (allowed.empty() || allowed.count(o)) cols.push_back(o);
  const std::string low = pj.value("low_option", std::string("fp4"));
  std::map<std::string, double> cost;
  if (pj.contains("option_costs") && pj["option_costs"].is_object())
    for (const auto& [k, v] : pj["option_costs"].items())
      if (v.is_number()) cost[k] = v.get<double>();
  auto c = [&](const std::string& s) { return cost.count(s) ? cost[s] : 1e300; };
  std::stable_sort(cols.begin(), cols.end(), [&](const std::string& a, const std::string& b) {
    if ((a == low) != (b == low)) return a == low;
    return c(a) < c(b);
  });
  return cols;
}

// The options a plan could choose among: its "options" (plan_to_json), else
// the run's precision.options ("fp4,fp8"); empty when neither is known. The
// q_table alone does not tell: it carries the reference bf16 (Q = 0) even
// when bf16 is not allowed.
std::set<std::string> plan_options(const json& pj, const RunData& r) {
  std::set<std::string> out;
  if (pj.contains("options") && pj["options"].is_array()) {
    for (const json& o : pj["options"])
      if (o.is_string()) out.insert(o.get<std::string>());
    return out;
  }
  auto it = r.config.find("precision.options");
  if (it == r.config.end()) return out;
  std::stringstream ss(it->second);
  for (std::string o; std::getline(ss, o, ',');) {
    const size_t a = o.find_first_not_of(" \t"), b = o.find_last_not_of(" \t");
    if (a != std::string::npos) out.insert(o.substr(a, b - a + 1));
  }
  return out;
}

// Relative error per GEMM at each option, measured at a stats step:
// layer -> option -> {fprop, dgrad, wgrad} (NaN where absent).
using GemmErrors = std::map<std::string, std::map<std::string, std::array<double, 3>>>;

// From a stats file (core/stats.h to_json): the "measured" part (this step's
// raw statistics, the same measurement as the plan's rel_err_fprop), details
// layers[].options[opt].rel_err.{fprop,dgrad,wgrad}; the reference option
// (details.reference) has error 0. Empty when the file has no "measured".
GemmErrors measured_gemm_errors(const json& sj) {
  GemmErrors out;
  if (!sj.contains("measured") || !sj["measured"].is_object()) return out;
  const json d = sj["measured"].value("details", json::object());
  if (!d.is_object() || !d.contains("layers") || !d["layers"].is_array()) return out;
  const std::string ref = d.contains("reference") && d["reference"].is_string() ? d["reference"].get<std::string>() : "";
  for (const json& l : d["layers"]) {
    if (!l.is_object() || !l.contains("name") || !l["name"].is_string()) continue;
    auto& m = out[l["name"].get<std::string>()];
    if (!ref.empty()) m[ref] = {0.0, 0.0, 0.0};
    if (!l.contains("options") || !l["options"].is_object()) continue;
    for (const auto& [opt, o] : l["options"].items()) {
      if (!o.is_object() || !o.contains("rel_err") || !o["rel_err"].is_object()) continue;
      const json& re = o["rel_err"];
      m[opt] = {num_or_nan(re, "fprop"), num_or_nan(re, "dgrad"), num_or_nan(re, "wgrad")};
    }
  }
  return out;
}

std::string chip(const std::string& option) {
  return "<span class=\"chip\" style=\"background:" + option_color(option) + "\"></span>" + esc(option);
}

std::string plan_section(const RunData& r) {
  std::ostringstream os;
  os << "<section id=\"plan\"><h2>Latest plan</h2>";
  if (r.plans.empty()) {
    os << empty_note(r.decisions.empty() ? "no precision decisions (policy " + r.policy_label + ")"
                                         : "no plans/step-N.json files in the run directory");
    os << "</section>";
    return os.str();
  }
  // The latest planning decision (phase "plan"); warmup and final decisions
  // put every layer at one option and are listed after it.
  auto chosen = r.plans.rbegin();
  for (auto it = r.plans.rbegin(); it != r.plans.rend(); ++it)
    if (it->second.value("phase", json()) == "plan") {
      chosen = it;
      break;
    }
  const int64_t step = chosen->first;
  const json& pj = chosen->second;
  const std::string& path = r.plan_paths.at(step);
  std::string later;
  for (auto it = r.plans.upper_bound(step); it != r.plans.end(); ++it) {
    std::string opt;
    try {
      const json& items = it->second.at("items");
      if (!items.empty()) opt = items.at(0).at("option").get<std::string>();
      for (const json& i : items)
        if (i.at("option").get<std::string>() != opt) opt = "mixed";
    } catch (const json::exception& e) {
      fail("snip report: ", r.plan_paths.at(it->first), ": expected a plan file written by `snip train` (", e.what(), ")");
    }
    later += (later.empty() ? "" : "; ") + std::string("step ") + std::to_string(it->first) + " " +
             it->second.value("phase", std::string("?")) + " (" + (opt == "mixed" ? "mixed options" : "every item " + opt) + ")";
  }
  try {
    const std::string low = pj.value("low_option", std::string("fp4"));
    const std::vector<std::string> opts = plan_option_columns(pj, plan_options(pj, r));
    struct Row {
      std::string name, option;
      double flops;
      const json* item;
    };
    std::vector<Row> rows;
    double total = 0;
    for (const json& it : pj.at("items")) {
      rows.push_back({it.at("name").get<std::string>(), it.at("option").get<std::string>(), it.at("flops").get<double>(), &it});
      total += rows.back().flops;
    }
    std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return model_order_less(a.name, b.name); });
    const bool has_rel = pj.contains("rel_err_fprop") && pj["rel_err_fprop"].is_object();
    // Per-GEMM items ("<layer>:dgrad") show their own GEMM's error: from the
    // stats step of this decision (stats/step-<step>.json), which the plan
    // file itself does not carry beyond fprop.
    bool per_gemm = false;
    for (const Row& row : rows) per_gemm = per_gemm || row.name.find(':') != std::string::npos;
    GemmErrors gemm_err;
    if (per_gemm && has_rel) {
      const fs::path sp = fs::path(r.dir) / "stats" / ("step-" + std::to_string(step) + ".json");
      std::error_code ec;
      if (fs::exists(sp, ec)) {
        const json sj = read_json_file(sp.string(), "stats");
        if (sj.is_object()) gemm_err = measured_gemm_errors(sj);
      }
    }
    const std::string method = pj.value("method", std::string("?"));
    os << "<p class=\"note\">" << esc(fs::path(path).filename().string()) << ": decision at step " << step << ", phase "
       << esc(pj.value("phase", std::string("?"))) << ", policy " << esc(pj.value("policy", r.policy)) << ", "
       << rows.size() << " items." << (later.empty() ? "" : " Later decisions: " + esc(later) + ".")
       << "</p><dl class=\"kv\">";
    if (pj.contains("budget") && pj["budget"].is_number() && pj.value("phase", std::string()) == "plan" &&
        method.rfind("uniform-", 0) != 0)
      os << "<dt>budget</dt><dd>" << esc(low) << " FLOPs share ≥ " << fmt("%.4g", pj["budget"].get<double>()) << "</dd>";
    if (pj.contains("cost_budget") && pj["cost_budget"].is_number())
      os << "<dt>cost budget</dt><dd>" << fmt("%.4g", pj["cost_budget"].get<double>()) << " per FLOP</dd>";
    os << "<dt>achieved share</dt><dd>" << esc(low) << " " << fmt("%.4f", num_or_nan(pj, "fp4_share"));
    if (pj.contains("cost_per_flop") && pj["cost_per_flop"].is_number())
      os << ", cost " << fmt("%.4f", pj["cost_per_flop"].get<double>()) << " per FLOP";
    os << "</dd>";
    if (pj.contains("q_table") && pj.contains("objective") && pj["objective"].is_number())
      os << "<dt>objective</dt><dd>Σ Q = " << fmt("%.6g", pj["objective"].get<double>()) << "</dd>";
    if (method == "ilp")
      os << "<dt>solver</dt><dd>CBC " << esc(pj.value("status", std::string("?")))
         << (pj.value("proven_optimal", false) ? " (proven optimal)" : " (not proven optimal)") << " in "
         << fmt("%.3f", pj.value("solve_seconds", 0.0)) << " s</dd>";
    else
      os << "<dt>method</dt><dd>" << (method.rfind("uniform-", 0) == 0 ? "" : "heuristic ") << esc(method) << ", status "
         << esc(pj.value("status", std::string("?"))) << "</dd>";
    if (pj.contains("stats_seconds") && pj["stats_seconds"].is_number())
      os << "<dt>stats step</dt><dd>" << fmt("%.3f", pj["stats_seconds"].get<double>()) << " s</dd>";
    os << "</dl>";
    // Pipeline stages (dist.pipeline_stages): every item carries its stage.
    bool stages = !rows.empty();
    for (const Row& row : rows) stages = stages && row.item->contains("stage") && (*row.item)["stage"].is_number_integer();
    if (pj.contains("stage_fp4_share") && pj["stage_fp4_share"].is_array()) {
      os << "<p class=\"note\">" << esc(low) << " FLOPs share per pipeline stage (each meets the budget alone):";
      size_t k = 0;
      for (const json& v : pj["stage_fp4_share"]) os << " stage " << k++ << " " << fmt("%.4f", v.is_number() ? v.get<double>() : kNaN);
      os << ".</p>";
    }
    os << "<div class=\"scroll\"><table class=\"plan\" data-rows=\"" << rows.size() << "\"><thead><tr><th class=\"name\">item</th><th>option</th><th>FLOPs %</th>";
    if (stages) os << "<th>stage</th>";
    for (const auto& o : opts) os << "<th>Q(" << esc(o) << ")</th>";
    if (has_rel) os << (per_gemm ? "<th>rel. err (own GEMM)</th>" : "<th>rel. err fprop</th>");
    os << "</tr></thead><tbody>";
    for (const Row& row : rows) {
      os << "<tr><td class=\"name\">" << esc(row.name) << "</td><td class=\"opt\">" << chip(row.option) << "</td><td>"
         << fmt("%.2f", total > 0 ? 100 * row.flops / total : kNaN) << "</td>";
      if (stages) os << "<td>" << (*row.item)["stage"].get<int64_t>() << "</td>";
      const json* q = row.item->contains("q") && (*row.item)["q"].is_object() ? &(*row.item)["q"] : nullptr;
      const json* qt = pj.contains("q_table") && pj["q_table"].contains(row.name) ? &pj["q_table"][row.name] : nullptr;
      for (const auto& o : opts) {
        double v = kNaN;
        if (q && q->contains(o) && (*q)[o].is_number()) v = (*q)[o].get<double>();
        else if (qt && qt->is_object() && qt->contains(o) && (*qt)[o].is_number()) v = (*qt)[o].get<double>();
        os << "<td>" << fmt("%.4g", v) << "</td>";
      }
      if (has_rel) {
        const size_t colon = row.name.find(':');
        const std::string layer = row.name.substr(0, colon);
        const std::string gemm = colon == std::string::npos ? "fprop" : row.name.substr(colon + 1);
        double v = kNaN;
        if (gemm == "fprop") {  // the plan's own record
          const json& m = pj["rel_err_fprop"].value(layer, json::object());
          if (m.is_object() && m.contains(row.option) && m[row.option].is_number()) v = m[row.option].get<double>();
        } else if (gemm == "dgrad" || gemm == "wgrad") {
          auto l = gemm_err.find(layer);
          if (l != gemm_err.end()) {
            auto o = l->second.find(row.option);
            if (o != l->second.end()) v = o->second[gemm == "dgrad" ? 1 : 2];
          }
        }
        os << "<td>" << fmt("%.4g", v) << "</td>";
      }
      os << "</tr>";
    }
    os << "</tbody></table></div>";
  } catch (const json::exception& e) {
    fail("snip report: ", path, ": expected a plan file written by `snip train` (", e.what(), ")");
  }
  os << "</section>";
  return os.str();
}

std::string stats_section(const RunData& r) {
  std::ostringstream os;
  os << "<section id=\"stats\"><h2>Latest stats step</h2>";
  if (!r.stats) {
    os << empty_note("no stats steps (policy " + r.policy_label + (r.policy == "snip" || r.policy == "min-rel-err" ? "; none yet" : " takes none") + ")");
    os << "</section>";
    return os.str();
  }
  const json& sj = *r.stats;
  try {
    const json details = sj.value("details", json::object());
    const std::string low = details.value("low_option", std::string("fp4"));
    std::map<std::string, const json*> det;
    if (details.contains("layers") && details["layers"].is_array())
      for (const json& l : details["layers"])
        if (l.is_object() && l.contains("name") && l["name"].is_string()) det[l["name"].get<std::string>()] = &l;
    struct Row {
      std::string name;
      double flops = kNaN, q = kNaN, rel = kNaN, rel_f = kNaN, rel_d = kNaN, rel_w = kNaN, ld = kNaN, wd_own = kNaN,
             wd_upstream = kNaN, curvature = kNaN;
    };
    std::vector<Row> rows;
    double total = 0;
    for (const json& l : sj.at("layers")) {
      Row row;
      row.name = l.at("name").get<std::string>();
      if (l.contains("gemms") && l["gemms"].is_object()) {  // per-GEMM cost table: sum the three
        row.flops = row.q = 0;
        for (const auto& [g, e] : l["gemms"].items()) {
          row.flops += num_or_nan(e, "flops");
          if (e.contains("q") && e["q"].contains(low)) row.q += e["q"][low].get<double>();
        }
      } else {
        row.flops = num_or_nan(l, "flops");
        if (l.contains("q") && l["q"].contains(low)) row.q = l["q"][low].get<double>();
        if (l.contains("rel_err") && l["rel_err"].contains(low)) row.rel = l["rel_err"][low].get<double>();
      }
      auto d = det.find(row.name);
      if (d != det.end()) {
        const json& dl = *d->second;
        row.curvature = num_or_nan(dl, "curvature");
        if (dl.contains("options") && dl["options"].contains(low)) {
          const json& o = dl["options"][low];
          row.ld = num_or_nan(o, "ld");
          row.wd_own = num_or_nan(o, "wd_own");
          row.wd_upstream = num_or_nan(o, "wd_up");
          if (o.contains("rel_err") && o["rel_err"].is_object()) {
            row.rel_f = num_or_nan(o["rel_err"], "fprop");
            row.rel_d = num_or_nan(o["rel_err"], "dgrad");
            row.rel_w = num_or_nan(o["rel_err"], "wgrad");
          }
        }
      }
      if (std::isfinite(row.flops)) total += row.flops;
      rows.push_back(row);
    }
    std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return model_order_less(a.name, b.name); });
    os << "<p class=\"note\">" << esc(fs::path(r.stats_path).filename().string()) << ": step " << sj.value("step", json(-1)).dump()
       << ", " << rows.size() << " layers; smoothed values (precision.smoothing "
       << esc(sj.contains("smoothing") ? sj["smoothing"].dump() : std::string("?"))
       << "), the planner's input. Q, LD and WD at the low option " << esc(low)
       << "; LD: loss change from the layer's fprop error (loss units), WD_own / WD_up: weight-update deviation from "
          "its own wgrad / from upstream dgrad errors (fractions).</p>";
    // Scatter: does the relative error predict Q?
    std::vector<double> xs, ys;
    std::vector<ScatterPoint> pts;
    for (const Row& row : rows) {
      const double x = std::isfinite(row.rel_f) ? row.rel_f : row.rel;
      xs.push_back(x);
      ys.push_back(row.q);
      pts.push_back({x, row.q, short_label(row.name), ""});
    }
    ScatterOptions so;
    so.id = "stats-scatter";
    so.width = 640;
    so.title = "Q(" + low + ") against relative error (" + low + ", fprop)";
    so.subtitle = "Pearson r = " + fmt("%.3f", pearson(xs, ys)) + ", Spearman ρ = " + fmt("%.3f", spearman(xs, ys)) +
                  " over " + std::to_string(rows.size()) + " layers";
    so.x_label = "relative error ‖Y−Ŷ‖/‖Y‖";
    so.y_label = "Q (snip's quality loss)";
    so.log_x = so.log_y = true;
    so.show_labels = rows.size() <= 16;  // more would overlap; every point has a tooltip
    os << "<div class=\"charts\">" << figure(svg_scatter(pts, so), "How well the plain relative error (the min-rel-err heuristic's criterion) ranks layers like snip's Q.") << "</div>";
    os << "<div class=\"scroll\"><table class=\"stats\" data-rows=\"" << rows.size() << "\"><thead><tr><th class=\"name\">layer</th><th>FLOPs %</th><th>Q(" << esc(low)
       << ")</th><th>rel. err fprop</th><th>dgrad</th><th>wgrad</th><th>LD</th><th>WD_own</th><th>WD_up</th><th>curvature</th></tr></thead><tbody>";
    for (const Row& row : rows)
      os << "<tr><td class=\"name\">" << esc(row.name) << "</td><td>" << fmt("%.2f", total > 0 ? 100 * row.flops / total : kNaN)
         << "</td><td>" << fmt("%.4g", row.q) << "</td><td>" << fmt("%.4g", std::isfinite(row.rel_f) ? row.rel_f : row.rel) << "</td><td>"
         << fmt("%.4g", row.rel_d) << "</td><td>" << fmt("%.4g", row.rel_w) << "</td><td>" << fmt("%.4g", row.ld)
         << "</td><td>" << fmt("%.4g", row.wd_own) << "</td><td>" << fmt("%.4g", row.wd_upstream) << "</td><td>"
         << fmt("%.4g", row.curvature) << "</td></tr>";
    os << "</tbody></table></div>";
  } catch (const json::exception& e) {
    fail("snip report: ", r.stats_path, ": expected a stats file written by `snip train` (", e.what(), ")");
  }
  os << "</section>";
  return os.str();
}

}  // namespace

// ---- public -----------------------------------------------------------------

RunCurves read_metrics(const std::string& path) {
  const std::string text = io::read_file(path);
  RunCurves c;
  std::istringstream in(text);
  std::string line;
  auto truncate_from = [&](double step) {
    // Drop records at or after `step` (a re-logged tail after a resume).
    size_t keep = size_t(std::lower_bound(c.step.begin(), c.step.end(), step) - c.step.begin());
    for (auto* v : {&c.step, &c.loss, &c.lr, &c.grad_norm, &c.tokens_per_s, &c.elapsed_s, &c.fp4_share}) v->resize(keep);
    size_t vk = size_t(std::lower_bound(c.val_step.begin(), c.val_step.end(), step) - c.val_step.begin());
    for (auto* v : {&c.val_step, &c.val_loss, &c.val_ppl}) v->resize(vk);
    while (!c.decisions.empty() && double(c.decisions.back().step) >= step) c.decisions.pop_back();
  };
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    // A line that is not a record snip writes (a torn last line, a key of
    // another type) is skipped and counted.
    StepRecord r;
    try {
      r = step_record_from_json(json::parse(line), path);
    } catch (const json::exception&) {  // unparsable, or a number past double's range (tests/fuzz/fuzz_metrics.cpp)
      ++c.skipped_lines;
      continue;
    } catch (const UserError&) {
      ++c.skipped_lines;
      continue;
    }
    const double step = double(r.step);
    if (!c.step.empty() && step <= c.step.back()) truncate_from(step);
    for (const GuardEvent& e : r.guard)
      c.guard.push_back({r.step, e.condition, to_string(e.action), e.reason, e.outcome});
    c.step.push_back(step);
    c.loss.push_back(r.loss.value_or(kNaN));
    c.lr.push_back(r.lr.value_or(kNaN));
    c.grad_norm.push_back(r.grad_norm.value_or(kNaN));
    c.tokens_per_s.push_back(r.tokens_per_s.value_or(kNaN));
    c.elapsed_s.push_back(r.elapsed_s.value_or(kNaN));
    c.fp4_share.push_back(r.fp4_share.value_or(kNaN));
    const double vl = r.val_loss.value_or(kNaN);
    if (std::isfinite(vl)) {
      c.val_step.push_back(step);
      c.val_loss.push_back(vl);
      c.val_ppl.push_back(r.val_ppl.value_or(kNaN));
    }
    if (r.precision) {
      Decision d;
      d.step = r.step;
      d.plan_step = r.plan_step.value_or(d.step - 1);
      d.phase = r.phase.value_or("");
      d.precision = *r.precision;
      if (r.rel_err_fprop)
        for (const auto& [k, v] : *r.rel_err_fprop)
          if (!std::isnan(v)) d.rel_err_fprop[k] = v;
      c.decisions.push_back(std::move(d));
    }
  }
  return c;
}

std::vector<double> ema_smooth(const std::vector<double>& y, double span) {
  if (!(span > 1)) return y;
  const double beta = 1.0 - 2.0 / (span + 1.0);
  std::vector<double> out(y.size(), kNaN);
  double m = 0, bias = 1;
  for (size_t k = 0; k < y.size(); ++k) {
    if (!std::isfinite(y[k])) continue;
    m = beta * m + (1 - beta) * y[k];
    bias *= beta;
    out[k] = m / (1 - bias);
  }
  return out;
}

bool model_order_less(const std::string& a, const std::string& b) {
  const OrderKey ka = order_key(a), kb = order_key(b);
  if (ka.layer != kb.layer) return ka.layer < kb.layer;
  if (ka.proj != kb.proj) return ka.proj < kb.proj;
  const std::string ba = a.substr(0, a.find(':')), bb = b.substr(0, b.find(':'));
  if (ba != bb) return ba < bb;  // two unknown projections of one layer
  if (ka.gemm != kb.gemm) return ka.gemm < kb.gemm;
  return a < b;
}

void sort_model_order(std::vector<std::string>& names) {
  std::stable_sort(names.begin(), names.end(), model_order_less);
}

std::vector<RunDifference> check_reference(const std::string& run_dir, const std::string& reference_dir, bool force) {
  // Both must be runs before anything is compared (a folder that is not one
  // is one error line, not a list of "unknown" notes first).
  require_dir(run_dir);
  require_dir(reference_dir);
  const RunRecord a = read_run_record(run_dir), b = read_run_record(reference_dir);
  std::vector<RunDifference> diffs = compare_runs(a, b);
  if (incomparable(diffs) && !force) {
    std::string what;
    for (const RunDifference& d : diffs)
      if (d.incomparable) what += (what.empty() ? "" : "; ") + d.line(a.name, b.name);
    fail("snip report: ", run_dir, " and the reference ", reference_dir, " have incomparable losses (", what,
         "): nats per token of another tokenizer or on other validation data; compare runs on the same data, or "
         "pass --force to overlay them anyway");
  }
  return diffs;
}

std::string report_html(const std::string& run_dir, const std::string& reference_dir, bool force) {
  const RunData r = load_run(run_dir, true);
  std::optional<RunData> ref;
  std::vector<RunDifference> diffs;
  if (!reference_dir.empty()) {
    ref = load_run(reference_dir, false);
    diffs = check_reference(run_dir, reference_dir, force);
  }
  const RunData* refp = ref ? &*ref : nullptr;
  const bool diffs_incomparable = incomparable(diffs);
  std::ostringstream os;
  os << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
     << "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
     << "<title>snip report: " << esc(r.name) << "</title><style>" << kStyle << "</style></head>\n<body><main>\n";
  os << header_html(r, refp, diffs) << "\n";
  os << "<nav><a href=\"#loss\">Loss</a><a href=\"#precision\">Precision</a><a href=\"#plan\">Latest plan</a>"
     << "<a href=\"#stats\">Latest stats step</a></nav>\n";
  if (!r.has_metrics) os << "<p class=\"empty\">no metrics.jsonl in " << esc(run_dir) << " yet</p>";
  else if (r.curves.skipped_lines > 0)
    os << "<p class=\"note\">" << r.curves.skipped_lines << " unparsable line(s) of metrics.jsonl skipped (e.g. a torn last line).</p>";
  os << loss_section(r, refp) << "\n";
  os << guard_section(r) << "\n";
  os << precision_section(r, refp) << "\n";
  os << plan_section(r) << "\n";
  os << stats_section(r) << "\n";
  os << "<footer>snip report of " << esc(run_dir) << (refp ? " (reference " + esc(reference_dir) + ")" : std::string())
     << ". Regenerate with <code>snip report " << esc(run_dir)
     << (refp ? " --reference " + esc(reference_dir) + (diffs_incomparable ? " --force" : "") : std::string())
     << "</code>.</footer>\n</main></body></html>\n";
  return os.str();
}

std::string write_report(const std::string& run_dir, const std::string& reference_dir, const std::string& out_path,
                         bool force) {
  if (!out_path.empty()) io::ensure_writable_file(out_path, "--out");  // before the report is built
  const std::string html = report_html(run_dir, reference_dir, force);
  const std::string out = out_path.empty() ? (fs::path(run_dir) / "report.html").string() : out_path;
  io::write_file_atomic(out, html);
  return out;
}

}  // namespace snip::report
