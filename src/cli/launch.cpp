// launch.cpp: `snip train --nproc-per-node N`, N local ranks without torchrun
// (docs/distributed.md "Without torchrun"). The launcher is a plain parent:
// it picks a free port on 127.0.0.1, starts N copies of this program with the
// same arguments (less --nproc-per-node) and torchrun's variables (RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), passes
// SIGINT/SIGTERM/SIGHUP on to every rank (they agree on the step at which they
// stop), and ends as the first rank that failed, or by the forwarded signal.
// The ranks talk to each other over c10d as under torchrun; the launcher
// only starts and waits.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "commands.h"
#include "snip/core/error.h"

extern char** environ;

namespace snip::cli {

namespace {

std::vector<std::string>& args_store() {
  static std::vector<std::string> a;
  return a;
}

volatile sig_atomic_t g_signal = 0;
void remember(int sig) { g_signal = sig; }

// A TCP port on 127.0.0.1 that is free now (the kernel's choice; the rank-0
// store binds it a moment later, a race no launcher avoids, torchrun's
// --standalone included).
int free_port() {
  const int s = socket(AF_INET, SOCK_STREAM, 0);
  if (s < 0) fail("--nproc-per-node: cannot open a socket: ", std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t n = sizeof a;
  const bool ok = bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  getsockname(s, reinterpret_cast<sockaddr*>(&a), &n) == 0;
  const int err = errno;
  close(s);
  if (!ok) fail("--nproc-per-node: cannot find a free port on 127.0.0.1: ", std::strerror(err));
  return ntohs(a.sin_port);
}

}  // namespace

void set_program_args(int argc, char** argv) {
  args_store().assign(argv, argv + argc);
}

const std::vector<std::string>& program_args() { return args_store(); }

int launch_local_ranks(int n, const std::vector<std::string>& args) {
  if (n < 2 || n > 256) fail("--nproc-per-node: expected 2 to 256 local ranks, got ", n);
  for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK"})
    if (std::getenv(v))
      fail("--nproc-per-node: this process is already a rank (", v, " is set: launched by torchrun?); give "
           "--nproc-per-node to torchrun, not to snip");
  const int port = free_port();
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::vector<char*> argv{const_cast<char*>(self.c_str())};
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);

  // Forward stop signals to every rank from the moment the first exists.
  struct sigaction sa {}, old_int {}, old_term {}, old_hup {};
  sa.sa_handler = remember;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  sigaction(SIGHUP, &sa, &old_hup);

  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
      const std::string kv(*e);
      const std::string k = kv.substr(0, kv.find('='));
      // The launcher's world, not one Slurm or an outer torchrun described.
      if (k == "MASTER_ADDR" || k == "MASTER_PORT" || k == "LOCAL_WORLD_SIZE" || k.rfind("SLURM_", 0) == 0 ||
          k.rfind("TORCHELASTIC_", 0) == 0 || k == "SNIP_LAUNCHER")
        continue;
      env.push_back(kv);
    }
    for (const std::string& kv :
         {"RANK=" + std::to_string(r), "WORLD_SIZE=" + std::to_string(n), "LOCAL_RANK=" + std::to_string(r),
          "LOCAL_WORLD_SIZE=" + std::to_string(n), std::string("MASTER_ADDR=127.0.0.1"),
          "MASTER_PORT=" + std::to_string(port), std::string("SNIP_LAUNCHER=nproc-per-node")})
      env.push_back(kv);
    std::vector<char*> envp;
    for (std::string& kv : env) envp.push_back(kv.data());
    envp.push_back(nullptr);
    pid_t pid = 0;
    const int rc = posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv.data(), envp.data());
    if (rc != 0) {
      for (pid_t p : pids) kill(p, SIGKILL);
      for (pid_t p : pids) waitpid(p, nullptr, 0);
      fail("--nproc-per-node: cannot start rank ", r, " (", self, "): ", std::strerror(rc));
    }
    pids.push_back(pid);
  }
  if (spdlog::should_log(spdlog::level::info)) {  // --quiet, --log-level: not this line either
    std::cerr << "snip: --nproc-per-node " << n << ": ranks 0-" << n - 1 << " started (pids";
    for (pid_t p : pids) std::cerr << " " << p;
    std::cerr << "), rendezvous at 127.0.0.1:" << port << "\n";
  }

  // Wait for all. A rank that fails (not stopped by a signal we forwarded)
  // leaves the others waiting in a collective until dist.timeout_s: stop them
  // (SIGTERM, then SIGKILL after 10 s). A checkpoint is a rename of a
  // complete folder, so neither leaves a half-written one.
  int first_status = 0, first_rank = -1;
  int forwarded = 0;
  size_t alive = pids.size();
  std::vector<bool> done(pids.size(), false);
  bool terminating = false;
  timespec term_at{};
  while (alive > 0) {
    if (g_signal && forwarded != g_signal) {
      forwarded = g_signal;
      for (size_t i = 0; i < pids.size(); ++i)
        if (!done[i]) kill(pids[i], forwarded);
    }
    int status = 0;
    const pid_t w = waitpid(-1, &status, WNOHANG);
    if (w > 0) {
      for (size_t i = 0; i < pids.size(); ++i) {
        if (pids[i] != w || done[i]) continue;
        done[i] = true;
        --alive;
        const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
        if (code != 0 && first_rank < 0) {
          first_rank = int(i);
          first_status = code;
          if (!forwarded && alive > 0) {
            std::cerr << "snip: --nproc-per-node: rank " << i << " ended with status " << code
                      << "; stopping the other ranks\n";
            for (size_t j = 0; j < pids.size(); ++j)
              if (!done[j]) kill(pids[j], SIGTERM);
            terminating = true;
            clock_gettime(CLOCK_MONOTONIC, &term_at);
          }
        }
      }
      continue;
    }
    if (w < 0 && errno != EINTR) break;
    if (terminating) {
      timespec now{};
      clock_gettime(CLOCK_MONOTONIC, &now);
      if (now.tv_sec - term_at.tv_sec >= 10) {
        for (size_t j = 0; j < pids.size(); ++j)
          if (!done[j]) kill(pids[j], SIGKILL);
        terminating = false;
      }
    }
    const timespec tick{0, 50'000'000};
    nanosleep(&tick, nullptr);
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  sigaction(SIGHUP, &old_hup, nullptr);
  if (forwarded) {  // asked to stop: end by the same signal, as a rank does
    signal(forwarded, SIG_DFL);
    raise(forwarded);
  }
  return first_status;
}

}  // namespace snip::cli
