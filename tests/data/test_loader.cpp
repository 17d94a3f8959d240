// TokenLoader: the shard holds tokens 0, 1, ..., N-1, so every row tells
// which window it is (first input = window * T) and the invariants below are
// checked against that arithmetic, not against the loader's own code.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "snip/data/loader.h"
#include "test_util.h"

namespace snip::data {
namespace {

using testing::TempDir;
using testing::user_error_of;

constexpr int kT = 10;

class LoaderTest : public ::testing::Test {
 protected:
  // Shard of tokens 0..n-1 (vocab 65536).
  std::string make_shard(int n, const std::string& name = "s.bin") {
    std::vector<int32_t> v(n);
    for (int i = 0; i < n; ++i) v[i] = i;
    ShardWriter w(dir_ / name, 65536);
    w.append(v);
    w.commit();
    return dir_ / name;
  }
  // Window index of each row of one batch, checking the row's content.
  static std::vector<uint64_t> rows(const std::vector<int32_t>& in, const std::vector<int32_t>& tg, int b, int t) {
    std::vector<uint64_t> out;
    EXPECT_EQ(in.size(), static_cast<size_t>(b * t));
    EXPECT_EQ(tg.size(), static_cast<size_t>(b * t));
    for (int r = 0; r < b; ++r) {
      const int32_t start = in[static_cast<size_t>(r * t)];
      EXPECT_EQ(start % t, 0) << "windows start at multiples of T";
      for (int j = 0; j < t; ++j) {
        EXPECT_EQ(in[static_cast<size_t>(r * t + j)], start + j);
        EXPECT_EQ(tg[static_cast<size_t>(r * t + j)], start + j + 1) << "target = input shifted by one";
      }
      out.push_back(static_cast<uint64_t>(start / t));
    }
    return out;
  }
  // Window indices of the next `batches` batches.
  static std::vector<uint64_t> take(TokenLoader& l, int batches) {
    std::vector<uint64_t> out;
    std::vector<int32_t> in, tg;
    for (int i = 0; i < batches; ++i) {
      l.next(in, tg);
      const auto r = rows(in, tg, l.batch(), l.seq());
      out.insert(out.end(), r.begin(), r.end());
    }
    return out;
  }
  TempDir dir_;
};

TEST_F(LoaderTest, WindowCountFollowsStrideT) {
  // W = floor((N - 1) / T): 1001 tokens -> 100 windows; 1000 -> 99; 11 -> 1.
  EXPECT_EQ(TokenLoader(make_shard(1001, "a.bin"), 1, kT, 1).num_windows(), 100u);
  EXPECT_EQ(TokenLoader(make_shard(1000, "b.bin"), 1, kT, 1).num_windows(), 99u);
  EXPECT_EQ(TokenLoader(make_shard(11, "c.bin"), 1, kT, 1).num_windows(), 1u);
}

TEST_F(LoaderTest, EveryWindowOncePerEpoch) {
  TokenLoader l(make_shard(1001), 4, kT, 42);
  ASSERT_EQ(l.windows_per_epoch(), 100u);
  const auto e0 = take(l, 25);
  EXPECT_EQ(l.state(), (LoaderState{1, 0}));
  const auto e1 = take(l, 25);
  for (const auto* e : {&e0, &e1}) {
    std::vector<uint64_t> s = *e;
    std::sort(s.begin(), s.end());
    for (uint64_t i = 0; i < 100; ++i) ASSERT_EQ(s[i], i);
  }
  EXPECT_NE(e0, e1) << "each epoch has its own order";
  std::vector<uint64_t> identity(100);
  for (uint64_t i = 0; i < 100; ++i) identity[i] = i;
  EXPECT_NE(e0, identity) << "order is shuffled";
}

TEST_F(LoaderTest, SameSeedSameBatchesDifferentSeedDifferentOrder) {
  const std::string s = make_shard(1001);
  TokenLoader a(s, 3, kT, 7), b(s, 3, kT, 7), c(s, 3, kT, 8);
  const auto wa = take(a, 40), wb = take(b, 40), wc = take(c, 40);
  EXPECT_EQ(wa, wb);
  EXPECT_NE(wa, wc);
}

TEST_F(LoaderTest, RanksAreDisjointAndCover) {
  const std::string s = make_shard(1001);  // W = 100
  for (int world : {4, 3}) {
    std::vector<uint64_t> all;
    for (int r = 0; r < world; ++r) {
      TokenLoader l(s, 1, kT, 99, r, world);
      EXPECT_EQ(l.windows_per_epoch(), static_cast<uint64_t>(100 / world));
      const auto w = take(l, static_cast<int>(l.windows_per_epoch()));
      EXPECT_EQ(l.state(), (LoaderState{1, 0}));
      all.insert(all.end(), w.begin(), w.end());
    }
    const std::set<uint64_t> uniq(all.begin(), all.end());
    EXPECT_EQ(uniq.size(), all.size()) << "world " << world << ": ranks overlap";
    EXPECT_EQ(all.size(), static_cast<size_t>(100 / world * world)) << "world " << world;
    EXPECT_LT(*uniq.rbegin(), 100u);
  }
}

TEST_F(LoaderTest, ResumeGivesIdenticalBatches) {
  const std::string s = make_shard(1001);
  for (int k : {0, 7, 33, 34, 70}) {  // 100 windows / B=3: batches straddle epochs
    TokenLoader a(s, 3, kT, 5, 1, 2);
    take(a, k);
    const LoaderState st = a.state();
    TokenLoader b(s, 3, kT, 5, 1, 2);
    b.restore(st);
    EXPECT_EQ(b.state(), st);
    EXPECT_EQ(take(a, 40), take(b, 40)) << "after " << k << " batches";
  }
}

TEST_F(LoaderTest, RestoreRejectsForeignState) {
  TokenLoader l(make_shard(1001), 2, kT, 5);
  const std::string msg = user_error_of([&] { l.restore({3, 100}); });
  EXPECT_NE(msg.find("cursor 100 out of range [0, 100)"), std::string::npos) << msg;
}

TEST_F(LoaderTest, LastEpochIsARealEpoch) {
  // Epoch 2^64 - 1 once read a permutation that was never made (it equalled the
  // "none yet" marker): a SIGSEGV on resume. Its windows must be a permutation
  // of all windows, like any epoch's.
  TokenLoader l(make_shard(1001), 4, kT, 42);
  l.restore({UINT64_MAX, 0});
  std::vector<uint64_t> w = take(l, 25);
  std::sort(w.begin(), w.end());
  ASSERT_EQ(w.size(), 100u);
  for (uint64_t i = 0; i < 100; ++i) ASSERT_EQ(w[i], i);
}

TEST_F(LoaderTest, EvalWindowsInOrder) {
  const TokenLoader l(make_shard(1001), 2, kT, 5);
  std::vector<int32_t> in, tg;
  for (uint64_t i = 0; i < l.num_windows(); ++i) {
    l.window(i, in, tg);
    ASSERT_EQ(rows(in, tg, 1, kT), (std::vector<uint64_t>{i}));
  }
}

TEST_F(LoaderTest, TooShortShard) {
  std::string msg = user_error_of([&] { TokenLoader(make_shard(10, "ten.bin"), 1, kT, 1); });
  EXPECT_NE(msg.find("10 tokens is too few for seq 10 and world 1: needs at least 11"), std::string::npos) << msg;
  // 30 tokens = 2 windows of 11: enough for 2 ranks, not for 3.
  const std::string s = make_shard(30, "thirty.bin");
  EXPECT_EQ(TokenLoader(s, 1, kT, 1, 1, 2).windows_per_epoch(), 1u);
  msg = user_error_of([&] { TokenLoader(s, 1, kT, 1, 0, 3); });
  EXPECT_NE(msg.find("needs at least 31"), std::string::npos) << msg;
}

TEST_F(LoaderTest, BadArguments) {
  const std::string s = make_shard(100);
  EXPECT_NE(user_error_of([&] { TokenLoader(s, 0, kT, 1); }).find("batch"), std::string::npos);
  EXPECT_NE(user_error_of([&] { TokenLoader(s, 1, 0, 1); }).find("seq"), std::string::npos);
  EXPECT_NE(user_error_of([&] { TokenLoader(s, 1, kT, 1, 2, 2); }).find("rank"), std::string::npos);
}

TEST_F(LoaderTest, RejectsTokensOutsideVocab) {
  {
    ShardWriter w(dir_ / "v.bin", 5);
    w.append({1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2});
    w.commit();
  }
  std::string f = testing::read_bytes(dir_ / "v.bin");
  f[64 + 2 * 7] = 9;  // token 7 := 9 >= vocab 5
  testing::write_text(dir_ / "v.bin", f);
  const std::string msg = user_error_of([&] { TokenLoader(dir_ / "v.bin", 1, 4, 1); });
  EXPECT_NE(msg.find("token at index 7 is 9, outside the vocabulary [0, 5)"), std::string::npos) << msg;
}

}  // namespace
}  // namespace snip::data
