// `snip experiment` (the comparison of METHOD.md section 8: every policy on
// the same model, seed and data) and `snip correlate` (the correlation study,
// core/study.h).
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

#include "commands.h"
#include "snip/config/config.h"
#include "snip/quant/quantizers.h"
#include "snip/quant/recipe_file.h"
#include "snip/method/study.h"
#include "snip/io/atomic_file.h"
#include "snip/io/json.h"
#include "snip/report/report.h"
#include "snip/report/svg.h"
#include "snip/util/error.h"
#include "snip/util/statistics.h"

extern char** environ;

namespace snip::cli {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

/// One arm of the experiment: "<policy>" or "<policy>-<budget>" (e.g.
/// "snip-0.75", "uniform-fp4", "none"; an arm named "bf16", the unquantized
/// policy's name until 2026-12-01, keeps its name and runs policy none).
struct Arm {
  std::string name, policy;
  double budget = std::nan("");  // NaN = the config's
};

Arm parse_arm(const std::string& s) {
  Arm a{s, s};
  const auto dash = s.rfind('-');
  if (dash != std::string::npos && dash + 1 < s.size()) {
    const std::string tail = s.substr(dash + 1);
    char* end = nullptr;
    const double b = std::strtod(tail.c_str(), &end);
    if (end && *end == '\0' && (std::isdigit(static_cast<unsigned char>(tail[0])) || tail[0] == '.')) {
      if (!(b >= 0 && b <= 1)) fail("--arms: '", s, "': expected a budget in [0, 1] after the last '-'");
      a.policy = s.substr(0, dash);
      a.budget = b;
    }
  }
  if (a.policy.empty()) fail("--arms: empty arm name");
  if (a.policy == "bf16") a.policy = "none";
  return a;
}

const char* kDefaultArms =
    "none,uniform-fp8,uniform-fp4,snip-0.5,snip-0.75,min-rel-err-0.75,layer-type-0.75,first-last-fp8-0.75,"
    "random-0.75";

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

/// Seconds of a duration as `snip train`'s progress line prints it
/// (trainer.cpp's fmt_duration: "4m05s", or "1h07m" from an hour on); NaN
/// for "?" (no estimate yet) or any other text.
double parse_duration(const std::string& s) {
  long a = 0, b = 0;
  int n = 0;
  if (std::sscanf(s.c_str(), "%ldm%lds%n", &a, &b, &n) == 2 && size_t(n) == s.size()) return 60.0 * a + b;
  if (std::sscanf(s.c_str(), "%ldh%ldm%n", &a, &b, &n) == 2 && size_t(n) == s.size()) return 3600.0 * a + 60.0 * b;
  return std::nan("");
}

/// What one progress line of `snip train` says (trainer.cpp: "step N/M |
/// loss L | lr ... | gnorm ... | ... tok/s | ETA 4m05s[ | val V]").
struct TrainerProgress {
  int64_t step = 0, total = 0;   ///< steps done, train.max_steps
  double loss = std::nan("");    ///< this step's training loss (nats/token)
  double eta_s = std::nan("");   ///< the trainer's estimate of the rest of the run (seconds; NaN if "?")
};

/// The progress in one line of an arm's log, or nullopt when the line is
/// something else (a sample, a warning, the summary).
std::optional<TrainerProgress> parse_progress_line(const std::string& line) {
  TrainerProgress p;
  long step = 0, total = 0;
  if (std::sscanf(line.c_str(), "step %ld/%ld | loss %lf", &step, &total, &p.loss) != 3) return std::nullopt;
  p.step = step;
  p.total = total;
  const auto at = line.find("| ETA ");
  if (at != std::string::npos) {
    const size_t b = at + 6, e = line.find(' ', b);
    p.eta_s = parse_duration(line.substr(b, e == std::string::npos ? std::string::npos : e - b));
  }
  return p;
}

/// The lines a child appends to its log file, from a byte offset on (what
/// the file held before this arm started is skipped).
class LogFollower {
 public:
  LogFollower(std::string path, std::uintmax_t offset) : path_(std::move(path)), offset_(offset) {}
  /// Calls on_line(line) for every complete line appended since the last call.
  template <class F>
  void poll(F&& on_line) {
    std::ifstream in(path_, std::ios::binary);
    if (!in) return;
    in.seekg(std::streamoff(offset_));
    std::string chunk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    offset_ += chunk.size();
    partial_ += chunk;
    for (size_t nl; (nl = partial_.find('\n')) != std::string::npos;) {
      std::string line = partial_.substr(0, nl);
      partial_.erase(0, nl + 1);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      on_line(line);
    }
  }

