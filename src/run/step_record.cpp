// metrics.jsonl records as a type (step_record.h).
#include "snip/run/step_record.h"

#include <cmath>
#include <limits>

#include "json_fields.h"
#include "snip/core/error.h"

namespace snip {

using json = nlohmann::json;
using namespace run_fields;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// A number, or null for a non-finite one (NaN: JSON has no NaN or inf).
double number_or_null(const json& v, const std::string& what, const std::string& key) {
  if (v.is_null()) return kNaN;
  if (!v.is_number()) bad(what, key, "a number or null", v);
  return v.get<double>();
}

int64_t integer(const json& v, const std::string& what, const std::string& key) {
  return int_in(v, what, key, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(),
                "an integer");
}

bool flag(const json& v, const std::string& what, const std::string& key) {
  if (!v.is_boolean()) bad(what, key, "true or false", v);
  return v.get<bool>();
}

GuardEvent guard_event(const json& e, const std::string& what, const std::string& key) {
  if (!e.is_object()) bad(what, key, "an object", e);
  GuardEvent g;
  if (e.contains("step")) g.step = integer(e["step"], what, key + ".step");
  if (e.contains("condition")) g.condition = text(e["condition"], what, key + ".condition");
  if (e.contains("action")) g.action = parse_guard_action(text(e["action"], what, key + ".action"), what + ": " + key + ".action");
  if (e.contains("reason")) g.reason = text(e["reason"], what, key + ".reason");
  if (e.contains("outcome")) g.outcome = text(e["outcome"], what, key + ".outcome");
  if (e.contains("layers")) {
    if (!e["layers"].is_array()) bad(what, key + ".layers", "a list of layer names", e["layers"]);
    for (const json& l : e["layers"]) g.layers.push_back(text(l, what, key + ".layers[]"));
  }
  return g;
}

template <class T>
void put(json& j, const char* key, const std::optional<T>& v) {
  if (v) j[key] = *v;
}

}  // namespace

json GuardEvent::to_json() const {
  return {{"step", step}, {"condition", condition}, {"action", snip::to_string(action)},
          {"reason", reason}, {"layers", layers},     {"outcome", outcome}};
}

json StepRecord::to_json() const {
  json j = extra.is_object() ? extra : json::object();
  j["step"] = step;
  put(j, "loss", loss);
  put(j, "lr", lr);
  put(j, "grad_norm", grad_norm);
  put(j, "tokens_per_s", tokens_per_s);
  put(j, "elapsed_s", elapsed_s);
  put(j, "fp4_share", fp4_share);
  put(j, "step_s", step_s);
  put(j, "val_loss", val_loss);
  put(j, "val_ppl", val_ppl);
  put(j, "grad_clip", grad_clip);
  put(j, "grad_comm_bytes", grad_comm_bytes);
  put(j, "grad_comm_sent_bytes", grad_comm_sent_bytes);
  put(j, "comm_s", comm_s);
  put(j, "precision", precision);
  put(j, "plan_step", plan_step);
  put(j, "phase", phase);
  put(j, "plan_status", plan_status);
  put(j, "plan_solve_seconds", plan_solve_seconds);
  put(j, "stats_seconds", stats_seconds);
  put(j, "rel_err_fprop", rel_err_fprop);
  put(j, "quant_err", quant_err);
  if (guard_replan) j["guard_replan"] = true;
  if (!guard.empty()) {
    json g = json::array();
    for (const GuardEvent& e : guard) g.push_back(e.to_json());
    j["guard"] = std::move(g);
  }
  if (skipped) j["skipped"] = true;
  put(j, "rollback_to", rollback_to);
  put(j, "pipe_bubble", pipe_bubble);
  put(j, "boundary_bytes", boundary_bytes);
  put(j, "stage_imbalance", stage_imbalance);
  put(j, "rebalanced_to", rebalanced_to);
  return j;
}

