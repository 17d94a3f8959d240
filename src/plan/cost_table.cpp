// cost_table.cpp: cost-table parsing, plan JSON, atomic writes, Llama layer
// shapes. Formats are documented in cost_table.h and docs/planner.md.
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>

#include "snip/io/atomic_file.h"
#include "snip/io/json.h"
#include "snip/plan/cost_table.h"
#include "snip/core/error.h"

namespace snip::plan {

using nlohmann::json;

namespace {

// A short, one-line rendering of a JSON value for "got ..." messages.
std::string show(const json& v) { return io::json_excerpt(v, 40); }

struct Ctx {
  const std::string& source;
  [[noreturn]] void bad(const std::string& path, const std::string& expected,
                        const std::string& got) const {
    fail(source, ": ", path, ": expected ", expected, ", got ", got);
  }
};

double number(const Ctx& c, const json& v, const std::string& path, bool positive) {
  const char* what = positive ? "a finite number > 0" : "a finite number >= 0";
  if (!v.is_number()) c.bad(path, what, show(v));
  const double d = v.get<double>();
  if (!std::isfinite(d) || (positive ? !(d > 0) : !(d >= 0))) c.bad(path, what, show(v));
  return d;
}

std::map<std::string, double> option_map(const Ctx& c, const json& v, const std::string& path,
                                         bool need_one) {
  if (!v.is_object())
    c.bad(path, "an object {\"<option>\": <number>, ...}", show(v));
  if (need_one && v.empty()) c.bad(path, "at least one option", "{}");
  std::map<std::string, double> m;
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (it.key().empty()) c.bad(path, "non-empty option names", "\"\"");
    m[it.key()] = number(c, it.value(), path + "." + it.key(), false);
  }
  return m;
}

void check_keys(const Ctx& c, const json& v, const std::string& path,
                const std::set<std::string>& allowed, const std::string& list) {
  for (auto it = v.begin(); it != v.end(); ++it)
    if (!allowed.count(it.key())) c.bad(path, "only the keys " + list, "'" + it.key() + "'");
}

GemmCost parse_gemm(const Ctx& c, const json& v, const std::string& path) {
  if (!v.is_object()) c.bad(path, "an object {\"flops\": .., \"q\": {..}}", show(v));
  check_keys(c, v, path, {"flops", "q", "rel_err"}, "flops, q, rel_err");
  GemmCost g;
  if (!v.contains("flops")) c.bad(path + ".flops", "FLOPs per step", "nothing");
  g.flops = number(c, v["flops"], path + ".flops", true);
  if (!v.contains("q")) c.bad(path + ".q", "the quality loss per option", "nothing");
  g.q = option_map(c, v["q"], path + ".q", true);
  if (v.contains("rel_err")) g.rel_err = option_map(c, v["rel_err"], path + ".rel_err", false);
  return g;
}

}  // namespace

bool CostTable::per_gemm() const {
  if (layers.empty()) return false;
  for (const LayerCost& l : layers)
    if (!l.has_gemms) return false;
  return true;
}

json to_json(const CostTable& t) {
  json layers = json::array();
  for (const LayerCost& l : t.layers) {
    json e = {{"name", l.name}};
    if (l.stage >= 0) e["stage"] = l.stage;
    if (l.has_gemms) {
      json g = json::object();
      for (Gemm k : kAllGemms) {
        const GemmCost& c = l.gemms[size_t(k)];
        g[gemm_name(k)] = {{"flops", c.flops}, {"q", c.q}};
        if (!c.rel_err.empty()) g[gemm_name(k)]["rel_err"] = c.rel_err;
      }
      e["gemms"] = std::move(g);
    } else {
      e["flops"] = l.flops;
      e["q"] = l.q;
      if (!l.rel_err.empty()) e["rel_err"] = l.rel_err;
    }
    layers.push_back(std::move(e));
  }
  return {{"layers", std::move(layers)}};
}

