// Atomic file writes and whole-file reads (see snip/io/atomic_file.h).
#include "snip/io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "snip/core/error.h"

namespace snip::io {
namespace {

namespace fs = std::filesystem;

std::string errno_text(int err) { return std::strerror(err); }

/// Directory that holds `path` ("." for a bare file name).
std::string parent_dir(const std::string& path) {
  fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

/// close(2) that retries nothing (POSIX leaves the fd state unspecified after
/// EINTR; Linux always releases it) and returns the errno or 0.
int close_fd(int fd) { return ::close(fd) == 0 ? 0 : errno; }

/// Creates `file`, writes one byte, closes and removes it: 0 when all of that
/// worked, else the first errno. Flags as AtomicFileWriter's temp file.
int probe_create(const std::string& file) {
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno;
  const char byte = 0;
  ssize_t n;
  do {
    n = ::write(fd, &byte, 1);
  } while (n < 0 && errno == EINTR);
  const int werr = n == 1 ? 0 : (n < 0 ? errno : EIO);
  const int cerr = close_fd(fd);
  ::unlink(file.c_str());
  return werr != 0 ? werr : cerr;
}

}  // namespace

// ---------------------------------------------------------------- writer ---

AtomicFileWriter::AtomicFileWriter(const std::string& path) : path_(path) {
  if (path.empty()) fail("cannot write file '': expected a non-empty path");
  tmp_ = str_cat(path, ".tmp.", static_cast<long>(::getpid()));
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    const int err = errno;
    fail("cannot write file ", path_, ": create temp file ", tmp_, ": ",
         errno_text(err));
  }
}

AtomicFileWriter::~AtomicFileWriter() {
  if (!done_) cleanup();
}

void AtomicFileWriter::cleanup() noexcept {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  ::unlink(tmp_.c_str());
  done_ = true;
}

void AtomicFileWriter::fail_and_cleanup(const char* step, int err) {
  cleanup();
  fail("cannot write file ", path_, ": ", step, ": ", errno_text(err));
}

void AtomicFileWriter::write(std::string_view bytes) {
  SNIP_CHECK(!done_ && fd_ >= 0, "write after commit or failure on ", path_);
  const char* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = ::write(fd_, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_and_cleanup("write", errno);
    }
    if (n == 0) fail_and_cleanup("write", EIO);
    p += n;
    left -= static_cast<size_t>(n);
  }
}

void AtomicFileWriter::commit() {
  SNIP_CHECK(!done_ && fd_ >= 0, "commit after commit or failure on ", path_);
  if (::fsync(fd_) != 0) fail_and_cleanup("fsync", errno);
  const int err = close_fd(fd_);
  fd_ = -1;
  if (err != 0) fail_and_cleanup("close", err);
  if (::rename(tmp_.c_str(), path_.c_str()) != 0)
    fail_and_cleanup("rename temp file into place", errno);
  done_ = true;  // the temp name no longer exists; nothing to clean up
  fsync_dir(parent_dir(path_));
}

// ------------------------------------------------------------- functions ---

void write_file_atomic(const std::string& path, std::string_view bytes) {
  AtomicFileWriter w(path);
  w.write(bytes);
  w.commit();
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    fail("cannot sync directory ", dir, ": ", errno_text(err));
  }
  int err = 0;
  if (::fsync(fd) != 0) err = errno;
  ::close(fd);
  if (err != 0 && err != EINVAL && err != ENOTSUP)
    fail("cannot sync directory ", dir, ": ", errno_text(err));
}

void rename_atomic(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    const int err = errno;
    fail("cannot rename ", from, " to ", to, ": ", errno_text(err));
  }
  const std::string to_dir = parent_dir(to);
  const std::string from_dir = parent_dir(from);
  fsync_dir(to_dir);
  std::error_code ec;
  if (!fs::equivalent(from_dir, to_dir, ec)) fsync_dir(from_dir);
}

std::string read_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    fail("cannot read file ", path, ": ", errno_text(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail("cannot read file ", path, ": ", errno_text(err));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    fail("cannot read file ", path, ": ", errno_text(EISDIR));
  }
  std::string out;
  if (st.st_size > 0) out.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      fail("cannot read file ", path, ": ", errno_text(err));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

void ensure_writable_dir(const std::string& dir) {
  if (dir.empty()) fail("run directory '' is not writable: empty path");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("run directory ", dir, " is not writable: ", ec.message());
  if (!fs::is_directory(dir, ec))
    fail("run directory ", dir, " is not writable: exists and is not a directory");
  const std::string probe =
      (fs::path(dir) / str_cat(".snip-write-probe.", static_cast<long>(::getpid())))
          .string();
  if (const int err = probe_create(probe))
    fail("run directory ", dir, " is not writable: ", errno_text(err));
}

void ensure_writable_file(const std::string& path, std::string_view what) {
  if (path.empty()) fail(what, ": expected a file path, got ''");
  const auto refuse = [&](const auto&... why) {
    fail(what, " ", path, " is not writable: ", why...);
  };
  std::error_code ec;
  if (fs::is_directory(path, ec)) refuse("it is a folder; expected a file path");
  const std::string dir = parent_dir(path);
  const fs::file_status st = fs::status(dir, ec);
  if (st.type() == fs::file_type::not_found) refuse("folder ", dir, " does not exist");
  if (ec) refuse("folder ", dir, ": ", ec.message());
  if (st.type() != fs::file_type::directory) refuse(dir, " is not a folder");
  // The very name and flags AtomicFileWriter will use for its temp file.
  if (const int err = probe_create(str_cat(path, ".tmp.", static_cast<long>(::getpid()))))
    refuse(errno_text(err));
}

}  // namespace snip::io
