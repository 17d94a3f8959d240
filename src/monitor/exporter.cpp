// The Prometheus exporter (see exporter.h).
#include "snip/monitor/exporter.h"

#include <httplib.h>
#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <fstream>
#include <limits>
#include <cstring>
#include <sstream>
#include <thread>
#include <tuple>

#include <spdlog/spdlog.h>

#include "snip/config/config.h"
#include "snip/recipes/recipe.h"
#include "snip/core/error.h"

namespace snip::monitor {

using json = nlohmann::json;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Element bits of registry format `name` (NaN for "" or an unknown name).
double format_bits(const std::string& name) {
  const std::optional<formats::ElementFormat> f = formats::lookup_element_format(name);
  return f ? double(f->bits) : kNaN;
}

double wall_now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// VmRSS / VmHWM of /proc/self/status in bytes (the kernel writes kB); NaN
// where the file or the field is missing (not Linux).
double proc_status_bytes(const char* field) {
  std::ifstream in("/proc/self/status");
  const std::string key = std::string(field) + ":";
  for (std::string line; std::getline(in, line);)
    if (line.compare(0, key.size(), key) == 0) {
      std::istringstream is(line.substr(key.size()));
      double kb = 0;
      if (is >> kb) return kb * 1024.0;
    }
  return kNaN;
}

// The exposition text of `families`. prometheus-cpp 1.0.1 writes NaN as
// "Nan" (Go's ParseFloat, which Prometheus uses, reads it case-blind); the
// format's spelling is "NaN", so it is rewritten: a sample's value is the
// last field of its line (no timestamps here), so only " Nan\n" can match.
std::string exposition(const std::vector<prometheus::MetricFamily>& families) {
  std::string t = prometheus::TextSerializer().Serialize(families);
  for (size_t p = 0; (p = t.find(" Nan\n", p)) != std::string::npos; p += 5) t.replace(p, 5, " NaN\n");
  return t;
}

}  // namespace

// ---- options -------------------------------------------------------------

std::string MonitorOptions::address(int rank, int local_rank) const {
  if (!enabled || (!all_ranks && rank != 0)) return "";
  const int p = port == 0 ? 0 : port + (all_ranks ? local_rank : 0);
  return host + ":" + std::to_string(p);
}

MonitorOptions monitor_options(const MonitorConfig& cfg) {
  MonitorOptions o;
  const std::string& s = cfg.listen;
  o.all_ranks = cfg.ranks == "all";
  if (s.empty()) return o;
  const auto bad = [&] {
    fail("monitor.listen: expected HOST:PORT (e.g. 127.0.0.1:9464; port 0 = any free port) or an empty string "
         "(no endpoint), got '", s, "'");
  };
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == s.size()) bad();
  o.host = s.substr(0, colon);
  const std::string p = s.substr(colon + 1);
  if (p.size() > 5 || p.find_first_not_of("0123456789") != std::string::npos) bad();
  o.port = std::stoi(p);
  if (o.port > 65535) bad();
  if (o.host.find_first_of(" :/[]") != std::string::npos) bad();
  o.enabled = true;
  return o;
}

// ---- Streak ----------------------------------------------------------------

int64_t Streak::add(const std::string& key, double value) { return add(key, value, threshold_); }

int64_t Streak::add(const std::string& key, double value, double threshold) {
  int64_t& n = n_[key];
  const bool above = !std::isfinite(value) || value > threshold;  // NaN/Inf: a broken measurement
  n = above ? n + 1 : 0;
  return n;
}

void Streak::keep_only(const std::set<std::string>& keys) {
  for (auto it = n_.begin(); it != n_.end();) it = keys.count(it->first) ? std::next(it) : n_.erase(it);
}

int64_t Streak::get(const std::string& key) const {
  auto it = n_.find(key);
  return it == n_.end() ? 0 : it->second;
}

// ---- the metric table --------------------------------------------------------

