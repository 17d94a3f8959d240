// Plan files: rendering and look-up (see plan_file.h).
#include "snip/plan/plan_file.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <vector>

#include "snip/core/error.h"
#include "snip/core/statistics.h"
#include "snip/io/atomic_file.h"
#include "snip/io/toml.h"

namespace snip {

namespace {
std::string fmtd(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}
}  // namespace

std::string format_plan_table(const nlohmann::json& pj) {
  std::ostringstream os;
  try {
    const std::string low = pj.value("low_option", std::string("fp4"));
    std::string up = low;
    for (char& c : up) c = char(std::toupper(static_cast<unsigned char>(c)));
    const nlohmann::json& items = pj.at("items");
    const bool has_q = pj.contains("q_table"), has_rel = pj.contains("rel_err_fprop");
    std::vector<std::string> cols;
    if (has_q) {
      // Columns: options with a Q that the plan chose among ("options"; the
      // q_table also holds the bf16 reference when bf16 was not allowed).
      std::set<std::string> all, allowed;
      if (pj.contains("options") && pj["options"].is_array())
        for (const auto& o : pj["options"])
          if (o.is_string()) allowed.insert(o.get<std::string>());
      for (const auto& [layer, q] : pj["q_table"].items())
        for (const auto& [opt, v] : q.items())
          if (allowed.empty() || allowed.count(opt)) all.insert(opt);
      cols.assign(all.begin(), all.end());
      std::map<std::string, double> cost = pj.value("option_costs", std::map<std::string, double>{});
      auto c = [&](const std::string& s) { return cost.count(s) ? cost[s] : 1e300; };
      std::stable_sort(cols.begin(), cols.end(), [&](const std::string& a, const std::string& b) {
        if ((a == low) != (b == low)) return a == low;
        return c(a) < c(b);
      });
    }
    // Pipeline stages: every item carries an integer "stage" (dist.pipeline_stages).
    bool stages = !items.empty();
    for (const nlohmann::json& it : items) stages = stages && it.contains("stage") && it["stage"].is_number_integer();
    size_t w = 4;
    double total = 0;
    for (const nlohmann::json& it : items) {
      w = std::max(w, it.at("name").get<std::string>().size());
      total += it.at("flops").get<double>();
    }
    auto pad = [](const std::string& s, size_t n) { return s.size() >= n ? s : s + std::string(n - s.size(), ' '); };
    auto lpad = [](const std::string& s, size_t n) { return s.size() >= n ? s : std::string(n - s.size(), ' ') + s; };
    // "step": an integer; json::value() would cast a float such as 1e300 to
    // int64 (undefined behaviour, found by fuzz_plan_file).
    int64_t step = -1;
    if (pj.contains("step")) {
      const nlohmann::json& s = pj["step"];
      if (!s.is_number_integer() || (s.is_number_unsigned() && s.get<uint64_t>() > uint64_t(INT64_MAX)))
        fail("plan JSON: step: expected an integer >= 0, got ", s.type_name());
      step = s.get<int64_t>();
    }
    os << "precision plan at step " << step << ": policy "
       << pj.value("policy", std::string("?")) << ", phase " << pj.value("phase", std::string("?")) << "\n";
    os << pad("item", w) << "  " << pad("option", 8) << lpad("FLOPs %", 9);
    if (stages) os << lpad("stage", 7);
    for (const auto& c : cols) os << lpad("Q(" + c + ")", 13);
    if (has_rel) os << lpad("rel.err fprop", 15);
    os << "\n";
    for (const nlohmann::json& it : items) {
      const std::string name = it.at("name").get<std::string>(), opt = it.at("option").get<std::string>();
      os << pad(name, w) << "  " << pad(opt, 8) << lpad(fmtd("%.2f%%", 100.0 * it.at("flops").get<double>() / total), 9);
      if (stages) os << lpad(std::to_string(it["stage"].get<int64_t>()), 7);
      for (const auto& c : cols) {
        const nlohmann::json& q = pj["q_table"].value(name, nlohmann::json::object());
        os << lpad(q.contains(c) ? fmtd("%.4g", q[c].get<double>()) : "-", 13);
      }
      if (has_rel) {
        // Layers, and the fprop GEMM of per-GEMM items ("<layer>:fprop"): the
        // layer's fprop error; dgrad/wgrad items: "-" (not in the plan file).
        const size_t colon = name.find(':');
        const bool fprop = colon == std::string::npos || name.compare(colon + 1, std::string::npos, "fprop") == 0;
        const nlohmann::json& r =
            fprop ? pj["rel_err_fprop"].value(name.substr(0, colon), nlohmann::json::object()) : nlohmann::json::object();
        os << lpad(r.contains(opt) ? fmtd("%.4g", r[opt].get<double>()) : "-", 15);
      }
      os << "\n";
    }
    os << "\n";
    const std::string method = pj.value("method", std::string("?"));
    // The rivals' rules (planner.h) reach their own share: no budget applies.
    const bool rule = method == "bf16-tail" || method == "first-last-n" || method == "autoswitch";
    if (rule && pj.value("phase", std::string()) == "plan")
      os << "budget:    none (" << method << " follows its rule; the share below is what it reached)\n";
    if (!rule && pj.contains("budget") && pj["budget"].is_number() && pj.value("phase", std::string()) == "plan" &&
        method.rfind("uniform-", 0) != 0)
      os << "budget:    " << up << " FLOPs share >= " << fmtd("%.4g", pj["budget"].get<double>()) << "\n";
    if (!rule && pj.contains("time_budget") && pj["time_budget"].is_number() &&
        pj.value("phase", std::string()) == "plan")
      os << "budget:    GEMM time <= " << fmtd("%.4g", pj["time_budget"].get<double>()) << " x "
         << pj.value("time_reference", std::string("bf16")) << " (measured)\n";
    os << "achieved:  " << up << " share " << fmtd("%.4f", pj.at("fp4_share").get<double>());
    if (pj.contains("cost_per_flop") && pj["cost_per_flop"].is_number())
      os << ", cost " << fmtd("%.4f", pj["cost_per_flop"].get<double>()) << " per FLOP";
    os << "\n";
    if (pj.contains("gemm_seconds") && pj["gemm_seconds"].is_number() && pj.contains("reference_gemm_seconds") &&
        pj["reference_gemm_seconds"].is_number()) {
      const double t = pj["gemm_seconds"].get<double>(), tr = pj["reference_gemm_seconds"].get<double>();
      os << "GEMM time: " << fmtd("%.4g", 1e3 * t) << " ms/step predicted, "
         << pj.value("time_reference", std::string("bf16")) << " " << fmtd("%.4g", 1e3 * tr) << " ms/step ("
         << fmtd("%.3f", tr > 0 ? t / tr : 0.0) << "x)\n";
    }
    if (pj.contains("stage_fp4_share") && pj["stage_fp4_share"].is_array()) {
      os << "stages:   ";
      size_t k = 0;
      for (const nlohmann::json& v : pj["stage_fp4_share"])
        os << " " << k++ << ":" << (v.is_number() ? fmtd("%.4f", v.get<double>()) : std::string("?"));
      os << " (" << up << " share per stage)\n";
    }
    if (has_q) os << "objective: sum Q = " << fmtd("%.6g", pj.at("objective").get<double>()) << "\n";
    if (method == "ilp" && pj.contains("gap") && pj["gap"].is_number() && pj.contains("lower_bound") &&
        pj["lower_bound"].is_number())
      os << "bound:     sum Q >= " << fmtd("%.6g", pj["lower_bound"].get<double>()) << " (gap "
         << fmtd("%.3g", pj["gap"].get<double>()) << ", "
         << fmtd("%.3g", 100.0 * pj.value("relative_gap", 0.0)) << "%)\n";
    if (method == "ilp")
      os << "solver:    " << pj.value("algorithm", std::string("cbc")) << " " << pj.value("status", std::string("?"))
         << (pj.value("proven_optimal", false) ? " (proven)" : " (NOT proven optimal)") << " in "
         << fmtd("%.3f", pj.value("solve_seconds", 0.0)) << " s\n";
    else if (pj.value("final_phase_gemms", std::string()) == "fprop" && method.rfind("uniform-", 0) == 0)
      // The late forward-only raise: the plan file's method names the option
      // the fprop GEMMs took; dgrad and wgrad are the last plan's.
      os << "method:    final phase, forward only (precision.final_phase_gemms = fprop): every fprop GEMM at "
         << method.substr(8) << ", dgrad and wgrad as the last plan\n";
    else
      os << "method:    " << (method.rfind("uniform-", 0) == 0 ? "" : "heuristic ") << method << " in "
         << fmtd("%.3f", pj.value("solve_seconds", 0.0)) << " s\n";
    if (pj.contains("stats_seconds")) os << "stats:     " << fmtd("%.3f", pj["stats_seconds"].get<double>()) << " s\n";
  } catch (const nlohmann::json::exception& e) {
    fail("plan JSON: expected a plan file written by `snip train` (", e.what(), ")");
  }
  return os.str();
}

std::string find_plan_file(const std::string& run_dir, int64_t step) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(run_dir)) fail("snip plan show: run folder ", run_dir, " does not exist");
  const fs::path dir = fs::path(run_dir) / "plans";
  if (!fs::is_directory(dir)) {
    // Why: a run with precision.policy = none (the main job's) makes no plan.
    bool have_config = false;
    std::string policy = "none";  // the default
    try {
      const nlohmann::json c = io::parse_toml_as_json(io::read_file((fs::path(run_dir) / "config.toml").string()),
                                                      "config.toml");
      have_config = true;
      if (c.contains("precision") && c["precision"].contains("policy")) policy = c["precision"]["policy"].get<std::string>();
    } catch (const std::exception&) {  // no readable config.toml: nothing more to say
    }
    if (have_config && (policy == "none" || policy == "bf16"))
      fail("snip plan show: ", run_dir, " made no plan: its precision.policy is none (every layer at "
           "train.gemm_dtype); a run with precision.policy = snip, or a baseline, writes plans/step-N.json");
    fail("snip plan show: ", dir.string(), " does not exist (no plan was made in ", run_dir, ")");
  }
  std::vector<int64_t> steps;
  const std::regex re("step-([0-9]+)\\.json");
  for (auto& e : fs::directory_iterator(dir)) {
    std::smatch m;
    const std::string n = e.path().filename().string();
    if (std::regex_match(n, m, re)) steps.push_back(std::stoll(m[1]));
  }
  if (steps.empty()) fail("snip plan show: no plans/step-N.json in ", run_dir);
  std::sort(steps.rbegin(), steps.rend());
  auto path = [&](int64_t s) { return (dir / ("step-" + std::to_string(s) + ".json")).string(); };
  if (step >= 0) {
    // The plan in force at `step`: the newest one decided at or before it.
    for (int64_t s : steps)
      if (s <= step) return path(s);
    std::string made;
    for (auto it = steps.rbegin(); it != steps.rend(); ++it) made += (made.empty() ? "" : ", ") + std::to_string(*it);
    fail("snip plan show: no plan was in force at step ", step, " in ", run_dir, " (plans were made at steps ", made,
         "; before the first, the warmup precision ran)");
  }
  // The newest real plan (phase "plan"), not the final phase's all-FP8 decision.
  for (int64_t s : steps) {
    std::ifstream in(path(s));
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.value("phase", std::string()) == "plan") return path(s);
  }
  return path(steps.front());
}

double measured_step_seconds(const std::string& run_dir, int64_t plan_step, int64_t& n) {
  namespace fs = std::filesystem;
  n = 0;
  int64_t next = std::numeric_limits<int64_t>::max();
  const std::regex re("step-([0-9]+)\\.json");
  std::error_code ec;
  for (auto& e : fs::directory_iterator(fs::path(run_dir) / "plans", ec)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (std::regex_match(name, m, re)) {
      const int64_t s = std::stoll(m[1]);
      if (s > plan_step) next = std::min(next, s);
    }
  }
  std::ifstream in((fs::path(run_dir) / "metrics.jsonl").string());
  std::vector<double> t;
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("step") || !j.contains("step_s") || !j["step"].is_number_integer() ||
        !j["step_s"].is_number())
      continue;
    const int64_t s = j["step"].get<int64_t>();
    if (s > plan_step && s <= next) t.push_back(j["step_s"].get<double>());
  }
  n = int64_t(t.size());
  return median(std::move(t));  // NaN when no step was measured
}

}  // namespace snip
