// `snip experiment` (app/experiment.h): every arm trained by a child
// `snip train`, followed through its metrics.jsonl, then tabulated and
// charted.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <optional>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "snip/config/config.h"
#include "snip/model/quantizers.h"
#include "snip/recipes/recipe_file.h"
#include "snip/app/experiment.h"
#include "snip/run/step_record.h"
#include "snip/app/study.h"
#include "snip/io/atomic_file.h"
#include "snip/io/dir_lock.h"
#include "snip/io/json.h"
#include "snip/report/report.h"
#include "snip/report/svg.h"
#include "snip/core/error.h"
#include "snip/core/statistics.h"

extern char** environ;

namespace snip {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

/// One arm of the experiment: "<policy>" or "<policy>-<budget>" (e.g.
/// "snip-0.75", "uniform-fp4", "none"; an arm named "bf16", the unquantized
/// policy's earlier name, keeps its name and runs policy none). A
/// planning policy followed by "-gemm" ("snip-gemm-0.75") plans per GEMM
/// (precision.granularity = gemm) instead of per layer.
struct Arm {
  std::string name, policy;
  double budget = std::nan("");  // NaN = the config's
  bool per_gemm = false;         // precision.granularity = gemm
  // "+<modifier>" suffixes (kArmModifiers): option -> value the arm sets
  std::map<std::string, std::string> sets;
};

// An arm name's "+<modifier>" suffixes: what each sets.
const std::map<std::string, std::pair<std::string, std::string>> kArmModifiers = {
    {"fprop", {"precision.final_phase_gemms", "fprop"}},  // the late forward-only raise
    {"time", {"precision.budget_unit", "time"}},          // the budget in measured GEMM seconds
    {"nofinal", {"precision.final_high_precision_fraction", "0"}},  // no final phase (the raise's control)
};

Arm parse_arm(const std::string& full) {
  Arm a{full, full};
  // <policy>[-gemm][-<budget>][+fprop|+nofinal][+time]
  const std::string s = full.substr(0, full.find('+'));
  a.policy = s;
  for (size_t at = full.find('+'); at != std::string::npos;) {
    const size_t next = full.find('+', at + 1);
    const std::string m = full.substr(at + 1, next == std::string::npos ? std::string::npos : next - at - 1);
    const auto it = kArmModifiers.find(m);
    if (it == kArmModifiers.end())
      fail("--arms: '", full, "': unknown modifier '+", m, "' (expected +fprop, +nofinal or +time)");
    if (!a.sets.emplace(it->second.first, it->second.second).second)
      fail("--arms: '", full, "': modifier '+", m, "' given twice");
    at = next;
  }
  if (a.sets.count("precision.final_phase_gemms") && a.sets.count("precision.final_high_precision_fraction"))
    fail("--arms: '", full, "': +fprop sets what the final phase raises and +nofinal removes the phase; give one");
  const auto dash = s.rfind('-');
  if (dash != std::string::npos && dash + 1 < s.size()) {
    const std::string tail = s.substr(dash + 1);
    char* end = nullptr;
    const double b = std::strtod(tail.c_str(), &end);
    if (end && *end == '\0' && (std::isdigit(static_cast<unsigned char>(tail[0])) || tail[0] == '.')) {
      // Under +time the budget is a ratio to the BF16 GEMM time (above 1 where low precision is slower).
      if (a.sets.count("precision.budget_unit") ? !(b > 0 && b <= 1e6) : !(b >= 0 && b <= 1))
        fail("--arms: '", s, "': expected a budget in ",
             a.sets.count("precision.budget_unit") ? "(0, 1e6] (+time: a ratio to the BF16 GEMM time)" : "[0, 1]",
             " after the last '-'");
      a.policy = s.substr(0, dash);
      a.budget = b;
    }
  }
  if (a.policy.empty()) fail("--arms: empty arm name");
  if (a.policy == "bf16") a.policy = "none";
  const std::string gemm = "-gemm";
  if (a.policy.size() > gemm.size() && a.policy.compare(a.policy.size() - gemm.size(), gemm.size(), gemm) == 0) {
    a.policy.resize(a.policy.size() - gemm.size());
    a.per_gemm = true;
  }
  return a;
}

/// The --set assignments that make `arm` (after the experiment's own):
/// precision.policy, and precision.budget / precision.granularity when the
/// arm's name gives them.
std::vector<std::string> arm_sets(const Arm& arm) {
  std::vector<std::string> v{"precision.policy=" + arm.policy};
  if (std::isfinite(arm.budget)) v.push_back(fmt::format("precision.budget={}", arm.budget));
  if (arm.per_gemm) v.push_back("precision.granularity=gemm");
  for (const auto& [key, value] : arm.sets) v.push_back(key + "=" + value);
  return v;
}

}  // namespace

const char* const kDefaultArms =
    "none,uniform-fp8,uniform-fp4,snip-0.5,snip-0.75,min-rel-err-0.75,layer-type-0.75,first-last-fp8-0.75,"
    "random-0.75";

namespace {

volatile sig_atomic_t g_child = 0, g_signal = 0;
void forward_signal(int sig) {
  g_signal = sig;
  if (g_child > 0) kill(pid_t(g_child), sig);
}

// Runs `snip ARGS...` (this executable) with stdout+stderr appended to `log`
// and returns its exit status. While it runs, `poll` is called every 0.25 s
// (and once after it ended) to follow what it writes.
int run_self(const std::vector<std::string>& args, const std::string& log, const std::function<void()>& poll) {
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  std::vector<char*> argv{const_cast<char*>(self.c_str())};
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, self.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) fail("cannot start ", self, ": ", std::strerror(rc));
  // SIGINT/SIGTERM/SIGHUP to `snip experiment` go on to the training child, so
  // killing the experiment never leaves an orphan trainer writing the arm.
  g_child = pid;
  struct sigaction sa {}, old_int {}, old_term {}, old_hup {};
  sa.sa_handler = forward_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  sigaction(SIGHUP, &sa, &old_hup);
  int status = 0;
  for (;;) {
    const pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid || (w < 0 && errno != EINTR)) break;
    poll();
    const timespec quarter{0, 250'000'000};
    nanosleep(&quarter, nullptr);  // a forwarded signal cuts it short: fine
  }
  g_child = 0;
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  sigaction(SIGHUP, &old_hup, nullptr);
  if (g_signal) {  // the experiment itself was asked to stop
    const int sig = g_signal;
    signal(sig, SIG_DFL);
    raise(sig);
  }
  poll();  // the lines written between the last poll and the child's end
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

std::string fmt_minutes(double s) { return fmt::format("{}m{:02d}s", int(s / 60), int(s) % 60); }

