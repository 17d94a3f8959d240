// gemm_times.cpp: the measured GEMM-times table (snip/plan/gemm_times.h).
#include "snip/plan/gemm_times.h"

#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <stdexcept>

#include "snip/core/error.h"
#include "snip/io/json.h"

namespace snip::plan {

using nlohmann::json;

namespace {

constexpr const char* kFormat = "snip-gemm-times";
constexpr int kVersion = 1;
constexpr double kMaxGemmSeconds = 86400;  // one day per GEMM call

std::string show(const json& v) { return io::json_excerpt(v, 40); }

[[noreturn]] void bad(const std::string& src, const std::string& where, const std::string& expected,
                      const json& got) {
  fail(src, ": ", where, ": expected ", expected, ", got ", got.is_null() ? std::string("nothing") : show(got));
}

const json& field(const json& o, const std::string& src, const std::string& where, const char* key) {
  static const json null;
  auto it = o.find(key);
  if (it == o.end()) bad(src, where + "." + key, "a value", null);
  return *it;
}

std::string text_field(const json& o, const std::string& src, const std::string& where, const char* key) {
  const json& v = field(o, src, where, key);
  if (!v.is_string()) bad(src, where + "." + key, "a string", v);
  return v.get<std::string>();
}

int64_t int_field(const json& o, const std::string& src, const std::string& where, const char* key) {
  const json& v = field(o, src, where, key);
  if (!v.is_number_integer() || v.get<int64_t>() < 1) bad(src, where + "." + key, "an integer >= 1", v);
  return v.get<int64_t>();
}

}  // namespace

std::string GemmShape::str() const { return str_cat("{M=", m, ", K=", k, ", N=", n, "}"); }

std::array<GemmShape, 3> linear_gemm_shapes(int64_t tokens, int64_t in, int64_t out) {
  if (tokens < 1 || in < 1 || out < 1)
    fail("GEMM shapes: expected tokens, in and out features >= 1, got ", tokens, ", ", in, ", ", out);
  return {GemmShape{tokens, in, out}, GemmShape{tokens, out, in}, GemmShape{out, tokens, in}};
}

const GemmTimeEntry* GemmTimes::find(Gemm gemm, const GemmShape& shape, const std::string& option) const {
  for (const GemmTimeEntry& e : entries)
    if (e.gemm == gemm && e.shape == shape && e.option == option) return &e;
  return nullptr;
}

GemmTimes parse_gemm_times(const json& j, const std::string& src) {
  if (!j.is_object()) bad(src, "(top level)", "an object", j);
  GemmTimes t;
  t.source = src;
  if (text_field(j, src, "(top level)", "format") != kFormat)
    bad(src, "format", str_cat("\"", kFormat, "\""), j.at("format"));
  {
    const json& v = field(j, src, "(top level)", "version");
    if (!v.is_number_integer() || v.get<int64_t>() != kVersion) bad(src, "version", str_cat(kVersion), v);
  }
  if (text_field(j, src, "(top level)", "units") != "seconds") bad(src, "units", "\"seconds\"", j.at("units"));
  t.device = text_field(j, src, "(top level)", "device");
  t.machine = text_field(j, src, "(top level)", "machine");
  t.gemm_dtype = text_field(j, src, "(top level)", "gemm_dtype");
  if (t.device.empty()) bad(src, "device", "a device name (cpu, cuda:0 ...)", j.at("device"));
  const json& es = field(j, src, "(top level)", "entries");
  if (!es.is_array() || es.empty()) bad(src, "entries", "a non-empty array", es);
  static const std::set<std::string> known = {"gemm", "m", "k", "n", "option", "seconds", "repeats"};
  std::set<std::tuple<int, int64_t, int64_t, int64_t, std::string>> seen;
  for (size_t i = 0; i < es.size(); ++i) {
    const std::string w = str_cat("entries[", i, "]");
    const json& e = es[i];
    if (!e.is_object()) bad(src, w, "an object", e);
    for (auto it = e.begin(); it != e.end(); ++it)
      if (!known.count(it.key()))
        fail(src, ": ", w, ": expected keys gemm, m, k, n, option, seconds, repeats, got \"", it.key(), "\"");
    GemmTimeEntry x;
    const std::string g = text_field(e, src, w, "gemm");
    if (g == "fprop") x.gemm = Gemm::kFprop;
    else if (g == "dgrad") x.gemm = Gemm::kDgrad;
    else if (g == "wgrad") x.gemm = Gemm::kWgrad;
    else bad(src, w + ".gemm", "fprop, dgrad or wgrad", e.at("gemm"));
    x.shape = GemmShape{int_field(e, src, w, "m"), int_field(e, src, w, "k"), int_field(e, src, w, "n")};
    x.option = text_field(e, src, w, "option");
    if (x.option.empty()) bad(src, w + ".option", "an option name", e.at("option"));
    const json& s = field(e, src, w, "seconds");
    // At most a day per call: a larger value is no measurement (and near
    // DBL_MAX the planner's sums over items would overflow to inf).
    if (!s.is_number() || !(s.get<double>() > 0.0) || !(s.get<double>() <= kMaxGemmSeconds))
      bad(src, w + ".seconds", "seconds per call in (0, 86400]", s);
    x.seconds = s.get<double>();
    x.repeats = int_field(e, src, w, "repeats");
    if (!seen.insert({int(x.gemm), x.shape.m, x.shape.k, x.shape.n, x.option}).second)
      fail(src, ": ", w, ": expected each (gemm, shape, option) once, got ", g, " ", x.shape.str(), " ", x.option,
           " again");
    t.entries.push_back(std::move(x));
  }
  return t;
}

json to_json(const GemmTimes& t) {
  json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["units"] = "seconds";
  j["device"] = t.device;
  j["machine"] = t.machine;
  j["gemm_dtype"] = t.gemm_dtype;
  json es = json::array();
  for (const GemmTimeEntry& e : t.entries)
    es.push_back({{"gemm", gemm_name(e.gemm)},
                  {"m", e.shape.m},
                  {"k", e.shape.k},
                  {"n", e.shape.n},
                  {"option", e.option},
                  {"seconds", e.seconds},
                  {"repeats", e.repeats}});
  j["entries"] = std::move(es);
  return j;
}

GemmTimes load_gemm_times(const std::string& path) {
  return parse_gemm_times(io::read_json_file(path, "GEMM-times table"), path);
}

void save_gemm_times(const GemmTimes& t, const std::string& path) { io::save_json_atomic(to_json(t), path); }

void apply_gemm_times(PlanProblem& problem, const GemmTimes& table, const std::vector<TimedLayer>& layers,
                      int64_t tokens, double micro_batches, const std::vector<std::string>& options) {
  if (!(micro_batches > 0.0)) fail("GEMM times: expected micro-batches per step > 0, got ", micro_batches);
  std::map<std::string, const TimedLayer*> by;
  for (const TimedLayer& l : layers) by[l.name] = &l;
  for (PlanItem& it : problem.items) {
    auto l = by.find(it.layer.empty() ? it.name : it.layer);
    if (l == by.end()) throw std::logic_error("apply_gemm_times: item " + it.name + " has no layer shape");
    const auto shapes = linear_gemm_shapes(tokens, l->second->in, l->second->out);
    for (const std::string& o : options) {
      double s = 0.0;
      for (Gemm g : kAllGemms) {
        if (!it.gemm.empty() && it.gemm != gemm_name(g)) continue;
        const GemmTimeEntry* e = table.find(g, shapes[int(g)], o);
        if (!e)
          fail(table.source, ": no entry for ", gemm_name(g), " ", shapes[int(g)].str(), " at option ", o,
               " (layer ", l->first, " at ", tokens, " tokens per micro-batch; measured for another model, batch or "
               "option list? re-run snip doctor --calibrate --config FILE)");
        s += e->seconds;
      }
      it.seconds[o] = micro_batches * s;
    }
  }
}

}  // namespace snip::plan