const std::vector<MetricInfo>& metric_table() {
  static const std::vector<MetricInfo> t = {
      {"snip_info", "gauge", "Always 1; labels: rank, world_size, policy"},
      {"snip_step", "gauge", "Optimizer steps completed"},
      {"snip_tokens_total", "counter", "Training tokens processed (all ranks), step x tokens per step"},
      {"snip_loss", "gauge", "Training loss of the last step (nats per token)"},
      {"snip_val_loss", "gauge", "Validation loss of the last evaluation (nats per token)"},
      {"snip_learning_rate", "gauge", "Learning rate of the last step"},
      {"snip_grad_norm", "gauge", "Global gradient L2 norm of the last step, before clipping"},
      {"snip_tokens_per_second", "gauge", "Training throughput of the last step (tokens per second, all ranks)"},
      {"snip_step_seconds", "gauge", "Wall time of the last step (seconds; stats steps included)"},
      {"snip_last_step_timestamp_seconds", "gauge", "Unix time the last step ended (seconds)"},
      {"snip_fp4_flops_share", "gauge", "Share of linear-layer GEMM FLOPs at the low-precision option (0..1)"},
      {"snip_quant_rel_error", "gauge",
       "Relative error ||Y_q - Y||/||Y|| of a GEMM's output under the layer's option, at the last stats step "
       "(ratio; labels layer, gemm, operand)"},
      {"snip_quant_rel_error_streak", "gauge",
       "Consecutive stats steps with snip_quant_rel_error above its format's threshold (reset by one at or below "
       "it)"},
      {"snip_quant_operand_rel_error", "gauge",
       "Relative error ||Q(x) - x||/||x|| of each quantized GEMM operand over the last step's training passes "
       "(ratio; labels layer, gemm, operand, format)"},
      {"snip_quant_operand_rel_error_streak", "gauge",
       "Consecutive steps with snip_quant_operand_rel_error above its format's threshold (guard.quant_error_"
       "threshold*; reset by one at or below it)"},
      {"snip_layer_precision_bits", "gauge",
       "Element bits of each GEMM operand under the layer's current option (labels layer, gemm, operand, "
       "option)"},
      {"snip_plan_step", "gauge", "Step of the last precision plan"},
      {"snip_stats_step_seconds", "gauge", "Wall time of the last stats step (seconds)"},
      {"snip_planner_solve_seconds", "gauge", "Solve time of the last precision plan (seconds)"},
      {"snip_planner_status", "gauge", "1 for the last plan's status (label status: optimal, heuristic, ...)"},
      {"snip_process_resident_memory_bytes", "gauge", "Resident set size of the process (bytes)"},
      {"snip_process_peak_resident_memory_bytes", "gauge", "Peak resident set size of the process (bytes)"},
      {"snip_checkpoint_age_seconds", "gauge",
       "Seconds since this process last wrote a checkpoint (absent before the first)"},
      {"snip_last_checkpoint_step", "gauge", "Step of the last checkpoint written by this process"},
      {"snip_guard_state", "gauge",
       "The in-process guard's last action (train/guard.h): 0 idle, 1 warned, 2 raised precision, 3 rolled back, "
       "4 stopped"},
  };
  return t;
}

// ---- the collector -------------------------------------------------------------

class Collector : public prometheus::Collectable {
 public:
  explicit Collector(RunInfo info) : info_(std::move(info)) {}

  struct Key {
    std::string layer, gemm, operand;
    bool operator<(const Key& o) const {
      return std::tie(layer, gemm, operand) < std::tie(o.layer, o.gemm, o.operand);
    }
  };