void StepRecord::merge(const json& fields, const std::string& what) {
  if (!fields.is_object()) fail(what, ": expected a JSON object, got ", fields.type_name());
  for (auto it = fields.begin(); it != fields.end(); ++it) {
    const std::string& key = it.key();  // not a structured binding: lambdas capture these (C++17)
    const json& v = it.value();
    const auto num = [&](std::optional<double>& f) { f = number_or_null(v, what, key); };
    const auto whole = [&](std::optional<int64_t>& f) { f = integer(v, what, key); };
    if (key == "step") step = int_in(v, what, key, 0, std::numeric_limits<int64_t>::max(), "an integer >= 0");
    else if (key == "loss") num(loss);
    else if (key == "lr") num(lr);
    else if (key == "grad_norm") num(grad_norm);
    else if (key == "tokens_per_s") num(tokens_per_s);
    else if (key == "elapsed_s") num(elapsed_s);
    else if (key == "fp4_share") num(fp4_share);
    else if (key == "step_s") num(step_s);
    else if (key == "val_loss") num(val_loss);
    else if (key == "val_ppl") num(val_ppl);
    else if (key == "grad_clip") num(grad_clip);
    else if (key == "grad_comm_bytes") whole(grad_comm_bytes);
    else if (key == "grad_comm_sent_bytes") whole(grad_comm_sent_bytes);
    else if (key == "comm_s") num(comm_s);
    else if (key == "precision") {
      if (!v.is_object()) bad(what, key, "an object of item -> option", v);
      std::map<std::string, std::string> m;
      for (const auto& [item, o] : v.items()) m[item] = text(o, what, key + "." + item);
      precision = std::move(m);
    } else if (key == "plan_step") whole(plan_step);
    else if (key == "phase") phase = text(v, what, key);
    else if (key == "plan_status") plan_status = text(v, what, key);
    else if (key == "plan_solve_seconds") num(plan_solve_seconds);
    else if (key == "stats_seconds") num(stats_seconds);
    else if (key == "rel_err_fprop") {
      if (!v.is_object()) bad(what, key, "an object of layer -> relative error", v);
      std::map<std::string, double> m;
      for (const auto& [layer, e] : v.items()) m[layer] = number_or_null(e, what, key + "." + layer);
      rel_err_fprop = std::move(m);
    } else if (key == "quant_err") {
      if (!v.is_object()) bad(what, key, "an object of layer -> {operand: relative error}", v);
      std::map<std::string, std::map<std::string, double>> m;
      for (const auto& [layer, ops] : v.items()) {
        if (!ops.is_object()) bad(what, key + "." + layer, "an object of operand -> relative error", ops);
        for (const auto& [op, e] : ops.items()) m[layer][op] = number_or_null(e, what, key + "." + layer + "." + op);
      }
      quant_err = std::move(m);
    } else if (key == "guard_replan") guard_replan = flag(v, what, key);
    else if (key == "guard") {
      if (!v.is_array()) bad(what, key, "a list of guard events", v);
      guard.clear();
      for (const json& e : v) guard.push_back(guard_event(e, what, key + "[]"));
    } else if (key == "skipped") skipped = flag(v, what, key);
    else if (key == "rollback_to") whole(rollback_to);
    else if (key == "pipe_bubble") num(pipe_bubble);
    else if (key == "boundary_bytes") whole(boundary_bytes);
    else if (key == "stage_imbalance") num(stage_imbalance);
    else if (key == "rebalanced_to") {
      if (!v.is_array()) bad(what, key, "a list of block bounds", v);
      std::vector<int64_t> b;
      for (const json& x : v) b.push_back(integer(x, what, key + "[]"));
      rebalanced_to = std::move(b);
    } else extra[key] = v;
  }
}

StepRecord step_record_from_json(const json& j, const std::string& what) {
  if (!j.is_object()) fail(what, ": expected a JSON record, got ", j.type_name());
  if (!j.contains("step")) fail(what, ": step: missing");
  StepRecord r;
  r.merge(j, what);
  return r;
}

}  // namespace snip