CostTable parse_cost_table(const json& j, const std::string& source) {
  const Ctx c{source};
  CostTable t;
  t.source = source;
  if (!j.is_object()) c.bad("(top level)", "an object {\"layers\": [...]}", show(j));
  if (!j.contains("layers")) c.bad("layers", "an array of layer entries", "nothing");
  const json& layers = j["layers"];
  if (!layers.is_array()) c.bad("layers", "an array of layer entries", show(layers));
  if (layers.empty()) c.bad("layers", "at least one layer entry", "[]");
  std::set<std::string> names;
  for (size_t k = 0; k < layers.size(); ++k) {
    const json& e = layers[k];
    const std::string path = "layers[" + std::to_string(k) + "]";
    if (!e.is_object()) c.bad(path, "an object {\"name\": .., \"flops\": .., \"q\": {..}}", show(e));
    check_keys(c, e, path, {"name", "flops", "q", "stage", "rel_err", "gemms"},
               "name, flops, q, stage, rel_err, gemms");
    LayerCost l;
    if (!e.contains("name") || !e["name"].is_string() || e["name"].get<std::string>().empty())
      c.bad(path + ".name", "a non-empty string", e.contains("name") ? show(e["name"]) : "nothing");
    l.name = e["name"].get<std::string>();
    if (!names.insert(l.name).second) c.bad(path + ".name", "a unique layer name", show(e["name"]));
    if (e.contains("stage")) {
      const json& s = e["stage"];
      if (!s.is_number_integer() || s.get<long long>() < 0 || s.get<long long>() > 1000000)
        c.bad(path + ".stage", "an integer >= 0", show(s));
      l.stage = static_cast<int>(s.get<long long>());
    }
    if (e.contains("gemms")) {
      if (e.contains("flops") || e.contains("q") || e.contains("rel_err"))
        c.bad(path, "either \"gemms\" or \"flops\"/\"q\"/\"rel_err\"", "both");
      const json& g = e["gemms"];
      const std::string gp = path + ".gemms";
      if (!g.is_object()) c.bad(gp, "an object with keys fprop, dgrad, wgrad", show(g));
      check_keys(c, g, gp, {"fprop", "dgrad", "wgrad"}, "fprop, dgrad, wgrad");
      for (int k3 = 0; k3 < 3; ++k3) {
        if (!g.contains(gemm_name(Gemm(k3))))
          c.bad(gp + "." + gemm_name(Gemm(k3)), "an entry for every GEMM", "nothing");
        l.gemms[k3] = parse_gemm(c, g[gemm_name(Gemm(k3))], gp + "." + gemm_name(Gemm(k3)));
      }
      l.has_gemms = true;
    } else {
      if (!e.contains("flops")) c.bad(path + ".flops", "FLOPs per step (or \"gemms\")", "nothing");
      l.flops = number(c, e["flops"], path + ".flops", true);
      if (!e.contains("q")) c.bad(path + ".q", "the quality loss per option", "nothing");
      l.q = option_map(c, e["q"], path + ".q", true);
      if (e.contains("rel_err")) l.rel_err = option_map(c, e["rel_err"], path + ".rel_err", false);
    }
    t.layers.push_back(std::move(l));
  }
  // Each entry is finite, but shares divide by the sum (planner.h): 2 x 1e308
  // would give F/inf = 0 and inf/inf = NaN shares.
  double total = 0;
  for (const LayerCost& l : t.layers)
    total += l.has_gemms ? l.gemms[0].flops + l.gemms[1].flops + l.gemms[2].flops : l.flops;
  if (!std::isfinite(total))
    fail(source, ": total FLOPs overflow (sum of entry flops is not finite)");
  return t;
}

CostTable load_cost_table(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, ": cannot open the cost table (", std::strerror(errno), ")");
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail(path, ": cannot read the cost table");
  // Syntax, duplicate keys, nesting depth, numbers past a double's range:
  // io::parse_json's messages, which name the file and the JSON path.
  const json j = io::parse_json(ss.str(), path);
  return parse_cost_table(j, path);
}

