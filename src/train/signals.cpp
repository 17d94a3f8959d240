// Signals and the stall watchdog of a run (session.h StopOnSignal,
// StallWatchdog).
#include <unistd.h>

#include <csignal>
#include <ctime>

#include "session.h"

namespace snip {

namespace {

// SIGINT/SIGTERM during training: the first one asks the
// loop to stop after the step in progress, with a checkpoint; a second one
// ends the process at once (the default action, re-raised) — unless it comes
// within kEchoWindowNs of the first: that is the same request arriving twice,
// not a person pressing Ctrl-C again. A terminal's Ctrl-C reaches every
// process of the foreground group, so a rank under torchrun (which forwards
// the signal it got to its workers) or under `snip train --nproc-per-node`
// gets it twice within milliseconds.
std::atomic<int> g_stop_signal{0};
std::atomic<int64_t> g_first_signal_ns{0};
constexpr int64_t kEchoWindowNs = 1'000'000'000;

}  // namespace

int64_t monotonic_ns() {  // async-signal-safe (clock_gettime)
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

namespace {

extern "C" void on_stop_signal(int sig) {
  const int64_t now = monotonic_ns();
  int64_t none = 0;
  if (!g_first_signal_ns.compare_exchange_strong(none, now)) {
    if (now - none < kEchoWindowNs) return;  // the same request, forwarded (`none` holds the first's time)
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  g_stop_signal = sig;
  static const char msg[] =
      "\nsnip: stopping after this step and writing a checkpoint (press Ctrl-C again to stop at once)\n";
  (void)!::write(STDERR_FILENO, msg, sizeof msg - 1);
}

constexpr int kSignals[2] = {SIGINT, SIGTERM};

}  // namespace

struct StopOnSignal::Saved {
  struct sigaction old[2] {};
};

// Installs on_stop_signal for SIGINT and SIGTERM while alive (a signal the
// process ignores on entry, e.g. under nohup, stays ignored), restoring the
// previous handlers after.
StopOnSignal::StopOnSignal() : old_(std::make_unique<Saved>()) {
  g_stop_signal = 0;
  g_first_signal_ns = 0;
  for (int i = 0; i < 2; ++i) {
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(kSignals[i], nullptr, &old_->old[i]);
    if (old_->old[i].sa_handler != SIG_IGN) sigaction(kSignals[i], &sa, nullptr);
  }
}

StopOnSignal::~StopOnSignal() {
  for (int i = 0; i < 2; ++i) sigaction(kSignals[i], &old_->old[i], nullptr);
}

int StopOnSignal::received() const { return g_stop_signal.load(); }

StallWatchdog::StallWatchdog(const TrainSession& s) {
  if (!s.guard->enabled() || s.rc.guard.stall_minutes <= 0) return;
  thread_ = std::thread([this, &s, minutes = s.rc.guard.stall_minutes] {
    const int64_t limit = int64_t(minutes * 60e9);
    int64_t warned_for = -1;
    while (!stop_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      const int64_t t = started_ns_.load();
      if (t > 0 && t != warned_for && monotonic_ns() - t > limit) {
        warned_for = t;
        spdlog::warn("guard: the step in progress has run for more than {} minutes (guard.stall_minutes): "
                     "stalled? (a rank waiting for another stops after dist.timeout_s)", minutes);
        if (s.exporter) s.exporter->set_guard_state(int(GuardState::kWarned));
      }
    }
  });
}

StallWatchdog::~StallWatchdog() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

}  // namespace snip
