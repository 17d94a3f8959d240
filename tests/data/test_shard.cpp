// Token shard format: header bytes checked by hand against the layout in
// shard.h, both widths, and every rejection path of the reader.
#include <gtest/gtest.h>

#include <filesystem>

#include "snip/data/shard.h"
#include "test_util.h"

namespace snip::data {
namespace {

using testing::read_bytes;
using testing::TempDir;
using testing::user_error_of;
using testing::write_text;

std::string bytes(std::initializer_list<int> v) {
  std::string s;
  for (int b : v) s += static_cast<char>(b);
  return s;
}

TEST(Shard, Uint16HeaderAndPayloadBytes) {
  TempDir d;
  {
    ShardWriter w(d / "s.bin", 65536);
    EXPECT_EQ(w.dtype(), ShardDtype::kUint16);
    w.append({0, 1, 2});
    w.append({65535});
    EXPECT_EQ(w.count(), 4u);
    w.commit();
  }
  const std::string f = read_bytes(d / "s.bin");
  ASSERT_EQ(f.size(), 64u + 4 * 2);
  EXPECT_EQ(f.substr(0, 8), std::string("SNIPTOK\0", 8));
  EXPECT_EQ(f.substr(8, 4), bytes({1, 0, 0, 0}));                 // version 1
  EXPECT_EQ(f.substr(12, 4), bytes({1, 0, 0, 0}));                // dtype uint16
  EXPECT_EQ(f.substr(16, 8), bytes({4, 0, 0, 0, 0, 0, 0, 0}));    // count 4
  EXPECT_EQ(f.substr(24, 4), bytes({0, 0, 1, 0}));                // vocab 65536 = 0x00010000
  EXPECT_EQ(f.substr(28, 36), std::string(36, '\0'));             // reserved
  EXPECT_EQ(f.substr(64), bytes({0, 0, 1, 0, 2, 0, 0xff, 0xff}));  // little-endian tokens

  const ShardReader r(d / "s.bin");
  EXPECT_EQ(r.size(), 4u);
  EXPECT_EQ(r.vocab_size(), 65536u);
  EXPECT_EQ(r.dtype(), ShardDtype::kUint16);
  EXPECT_EQ(r[0], 0u);
  EXPECT_EQ(r[3], 65535u);
  std::vector<int32_t> out(3);
  r.read(1, 3, out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{1, 2, 65535}));
  EXPECT_EQ(r.find_out_of_range(), 4u);
}

TEST(Shard, Uint32ForLargeVocab) {
  TempDir d;
  ShardWriter w(d / "s.bin", 100000);
  EXPECT_EQ(w.dtype(), ShardDtype::kUint32);
  EXPECT_EQ(ShardWriter(d / "t.bin", 65537).dtype(), ShardDtype::kUint32);
  w.append({65536, 7, 0x10203});
  w.commit();
  const std::string f = read_bytes(d / "s.bin");
  ASSERT_EQ(f.size(), 64u + 3 * 4);
  EXPECT_EQ(f.substr(12, 4), bytes({2, 0, 0, 0}));
  EXPECT_EQ(f.substr(24, 4), bytes({0xa0, 0x86, 1, 0}));  // 100000 = 0x000186A0
  EXPECT_EQ(f.substr(64), bytes({0, 0, 1, 0, 7, 0, 0, 0, 3, 2, 1, 0}));
  const ShardReader r(d / "s.bin");
  EXPECT_EQ(r[0], 65536u);
  EXPECT_EQ(r[2], 0x10203u);
}

TEST(Shard, LargeAppendSpanningFlushes) {
  TempDir d;
  const int n = 1'500'000;  // > 1 MiB of uint16: exercises the buffered path
  std::vector<int32_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = static_cast<int32_t>((int64_t{i} * 7919) % 50000);
  ShardWriter w(d / "s.bin", 50000);
  w.append(v.data(), 1000);
  w.append(v.data() + 1000, n - 1000);
  w.commit();
  const ShardReader r(d / "s.bin");
  ASSERT_EQ(r.size(), static_cast<uint64_t>(n));
  std::vector<int32_t> back(n);
  r.read(0, n, back.data());
  EXPECT_EQ(back, v);
}

TEST(Shard, EmptyShard) {
  TempDir d;
  ShardWriter w(d / "e.bin", 10);
  w.commit();
  EXPECT_EQ(std::filesystem::file_size(d / "e.bin"), 64u);
  EXPECT_EQ(ShardReader(d / "e.bin").size(), 0u);
}

TEST(Shard, WriterWithoutCommitLeavesNothing) {
  TempDir d;
  {
    ShardWriter w(d / "s.bin", 100);
    w.append({1, 2, 3});
    const std::string msg = user_error_of([&] { w.append({4, 100}); });
    EXPECT_NE(msg.find("token id 100 out of range [0, 100)"), std::string::npos) << msg;
    EXPECT_EQ(w.count(), 3u);
  }
  EXPECT_TRUE(std::filesystem::is_empty(d.path()));
}

TEST(Shard, ReaderRejectsBadFiles) {
  TempDir d;
  {
    ShardWriter w(d / "good.bin", 1000);
    w.append({1, 2, 3, 4});
    w.commit();
  }
  const std::string good = read_bytes(d / "good.bin");
  auto expect_error = [&](const std::string& name, const std::string& content, const std::string& what) {
    write_text(d / name, content);
    const std::string msg = user_error_of([&] { ShardReader r(d / name); });
    EXPECT_NE(msg.find("token shard " + (d / name)), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
  };
  std::string bad = good;
  bad[0] = 'X';
  expect_error("magic.bin", bad, "bad magic");
  expect_error("trunc.bin", good.substr(0, good.size() - 1), "truncated: file is 71 bytes, header promises 4 uint16");
  expect_error("trail.bin", good + "xx", "trailing bytes");
  expect_error("short.bin", good.substr(0, 40), "smaller than the 64-byte header");
  bad = good;
  bad[8] = 2;
  expect_error("version.bin", bad, "unsupported version 2");
  bad = good;
  bad[12] = 3;
  expect_error("dtype.bin", bad, "unknown dtype code 3");
  bad = good;
  bad[24] = bad[25] = bad[26] = bad[27] = 0;
  expect_error("vocab0.bin", bad, "vocab_size is 0");
  for (size_t i : {size_t{28}, size_t{45}, size_t{63}}) {  // every reserved byte must be 0
    bad = good;
    bad[i] = 1;
    expect_error("reserved" + std::to_string(i) + ".bin", bad,
                 "reserved header byte " + std::to_string(i) + " is 1, expected 0");
  }
  bad = good;
  bad[16] = static_cast<char>(0xff);  // count 255
  expect_error("count.bin", bad, "truncated");

  const std::string msg = user_error_of([&] { ShardReader r(d / "absent.bin"); });
  EXPECT_NE(msg.find("cannot open token shard " + (d / "absent.bin")), std::string::npos) << msg;
}

TEST(Shard, FindOutOfRange) {
  TempDir d;
  ShardWriter w(d / "s.bin", 10);
  w.append({1, 2, 3});
  w.commit();
  std::string f = read_bytes(d / "s.bin");
  f[64 + 2] = 10;  // token 1 := 10, outside vocab 10 (format-valid, content-invalid)
  write_text(d / "s.bin", f);
  EXPECT_EQ(ShardReader(d / "s.bin").find_out_of_range(), 1u);
}

}  // namespace
}  // namespace snip::data