PlanProblem make_problem(const CostTable& t, Granularity g) {
  PlanProblem p;
  p.granularity = g;
  for (size_t k = 0; k < t.layers.size(); ++k) {
    const LayerCost& l = t.layers[k];
    if (g == Granularity::gemm) {
      if (!l.has_gemms)
        fail(t.source, ": layers[", k, "]: per-GEMM planning expected a \"gemms\" entry, ",
             "got only layer totals (plan per layer, or give fprop/dgrad/wgrad costs)");
      for (int k3 = 0; k3 < 3; ++k3) {
        PlanItem it;
        it.layer = l.name;
        it.gemm = gemm_name(Gemm(k3));
        it.name = plan_item_key(l.name, Gemm(k3));
        it.flops = l.gemms[k3].flops;
        it.q = l.gemms[k3].q;
        it.rel_err = l.gemms[k3].rel_err;
        it.stage = l.stage;
        p.items.push_back(std::move(it));
      }
      continue;
    }
    PlanItem it;
    it.name = it.layer = l.name;
    it.stage = l.stage;
    if (!l.has_gemms) {
      it.flops = l.flops;
      it.q = l.q;
      it.rel_err = l.rel_err;
    } else {
      // Per-layer view of per-GEMM costs: sums; options all GEMMs offer;
      // rel_err FLOPs-weighted where all three GEMMs give one.
      for (int k3 = 0; k3 < 3; ++k3) it.flops += l.gemms[k3].flops;
      for (const auto& [opt, q0] : l.gemms[0].q) {
        if (!l.gemms[1].q.count(opt) || !l.gemms[2].q.count(opt)) continue;
        it.q[opt] = q0 + l.gemms[1].q.at(opt) + l.gemms[2].q.at(opt);
      }
      if (it.q.empty())
        fail(t.source, ": layers[", k, "].gemms: expected an option all three GEMMs offer, ",
             "got none in common");
      for (const auto& [opt, e0] : l.gemms[0].rel_err) {
        if (!l.gemms[1].rel_err.count(opt) || !l.gemms[2].rel_err.count(opt)) continue;
        double s = 0;
        for (int k3 = 0; k3 < 3; ++k3) s += l.gemms[k3].flops * l.gemms[k3].rel_err.at(opt);
        it.rel_err[opt] = s / it.flops;
      }
    }
    p.items.push_back(std::move(it));
  }
  return p;
}

