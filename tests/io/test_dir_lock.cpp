// Tests for snip/io/dir_lock.h: one writer per folder, within a process and
// across processes, released when the holder goes away.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <string>

#include "snip/io/dir_lock.h"
#include "snip/core/error.h"
#include "tmpdir.h"

namespace snip::io {
namespace {

using testing::TmpDirTest;
using ::testing::HasSubstr;

class DirLockTest : public TmpDirTest {};

std::string lock_error(const std::string& dir) {
  try {
    DirLock second(dir, "run directory");
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST_F(DirLockTest, SecondHolderInTheSameProcessIsRefusedWithThePid) {
  const std::string run = at("run");
  auto first = std::make_unique<DirLock>(run, "run directory");
  std::ifstream in(run + "/.lock");
  std::string pid;
  in >> pid;
  EXPECT_EQ(pid, std::to_string(getpid()));
  const std::string m = lock_error(run);
  EXPECT_THAT(m, HasSubstr("run directory " + run + " is in use by process " + std::to_string(getpid())));
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  first.reset();                              // released on destruction
  EXPECT_EQ(lock_error(run), "(no error)");
}

TEST_F(DirLockTest, HeldByAnotherProcessUntilItExits) {
  const std::string run = at("run");
  int ready[2], go[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(go), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // holds the lock until told to exit
    DirLock l(run, "run directory");
    char c = 1;
    (void)!write(ready[1], &c, 1);
    (void)!read(go[0], &c, 1);
    _exit(0);
  }
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  EXPECT_THAT(lock_error(run), HasSubstr("in use by process " + std::to_string(child)));
  (void)!write(go[1], &c, 1);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_EQ(lock_error(run), "(no error)");  // the kernel released it with the process
}

}  // namespace
}  // namespace snip::io