 private:
  std::string path_, partial_;
  std::uintmax_t offset_;
};

std::string fmt_minutes(double s) { return fmt::format("{}m{:02d}s", int(s / 60), int(s) % 60); }

/// The console's line for the arm being trained: "[2/3] snip-0.75: step
/// 40/600 | loss 6.1234 | ETA arm 4m10s, experiment 12m30s", made from the
/// progress lines of the arm's own trainer (its step, loss and ETA; nothing
/// is recomputed here). The experiment's ETA adds to the arm's the arms
/// still to train, each estimated at the mean wall time of the arms trained
/// so far in this call, the current one counted at its elapsed time plus its
/// ETA. On a terminal the line is rewritten in place at every progress line
/// of the trainer (every train.log_interval steps and at evaluations);
/// otherwise one plain line at most every `interval_s` seconds, and always
/// the arm's last step.
class ArmProgress {
 public:
  using clock = std::chrono::steady_clock;
  ArmProgress(std::string prefix, bool tty, double interval_s, int64_t arms_after,
              const std::vector<double>& earlier_arm_seconds)
      : prefix_(std::move(prefix)), tty_(tty), interval_s_(interval_s), arms_after_(arms_after),
        earlier_(earlier_arm_seconds), start_(clock::now()) {}

  /// One line of the arm's log.
  void on_line(const std::string& line) {
    const auto p = parse_progress_line(line);
    if (!p) return;
    const double now = seconds_since(start_);
    if (!tty_ && p->step != p->total && shown_ && now - last_shown_ < interval_s_) return;
    double exp_eta = std::nan("");
    if (std::isfinite(p->eta_s)) {
      double sum = now + p->eta_s;
      for (double s : earlier_) sum += s;
      exp_eta = p->eta_s + double(arms_after_) * sum / double(earlier_.size() + 1);
    }
    auto eta = [](double s) { return std::isfinite(s) ? fmt_minutes(s + 0.5) : std::string("?"); };
    const std::string text = fmt::format("{}: step {}/{} | loss {:.4f} | ETA arm {}, experiment {}", prefix_,
                                         p->step, p->total, p->loss, eta(p->eta_s), eta(exp_eta));
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
  bool tty_;
  double interval_s_;
  int64_t arms_after_;
  const std::vector<double>& earlier_;
  clock::time_point start_;
  bool shown_ = false;
  double last_shown_ = 0;
};

struct ArmResult {
  Arm arm;
  bool done = false;
  double val = std::nan(""), gap_pct = std::nan(""), fp4_share = std::nan(""), seconds = std::nan(""),
         tokens_per_s = std::nan("");
  int64_t steps = 0;
  std::string gemm_dtype;  // summary.json "gemm_dtype": bf16 or fp32 ("" if absent)
  report::RunCurves curves;
  /// The policy as the table shows it: the unquantized policy with its GEMM
  /// dtype ("none (bf16 GEMMs)"), since "none" alone does not say what the
  /// baseline computed in.
  std::string policy_label() const {
    return arm.policy == "none" && !gemm_dtype.empty() ? "none (" + gemm_dtype + " GEMMs)" : arm.policy;
  }
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

/// Throws UserError when the arm's policy is not one snip knows.
void check_arm_policy(const Arm& arm) {
  const std::string& p = arm.policy;
  auto is_recipe = [&](const std::string& r) {
    try {
      return make_recipe_quantizer(r) != nullptr;
    } catch (const UserError&) {
      return false;
    }
  };
  const bool known = p == "none" || p == "snip" || p == "min-rel-err" || p == "layer-type" ||
                     p == "first-last-fp8" || p == "random" ||
                     (p.rfind("uniform-", 0) == 0 && is_recipe(p.substr(8)));
  if (!known)
    fail("--arms: '", arm.name, "': expected none (or bf16, its old name), uniform-<recipe>, snip, min-rel-err, layer-type, "
         "first-last-fp8 or random, optionally followed by -<budget>");
}

/// The arms of a comma-separated list (blanks around names ignored), each
/// checked; UserError for a bad or repeated name or an empty list.
std::vector<Arm> parse_arm_list(const std::string& list) {
  std::vector<Arm> arms;
  std::stringstream ss(list);
  std::set<std::string> seen;
  std::map<std::pair<std::string, std::string>, std::string> runs;  // (policy, budget) -> arm
  for (std::string t; std::getline(ss, t, ',');) {
    const auto b = t.find_first_not_of(" \t"), e = t.find_last_not_of(" \t");
    if (b == std::string::npos) continue;
    Arm arm = parse_arm(t.substr(b, e - b + 1));
    if (!seen.insert(arm.name).second) fail("--arms: '", arm.name, "' given twice");
    check_arm_policy(arm);
    // A budget the policy does not read would label a run with a number it never used.
    if (std::isfinite(arm.budget) && (arm.policy == "none" || arm.policy.rfind("uniform-", 0) == 0))
      fail("--arms: '", arm.name, "': policy ", arm.policy, " takes no budget (it plans nothing); write '",
           arm.policy, "'");
    const auto key = std::make_pair(arm.policy, std::isfinite(arm.budget) ? fmt::format("{}", arm.budget) : "");
    if (runs.count(key))
      fail("--arms: '", arm.name, "' and '", runs[key], "' are the same run (policy ", arm.policy,
           arm.policy == "none" ? "; bf16 is its old name" : "", "); keep one");
    runs[key] = arm.name;
    arms.push_back(arm);
  }
  if (arms.empty()) fail("--arms: expected at least one arm");
  return arms;
}

/// --no-train without --arms: the arms trained in OUT (its subfolders named
/// like an arm and holding a config.toml), those of the default list first
/// and in its order (so none is the reference when present; a "bf16" arm,
/// its old name, right after it), then the
/// others by name. UserError when OUT does not exist or holds none.
std::vector<Arm> arms_in(const fs::path& out) {
  if (!fs::is_directory(out)) fail("--out: ", out.string(), " does not exist (nothing trained yet)");
  std::set<std::string> found;
  for (const auto& e : fs::directory_iterator(out))
    if (e.is_directory() && fs::is_regular_file(e.path() / "config.toml")) found.insert(e.path().filename().string());
  std::vector<Arm> arms;
  auto take = [&](const std::string& name) {
    if (!found.count(name)) return;
    found.erase(name);
    try {
      Arm arm = parse_arm(name);
      check_arm_policy(arm);
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
/// there), and train.log_interval (only what is printed).
bool arm_may_differ(const std::string& key, const Arm& x, const Arm& y) {
  if (key == "train.log_interval" || key == "precision.policy" || key == "precision.budget") return true;
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

/// --no-train: each arm's own resolved configuration, OUT/<arm>/config.toml
/// (what `snip train` wrote for the arm and trained with), stands instead of
/// --config and --set. UserError naming the arm folder when it or its
/// config.toml is missing, when its precision.policy (or, for an arm named
/// <policy>-<budget>, precision.budget) is not the arm's name's, or when it
/// differs from the first arm (the reference) in an option no arm sets (the
/// model, the data, the steps, the schedule: arm_may_differ()).
void check_trained_arms(const std::vector<Arm>& arms, const fs::path& out) {
  std::vector<Config> cfgs;
  for (const Arm& arm : arms) {
    const fs::path dir = out / arm.name, file = dir / "config.toml";
    if (!fs::is_directory(dir))
      fail("--no-train: experiment arm '", arm.name, "': ", dir.string(), " does not exist; train it (snip "
           "experiment without --no-train) or leave it out of --arms");
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
    cfgs.push_back(std::move(c));
  }
  for (size_t i = 1; i < arms.size(); ++i)
    for (const OptionSpec& o : option_table()) {
      if (arm_may_differ(o.key, arms[i], arms[0])) continue;
      const OptionValue v = option_value(cfgs[i], o), ref = option_value(cfgs[0], o);
      if (!(v == ref))
        fail("--no-train: experiment arm '", arms[i].name, "' in ", (out / arms[i].name).string(),
             " was trained with ", o.key, " = ", format_option_value(v), " but arm '", arms[0].name, "' in ",
             (out / arms[0].name).string(), " with ", format_option_value(ref),
             ": not one experiment; tabulate them apart (--arms, --out), or delete that arm's folder to retrain it");
    }
}

}  // namespace

void add_experiment_commands(CLI::App& app) {
  struct ExpArgs {
    std::string config, out = "runs/experiment", arms = kDefaultArms;
    std::vector<std::string> sets;
    bool no_train = false;
    double progress_s = 15;
  };
  auto a = std::make_shared<ExpArgs>();
  CLI::App* ex = app.add_subcommand(
      "experiment",
      "train one model under several precision policies (same seed and data order) and compare them: "
      "table of final validation loss, gap to the unquantized arm (policy none), FP4 share, time, tokens/s, and a validation-loss chart");
  ex->add_option("--config,-c", a->config,
                 "TOML run configuration shared by every arm (e.g. configs/experiment.toml); required unless "
                 "--no-train");
  ex->add_option("--out", a->out, "experiment folder: one run per arm in OUT/<arm>/, results in OUT/results.*")
      ->capture_default_str();
  CLI::Option* arms_opt =
      ex->add_option("--arms", a->arms,
                     "comma-separated arms: <policy> or <policy>-<budget>, e.g. snip-0.75, uniform-fp4, none "
                     "(the first arm is the reference of the gap column; with --no-train the default is the "
                     "arms found in OUT)")
          ->capture_default_str();
  ex->add_option("--set", a->sets, "override one option of every arm: section.key=value (repeatable)");
  ex->add_flag("--no-train", a->no_train,
               "only tabulate the arms already trained in OUT, each with its own OUT/<arm>/config.toml "
               "(--config and --set are not needed)");
  ex->add_option("--progress-interval", a->progress_s,
                 "seconds between two progress lines of an arm when stderr is not a terminal (the arm's last "
                 "step is always shown; on a terminal the line is rewritten at each of the trainer's)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e9));
  ex->callback([a, arms_opt] {
    const fs::path out(a->out);
    std::vector<Arm> arms;
    if (a->no_train) {
      // Re-tabulate: each arm's own config.toml, no --config or --set needed;
      // recipes from a recipe file as each arm trained with them (its recipes.json).
      if (fs::is_directory(out))
        for (const auto& e : fs::directory_iterator(out))
          if (fs::is_regular_file(e.path() / "recipes.json"))
            quant::register_recipe_copy((e.path() / "recipes.json").string());
      arms = arms_opt->count() > 0 ? parse_arm_list(a->arms) : arms_in(out);
      check_trained_arms(arms, out);
      if (!a->config.empty() || !a->sets.empty())
        spdlog::info("--no-train: each arm's own {} is used; --config and --set are not read",
                     (out / "<arm>" / "config.toml").string());
    } else {
      if (a->config.empty())
        fail("--config FILE is required (only --no-train, which reads each arm's ", (out / "<arm>").string(),
             "/config.toml, goes without it)");
      {  // precision.recipe_file first: an arm's policy may name one of its recipes
        Config c;
        c.load_toml_file(a->config);
        for (const auto& s : a->sets) c.set_override(s);
        quant::register_recipe_file(c.get_string("precision.recipe_file"));
      }
      arms = parse_arm_list(a->arms);
    }
    // Validate everything up front: the config, every arm's policy/budget.
    Config base;
    if (!a->no_train) {
      base.load_toml_file(a->config);
      for (const auto& s : a->sets) base.set_override(s);
      base.validate();
      for (const auto& st : a->sets) {
        const std::string key = st.substr(0, st.find('='));
        if (key == "precision.policy" || key == "precision.budget" || key == "precision.recipe")
          fail("--set ", st, ": ", key, " is set by each arm (--arms policy-budget); remove it");
      }
    }
    // An arm already in OUT must have been trained with the configuration
    // asked for now; otherwise its numbers would silently answer another question.
    for (const Arm& arm : arms) {
      if (a->no_train) break;  // check_trained_arms did it, from the arms' own files
      const fs::path saved = out / arm.name / "config.toml";
      if (!fs::exists(saved)) continue;
      Config want = base, have;
      want.set("precision.policy", arm.policy, "--arms");
      if (std::isfinite(arm.budget)) want.set("precision.budget", arm.budget, "--arms");
      have.load_toml_file(saved.string());
      for (const auto& [key, v] : want.values()) {
        // For the unquantized arm the other precision options change nothing.
        if (arm.policy == "none" && key.rfind("precision.", 0) == 0 && key != "precision.policy" &&
            key != "precision.recipe")
          continue;
        if (key == "train.log_interval") continue;  // only what is printed
        const auto it = have.values().find(key);
        if (it == have.values().end() || !(it->second == v))
          fail("experiment arm '", arm.name, "' in ", (out / arm.name).string(), " was trained with ", key, " = ",
               it == have.values().end() ? std::string("(unset)") : format_option_value(it->second),
               ", the configuration now says ", format_option_value(v),
               "; use another --out, or delete that folder to retrain the arm");
      }
    }
    if (!a->no_train) io::ensure_writable_dir(a->out);
    const auto t0 = std::chrono::steady_clock::now();
    const bool tty = isatty(STDERR_FILENO);
    std::vector<double> arm_seconds;  // wall time of each arm trained afresh in this call (the ETA's estimate)
    for (size_t i = 0; i < arms.size() && !a->no_train; ++i) {
      const Arm& arm = arms[i];
      const fs::path dir = out / arm.name;
      const std::string log = (out / (arm.name + ".log")).string();
      if (fs::exists(dir / "summary.json")) {
        std::cerr << fmt::format("[{}/{}] {}: already trained ({})\n", i + 1, arms.size(), arm.name, dir.string());
        continue;
      }
      std::vector<std::string> args{"train", "--run-dir", dir.string()};
      if (fs::exists(dir) && !fs::exists(dir / "checkpoints")) {
        // Stopped before its first checkpoint (killed, diverged): nothing to resume.
        std::cerr << fmt::format("[{}/{}] {}: {} holds no checkpoint (stopped early); training it afresh\n", i + 1,
                                 arms.size(), arm.name, dir.string());
        fs::remove_all(dir);
      }
      const bool resume = fs::exists(dir / "checkpoints");
      if (resume) {
        args.push_back("--resume");
      } else {
        args.insert(args.end(), {"--config", a->config});
        for (const auto& s : a->sets) args.insert(args.end(), {"--set", s});
        args.insert(args.end(), {"--set", "precision.policy=" + arm.policy});
        if (std::isfinite(arm.budget)) args.insert(args.end(), {"--set", fmt::format("precision.budget={}", arm.budget)});
      }
      std::cerr << fmt::format("[{}/{}] {}: {} (log: {})\n", i + 1, arms.size(), arm.name,
                               resume ? "resuming" : "training", log);
      int64_t arms_after = 0;  // still to train after this one
      for (size_t j = i + 1; j < arms.size(); ++j) arms_after += !fs::exists(out / arms[j].name / "summary.json");
      // The arm's progress, from the progress lines its trainer appends to the log.
      LogFollower follow(log, fs::exists(log) ? fs::file_size(log) : 0);
      ArmProgress progress(fmt::format("[{}/{}] {}", i + 1, arms.size(), arm.name), tty, a->progress_s, arms_after,
                           arm_seconds);
      const auto ts = std::chrono::steady_clock::now();
      const int rc = run_self(args, log, [&] { follow.poll([&](const std::string& l) { progress.on_line(l); }); });
      progress.finish();
      const double arm_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - ts).count();
      if (rc != 0) {
        std::string last;
        std::ifstream in(log);
        for (std::string line; std::getline(in, line);)
          if (!line.empty()) last = line;
        fail("experiment arm '", arm.name, "' failed (exit ", rc, "): ", last, " (see ", log, ")");
      }
      if (!resume) arm_seconds.push_back(arm_s);
      const ArmResult r = collect(arm, dir);
      std::cerr << fmt::format("[{}/{}] {}: val {:.4f} in {} (experiment so far {})\n", i + 1, arms.size(),
                               arm.name, r.val, fmt_minutes(arm_s),
                               fmt_minutes(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()));
    }

    // The table.
    std::vector<ArmResult> res;
    for (const Arm& arm : arms) res.push_back(collect(arm, out / arm.name));
    const double ref = res.front().val;
    for (auto& r : res)
      if (r.done && std::isfinite(ref) && ref != 0) r.gap_pct = 100.0 * (r.val - ref) / ref;
    std::ostringstream md;
    md << "| arm | policy | budget | final val loss | gap to " << res.front().arm.name
       << (res.front().arm.policy == "none" && !res.front().gemm_dtype.empty() ? " (" + res.front().gemm_dtype + " GEMMs)" : "")
       << " | FP4 FLOPs share | wall time | tokens/s |\n|---|---|---|---|---|---|---|---|\n";
    json jr = json::array();
    std::ostringstream csv;
    csv << "arm,policy,gemm_dtype,budget,final_val_loss,gap_pct,fp4_share,seconds,tokens_per_s,steps\n";
    for (const auto& r : res) {
      md << "| " << r.arm.name << " | " << r.policy_label() << " | " << cell(r.arm.budget, "{:.2f}") << " | "
         << (r.done ? cell(r.val, "{:.4f}") : "not trained") << " | " << cell(r.gap_pct, "{:+.2f}%") << " | "
         << cell(r.fp4_share, "{:.3f}") << " | " << (std::isfinite(r.seconds) ? fmt_minutes(r.seconds) : "-")
         << " | " << cell(r.tokens_per_s, "{:.0f}") << " |\n";
      auto num = [](double v) { return std::isfinite(v) ? json(v) : json(nullptr); };
      jr.push_back({{"arm", r.arm.name}, {"policy", r.arm.policy}, {"gemm_dtype", r.gemm_dtype},
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
    report::LineChartOptions lo;
    lo.id = "val_loss";
    lo.title = "Validation loss per arm";
    lo.x_label = "step";
    lo.y_label = "validation loss (nats/token)";
    lo.width = 900;
    lo.height = 460;
    // Zoom on the part where the arms differ: from the first evaluation after 20% of the run.
    for (const auto& s : series)
      for (size_t k = 0; k < s.x.size(); ++k)
        if (s.x[k] >= 0.2 * s.x.back() && std::isfinite(s.y[k]))
          lo.y_max = std::isfinite(lo.y_max) ? std::max(lo.y_max, s.y[k]) : s.y[k];
    if (!fs::exists(out)) fail("--out: ", out.string(), " does not exist (nothing trained yet)");
    io::write_file_atomic((out / "results.md").string(), md.str());
    io::write_file_atomic((out / "results.json").string(), jr.dump(2) + "\n");
    io::write_file_atomic((out / "results.csv").string(), csv.str());
    io::write_file_atomic((out / "val_loss.svg").string(), report::svg_line_chart(series, lo) + "\n");
    std::cout << md.str() << "\nwritten: " << (out / "results.md").string() << ", results.json, results.csv, "
              << "val_loss.svg\n";
  });

  struct CorrArgs {
    std::string run, out, option = "fp4", layers, replot, predictor = "q";
    int64_t step = -1, steps = 20, eval_batches = -1;
  };
  auto c = std::make_shared<CorrArgs>();
  CLI::App* co = app.add_subcommand(
      "correlate",
      "correlation study (METHOD.md section 8): from one checkpoint, quantize one layer at a time for K steps and "
      "correlate the measured loss change with the stats step's predicted Q");
  co->add_option("--run", c->run, "a run of `snip train` (its config, data and checkpoints)");
  co->add_option("--step", c->step, "checkpoint step (default: the newest)");
  co->add_option("--steps", c->steps, "K: training steps per arm")->capture_default_str();
  co->add_option("--option", c->option, "option the studied layer runs")->capture_default_str();
  co->add_option("--layers", c->layers, "comma-separated glob patterns of layers to study (default: all)");
  co->add_option("--eval-batches", c->eval_batches, "validation micro-batches (default: the run's)");
  co->add_option("--out", c->out, "results folder (default: RUN/correlation, or the --replot file's folder)");
  co->add_option("--replot", c->replot, "no training: re-plot a correlation.json with another --predictor");
  co->add_option("--predictor", c->predictor,
                 "what the scatter plot puts on x: q, ld, wd, wd_own, rel_err_fprop, ld[drop], q[drop,a=0.5], ...")
      ->capture_default_str();
  co->callback([c] {
    CorrelationResult r;
    std::string out_dir = c->out;
    if (!c->replot.empty()) {
      if (!c->run.empty()) fail("--replot and --run: give one of them");
      const json j = io::read_json_file(c->replot, "correlation study");
      r = correlation_from_json(j, c->replot);
      if (out_dir.empty()) out_dir = fs::path(c->replot).parent_path().string();
      if (out_dir.empty()) out_dir = ".";
    } else {
      if (c->run.empty()) fail("--run RUN is required (or --replot correlation.json)");
      CorrelationOptions o;
      o.run_dir = c->run;
      o.step = c->step;
      o.steps = c->steps;
      o.option = c->option;
      o.eval_batches = c->eval_batches;
      o.out_dir = out_dir.empty() ? (fs::path(c->run) / "correlation").string() : out_dir;
      out_dir = o.out_dir;
      std::stringstream ss(c->layers);
      for (std::string t; std::getline(ss, t, ',');)
        if (!t.empty()) o.layers.push_back(t);
      r = correlation_study(o);
    }
    const std::vector<double> x = predictor_values(r, c->predictor);  // UserError for an unknown name
    std::vector<double> dv;
    std::vector<report::ScatterPoint> pts;
    for (size_t i = 0; i < r.layers.size(); ++i) {
      std::string shortname = r.layers[i].name;
      if (shortname.rfind("model.layers.", 0) == 0) shortname = shortname.substr(13);
      pts.push_back({x[i], r.layers[i].delta_val, shortname, ""});
      dv.push_back(r.layers[i].delta_val);
    }
    report::ScatterOptions so;
    so.id = "correlation";
    so.title = fmt::format("{} vs measured loss change", c->predictor);
    so.subtitle = fmt::format("{} layers, {} alone for {} steps from step {}: Pearson {:.3f}, Spearman {:.3f}",
                              r.layers.size(), r.option, r.steps, r.step, pearson(x, dv),
                              spearman(x, dv));
    so.x_label = "predicted " + c->predictor + " (stats step)";
    so.y_label = "measured delta val loss (nats/token)";
    so.show_labels = r.layers.size() <= 40;
    std::string file = c->predictor == "q" ? "scatter.svg" : "scatter-" + c->predictor + ".svg";
    for (char& ch : file)
      if (ch == '[' || ch == ']' || ch == ',' || ch == '=') ch = '_';
    io::ensure_writable_dir(out_dir);
    const std::string svg_path = (fs::path(out_dir) / file).string();
    io::write_file_atomic(svg_path, report::svg_scatter(pts, so) + "\n");
    std::cout << fmt::format("{:<44} {:>10} {:>10} {:>10} {:>12}\n", "layer", "Q", "LD", "WD", "dval");
    for (const auto& l : r.layers)
      std::cout << fmt::format("{:<44} {:>10.4g} {:>10.4g} {:>10.4g} {:>+12.5f}\n", l.name, l.q, l.ld, l.wd,
                               l.delta_val);
    std::cout << fmt::format("\nbaseline (unquantized) val {:.5f} after {} steps from step {}\n", r.base_val_loss, r.steps,
                             r.step);
    std::cout << "predictor vs measured dval:      Pearson   Spearman\n";
    if (r.correlations.empty())  // --replot: the chosen predictor only
      r.correlations[c->predictor] = {{"pearson", pearson(x, dv)}, {"spearman", spearman(x, dv)}};
    for (const auto& [k, m] : r.correlations)
      if (k.find("/train") == std::string::npos)
        std::cout << fmt::format("  {:<28} {:>9.3f} {:>10.3f}\n", k, m.at("pearson"), m.at("spearman"));
    std::cout << fmt::format("\nwritten: {}", svg_path);
    if (c->replot.empty()) std::cout << fmt::format(", {}/correlation.json, correlation.csv ({:.0f} s)", out_dir, r.seconds);
    std::cout << "\n";
  });
}

}  // namespace snip::cli