  void update(const StepRecord& r) {
    std::lock_guard<std::mutex> g(mu_);
    auto set = [&](const std::optional<double>& v, const char* metric) {
      if (v) scalar_[metric] = *v;
    };
    step_ = r.step;
    scalar_["snip_step"] = double(step_);
    scalar_["snip_last_step_timestamp_seconds"] = wall_now_s();
    set(r.loss, "snip_loss");
    set(r.val_loss, "snip_val_loss");
    set(r.lr, "snip_learning_rate");
    set(r.grad_norm, "snip_grad_norm");
    set(r.tokens_per_s, "snip_tokens_per_second");
    set(r.fp4_share, "snip_fp4_flops_share");
    if (r.plan_step) scalar_["snip_plan_step"] = double(*r.plan_step);
    set(r.stats_seconds, "snip_stats_step_seconds");
    set(r.plan_solve_seconds, "snip_planner_solve_seconds");
    if (r.tokens_per_s && info_.tokens_per_step > 0) {
      const double tps = *r.tokens_per_s;
      scalar_["snip_step_seconds"] = tps > 0 ? double(info_.tokens_per_step) / tps : kNaN;
    }
    if (r.plan_status) plan_status_ = *r.plan_status;
    update_precision(r);
    // Every quantized operand is measured at every step: one not in this
    // record was not quantized by it (its layer moved to the reference, or
    // nothing ran quantized), so its sample and its streak go.
    std::map<Key, std::pair<double, std::string>> fresh;
    std::set<std::string> seen;
    if (r.quant_err)
      for (const auto& [layer, ops] : *r.quant_err)
        for (const auto& [op, v] : ops) {
          const size_t dot = op.find('.');
          const Key k{layer, op.substr(0, dot), dot == std::string::npos ? "" : op.substr(dot + 1)};
          const auto b = bits_.find(k);
          const std::string format = b != bits_.end() ? b->second.second : "";
          const std::string key = operand_streak_key(layer, op, format);
          op_streak_.add(key, v, info_.guard.threshold_for(format));
          seen.insert(key);
          fresh[k] = {v, format};
        }
    op_err_ = std::move(fresh);
    op_streak_.keep_only(seen);
    if (r.rel_err_fprop) {
      std::map<Key, double> fresh;
      for (const auto& [layer, v] : *r.rel_err_fprop) fresh[{layer, "fprop", "both"}] = v;
      // A layer not measured at this stats step has no current value: drop it.
      rel_ = fresh;
      for (const auto& [k, v] : rel_) {
        // The GEMM output counts against the higher threshold of its two
        // operands' formats (both are quantized).
        double threshold = info_.guard.threshold_for("");
        for (const char* operand : {"x", "w"}) {
          const auto b = bits_.find({k.layer, "fprop", operand});
          if (b != bits_.end()) threshold = std::max(threshold, info_.guard.threshold_for(b->second.second));
        }
        streak_.add(k.layer + "\n" + k.gemm + "\n" + k.operand, v, threshold);
      }
    }
  }

  void set_operand_streaks(const std::map<std::string, int64_t>& counts) {
    std::lock_guard<std::mutex> g(mu_);
    op_streak_ = Streak(kQuantErrorThreshold);
    for (const auto& [k, n] : counts) op_streak_.set(k, n);
  }

  void set_precision(const std::map<std::string, std::string>& items) {
    std::lock_guard<std::mutex> g(mu_);
    StepRecord r;
    r.precision = items;
    update_precision(r);
  }

  void checkpoint_written(int64_t step) {
    std::lock_guard<std::mutex> g(mu_);
    checkpoint_s_ = wall_now_s();
    scalar_["snip_last_checkpoint_step"] = double(step);
  }
  void set_guard_state(int s) {
    std::lock_guard<std::mutex> g(mu_);
    guard_ = s;
  }
  int64_t streak(const Key& k) const {
    std::lock_guard<std::mutex> g(mu_);
    return streak_.get(k.layer + "\n" + k.gemm + "\n" + k.operand);
  }

