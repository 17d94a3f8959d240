// Runs one of the built programs (snip, snip-data) as a user would, for the
// tests of a command's behaviour: the command-line programs are tested
// through their binaries, never by compiling src/cli sources into a test.
// LibTorch-free: the Torch-free test programs use it too.
#pragma once

#include <fcntl.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

extern char** environ;

namespace snip::test {

/// What one run of a program printed and how it ended.
struct Ran {
  std::string out;    ///< everything on stdout
  std::string err;    ///< everything on stderr
  std::string error;  ///< the message of its `snip: error: <message>` line ("" when none)
  int status = -1;    ///< exit status; 128 + N when killed by signal N
};

namespace detail {
inline std::string slurp_and_remove(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  ::unlink(path.c_str());
  return s.str();
}
}  // namespace detail

/// Runs `exe args...` (no shell) with stdin from /dev/null, waits for it and
/// returns its output. `error` is the message of its last line starting
/// `snip: error: `; a run that failed without one (an internal error, a
/// signal) gets "exit status N: <its last stderr line>", so an empty `error`
/// means status 0. Throws std::runtime_error when it cannot be started.
inline Ran run_program(const std::string& exe, const std::vector<std::string>& args) {
  char out_tmpl[] = "/tmp/snip_test_outXXXXXX";
  char err_tmpl[] = "/tmp/snip_test_errXXXXXX";
  const int out_fd = ::mkostemp(out_tmpl, O_CLOEXEC);
  if (out_fd < 0) throw std::runtime_error("run_program: cannot make a temporary file");
  const int err_fd = ::mkostemp(err_tmpl, O_CLOEXEC);
  if (err_fd < 0) {
    ::close(out_fd);
    ::unlink(out_tmpl);
    throw std::runtime_error("run_program: cannot make a temporary file");
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, out_fd, 1);  // dup2 clears close-on-exec on 1 and 2
  posix_spawn_file_actions_adddup2(&fa, err_fd, 2);
  std::vector<char*> argv{const_cast<char*>(exe.c_str())};
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, exe.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(out_fd);
  ::close(err_fd);
  Ran r;
  bool waited = false;
  if (rc == 0) {
    int ws = 0;
    pid_t w;
    while ((w = ::waitpid(pid, &ws, 0)) < 0 && errno == EINTR) {
    }
    waited = w == pid;
    if (waited) r.status = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
  }
  r.out = detail::slurp_and_remove(out_tmpl);
  r.err = detail::slurp_and_remove(err_tmpl);
  if (rc != 0) throw std::runtime_error("run_program: cannot start " + exe);
  if (!waited) throw std::runtime_error("run_program: cannot wait for " + exe);
  const std::string tag = "snip: error: ";
  std::istringstream lines(r.err);
  std::string last;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(tag, 0) == 0) r.error = line.substr(tag.size());
    if (!line.empty()) last = line;
  }
  if (r.status != 0 && r.error.empty()) r.error = "exit status " + std::to_string(r.status) + ": " + last;
  return r;
}

/// The same with the arguments as one string split at spaces (the tests'
/// paths hold none).
inline Ran run_program(const std::string& exe, const std::string& args) {
  std::vector<std::string> words;
  std::istringstream in(args);
  for (std::string w; in >> w;) words.push_back(w);
  return run_program(exe, words);
}

}  // namespace snip::test
