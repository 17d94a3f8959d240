// signal_cleanup.cpp: the watcher thread behind CleanupOnSignal (see
// snip/io/signal_cleanup.h for the behaviour and the reasons).
#include "snip/io/signal_cleanup.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>

namespace snip::io {

namespace {

namespace fs = std::filesystem;

struct Registry {
  std::mutex mu;
  uint64_t next_id = 1;
  std::map<uint64_t, std::pair<std::string, std::string>> dirs;  // id -> (dir, remove_if_empty)
};

// Never destroyed: the watcher may run while static destructors do.
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

void write_stderr(const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::write(STDERR_FILENO, s.data() + off, s.size() - off);
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

[[noreturn]] void watch(sigset_t set) {
  int sig = 0;
  while (::sigwait(&set, &sig) != 0) {
  }
  Registry& r = registry();
  // Held until the process ends: no guard is added or dropped meanwhile.
  r.mu.lock();
  std::string removed;
  for (const auto& [id, entry] : r.dirs) {
    std::error_code ec;
    if (fs::remove_all(entry.first, ec) > 0 && !ec) removed += (removed.empty() ? "" : ", ") + entry.first;
    if (!entry.second.empty() && fs::is_directory(entry.second, ec) && fs::is_empty(entry.second, ec))
      fs::remove(entry.second, ec);
  }
  const char* name = sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal";
  write_stderr(std::string("snip: interrupted by ") + name + (removed.empty() ? "" : ": removed " + removed) + "\n");
  // End the process by the same signal, default action.
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(sig, &dfl, nullptr);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, sig);
  ::pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
  ::raise(sig);
  ::_exit(128 + sig);  // not reached: the default action of SIGINT/SIGTERM ends the process
}

}  // namespace

void install_signal_cleanup() {
  static std::once_flag once;
  std::call_once(once, [] {
    sigset_t set;
    sigemptyset(&set);
    for (int sig : {SIGINT, SIGTERM}) {
      struct sigaction old;
      if (::sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;  // stays ignored
      sigaddset(&set, sig);
    }
    if (sigismember(&set, SIGINT) != 1 && sigismember(&set, SIGTERM) != 1) return;
    ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
    try {
      std::thread(watch, set).detach();
    } catch (const std::system_error&) {
      ::pthread_sigmask(SIG_UNBLOCK, &set, nullptr);  // no watcher: signals act as before
    }
  });
}

CleanupOnSignal::CleanupOnSignal(std::string dir, std::string remove_if_empty) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  id_ = r.next_id++;
  r.dirs.emplace(id_, std::make_pair(std::move(dir), std::move(remove_if_empty)));
}

CleanupOnSignal::~CleanupOnSignal() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.dirs.erase(id_);
}

}  // namespace snip::io
