// Tests for snip/io/atomic_file.h: content, replacement, and that failures
// leave neither a temp file nor a damaged old file.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <fstream>
#include <string>

#include "snip/io/atomic_file.h"
#include "snip/core/error.h"
#include "tmpdir.h"

namespace snip::io {
namespace {

using testing::TmpDirTest;
using ::testing::HasSubstr;

/// Runs f, expects UserError, returns its message.
template <typename F>
std::string user_error(F&& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected snip::UserError";
  return "";
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class AtomicFile : public TmpDirTest {};

TEST_F(AtomicFile, WritesExactBytesIncludingNulAndReplaces) {
  const std::string p = at("a.bin");
  const std::string first("x\0y\n\xff", 5);
  write_file_atomic(p, first);
  EXPECT_EQ(slurp(p), first);
  EXPECT_EQ(read_file(p), first);
  write_file_atomic(p, "second");
  EXPECT_EQ(read_file(p), "second");
  write_file_atomic(p, "");
  EXPECT_EQ(read_file(p), "");
  EXPECT_EQ(entries(), std::vector<std::string>{"a.bin"});  // no temp left
}

TEST_F(AtomicFile, LargeWriteRoundTrips) {
  std::string big(3 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>((i * 2654435761u) >> 13);
  write_file_atomic(at("big"), big);
  EXPECT_EQ(read_file(at("big")), big);
}

TEST_F(AtomicFile, MissingDirectoryFailsNamingPath) {
  const std::string p = at("nodir/x.txt");
  const std::string msg = user_error([&] { write_file_atomic(p, "abc"); });
  EXPECT_THAT(msg, HasSubstr(p));
  EXPECT_THAT(msg, HasSubstr("No such file or directory"));
  EXPECT_TRUE(entries().empty());
}

TEST_F(AtomicFile, RenameFailureRemovesTempFile) {
  // The target is a non-empty directory: the temp file is written, rename(2)
  // fails, and the temp file must be gone afterwards.
  std::filesystem::create_directories(at("target/inner"));
  const std::string msg = user_error([&] { write_file_atomic(at("target"), "abc"); });
  EXPECT_THAT(msg, HasSubstr(at("target")));
  EXPECT_THAT(msg, HasSubstr("rename"));
  EXPECT_EQ(entries(), std::vector<std::string>{"target"});
  EXPECT_EQ(entries(at("target")), std::vector<std::string>{"inner"});
}

TEST_F(AtomicFile, WriteFailureKeepsOldFileAndRemovesTemp) {
  // A file-size limit makes write(2) fail with EFBIG half-way (works as root,
  // unlike permission bits).
  const std::string p = at("ckpt.bin");
  write_file_atomic(p, "old content");
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = old;
  lim.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
  std::string msg;
  try {
    write_file_atomic(p, std::string(1 << 16, 'n'));
  } catch (const UserError& e) {
    msg = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_THAT(msg, HasSubstr(p));
  EXPECT_THAT(msg, HasSubstr("File too large"));
  EXPECT_EQ(read_file(p), "old content");
  EXPECT_EQ(entries(), std::vector<std::string>{"ckpt.bin"});
}

TEST_F(AtomicFile, WriterWithoutCommitLeavesNothing) {
  const std::string p = at("w.bin");
  write_file_atomic(p, "keep");
  {
    AtomicFileWriter w(p);
    w.write("partial");
    EXPECT_TRUE(std::filesystem::exists(w.temp_path()));
    EXPECT_EQ(std::filesystem::path(w.temp_path()).parent_path(), dir_);
  }  // destroyed, e.g. by an exception half-way through a checkpoint
  EXPECT_EQ(read_file(p), "keep");
  EXPECT_EQ(entries(), std::vector<std::string>{"w.bin"});
  {
    AtomicFileWriter w(p);
    w.write("new ");
    w.write("content");
    w.commit();
  }
  EXPECT_EQ(read_file(p), "new content");
  EXPECT_EQ(entries(), std::vector<std::string>{"w.bin"});
}

TEST_F(AtomicFile, ReadFileErrors) {
  std::string msg = user_error([&] { read_file(at("missing")); });
  EXPECT_THAT(msg, HasSubstr(at("missing")));
  EXPECT_THAT(msg, HasSubstr("No such file"));
  msg = user_error([&] { read_file(dir_.string()); });
  EXPECT_THAT(msg, HasSubstr("directory"));
}

TEST_F(AtomicFile, RenameAtomic) {
  write_file_atomic(at("a"), "A");
  write_file_atomic(at("b"), "B");
  std::filesystem::create_directories(at("sub"));
  rename_atomic(at("a"), at("b"));
  EXPECT_EQ(read_file(at("b")), "A");
  EXPECT_FALSE(std::filesystem::exists(at("a")));
  rename_atomic(at("b"), at("sub/c"));  // across directories
  EXPECT_EQ(read_file(at("sub/c")), "A");
  const std::string msg = user_error([&] { rename_atomic(at("nope"), at("x")); });
  EXPECT_THAT(msg, HasSubstr(at("nope")));
  EXPECT_THAT(msg, HasSubstr(at("x")));
  fsync_dir(dir_.string());
  EXPECT_THAT(user_error([&] { fsync_dir(at("nope")); }), HasSubstr(at("nope")));
}

TEST_F(AtomicFile, EnsureWritableDir) {
  const std::string d = at("runs/r1/checkpoints");
  ensure_writable_dir(d);
  EXPECT_TRUE(std::filesystem::is_directory(d));
  EXPECT_TRUE(entries(d).empty());  // probe removed
  ensure_writable_dir(d);           // idempotent
  write_file_atomic(at("plain"), "f");
  std::string msg = user_error([&] { ensure_writable_dir(at("plain/sub")); });
  EXPECT_THAT(msg, HasSubstr("run directory " + at("plain/sub") + " is not writable: "));
  msg = user_error([&] { ensure_writable_dir(at("plain")); });
  EXPECT_THAT(msg, HasSubstr("is not writable"));
  EXPECT_THAT(msg, HasSubstr("ot a directory"));  // errno text or ours
}

TEST_F(AtomicFile, EnsureWritableFile) {
  ensure_writable_file(at("new.bin"), "--output");  // a new file in an existing folder
  write_file_atomic(at("old.bin"), "keep");
  ensure_writable_file(at("old.bin"), "--output");  // an existing file is replaced atomically
  EXPECT_EQ(read_file(at("old.bin")), "keep");      // ... but not touched by the check
  EXPECT_EQ(entries(), std::vector<std::string>{"old.bin"});  // probe removed
  const std::string prefix = "--output " + at("no/new.bin") + " is not writable: ";
  EXPECT_EQ(user_error([&] { ensure_writable_file(at("no/new.bin"), "--output"); }),
            prefix + "folder " + at("no") + " does not exist");
  EXPECT_FALSE(std::filesystem::exists(at("no")));  // no folder created
  EXPECT_THAT(user_error([&] { ensure_writable_file(at("old.bin/x"), "--out"); }),
              HasSubstr(at("old.bin") + " is not a folder"));
  EXPECT_THAT(user_error([&] { ensure_writable_file(dir_.string(), "--out"); }),
              HasSubstr("it is a folder"));
  EXPECT_THAT(user_error([&] { ensure_writable_file("", "--out"); }), HasSubstr("--out: expected"));
  EXPECT_EQ(entries(), std::vector<std::string>{"old.bin"});
}

}  // namespace
}  // namespace snip::io