  std::vector<prometheus::MetricFamily> Collect() const override {
    std::lock_guard<std::mutex> g(mu_);
    std::vector<prometheus::MetricFamily> out;
    for (const MetricInfo& m : metric_table()) {
      prometheus::MetricFamily f;
      f.name = m.name;
      f.help = m.help;
      const bool counter = std::string(m.type) == "counter";
      f.type = counter ? prometheus::MetricType::Counter : prometheus::MetricType::Gauge;
      auto add = [&](double v, std::vector<prometheus::ClientMetric::Label> labels = {}) {
        prometheus::ClientMetric c;
        c.label = std::move(labels);
        if (counter) c.counter.value = v;
        else c.gauge.value = v;
        f.metric.push_back(std::move(c));
      };
      const std::string name = m.name;
      if (name == "snip_info") {
        add(1, {{"policy", info_.policy}, {"rank", std::to_string(info_.rank)},
                {"world_size", std::to_string(info_.world_size)}});
      } else if (name == "snip_tokens_total") {
        add(double(step_) * double(info_.tokens_per_step));
      } else if (name == "snip_quant_rel_error") {
        for (const auto& [k, v] : rel_) add(v, {{"gemm", k.gemm}, {"layer", k.layer}, {"operand", k.operand}});
      } else if (name == "snip_quant_rel_error_streak") {
        for (const auto& [k, v] : rel_)
          add(double(streak_.get(k.layer + "\n" + k.gemm + "\n" + k.operand)),
              {{"gemm", k.gemm}, {"layer", k.layer}, {"operand", k.operand}});
      } else if (name == "snip_quant_operand_rel_error") {
        for (const auto& [k, v] : op_err_)
          add(v.first, {{"format", v.second}, {"gemm", k.gemm}, {"layer", k.layer}, {"operand", k.operand}});
      } else if (name == "snip_quant_operand_rel_error_streak") {
        for (const auto& [k, v] : op_err_)
          add(double(op_streak_.get(operand_streak_key(k.layer, k.gemm + "." + k.operand, v.second))),
              {{"format", v.second}, {"gemm", k.gemm}, {"layer", k.layer}, {"operand", k.operand}});
      } else if (name == "snip_layer_precision_bits") {
        for (const auto& [k, v] : bits_)
          add(format_bits(v.second), {{"gemm", k.gemm}, {"layer", k.layer}, {"operand", k.operand}, {"option", v.first}});
      } else if (name == "snip_planner_status") {
        if (!plan_status_.empty()) add(1, {{"status", plan_status_}});
      } else if (name == "snip_process_resident_memory_bytes") {
        add(proc_status_bytes("VmRSS"));
      } else if (name == "snip_process_peak_resident_memory_bytes") {
        add(proc_status_bytes("VmHWM"));
      } else if (name == "snip_checkpoint_age_seconds") {
        if (!std::isnan(checkpoint_s_)) add(wall_now_s() - checkpoint_s_);
      } else if (name == "snip_guard_state") {
        add(double(guard_));
      } else {
        auto it = scalar_.find(name);
        if (it == scalar_.end()) continue;  // not measured yet: no sample rather than an invented 0
        add(it->second);
      }
      if (!f.metric.empty()) out.push_back(std::move(f));
    }
    return out;
  }

 private:
  // snip_layer_precision_bits from a record's "precision" (mu_ held).
  void update_precision(const StepRecord& r) {
    if (r.precision) {
      bits_.clear();
      for (const auto& [item, option] : *r.precision) {
        // Items are layers ("layers.0.mlp.up_proj") or, with
        // precision.granularity = gemm, "layer:gemm".
        const size_t c = item.rfind(':');
        const std::string layer = c == std::string::npos ? item : item.substr(0, c);
        const std::string only = c == std::string::npos ? "" : item.substr(c + 1);
        auto of = info_.option_formats.find(option);
        for (const char* gemm : {"fprop", "dgrad", "wgrad"}) {
          if (!only.empty() && only != gemm) continue;
          if (of == info_.option_formats.end()) continue;
          for (const auto& [operand, format] : of->second)
            if (operand.compare(0, std::strlen(gemm) + 1, std::string(gemm) + ".") == 0)
              bits_[{layer, gemm, operand.substr(std::strlen(gemm) + 1)}] = {option, format};
        }
      }
    }
  }

