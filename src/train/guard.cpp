// The in-process guard's conditions (see guard.h).
#include "guard.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <limits>
#include <numeric>

#include <spdlog/fmt/fmt.h>

#include "snip/core/error.h"

namespace snip {

using json = nlohmann::json;

namespace {

constexpr size_t kMaxEvents = 1000;

const char* const kStateNames[] = {"idle", "warned", "raised", "rolled_back", "stopped"};

double mean(const std::deque<double>& v) {
  return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
}

}  // namespace

Guard::Guard(const GuardConfig& cfg) : cfg_(cfg), streak_(cfg.quant_error_threshold) {
  // Ranges and words were checked by Config::validate; a GuardConfig built
  // in code is checked here.
  const GuardAction t = cfg_.on_throughput_drop;
  if (t != GuardAction::kWarn && t != GuardAction::kStop)
    fail("config: guard.on_throughput_drop: expected warn or stop, got '", to_string(t),
         "' (throughput is measured per rank, so only actions that need no agreement between ranks apply)");
}

std::vector<GuardEvent> Guard::observe(const GuardObservation& o) {
  std::vector<GuardEvent> out;
  if (!cfg_.enabled) return out;
  const size_t W = size_t(cfg_.spike_window);
  auto event = [&](const char* cond, GuardAction action, std::string reason) {
    GuardEvent e;
    e.step = o.step;
    e.condition = cond;
    e.action = action;
    e.reason = std::move(reason);
    return e;
  };
  const bool finite = std::isfinite(o.loss) && std::isfinite(o.grad_norm);
  if (!finite) {
    out.push_back(event("nonfinite", cfg_.on_nonfinite,
                        fmt::format("{} is {} (the step's update was skipped)",
                                    std::isfinite(o.loss) ? "gradient norm" : "loss",
                                    std::isfinite(o.loss) ? o.grad_norm : o.loss)));
  } else if (losses_.size() >= W && o.loss > (1.0 + cfg_.spike_ratio) * mean(losses_)) {
    out.push_back(event("loss_spike", cfg_.on_loss_spike,
                        fmt::format("loss {:.4f} > {:g} x mean {:.4f} of the last {} steps", o.loss,
                                    1.0 + cfg_.spike_ratio, mean(losses_), losses_.size())));
    losses_.clear();  // the window refills before the next judgement (no cascade of events)
  } else {
    losses_.push_back(o.loss);
    if (losses_.size() > W) losses_.pop_front();
  }
  // Per layer over its threshold: its operands over, and the worst of them
  // (the largest error relative to its threshold; NaN counts as the worst).
  struct Over {
    std::string layer, worst;
    double ratio = -1;
    int operands = 0;
  };
  std::vector<Over> over;
  std::set<std::string> seen;
  for (const GuardObservation::QuantError& q : o.quant_error) {
    const std::string key = q.operand.empty() ? q.layer : monitor::operand_streak_key(q.layer, q.operand, q.format);
    const std::string name = q.operand.empty() ? q.layer : q.layer + " " + q.operand;
    const double threshold = cfg_.threshold_for(q.format);
    seen.insert(key);
    // Once per streak, at its quant_error_steps-th step.
    if (streak_.add(key, q.rel_err, threshold) != cfg_.quant_error_steps) continue;
    auto it = std::find_if(over.begin(), over.end(), [&](const Over& v) { return v.layer == q.layer; });
    if (it == over.end()) it = over.insert(over.end(), Over{q.layer, "", -1, 0});
    ++it->operands;
    const double ratio = std::isfinite(q.rel_err) ? q.rel_err / threshold : std::numeric_limits<double>::infinity();
    if (ratio > it->ratio) {
      it->ratio = ratio;
      it->worst = fmt::format("{} {:.4f} (> {:.3g}, {})", name, q.rel_err, threshold,
                              q.format.empty() ? std::string("format unknown") : q.format);
    }
  }
  // Not measured at this step: its run of steps is broken.
  streak_.keep_only(seen);
  // One entry per layer (its worst operand), at most kListed layers.
  constexpr size_t kListed = 6;
  std::string worst;
  for (size_t i = 0; i < over.size() && i < kListed; ++i) {
    if (!worst.empty()) worst += ", ";
    worst += over[i].worst;
    if (over[i].operands > 1) worst += fmt::format(" and {} more operands", over[i].operands - 1);
  }
  if (over.size() > kListed) worst += fmt::format(", and {} more layers", over.size() - kListed);
  if (!over.empty()) {
    GuardEvent e = event("quant_error", cfg_.on_quant_error,
                         fmt::format("relative quantization error above its format's threshold for {} steps "
                                     "in a row: {}", cfg_.quant_error_steps, worst));
    for (const Over& v : over) e.layers.push_back(v.layer);
    out.push_back(std::move(e));
  }
  if (o.tokens_per_s > 0) {
    if (throughput_.size() >= W && o.tokens_per_s < (1.0 - cfg_.throughput_drop) * mean(throughput_)) {
      // One slow step is noise (the OS, a neighbour); kThroughputSteps in a
      // row is a drop (the alert rule's `for: 2m`, in steps).
      if (++slow_ == kThroughputSteps) {
        out.push_back(event("throughput_drop", cfg_.on_throughput_drop,
                            fmt::format("{:.0f} tokens/s < {:g} x mean {:.0f} of the last {} steps, {} steps in a row",
                                        o.tokens_per_s, 1.0 - cfg_.throughput_drop, mean(throughput_),
                                        throughput_.size(), kThroughputSteps)));
        throughput_.clear();
        slow_ = 0;
      }
    } else {
      slow_ = 0;
      throughput_.push_back(o.tokens_per_s);
      if (throughput_.size() > W) throughput_.pop_front();
    }
  }
  return out;
}

GuardAction Guard::strongest(const std::vector<GuardEvent>& events) {
  GuardAction a = GuardAction::kWarn;
  for (const GuardEvent& e : events) a = std::max(a, e.action);
  return a;
}

void Guard::reset_windows() {
  losses_.clear();
  throughput_.clear();
  slow_ = 0;
  streak_ = monitor::Streak(cfg_.quant_error_threshold);
}

void Guard::remember(const GuardEvent& e) {
  events.push_back(e);
  if (events.size() > kMaxEvents) events.erase(events.begin());
}

json Guard::to_json() const {
  json ev = json::array();
  for (const GuardEvent& e : events) ev.push_back(e.to_json());
  // The loss window and the streaks decide later events: a resumed run
  // carries them on (throughput is wall time: it refills).
  return {{"rollbacks", rollbacks}, {"skipped_steps", skipped_steps}, {"raises", raises},
          {"rolled_back_steps", rolled_back_steps}, {"state", kStateNames[int(state)]}, {"events", std::move(ev)},
          {"loss_window", losses_}, {"quant_error_streaks", streak_.counts()}};
}

void Guard::restore(const json& j, const std::string& what) {
  try {
    rollbacks = j.at("rollbacks").get<int64_t>();
    skipped_steps = j.at("skipped_steps").get<int64_t>();
    raises = j.at("raises").get<int64_t>();
    // Absent in checkpoints written before snip counted them: unknown, taken as 0.
    rolled_back_steps = j.contains("rolled_back_steps") ? j.at("rolled_back_steps").get<int64_t>() : 0;
    const std::string s = j.at("state").get<std::string>();
    bool known = false;
    for (int i = 0; i < 5; ++i)
      if (s == kStateNames[i]) state = GuardState(i), known = true;
    if (!known) fail(what, ": guard.state: expected idle, warned, raised, rolled_back or stopped, got '", s, "'");
    if (rollbacks < 0 || skipped_steps < 0 || raises < 0 || rolled_back_steps < 0)
      fail(what, ": guard: expected counts >= 0 (corrupt)");
    events.clear();
    for (const json& e : j.at("events")) {
      GuardEvent g;
      g.step = e.at("step").get<int64_t>();
      g.condition = e.at("condition").get<std::string>();
      g.action = parse_guard_action(e.at("action").get<std::string>(), what + ": guard.events.action");
      g.reason = e.at("reason").get<std::string>();
      g.layers = e.at("layers").get<std::vector<std::string>>();
      g.outcome = e.at("outcome").get<std::string>();
      events.push_back(std::move(g));
    }
    losses_.clear();
    streak_ = monitor::Streak(cfg_.quant_error_threshold);
    if (j.contains("loss_window"))  // absent: written before snip saved the windows
      for (const json& v : j.at("loss_window")) losses_.push_back(v.get<double>());
    while (losses_.size() > size_t(cfg_.spike_window)) losses_.pop_front();
    if (j.contains("quant_error_streaks"))
      for (const auto& [k, v] : j.at("quant_error_streaks").items()) streak_.set(k, v.get<int64_t>());
  } catch (const json::exception& e) {
    fail(what, ": malformed guard state (", e.what(), ")");
  }
}

}  // namespace snip