namespace {

json num_or_null(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

}  // namespace

json plan_to_json(const PlanResult& r) {
  json j;
  j["granularity"] = to_string(r.granularity);
  j["method"] = r.method;
  if (r.budget.kind == Budget::Kind::fp4_share) {
    j["budget"] = r.budget.value;
  } else if (r.budget.kind == Budget::Kind::time) {
    j["budget"] = nullptr;
    j["time_budget"] = r.budget.value;
    j["time_reference"] = r.budget.time_reference;
  } else {
    j["budget"] = nullptr;
    j["cost_budget"] = r.budget.value;
  }
  j["option_costs"] = r.budget.cost_per_flop;
  j["low_option"] = r.low_option;
  if (!r.options.empty()) j["options"] = r.options;
  j["status"] = r.status;
  if (!r.algorithm.empty()) j["algorithm"] = r.algorithm;
  j["proven_optimal"] = r.proven_optimal;
  j["solve_seconds"] = r.solve_seconds;
  j["objective"] = r.objective;
  j["lower_bound"] = num_or_null(r.lower_bound);
  j["gap"] = num_or_null(r.gap);
  j["relative_gap"] = num_or_null(r.relative_gap);
  j["fp4_share"] = r.fp4_share;
  j["cost_per_flop"] = num_or_null(r.cost_per_flop);
  if (!r.stage_fp4_share.empty()) j["stage_fp4_share"] = r.stage_fp4_share;
  // Predicted GEMM seconds per step (only when the items carry measured times).
  if (std::isfinite(r.seconds) && std::isfinite(r.reference_seconds)) {
    j["gemm_seconds"] = r.seconds;
    j["reference_gemm_seconds"] = r.reference_seconds;
    j["time_ratio"] = num_or_null(r.time_ratio);
    if (r.budget.kind != Budget::Kind::time) j["time_reference"] = r.budget.time_reference;
  }
  if (!r.warnings.empty()) j["warnings"] = r.warnings;
  json a = json::object();
  json items = json::array();
  for (const PlanChoice& c : r.items) {
    a[c.name] = c.option;
    json it = {{"name", c.name}, {"flops", c.flops}, {"option", c.option}, {"q", c.q}};
    if (c.stage >= 0) it["stage"] = c.stage;
    if (std::isfinite(c.seconds)) it["seconds"] = c.seconds;
    items.push_back(std::move(it));
  }
  j["assignments"] = std::move(a);
  j["items"] = std::move(items);
  return j;
}

json sweep_to_json(const std::vector<ParetoPoint>& points) {
  json pts = json::array();
  std::string low = "fp4";
  for (const ParetoPoint& p : points) {
    low = p.plan.low_option;
    json a = json::object();
    for (const PlanChoice& c : p.plan.items) a[c.name] = c.option;
    pts.push_back({{"budget", p.budget},
                   {"fp4_share", p.plan.fp4_share},
                   {"objective", p.plan.objective},
                   {"lower_bound", num_or_null(p.plan.lower_bound)},
                   {"gap", num_or_null(p.plan.gap)},
                   {"relative_gap", num_or_null(p.plan.relative_gap)},
                   {"proven_optimal", p.plan.proven_optimal},
                   {"cost_per_flop", num_or_null(p.plan.cost_per_flop)},
                   {"status", p.plan.status},
                   {"solve_seconds", p.plan.solve_seconds},
                   {"assignments", std::move(a)}});
    // Predicted GEMM seconds per step when the items carry measured times.
    if (std::isfinite(p.plan.seconds) && std::isfinite(p.plan.reference_seconds)) {
      pts.back()["gemm_seconds"] = p.plan.seconds;
      pts.back()["reference_gemm_seconds"] = p.plan.reference_seconds;
      pts.back()["time_ratio"] = num_or_null(p.plan.time_ratio);
    }
  }
  return json{{"low_option", low}, {"points", std::move(pts)}};
}

std::vector<LinearLayerShape> llama_linear_layers(int n_layers, int64_t hidden,
                                                  int64_t intermediate, int n_heads,
                                                  int n_kv_heads, int64_t tokens_per_step) {
  if (n_layers < 1 || hidden < 1 || intermediate < 1 || n_heads < 1 || n_kv_heads < 1 ||
      tokens_per_step < 1)
    fail("llama shape: expected positive sizes, got n_layers=", n_layers, " hidden=", hidden,
         " intermediate=", intermediate, " n_heads=", n_heads, " n_kv_heads=", n_kv_heads,
         " tokens_per_step=", tokens_per_step);
  if (hidden % n_heads != 0)
    fail("llama shape: expected hidden (", hidden, ") divisible by n_heads (", n_heads, ")");
  if (n_heads % n_kv_heads != 0)
    fail("llama shape: expected n_heads (", n_heads, ") divisible by n_kv_heads (", n_kv_heads,
         ")");
  const int64_t kv = n_kv_heads * (hidden / n_heads);
  struct Proto {
    const char* suffix;
    int64_t in, out;
  };
  const Proto protos[7] = {{"self_attn.q_proj", hidden, hidden},
                           {"self_attn.k_proj", hidden, kv},
                           {"self_attn.v_proj", hidden, kv},
                           {"self_attn.o_proj", hidden, hidden},
                           {"mlp.gate_proj", hidden, intermediate},
                           {"mlp.up_proj", hidden, intermediate},
                           {"mlp.down_proj", intermediate, hidden}};
  std::vector<LinearLayerShape> out;
  for (int b = 0; b < n_layers; ++b)
    for (const Proto& p : protos)
      out.push_back(LinearLayerShape{
          "model.layers." + std::to_string(b) + "." + p.suffix, p.in, p.out,
          2.0 * static_cast<double>(tokens_per_step) * static_cast<double>(p.in) *
              static_cast<double>(p.out)});
  return out;
}

std::vector<Pin> conservative_pins(int last_block, const std::string& option) {
  return {Pin{"*.down_proj", option}, Pin{"*.v_proj", option},
          Pin{"layers." + std::to_string(last_block) + ".mlp.*", option}};
}

}  // namespace snip::plan
