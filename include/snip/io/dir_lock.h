// snip/io/dir_lock.h: one writer per folder.
#pragma once

#include <string>

namespace snip::io {

/// An exclusive advisory lock on DIR/.lock (flock(2), LOCK_EX | LOCK_NB), held
/// for the object's lifetime; the file holds the holder's PID in decimal. The
/// kernel releases it when the process exits or is killed, so no stale lock
/// survives a crash. Two locks on one folder conflict even inside one process.
class DirLock {
 public:
  /// Creates DIR if needed. Throws UserError "<what> <dir> is in use by
  /// process <pid> (...)" when another holder has it, or naming the OS error
  /// when DIR/.lock cannot be created.
  DirLock(const std::string& dir, const std::string& what);
  ~DirLock();
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace snip::io