  mutable std::mutex mu_;
  RunInfo info_;
  int64_t step_ = 0;
  std::map<std::string, double> scalar_;
  std::map<Key, double> rel_;
  Streak streak_{kQuantErrorThreshold};
  std::map<Key, std::pair<std::string, std::string>> bits_;  // -> option, element format
  std::map<Key, std::pair<double, std::string>> op_err_;      // -> per-step error, element format
  Streak op_streak_{kQuantErrorThreshold};
  std::string plan_status_;
  double checkpoint_s_ = kNaN;
  int guard_ = 0;
};

// ---- Exporter ---------------------------------------------------------------------

Exporter::Exporter(RunInfo info) : collector_(std::make_shared<Collector>(std::move(info))) {}

Exporter::~Exporter() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

int Exporter::listen(const std::string& address, std::string* error) {
  const size_t colon = address.rfind(':');
  const std::string host = address.substr(0, colon);
  const int want = std::stoi(address.substr(colon + 1));
  auto srv = std::make_unique<httplib::Server>();
  srv->new_task_queue = [] { return new httplib::ThreadPool(1); };  // one scrape at a time is plenty
  // SO_REUSEADDR only: cpp-httplib's default adds SO_REUSEPORT, with which a
  // second run binds the same port and the kernel splits scrapes between the
  // two processes; without it the second bind fails (EADDRINUSE) and warns.
  srv->set_socket_options([](int sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  std::weak_ptr<Collector> c = collector_;
  srv->Get("/metrics", [c](const httplib::Request&, httplib::Response& res) {
    if (auto col = c.lock())
      res.set_content(exposition(col->Collect()), "text/plain; version=0.0.4; charset=utf-8");
  });
  errno = 0;
  const int port = want == 0 ? srv->bind_to_any_port(host) : (srv->bind_to_port(host, want) ? want : -1);
  if (port <= 0) {
    if (error) *error = errno ? std::strerror(errno) : "cannot bind";
    return -1;
  }
  server_ = std::move(srv);
  thread_ = std::thread([s = server_.get()] { s->listen_after_bind(); });
  // cpp-httplib's stop() does nothing until the server runs: a run that ends
  // (or fails) right after this would leave ~Exporter joining a thread that
  // then blocks in accept() for ever. Wait until it runs (a few ms).
  for (int i = 0; i < 5000 && !server_->is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return port;
}

void Exporter::update(const StepRecord& record) { collector_->update(record); }
void Exporter::set_precision(const std::map<std::string, std::string>& items) { collector_->set_precision(items); }
void Exporter::set_operand_streaks(const std::map<std::string, int64_t>& counts) {
  collector_->set_operand_streaks(counts);
}
void Exporter::checkpoint_written(int64_t step) { collector_->checkpoint_written(step); }
void Exporter::set_guard_state(int state) { collector_->set_guard_state(state); }

std::string Exporter::text() const { return exposition(collector_->Collect()); }

int64_t Exporter::streak(const std::string& layer, const std::string& gemm, const std::string& operand) const {
  return collector_->streak({layer, gemm, operand});
}

std::unique_ptr<Exporter> start_exporter(const MonitorOptions& opts, RunInfo info, const recipes::RecipeSet& recipes,
                                         int local_rank, bool log) {
  const std::string address = opts.address(info.rank, local_rank);
  if (address.empty()) return nullptr;
  for (const std::string& name : recipes.names()) {
    const recipes::Recipe& r = recipes.find(name);
    for (int op = 0; op < kNumOperands; ++op)
      info.option_formats[name][operand_name(Operand(op))] = r[Operand(op)].element.name;
  }
  auto e = std::make_unique<Exporter>(std::move(info));
  std::string why;
  const int port = e->listen(address, &why);
  if (port < 0) {
    spdlog::warn("monitor.listen: cannot serve /metrics on {} ({}; another snip run on this port?): training goes "
                 "on without it (monitor.listen = \"{}:0\" takes any free port, \"\" turns it off)",
                 address, why, opts.host);
    return nullptr;
  }
  if (log) spdlog::info("monitor: Prometheus metrics at http://{}:{}/metrics", opts.host, port);
  return e;
}

}  // namespace snip::monitor
