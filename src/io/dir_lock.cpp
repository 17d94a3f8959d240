// One writer per folder (see dir_lock.h).
#include "snip/io/dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "snip/core/error.h"

namespace snip::io {

DirLock::DirLock(const std::string& dir, const std::string& what) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::string path = (std::filesystem::path(dir) / ".lock").string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(what, " ", dir, ": cannot create ", path, ": ", std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {0};
    const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
    ::close(fd_);
    fd_ = -1;
    if (err == EWOULDBLOCK) {
      std::string pid = n > 0 ? std::string(buf, size_t(n)) : std::string("?");
      while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
      fail(what, " ", dir, " is in use by process ", pid, " (another snip writing to it; wait for it to end, "
           "or choose another folder)");
    }
    fail(what, " ", dir, ": cannot lock ", path, ": ", std::strerror(err));
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  // The PID only feeds a second writer's message: the lock holds without it.
  if (::ftruncate(fd_, 0) == 0) (void)!::pwrite(fd_, pid.data(), pid.size(), 0);
}

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

}  // namespace snip::io
