// io/signal_cleanup.h in a forked child: SIGTERM/SIGINT remove the registered
// folders, print one line, and end the child by the same signal; folders no
// longer guarded stay; a signal ignored on entry stays ignored.
#include <gtest/gtest.h>

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "snip/io/signal_cleanup.h"

namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/snip_signal_test_XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

struct Child {
  pid_t pid = -1;
  int err_fd = -1;  // the child's stderr
};

// Forks a child that ignores SIGINT first when `ignore_int`, installs the
// watcher, creates `out/stage/file`, guards `out/stage` (removing `out` when
// empty), drops a guard of `kept` at once, says "ready" and waits.
Child start_child(const fs::path& out, const fs::path& kept, bool ignore_int) {
  int ready[2], err[2];
  if (::pipe(ready) != 0 || ::pipe(err) != 0) ADD_FAILURE() << "pipe";
  Child c;
  c.pid = ::fork();
  if (c.pid == 0) {
    ::dup2(err[1], STDERR_FILENO);
    if (ignore_int) ::signal(SIGINT, SIG_IGN);
    snip::io::install_signal_cleanup();
    fs::create_directories(out / "stage");
    std::ofstream(out / "stage" / "file") << "partial";
    fs::create_directories(kept);
    { snip::io::CleanupOnSignal dropped(kept.string()); }
    snip::io::CleanupOnSignal guard((out / "stage").string(), out.string());
    if (::write(ready[1], "r", 1) != 1) ::_exit(90);
    for (;;) ::pause();
  }
  ::close(ready[1]);
  ::close(err[1]);
  char b = 0;
  EXPECT_EQ(::read(ready[0], &b, 1), 1) << "child did not get ready";
  ::close(ready[0]);
  c.err_fd = err[0];
  return c;
}

std::string read_all(int fd) {
  std::string s;
  char buf[256];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) s.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return s;
}

}  // namespace

TEST(SignalCleanup, SigtermRemovesGuardedFoldersAndEndsBySigterm) {
  for (int sig : {SIGTERM, SIGINT}) {
    TempDir t;
    const fs::path out = t.path / "out", kept = t.path / "kept";
    Child c = start_child(out, kept, /*ignore_int=*/false);
    ASSERT_TRUE(fs::exists(out / "stage" / "file"));
    ::kill(c.pid, sig);
    int status = 0;
    ASSERT_EQ(::waitpid(c.pid, &status, 0), c.pid);
    EXPECT_TRUE(WIFSIGNALED(status)) << "status " << status;
    EXPECT_EQ(WTERMSIG(status), sig);  // a shell shows 128 + sig
    EXPECT_FALSE(fs::exists(out / "stage"));
    EXPECT_FALSE(fs::exists(out)) << "the parent folder was left empty, so it goes too";
    EXPECT_TRUE(fs::exists(kept)) << "no longer guarded";
    EXPECT_EQ(read_all(c.err_fd), std::string("snip: interrupted by ") + (sig == SIGINT ? "SIGINT" : "SIGTERM") +
                                      ": removed " + (out / "stage").string() + "\n");
  }
}

TEST(SignalCleanup, IgnoredSigintStaysIgnored) {
  TempDir t;
  const fs::path out = t.path / "out";
  Child c = start_child(out, t.path / "kept", /*ignore_int=*/true);
  ::kill(c.pid, SIGINT);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  int status = 0;
  EXPECT_EQ(::waitpid(c.pid, &status, WNOHANG), 0) << "SIGINT was ignored on entry and must stay so";
  EXPECT_TRUE(fs::exists(out / "stage" / "file"));
  ::kill(c.pid, SIGTERM);
  ASSERT_EQ(::waitpid(c.pid, &status, 0), c.pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << "status " << status;
  EXPECT_FALSE(fs::exists(out));
  read_all(c.err_fd);
}