/// The last complete record of an arm's RUN/metrics.jsonl (train/metrics.h):
/// its "step" and "loss"; nullopt while the file is missing, empty, or its
/// last line is not a record yet. Reads the file's tail only. The trainer
/// rewrites the file (atomically) when it resumes, so no byte offset is kept.
struct MetricsTail {
  int64_t step = 0;
  double loss = std::nan("");
};
std::optional<MetricsTail> read_metrics_tail(const fs::path& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return std::nullopt;
  const std::streamoff size = in.tellg();
  const std::streamoff from = std::max<std::streamoff>(0, size - 8192);
  in.seekg(from);
  std::string tail((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t end = tail.rfind('\n');  // a record counts once its line is complete
  if (end == std::string::npos) return std::nullopt;
  const size_t begin = tail.rfind('\n', end == 0 ? 0 : end - 1);
  if (begin == std::string::npos && from > 0) return std::nullopt;  // a line longer than the tail read
  const std::string line = tail.substr(begin == std::string::npos ? 0 : begin + 1,
                                       end - (begin == std::string::npos ? 0 : begin + 1));
  StepRecord r;
  try {
    r = step_record_from_json(json::parse(line), path.string());
  } catch (const std::exception&) {  // a line being written, or not a record: no progress to show yet
    return std::nullopt;
  }
  MetricsTail t;
  t.step = r.step;
  if (r.loss && !std::isnan(*r.loss)) t.loss = *r.loss;
  return t;
}

/// The console's line for the arm being trained: "[2/3] snip-0.75: step
/// 40/600 | loss 6.1234 | ETA arm 4m10s, experiment 12m30s", from the arm's
/// own RUN/metrics.jsonl (the step and its loss as recorded; the total is
/// the arm's train.max_steps from RUN/config.toml). The arm's ETA: the steps
/// left at the rate of the arm so far (a fresh arm: its steps over the time
/// since it started, setup included; a resumed one: the steps recorded
/// since this call first saw one, "?" until two); 0 at the last step. The experiment's ETA adds to the
/// arm's the arms still to train, each estimated at the mean wall time of
/// the arms trained so far in this call, the current one counted at its
/// elapsed time plus its ETA. On a terminal the line is rewritten in place
/// at each new record; otherwise one plain line at most every `interval_s`
/// seconds, and always the arm's last step.
class ArmProgress {
 public:
  using clock = std::chrono::steady_clock;
  ArmProgress(std::string prefix, fs::path run_dir, bool tty, double interval_s, int64_t arms_after,
              const std::vector<double>& earlier_arm_seconds)
      : prefix_(std::move(prefix)), run_(std::move(run_dir)), tty_(tty), interval_s_(interval_s),
        arms_after_(arms_after), earlier_(earlier_arm_seconds), start_(clock::now()) {
    if (const auto t = read_metrics_tail(run_ / "metrics.jsonl")) last_step_ = t->step;  // a resumed arm's old tail
    else base_step_ = 0;  // a fresh arm: its steps and this call's clock start together
  }

  /// Reads the arm's newest record and shows it when it is new.
  void poll() {
    const auto t = read_metrics_tail(run_ / "metrics.jsonl");
    if (!t || t->step == last_step_) return;
    last_step_ = t->step;
    if (total_ <= 0 && fs::exists(run_ / "config.toml")) {
      try {
        Config c;
        c.load_toml_file((run_ / "config.toml").string());
        total_ = c.get_int("train.max_steps");
      } catch (const std::exception&) {
        total_ = 0;  // being written: read again at the next record
      }
    }
    const double now = seconds_since(start_);
    if (first_step_ < 0) first_step_ = t->step, first_s_ = now;
    double eta_s = std::nan("");
    if (total_ > 0 && t->step >= total_) eta_s = 0;
    else if (total_ > 0 && base_step_ >= 0 && t->step > base_step_)
      eta_s = double(total_ - t->step) * now / double(t->step - base_step_);
    else if (total_ > 0 && t->step > first_step_)
      eta_s = double(total_ - t->step) * (now - first_s_) / double(t->step - first_step_);
    if (!tty_ && t->step != total_ && shown_ && now - last_shown_ < interval_s_) return;
    double exp_eta = std::nan("");
    if (std::isfinite(eta_s)) {
      double sum = now + eta_s;
      for (double s : earlier_) sum += s;
      exp_eta = eta_s + double(arms_after_) * sum / double(earlier_.size() + 1);
    }
    auto eta = [](double s) { return std::isfinite(s) ? fmt_minutes(s + 0.5) : std::string("?"); };
    const std::string text = fmt::format("{}: step {}/{} | loss {:.4f} | ETA arm {}, experiment {}", prefix_,
                                         t->step, total_ > 0 ? std::to_string(total_) : std::string("?"), t->loss,
                                         eta(eta_s), eta(exp_eta));
    if (tty_) std::cerr << "\r" << text << "\033[K" << std::flush;
    else std::cerr << text << "\n" << std::flush;
    shown_ = true;
    last_shown_ = now;
  }
  /// Ends the rewritten line on a terminal.
  void finish() {
    if (tty_ && shown_) std::cerr << "\n";
  }

 private:
  static double seconds_since(clock::time_point t) {
    return std::chrono::duration<double>(clock::now() - t).count();
  }
  std::string prefix_;
  fs::path run_;
  bool tty_;
  double interval_s_;
  int64_t arms_after_;
  const std::vector<double>& earlier_;
  clock::time_point start_;
  int64_t total_ = 0, last_step_ = -1, first_step_ = -1;
  int64_t base_step_ = -1;  // a fresh arm's 0 (its rate from this call's start); -1 for a resumed arm
  double first_s_ = 0;
  bool shown_ = false;
  double last_shown_ = 0;
};

/// " (bf16 GEMMs)" after the unquantized policy when its GEMM dtype is known
/// (summary.json "gemm_dtype"), else "": "none" alone does not say what the
/// baseline computed in.
std::string gemm_note(const Arm& arm, const std::string& gemm_dtype) {
  return arm.policy == "none" && !gemm_dtype.empty() ? " (" + gemm_dtype + " GEMMs)" : "";
}

/// ", fprop-only final phase" / ", no final phase" / ", budget in GEMM time" for an arm's +modifiers.
std::string modifier_note(const Arm& arm) {
  std::string n;
  if (arm.sets.count("precision.final_phase_gemms")) n += ", fprop-only final phase";
  if (arm.sets.count("precision.final_high_precision_fraction")) n += ", no final phase";
  if (arm.sets.count("precision.budget_unit")) n += ", budget in GEMM time";
  return n;
}

struct ArmResult {
  Arm arm;
  bool done = false;
  double val = std::nan(""), gap_pct = std::nan(""), fp4_share = std::nan(""), seconds = std::nan(""),
         tokens_per_s = std::nan("");
  int64_t steps = 0;
  std::string gemm_dtype;  // summary.json "gemm_dtype": bf16 or fp32 ("" if absent)
  report::RunCurves curves;
  /// The policy as the table shows it: "none (bf16 GEMMs)" (gemm_note), or the policy.
  std::string policy_label() const { return arm.policy + gemm_note(arm, gemm_dtype) + modifier_note(arm); }
};

ArmResult collect(const Arm& arm, const fs::path& dir) {
  ArmResult r;
  r.arm = arm;
  const fs::path sp = dir / "summary.json";
  if (!fs::exists(sp)) return r;
  const json s = io::read_json_file(sp.string(), "summary");
  r.done = true;
  r.val = s.value("final_val_loss", std::nan(""));
  r.steps = s.value("steps", int64_t{0});
  r.gemm_dtype = s.contains("gemm_dtype") && s["gemm_dtype"].is_string() ? s["gemm_dtype"].get<std::string>() : "";
  r.curves = report::read_metrics((dir / "metrics.jsonl").string());
  double share = 0;
  for (double v : r.curves.fp4_share) share += v;
  r.fp4_share = r.curves.fp4_share.empty() ? std::nan("") : share / double(r.curves.fp4_share.size());
  // Wall time of the training steps (evaluation and checkpoints excluded):
  // the last record's elapsed_s, which a resumed run continues.
  r.seconds = r.curves.elapsed_s.empty() ? s.value("seconds", std::nan("")) : r.curves.elapsed_s.back();
  const double tokens = s.value("tokens", 0.0);
  r.tokens_per_s = s.value("tokens_per_s", r.seconds > 0 ? tokens / r.seconds : std::nan(""));
  return r;
}

std::string cell(double v, const char* f) { return std::isfinite(v) ? fmt::format(fmt::runtime(f), v) : "-"; }

/// The rivals' rules (planner.h heuristic_bf16_tail, ...): they reach
/// whatever FP4 share their rule gives and read no budget.
bool is_rule_policy(const std::string& p) { return p == "autoswitch" || p == "bf16-tail" || p == "first-last-n"; }

/// Throws UserError when the arm's policy is not one snip knows (a
/// uniform-<recipe> names a recipe of `set`).
void check_arm_policy(const Arm& arm, const recipes::RecipeSet& set) {
  const std::string& p = arm.policy;
  const bool known = p == "none" || p == "snip" || p == "min-rel-err" || p == "layer-type" ||
                     p == "first-last-fp8" || p == "random" || is_rule_policy(p) ||
                     (p.rfind("uniform-", 0) == 0 && set.has(p.substr(8)));
  if (!known)
    fail("--arms: '", arm.name, "': expected none (or bf16, its old name), uniform-<recipe>, snip, min-rel-err, layer-type, "
         "first-last-fp8 or random, optionally followed by -<budget>, or a rival's rule: autoswitch, bf16-tail, "
         "first-last-n");
}

/// The arms of a comma-separated list (blanks around names ignored), each
/// checked (`set`: the recipes a uniform-<recipe> arm may name); UserError
/// for a bad or repeated name or an empty list.
std::vector<Arm> parse_arm_list(const std::string& list, const recipes::RecipeSet& set) {
  std::vector<Arm> arms;
  std::stringstream ss(list);
  std::set<std::string> seen;
  std::map<std::pair<std::string, std::string>, std::string> runs;  // (policy, budget) -> arm
  for (std::string t; std::getline(ss, t, ',');) {
    const auto b = t.find_first_not_of(" \t"), e = t.find_last_not_of(" \t");
    if (b == std::string::npos) continue;
    Arm arm = parse_arm(t.substr(b, e - b + 1));
    if (!seen.insert(arm.name).second) fail("--arms: '", arm.name, "' given twice");
    check_arm_policy(arm, set);
    // A budget the policy does not read would label a run with a number it never used.
    if (std::isfinite(arm.budget) && is_rule_policy(arm.policy))
      fail("--arms: '", arm.name, "': policy ", arm.policy, " takes no budget (its rule sets the FP4 share; the "
           "table reports it); write '", arm.policy, "'");
    if (std::isfinite(arm.budget) && (arm.policy == "none" || arm.policy.rfind("uniform-", 0) == 0))
      fail("--arms: '", arm.name, "': policy ", arm.policy, " takes no budget (it plans nothing); write '",
           arm.policy, "'");
    if (arm.per_gemm && (arm.policy == "none" || arm.policy.rfind("uniform-", 0) == 0))
      fail("--arms: '", arm.name, "': policy ", arm.policy, " plans nothing, so it has no per-GEMM form");
    if (!arm.sets.empty() && arm.policy == "none")
      fail("--arms: '", arm.name, "': policy none quantizes nothing, so +modifiers do not apply to it");
    if (arm.sets.count("precision.budget_unit") && (arm.policy.rfind("uniform-", 0) == 0 || is_rule_policy(arm.policy)))
      fail("--arms: '", arm.name, "': policy ", arm.policy, " reads no budget, so +time does not apply to it");
    if (arm.per_gemm && arm.policy == "autoswitch")
      fail("--arms: '", arm.name, "': autoswitch always plans per GEMM; write 'autoswitch'");
    std::string mods;
    for (const auto& [k, v] : arm.sets) mods += "+" + k + "=" + v;
    const auto key = std::make_pair(arm.policy + (arm.per_gemm ? "/gemm" : "") + mods,
                                    std::isfinite(arm.budget) ? fmt::format("{}", arm.budget) : "");
    if (runs.count(key))
      fail("--arms: '", arm.name, "' and '", runs[key], "' are the same run (policy ", arm.policy,
           arm.policy == "none" ? "; bf16 is its old name" : "", "); keep one");
    runs[key] = arm.name;
    arms.push_back(arm);
  }
  if (arms.empty()) fail("--arms: expected at least one arm");
  return arms;
}

/// The seeded runs of one arm (`snip experiment --seeds`): the folders
/// ARM_DIR/seed-<s> (s a non-negative integer) that hold a config.toml, by
/// ascending seed. Empty when there are none.
std::vector<std::pair<int64_t, fs::path>> seed_runs(const fs::path& arm_dir) {
  std::vector<std::pair<int64_t, fs::path>> v;
  if (!fs::is_directory(arm_dir)) return v;
  for (const auto& e : fs::directory_iterator(arm_dir)) {
    const std::string n = e.path().filename().string();
    if (!e.is_directory() || n.rfind("seed-", 0) != 0 || n.size() == 5 || n.size() > 23) continue;
    if (n.find_first_not_of("0123456789", 5) != std::string::npos) continue;
    if (fs::is_regular_file(e.path() / "config.toml")) v.emplace_back(std::stoll(n.substr(5)), e.path());
  }
  std::sort(v.begin(), v.end());
  return v;
}

/// --no-train without --arms: the arms trained in OUT (its subfolders named
/// like an arm and holding a config.toml), those of the default list first
/// and in its order (so none is the reference when present; a "bf16" arm,
/// its old name, right after it), then the
/// others by name (`set`: the recipes a uniform-<recipe> arm may name).
/// UserError when OUT does not exist or holds none.
std::vector<Arm> arms_in(const fs::path& out, const recipes::RecipeSet& set) {
  if (!fs::is_directory(out)) fail("--out: ", out.string(), " does not exist (nothing trained yet)");
  std::set<std::string> found;
  for (const auto& e : fs::directory_iterator(out))
    if (e.is_directory() && (fs::is_regular_file(e.path() / "config.toml") || !seed_runs(e.path()).empty()))
      found.insert(e.path().filename().string());
  std::vector<Arm> arms;
  auto take = [&](const std::string& name) {
    if (!found.count(name)) return;
    found.erase(name);
    try {
      Arm arm = parse_arm(name);
      check_arm_policy(arm, set);
      arms.push_back(arm);
    } catch (const UserError&) {
      // a folder that is not an arm (its name is no policy): not tabulated
    }
  };
  std::stringstream ss(std::string("none,bf16") + (kDefaultArms + 4));
  for (std::string t; std::getline(ss, t, ',');) take(t);
  for (const std::string& name : std::set<std::string>(found)) take(name);
  if (arms.empty())
    fail("--no-train: ", out.string(), " holds no trained arm (no ", (out / "<arm>" / "config.toml").string(),
         "); train them first (snip experiment without --no-train)");
  return arms;
}

/// Whether an option may differ between two arms of one experiment: what
/// each arm sets (precision.policy, precision.budget), every precision
/// option when one of them is the unquantized arm, policy none (nothing reads them
/// there), train.log_interval (only what is printed), and where the GEMM-times
/// table comes from (precision.gemm_times, calibration, calibrate_seconds:
/// read by a +time arm's plans; a FLOPs-budget plan only records its times).
bool arm_may_differ(const std::string& key, const Arm& x, const Arm& y) {
  if (key == "train.log_interval" || key == "precision.policy" || key == "precision.budget") return true;
  if (key == "precision.gemm_times" || key == "precision.calibration" || key == "precision.calibrate_seconds")
    return true;
  if (key == "precision.granularity" && (x.per_gemm || y.per_gemm)) return true;
  if (x.sets.count(key) || y.sets.count(key)) return true;
  return key.rfind("precision.", 0) == 0 && (x.policy == "none" || y.policy == "none");
}

OptionValue option_value(const Config& c, const OptionSpec& o) {
  switch (o.type) {
    case OptionType::kBool: return c.get_bool(o.key);
    case OptionType::kInt: return c.get_int(o.key);
    case OptionType::kFloat: return c.get_float(o.key);
    case OptionType::kString: return c.get_string(o.key);
  }
  return {};
}

/// One training run of the experiment: an arm, and with --seeds one of its
/// seeds. Its folder is OUT/<arm> (no seeds) or OUT/<arm>/seed-<s>, its log
/// OUT/<arm>.log or OUT/<arm>/seed-<s>.log.
struct RunSpec {
  Arm arm;
  int64_t seed = -1;  ///< -1 = no --seeds (the config's train.seed)
  fs::path dir, log;
  /// "snip-0.75" or "snip-0.75 seed 1235": how the console names the run.
  std::string label() const { return seed < 0 ? arm.name : fmt::format("{} seed {}", arm.name, seed); }
  /// The --set assignments of the seed: train.seed (initialisation, data
  /// order, stochastic rounding, dropout) and precision.seed (the random
  /// policy's draw) both = s. None without --seeds.
  std::vector<std::string> seed_sets() const {
    if (seed < 0) return {};
    return {fmt::format("train.seed={}", seed), fmt::format("precision.seed={}", seed)};
  }
};

RunSpec run_spec(const Arm& arm, const fs::path& out, int64_t seed) {
  RunSpec r{arm, seed, out / arm.name, out / (arm.name + ".log")};
  if (seed >= 0) {
    r.dir = out / arm.name / fmt::format("seed-{}", seed);
    r.log = out / arm.name / fmt::format("seed-{}.log", seed);
  }
  return r;
}

/// The runs on disk of each arm, for --no-train: ARM/seed-<s> folders when
/// the arm has them (seeded), else ARM itself. UserError when some arms are
/// seeded and others not, or an arm folder holds both layouts.
std::vector<RunSpec> trained_runs(const std::vector<Arm>& arms, const fs::path& out) {
  std::vector<RunSpec> runs;
  int seeded = -1;           // the layout of the first arm with runs: 1 seeded, 0 not
  std::string layout_arm;    // that arm
  for (const Arm& arm : arms) {
    const auto sr = seed_runs(out / arm.name);
    const bool plain = fs::is_regular_file(out / arm.name / "config.toml");
    if (plain && !sr.empty())
      fail("--no-train: experiment arm '", arm.name, "': ", (out / arm.name).string(),
           " holds both a run (config.toml) and seeded runs (seed-<s>/); keep one layout per arm");
    const int this_seeded = sr.empty() ? 0 : 1;
    if (seeded >= 0 && this_seeded != seeded && (plain || !sr.empty()))
      fail("--no-train: experiment arm '", arm.name, "' in ", (out / arm.name).string(), " was trained ",
           this_seeded ? "with" : "without", " --seeds but arm '", layout_arm, "' ",
           this_seeded ? "without" : "with", " them; tabulate them apart (--arms)");
    if ((plain || !sr.empty()) && seeded < 0) seeded = this_seeded, layout_arm = arm.name;
    if (sr.empty()) runs.push_back(run_spec(arm, out, -1));
    for (const auto& [seed, dir] : sr) runs.push_back(run_spec(arm, out, seed));
  }
  return runs;
}

/// --no-train: each run's own resolved configuration, its config.toml (what
/// `snip train` wrote for the run and trained with), stands instead of
/// --config and --set. UserError naming the folder when an arm has no run
/// or its config.toml is missing, when its precision.policy (or, for an arm
/// named <policy>-<budget>, precision.budget; for <policy>-gemm-<budget>,
/// precision.granularity) is not the arm's name's, when a seeded run's
/// train.seed is not its folder's, or when it differs from the first run
/// (the reference arm's first) in an option no arm sets (the model, the
/// data, the steps, the schedule: arm_may_differ(); train.seed and
/// precision.seed differ between seeds).
void check_trained_arms(const std::vector<Arm>& arms, const std::vector<RunSpec>& runs, const fs::path& out) {
  for (const Arm& arm : arms) {
    const fs::path dir = out / arm.name;
    if (!fs::is_directory(dir))
      fail("--no-train: experiment arm '", arm.name, "': ", dir.string(), " does not exist; train it (snip "
           "experiment without --no-train) or leave it out of --arms");
  }
  std::vector<Config> cfgs;
  for (const RunSpec& run : runs) {
    const Arm& arm = run.arm;
    const fs::path& dir = run.dir;
    const fs::path file = dir / "config.toml";
    if (!fs::is_regular_file(file))
      fail("--no-train: experiment arm '", arm.name, "': ", dir.string(), " holds no config.toml (not a run of "
           "snip train); delete it to retrain the arm, or leave it out of --arms");
    Config c;
    c.load_toml_file(file.string());  // UserError "<file>: ..."
    const std::string policy = c.get_string("precision.policy");
    if (policy != arm.policy)
      fail("--no-train: experiment arm '", arm.name, "' in ", dir.string(), " was trained with precision.policy = ",
           policy, ", not ", arm.policy, " (a folder of another arm?); delete it to retrain the arm");
    if (std::isfinite(arm.budget) && c.get_float("precision.budget") != arm.budget)
      fail("--no-train: experiment arm '", arm.name, "' in ", dir.string(), " was trained with precision.budget = ",
           format_option_value(c.get_float("precision.budget")), ", not ", format_option_value(arm.budget),
           "; delete it to retrain the arm");
    if (arm.per_gemm && c.get_string("precision.granularity") != "gemm")
      fail("--no-train: experiment arm '", arm.name, "' in ", dir.string(),
           " was trained with precision.granularity = ", c.get_string("precision.granularity"),
           ", not gemm; delete it to retrain the arm");
    for (const auto& [key, value] : arm.sets) {
      // Compared as the option's type (+nofinal's "0" is a number).
      const OptionSpec* spec = find_spec(key);
      SNIP_CHECK(spec, "experiment: modifier option ", key, " is not in the option table");
      Config want;
      want.set_override(key + "=" + value);
      const OptionValue got = option_value(c, *spec);
      if (!(got == option_value(want, *spec)))
        fail("--no-train: experiment arm '", arm.name, "' in ", dir.string(), " was trained with ", key, " = ",
             format_option_value(got), ", not ", value, "; delete it to retrain the arm");
    }
    if (run.seed >= 0 && c.get_int("train.seed") != run.seed)
      fail("--no-train: experiment arm '", arm.name, "' in ", dir.string(), " was trained with train.seed = ",
           c.get_int("train.seed"), ", not its folder's ", run.seed, "; delete it to retrain that seed");
    cfgs.push_back(std::move(c));
  }
  for (size_t i = 1; i < runs.size(); ++i)
    for (const OptionSpec& o : option_table()) {
      if (arm_may_differ(o.key, runs[i].arm, runs[0].arm)) continue;
      if (runs[i].seed >= 0 && (o.key == "train.seed" || o.key == "precision.seed")) continue;
      const OptionValue v = option_value(cfgs[i], o), ref = option_value(cfgs[0], o);
      if (!(v == ref))
        fail("--no-train: experiment arm '", runs[i].arm.name, "' in ", runs[i].dir.string(),
             " was trained with ", o.key, " = ", format_option_value(v), " but arm '", runs[0].arm.name, "' in ",
             runs[0].dir.string(), " with ", format_option_value(ref),
             ": not one experiment; tabulate them apart (--arms, --out), or delete that arm's folder to retrain it");
    }
}

auto num(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

/// The chart's y range: from the first evaluation after 20% of the run, the
/// part where the arms differ.
void zoom_y(const std::vector<report::Series>& series, report::LineChartOptions& lo) {
  for (const auto& s : series)
    for (size_t k = 0; k < s.x.size(); ++k) {
      const double hi = k < s.y_hi.size() && std::isfinite(s.y_hi[k]) ? s.y_hi[k] : s.y[k];
      if (s.x[k] >= 0.2 * s.x.back() && std::isfinite(hi)) lo.y_max = std::isfinite(lo.y_max) ? std::max(lo.y_max, hi) : hi;
    }
}

/// Writes OUT/results.md, .json, .csv and val_loss.svg (atomically) and
/// prints the table and the files' names.
void write_result_files(const fs::path& out, const std::string& md, const json& j, const std::string& csv,
                        const std::string& svg) {
  io::write_file_atomic((out / "results.md").string(), md);
  io::write_file_atomic((out / "results.json").string(), j.dump(2) + "\n");
  io::write_file_atomic((out / "results.csv").string(), csv);
  io::write_file_atomic((out / "val_loss.svg").string(), svg + "\n");
  std::cout << md << "\nwritten: " << (out / "results.md").string() << ", results.json, results.csv, "
            << "val_loss.svg\n";
}

report::LineChartOptions val_chart_options() {
  report::LineChartOptions lo;
  lo.id = "val_loss";
  lo.title = "Validation loss per arm";
  lo.x_label = "step";
  lo.y_label = "validation loss (nats/token)";
  lo.width = 900;
  lo.height = 460;
  return lo;
}

/// Writes OUT/results.{md,json,csv} and OUT/val_loss.svg for an experiment
/// without seeds (one run per arm) and prints the table.
void write_results(const std::vector<Arm>& arms, const fs::path& out) {
  std::vector<ArmResult> res;
  for (const Arm& arm : arms) res.push_back(collect(arm, out / arm.name));
  const double ref = res.front().val;
  for (auto& r : res)
    if (r.done && std::isfinite(ref) && ref != 0) r.gap_pct = 100.0 * (r.val - ref) / ref;
  std::ostringstream md;
  md << "| arm | policy | budget | final val loss | gap to " << res.front().arm.name
     << gemm_note(res.front().arm, res.front().gemm_dtype) << " | FP4 FLOPs share | wall time | tokens/s |\n|---|---|---|---|---|---|---|---|\n";
  json jr = json::array();
  std::ostringstream csv;
  csv << "arm,policy,gemm_dtype,budget,final_val_loss,gap_pct,fp4_share,seconds,tokens_per_s,steps\n";
  for (const auto& r : res) {
    md << "| " << r.arm.name << " | " << r.policy_label() << " | " << cell(r.arm.budget, "{:.2f}") << " | "
       << (r.done ? cell(r.val, "{:.4f}") : "not trained") << " | " << cell(r.gap_pct, "{:+.2f}%") << " | "
       << cell(r.fp4_share, "{:.3f}") << " | " << (std::isfinite(r.seconds) ? fmt_minutes(r.seconds) : "-")
       << " | " << cell(r.tokens_per_s, "{:.0f}") << " |\n";
    jr.push_back({{"arm", r.arm.name}, {"policy", r.arm.policy}, {"sets", r.arm.sets}, {"gemm_dtype", r.gemm_dtype},
                  {"budget", num(r.arm.budget)},
                  {"trained", r.done}, {"final_val_loss", num(r.val)}, {"gap_pct", num(r.gap_pct)},
                  {"fp4_share", num(r.fp4_share)}, {"seconds", num(r.seconds)},
                  {"tokens_per_s", num(r.tokens_per_s)}, {"steps", r.steps}});
    csv << r.arm.name << "," << r.arm.policy << "," << r.gemm_dtype << "," << cell(r.arm.budget, "{}") << "," << cell(r.val, "{}") << ","
        << cell(r.gap_pct, "{}") << "," << cell(r.fp4_share, "{}") << "," << cell(r.seconds, "{}") << ","
        << cell(r.tokens_per_s, "{}") << "," << r.steps << "\n";
  }
  md << "\nFP4 FLOPs share: mean over all steps (warmup and the final high-precision phase included). "
        "Wall time: training steps incl. stats steps, evaluation excluded.\n";
  // The chart: every arm's validation-loss curve.
  std::vector<report::Series> series;
  for (size_t i = 0; i < res.size(); ++i) {
    const auto& r = res[i];
    if (!r.done || r.curves.val_step.empty()) continue;
    // 8 palette colours; the reference arm and arms past the 8th are dashed
    // (those with another colour than the reference's).
    series.push_back({r.arm.name, r.curves.val_step, r.curves.val_loss,
                      report::series_color(i < 8 ? i : (i + 3) % 8), i == 0 || i >= 8});
  }
  report::LineChartOptions lo = val_chart_options();
  zoom_y(series, lo);
  if (!fs::exists(out)) fail("--out: ", out.string(), " does not exist (nothing trained yet)");
  write_result_files(out, md.str(), jr, csv.str(), report::svg_line_chart(series, lo));
}

/// One arm over its seeds.
struct SeededArm {
  Arm arm;
  std::vector<int64_t> seeds;      ///< the finished runs' seeds, ascending
  std::vector<ArmResult> runs;     ///< the finished runs, by seed
  SampleSummary val;               ///< final validation loss over the seeds (nats/token)
  double fp4_share = std::nan(""), seconds = std::nan(""), tokens_per_s = std::nan("");  ///< means over seeds
  double gap_pct = std::nan("");   ///< 100 (mean - reference mean) / reference mean
  std::string gemm_dtype;
  /// The final validation loss of `seed`'s run (NaN when not trained).
  double val_of(int64_t seed) const {
    for (size_t i = 0; i < seeds.size(); ++i)
      if (seeds[i] == seed) return runs[i].val;
    return std::nan("");
  }
};

/// A paired comparison: arm a minus arm b over the seeds both trained.
struct Paired {
  std::string a, b;
  std::vector<int64_t> seeds;
  std::vector<double> diffs;  ///< val(a, s) - val(b, s), nats/token
  MeanInterval ci;            ///< mean of diffs, 95% Student-t interval (n-1 df)
};

Paired paired(const SeededArm& a, const SeededArm& b) {
  Paired p{a.arm.name, b.arm.name, {}, {}, {}};
  for (int64_t s : a.seeds) {
    const double x = a.val_of(s), y = b.val_of(s);
    if (std::isfinite(x) && std::isfinite(y)) p.seeds.push_back(s), p.diffs.push_back(x - y);
  }
  p.ci = t_interval(p.diffs, 0.95);
  return p;
}

std::string seed_list(const std::vector<int64_t>& seeds) {
  std::string t;
  for (size_t i = 0; i < seeds.size(); ++i) t += (i ? ", " : "") + std::to_string(seeds[i]);
  return t;
}

/// Writes OUT/results.{md,json,csv} and OUT/val_loss.svg for an experiment
/// with seeds (every finished OUT/<arm>/seed-<s> run of each arm) and prints
/// the tables: per arm the mean, sample standard deviation and per-seed
/// values of the final validation loss; the noise floor (the reference
/// arm's standard deviation); paired comparisons (same seed, A minus B)
/// with a 95% Student-t interval for every arm against the reference, every
/// snip arm against every uniform arm and every heuristic at its budget,
/// and a per-GEMM arm against its per-layer twin. The CSV holds
/// one row per run (the raw numbers). The chart: each arm's mean curve and
/// a band of ± one standard deviation over its seeds.
void write_seeded_results(const std::vector<Arm>& arms, const fs::path& out) {
  std::vector<SeededArm> res;
  for (const Arm& arm : arms) {
    SeededArm a;
    a.arm = arm;
    for (const auto& [seed, dir] : seed_runs(out / arm.name)) {
      ArmResult r = collect(arm, dir);
      if (!r.done) continue;
      a.seeds.push_back(seed);
      a.runs.push_back(std::move(r));
    }
    std::vector<double> v, share, secs, tps;
    for (const auto& r : a.runs) {
      v.push_back(r.val), share.push_back(r.fp4_share), secs.push_back(r.seconds), tps.push_back(r.tokens_per_s);
      if (a.gemm_dtype.empty()) a.gemm_dtype = r.gemm_dtype;
    }
    a.val = summarize(v);
    a.fp4_share = summarize(share).mean;
    a.seconds = summarize(secs).mean;
    a.tokens_per_s = summarize(tps).mean;
    res.push_back(std::move(a));
  }
  const SeededArm& ref = res.front();
  for (auto& a : res)
    if (a.val.n && ref.val.n && ref.val.mean != 0) a.gap_pct = 100.0 * (a.val.mean - ref.val.mean) / ref.val.mean;
  const std::string ref_label = ref.arm.name + gemm_note(ref.arm, ref.gemm_dtype);

  std::vector<Paired> cmp;
  // Every arm against the reference; every snip arm against each other arm
  // that plans nothing (uniform) or plans at its budget (the heuristics at
  // the same FP4 budget); a per-GEMM arm against its per-layer twin; an arm
  // with +modifiers (+fprop, +nofinal, +time) against the same arm without
  // them, two arms of one base with different modifiers against each other,
  // and a +time arm against the same policy at each FLOPs budget.
  auto is_snip = [](const SeededArm& a) { return a.arm.policy == "snip"; };
  auto same_budget = [](const Arm& x, const Arm& y) {
    return !std::isfinite(y.budget) || (std::isfinite(x.budget) && x.budget == y.budget);
  };
  for (size_t i = 1; i < res.size(); ++i) cmp.push_back(paired(res[i], ref));
  for (size_t i = 1; i < res.size(); ++i)
    for (size_t j = 1; j < res.size(); ++j) {
      const Arm &x = res[i].arm, &y = res[j].arm;
      const bool same = x.policy == y.policy && x.per_gemm == y.per_gemm &&
                        (std::isfinite(x.budget) ? x.budget == y.budget : !std::isfinite(y.budget));
      if (i != j && !x.sets.empty() && y.sets.empty() && same) cmp.push_back(paired(res[i], res[j]));
      // Two modifier arms of the same base (+fprop against +nofinal: the late
      // raise against no final phase), in --arms order.
      if (i < j && !x.sets.empty() && !y.sets.empty() && x.sets != y.sets && same) cmp.push_back(paired(res[i], res[j]));
      // A budget in GEMM time against the same policy's FLOPs budgets (the
      // comparison at equal step time: the +time arm's budget chosen so).
      if (i != j && x.policy == y.policy && x.per_gemm == y.per_gemm && x.sets.count("precision.budget_unit") &&
          y.sets.empty() && !same)
        cmp.push_back(paired(res[i], res[j]));
    }
  for (size_t i = 1; i < res.size(); ++i)
    for (size_t j = 1; j < res.size(); ++j) {
      const Arm &x = res[i].arm, &y = res[j].arm;
      if (i == j || !is_snip(res[i])) continue;
      const bool twin = x.per_gemm && !y.per_gemm && x.policy == y.policy && same_budget(x, y) &&
                        std::isfinite(y.budget);
      if ((!is_snip(res[j]) && same_budget(x, y)) || twin) cmp.push_back(paired(res[i], res[j]));
    }

  std::ostringstream md;
  md << fmt::format("Noise floor: the reference arm {} over {} seed{} ({}): final validation loss {} ± {} "
                    "(mean ± sample standard deviation, nats/token; {} of the mean).\n\n",
                    ref_label, ref.val.n, ref.val.n == 1 ? "" : "s", seed_list(ref.seeds), cell(ref.val.mean, "{:.4f}"),
                    cell(ref.val.sd, "{:.4f}"),
                    std::isfinite(ref.val.sd) ? fmt::format("{:.2f}%", 100 * ref.val.sd / ref.val.mean) : "-");
  md << "| arm | policy | budget | seeds | final val loss (mean) | sd | per seed | gap to " << ref_label
     << " | FP4 FLOPs share | wall time | tokens/s |\n|---|---|---|---|---|---|---|---|---|---|---|\n";
  json jarms = json::array();
  std::ostringstream csv;
  csv << "arm,policy,granularity,gemm_dtype,budget,seed,final_val_loss,fp4_share,seconds,tokens_per_s,steps\n";
  for (const auto& a : res) {
    std::string per;
    for (size_t i = 0; i < a.runs.size(); ++i) per += (i ? ", " : "") + cell(a.runs[i].val, "{:.4f}");
    const std::string policy =
        a.arm.policy + gemm_note(a.arm, a.gemm_dtype) + (a.arm.per_gemm ? " (per GEMM)" : "") + modifier_note(a.arm);
    md << "| " << a.arm.name << " | " << policy << " | " << cell(a.arm.budget, "{:.2f}") << " | " << a.val.n << " | "
       << (a.val.n ? cell(a.val.mean, "{:.4f}") : "not trained") << " | " << cell(a.val.sd, "{:.4f}") << " | "
       << (per.empty() ? "-" : per) << " | " << cell(a.gap_pct, "{:+.2f}%") << " | " << cell(a.fp4_share, "{:.3f}")
       << " | " << (std::isfinite(a.seconds) ? fmt_minutes(a.seconds) : "-") << " | "
       << cell(a.tokens_per_s, "{:.0f}") << " |\n";
    json jruns = json::array();
    for (size_t i = 0; i < a.runs.size(); ++i) {
      const auto& r = a.runs[i];
      jruns.push_back({{"seed", a.seeds[i]}, {"final_val_loss", num(r.val)}, {"fp4_share", num(r.fp4_share)},
                       {"seconds", num(r.seconds)}, {"tokens_per_s", num(r.tokens_per_s)}, {"steps", r.steps}});
      csv << a.arm.name << "," << a.arm.policy << "," << (a.arm.per_gemm ? "gemm" : "layer") << "," << r.gemm_dtype
          << "," << cell(a.arm.budget, "{}") << "," << a.seeds[i] << "," << cell(r.val, "{}") << ","
          << cell(r.fp4_share, "{}") << "," << cell(r.seconds, "{}") << "," << cell(r.tokens_per_s, "{}") << ","
          << r.steps << "\n";
    }
    jarms.push_back({{"arm", a.arm.name}, {"policy", a.arm.policy}, {"granularity", a.arm.per_gemm ? "gemm" : "layer"},
                     {"sets", a.arm.sets},
                     {"gemm_dtype", a.gemm_dtype}, {"budget", num(a.arm.budget)}, {"seeds", a.seeds},
                     {"n", a.val.n}, {"mean", num(a.val.mean)}, {"sd", num(a.val.sd)}, {"gap_pct", num(a.gap_pct)},
                     {"fp4_share", num(a.fp4_share)}, {"seconds", num(a.seconds)},
                     {"tokens_per_s", num(a.tokens_per_s)}, {"runs", jruns}});
  }
  md << "\nFP4 FLOPs share, wall time, tokens/s: means over the seeds (the share over all steps, warmup and the "
        "final high-precision phase included; wall time: training steps incl. stats steps, evaluation excluded).\n\n";
  md << "Paired comparisons: A minus B in final validation loss over the seeds both arms trained (the same seed "
        "gives both arms the same initialisation and data order), the mean difference with its 95% Student-t "
        "interval (n-1 degrees of freedom; needs n >= 2), and the mean in units of the noise floor. \"A lower\" "
        "or \"A higher\" when the interval excludes 0; \"not resolved\" otherwise.\n\n";
  md << "| A | B | seeds | mean A - B | 95% interval | / noise floor | verdict |\n|---|---|---|---|---|---|---|\n";
  json jcmp = json::array();
  for (const auto& p : cmp) {
    const double floors = std::isfinite(ref.val.sd) && ref.val.sd > 0 ? p.ci.summary.mean / ref.val.sd : std::nan("");
    const char* verdict = p.ci.sign() < 0 ? "A lower" : p.ci.sign() > 0 ? "A higher" : "not resolved";
    md << "| " << p.a << " | " << p.b << " | " << p.seeds.size() << " | " << cell(p.ci.summary.mean, "{:+.4f}")
       << " | " << (std::isfinite(p.ci.lo) ? fmt::format("[{:+.4f}, {:+.4f}]", p.ci.lo, p.ci.hi) : "-") << " | "
       << cell(floors, "{:+.1f}") << " | " << verdict << " |\n";
    jcmp.push_back({{"a", p.a}, {"b", p.b}, {"seeds", p.seeds}, {"differences", p.diffs},
                    {"mean", num(p.ci.summary.mean)}, {"sd", num(p.ci.summary.sd)}, {"lo", num(p.ci.lo)},
                    {"hi", num(p.ci.hi)}, {"level", p.ci.level}, {"interval", "student-t"},
                    {"noise_floors", num(floors)}, {"verdict", verdict}});
  }
  const json jr = {{"seeded", true},
                   {"reference", ref.arm.name},
                   {"noise_floor", {{"arm", ref.arm.name}, {"n", ref.val.n}, {"mean", num(ref.val.mean)},
                                    {"sd", num(ref.val.sd)}}},
                   {"arms", jarms},
                   {"paired", jcmp}};

  // The chart: per arm, the mean curve over the evaluation steps every seed
  // has, and a ± 1 sd band.
  std::vector<report::Series> series;
  for (size_t i = 0; i < res.size(); ++i) {
    const auto& a = res[i];
    if (a.runs.empty() || a.runs.front().curves.val_step.empty()) continue;
    report::Series s(fmt::format("{} (n={})", a.arm.name, a.runs.size()), {}, {},
                     report::series_color(i < 8 ? i : (i + 3) % 8), i == 0 || i >= 8);
    const auto& steps0 = a.runs.front().curves.val_step;
    for (size_t k = 0; k < steps0.size(); ++k) {
      std::vector<double> v;
      for (const auto& r : a.runs) {
        const auto& st = r.curves.val_step;
        const auto it = std::find(st.begin(), st.end(), steps0[k]);
        if (it != st.end()) v.push_back(r.curves.val_loss[size_t(it - st.begin())]);
      }
      if (v.size() != a.runs.size()) continue;
      const SampleSummary m = summarize(v);
      s.x.push_back(steps0[k]);
      s.y.push_back(m.mean);
      if (a.runs.size() >= 2) {
        s.y_lo.push_back(m.mean - m.sd);
        s.y_hi.push_back(m.mean + m.sd);
      }
    }
    series.push_back(std::move(s));
  }
  report::LineChartOptions lo = val_chart_options();
  lo.title = "Validation loss per arm: mean over seeds, band ± 1 standard deviation";
  zoom_y(series, lo);
  write_result_files(out, md.str(), jr, csv.str(), report::svg_line_chart(series, lo));
}

}  // namespace

void run_experiment(const ExperimentOptions& a) {
  const fs::path out(a.out);
  std::vector<Arm> arms;
  std::vector<RunSpec> runs;
  if (a.no_train) {
    // Re-tabulate: each run's own config.toml, no --config or --set needed;
    // recipes from a recipe file as each run trained with them (its recipes.json).
    recipes::RecipeSet known;
    auto add_copy = [&](const fs::path& copy) {
      if (!fs::is_regular_file(copy)) return;
      for (const recipes::Recipe& r : recipes::load_recipe_copy(copy.string())) known.add(r, /*replace=*/true);
    };
    if (fs::is_directory(out))
      for (const auto& e : fs::directory_iterator(out)) {
        add_copy(e.path() / "recipes.json");
        for (const auto& sr : seed_runs(e.path())) add_copy(sr.second / "recipes.json");
      }
    arms = a.arms_given ? parse_arm_list(a.arms, known) : arms_in(out, known);
    runs = trained_runs(arms, out);
    check_trained_arms(arms, runs, out);
    if (!a.config.empty() || !a.sets.empty() || a.seeds > 0)
      spdlog::info("--no-train: each run's own {} is used; --config, --set and --seeds are not read",
                   (out / "<arm>" / "config.toml").string());
  } else {
    if (a.config.empty())
      fail("--config FILE is required (only --no-train, which reads each arm's ", (out / "<arm>").string(),
           "/config.toml, goes without it)");
    Config c;  // precision.recipe_file first: an arm's policy may name one of its recipes
    c.load_toml_file(a.config);
    for (const auto& s : a.sets) c.set_override(s);
    arms = parse_arm_list(a.arms, recipes::load_recipe_set(c.get_string("precision.recipe_file")));
  }
  // Validate everything up front: the config, every arm's policy/budget.
  Config base;
  if (!a.no_train) {
    base.load_toml_file(a.config);
    for (const auto& s : a.sets) base.set_override(s);
    base.validate();
    for (const auto& st : a.sets) {
      const std::string key = st.substr(0, st.find('='));
      if (key == "precision.policy" || key == "precision.budget" || key == "precision.recipe")
        fail("--set ", st, ": ", key, " is set by each arm (--arms policy-budget); remove it");
      if (key == "precision.granularity")
        for (const Arm& arm : arms)
          if (arm.per_gemm) fail("--set ", st, ": arm '", arm.name, "' sets precision.granularity itself; remove it");
      for (const Arm& arm : arms)
        if (arm.sets.count(key)) fail("--set ", st, ": arm '", arm.name, "' sets ", key, " itself; remove it");
      if (key == "precision.seed" && a.seeds > 0)
        fail("--set ", st, ": with --seeds each run's precision.seed is its seed; remove it");
    }
    for (const Arm& arm : arms) {
      if (a.seeds == 0) {
        if (!seed_runs(out / arm.name).empty())
          fail("experiment arm '", arm.name, "': ", (out / arm.name).string(), " holds runs trained with --seeds; "
               "give --seeds, or use another --out");
        runs.push_back(run_spec(arm, out, -1));
      } else {
        if (fs::is_regular_file(out / arm.name / "config.toml"))
          fail("experiment arm '", arm.name, "': ", (out / arm.name).string(), " holds a run trained without "
               "--seeds; use another --out, or tabulate it without --seeds");
        const int64_t s0 = base.get_int("train.seed");
        for (int64_t k = 0; k < a.seeds; ++k) runs.push_back(run_spec(arm, out, s0 + k));
      }
    }
  }
  // A run already in OUT must have been trained with the configuration
  // asked for now; otherwise its numbers would silently answer another question.
  for (const RunSpec& run : runs) {
    if (a.no_train) break;  // check_trained_arms did it, from the runs' own files
    const Arm& arm = run.arm;
    const fs::path saved = run.dir / "config.toml";
    if (!fs::exists(saved)) continue;
    // A trainer still writing there is named first (its lock), before any
    // advice about the folder's configuration.
    { const io::DirLock probe(run.dir.string(), fmt::format("experiment arm '{}': run directory", run.label())); }
    Config want = base, have;
    for (const auto& st : run.seed_sets()) want.set_override(st);
    for (const auto& st : arm_sets(arm)) want.set_override(st);
    have.load_toml_file(saved.string());
    for (const auto& [key, v] : want.values()) {
      // For the unquantized arm the other precision options change nothing.
      if (arm.policy == "none" && key.rfind("precision.", 0) == 0 && key != "precision.policy" &&
          key != "precision.recipe")
        continue;
      if (key == "train.log_interval") continue;  // only what is printed
      const auto it = have.values().find(key);
      if (it == have.values().end() || !(it->second == v))
        fail("experiment arm '", run.label(), "' in ", run.dir.string(), " was trained with ", key, " = ",
             it == have.values().end() ? std::string("(unset)") : format_option_value(it->second),
             ", the configuration now says ", format_option_value(v),
             "; use another --out, or delete that folder to retrain the arm");
    }
  }
  if (!a.no_train) io::ensure_writable_dir(a.out);
  const auto t0 = std::chrono::steady_clock::now();
  const bool tty = isatty(STDERR_FILENO);
  std::vector<double> arm_seconds;  // wall time of each run trained afresh in this call (the ETA's estimate)
  for (size_t i = 0; i < runs.size() && !a.no_train; ++i) {
    const RunSpec& run = runs[i];
    const fs::path& dir = run.dir;
    const std::string log = run.log.string();
    if (fs::exists(dir / "summary.json")) {
      std::cerr << fmt::format("[{}/{}] {}: already trained ({})\n", i + 1, runs.size(), run.label(), dir.string());
      continue;
    }
    std::vector<std::string> args{"train", "--run-dir", dir.string()};
    if (fs::exists(dir) && !fs::exists(dir / "checkpoints")) {
      // Stopped before its first checkpoint (killed, diverged): nothing to
      // resume. Or still training there: a trainer holds the folder's lock
      // (io::DirLock), and this refuses, naming its process, before
      // deleting anything.
      const io::DirLock in_use(dir.string(), fmt::format("experiment arm '{}': run directory", run.label()));
      std::cerr << fmt::format("[{}/{}] {}: {} holds no checkpoint (stopped early); training it afresh\n", i + 1,
                               runs.size(), run.label(), dir.string());
      fs::remove_all(dir);
    }
    const bool resume = fs::exists(dir / "checkpoints");
    if (resume) {
      args.push_back("--resume");
    } else {
      if (run.seed >= 0) fs::create_directories(dir.parent_path());
      args.insert(args.end(), {"--config", a.config});
      for (const auto& s : a.sets) args.insert(args.end(), {"--set", s});
      for (const auto& s : run.seed_sets()) args.insert(args.end(), {"--set", s});
      for (const auto& s : arm_sets(run.arm)) args.insert(args.end(), {"--set", s});
    }
    std::cerr << fmt::format("[{}/{}] {}: {} (log: {})\n", i + 1, runs.size(), run.label(),
                             resume ? "resuming" : "training", log);
    int64_t arms_after = 0;  // still to train after this one
    for (size_t j = i + 1; j < runs.size(); ++j) arms_after += !fs::exists(runs[j].dir / "summary.json");
    // The run's progress, from the records its trainer appends to RUN/metrics.jsonl.
    ArmProgress progress(fmt::format("[{}/{}] {}", i + 1, runs.size(), run.label()), dir, tty, a.progress_s,
                         arms_after, arm_seconds);
    const auto ts = std::chrono::steady_clock::now();
    const int rc = run_self(args, log, [&] { progress.poll(); });
    progress.finish();
    const double arm_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - ts).count();
    if (rc != 0) {
      std::string last;
      std::ifstream in(log);
      for (std::string line; std::getline(in, line);)
        if (!line.empty()) last = line;
      fail("experiment arm '", run.label(), "' failed (exit ", rc, "): ", last, " (see ", log, ")");
    }
    if (!resume) arm_seconds.push_back(arm_s);
    const ArmResult r = collect(run.arm, dir);
    std::cerr << fmt::format("[{}/{}] {}: val {:.4f} in {} (experiment so far {})\n", i + 1, runs.size(),
                             run.label(), r.val, fmt_minutes(arm_s),
                             fmt_minutes(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()));
  }
  const bool seeded = a.no_train ? (!runs.empty() && runs.front().seed >= 0) : a.seeds > 0;
  if (seeded) write_seeded_results(arms, out);
  else write_results(arms, out);
}

}  // namespace snip
