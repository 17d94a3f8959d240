// snip/io/atomic_file.h: crash-safe file writes (write, fsync, rename, fsync
// the directory), whole-file reads and the writability probes (run
// directory, output file).
//
// Every file snip writes for later use (checkpoints, plans, stats, configs)
// goes through here, so a killed run never leaves a torn file: readers see
// either the old complete file or the new complete file (POSIX rename(2) is
// atomic within one file system; the fsyncs make the result durable).
//
// Temporary files are named `<path>.tmp.<pid>` and live in the target's own
// directory (a rename across file systems would not be atomic). On any
// failure the temporary file is removed and the previous file at `path`, if
// any, is left untouched.
//
// Plain C++17 + POSIX; no LibTorch.
#pragma once

#include <string>
#include <string_view>

namespace snip::io {

/// Writes `bytes` to `path` atomically: writes `path.tmp.<pid>` in the same
/// directory, fsyncs it, renames it over `path`, fsyncs the directory.
/// Throws UserError "cannot write file <path>: <step>: <errno text>" on any
/// failure (missing or unwritable directory, disk full, file-size limit,
/// `path` naming a directory, ...); the temp file is removed and an existing
/// file at `path` stays intact.
void write_file_atomic(const std::string& path, std::string_view bytes);

/// fsyncs directory `dir` so that entries created or renamed in it are
/// durable. Throws UserError "cannot sync directory <dir>: <errno text>".
/// File systems that do not support fsync on directories (EINVAL, ENOTSUP)
/// are accepted silently.
void fsync_dir(const std::string& dir);

/// rename(2) `from` to `to` (atomic replacement of `to`), then fsyncs the
/// parent directory of `to` (and of `from` when it differs). Throws
/// UserError "cannot rename <from> to <to>: <errno text>".
void rename_atomic(const std::string& from, const std::string& to);

/// Returns the whole content of `path` as bytes. Throws UserError
/// "cannot read file <path>: <errno text>" if it is missing, is a directory
/// or cannot be read.
std::string read_file(const std::string& path);

/// Creates `dir` (and its parents) if needed and proves it is writable by
/// creating and removing a probe file in it. Throws UserError
/// "run directory <dir> is not writable: <reason>".
void ensure_writable_dir(const std::string& dir);

/// Proves, before any work is done, that write_file_atomic(path, ...) could
/// create `path` now, without creating folders or leaving files behind:
/// `path` is not a folder, its folder exists, and the writer's own temp file
/// `path.tmp.<pid>` can be created and written there (then it is removed).
/// For commands that compute a single output file and should refuse an
/// unwritable one before printing anything. Throws UserError
/// "<what> <path> is not writable: <reason>" (`what` names the option, e.g.
/// "--output"; reason e.g. "folder /x does not exist", "Permission denied").
void ensure_writable_file(const std::string& path, std::string_view what);

/// Streaming form of write_file_atomic for large files (checkpoints): the
/// constructor creates `path.tmp.<pid>`, write() appends, commit() fsyncs,
/// renames over `path` and fsyncs the directory. Destroying the writer
/// without a successful commit() removes the temp file, so an exception
/// thrown half-way through never leaves a partial file behind. All errors are
/// UserError naming `path`, the failing step and the errno text.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(const std::string& path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  /// Appends `bytes` (loops over partial writes and EINTR).
  void write(std::string_view bytes);
  /// fsync + close + rename + fsync(dir). The writer is finished afterwards.
  void commit();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return tmp_; }

 private:
  [[noreturn]] void fail_and_cleanup(const char* step, int err);
  void cleanup() noexcept;

  std::string path_;
  std::string tmp_;
  int fd_ = -1;
  bool done_ = false;
};

}  // namespace snip::io
