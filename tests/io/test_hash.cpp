// FNV-1a against the published test vectors (isthe.com/chongo/tech/comp/fnv,
// "FNV test vectors"), not values computed by the code under test.
#include "snip/core/hash.h"

#include <gtest/gtest.h>

#include <string>

namespace snip {

TEST(Fnv1a, PublishedVectors64) {
  EXPECT_EQ(fnv1a64(""), 0xcbf29ce484222325ull);  // the offset basis
  EXPECT_EQ(fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(fnv1a64("foobar"), 0x85944171f73967e8ull);
}

TEST(Fnv1a, PublishedVectors32) {
  EXPECT_EQ(fnv1a32(""), 2166136261u);
  EXPECT_EQ(fnv1a32("a"), 0xe40c292cu);
  EXPECT_EQ(fnv1a32("foobar"), 0xbf9cf968u);
}

TEST(Fnv1a, ContinuesAcrossPieces) {
  const std::string a = "foo", b = "bar";
  EXPECT_EQ(fnv1a64(b.data(), b.size(), fnv1a64(a)), fnv1a64("foobar"));
}

}  // namespace snip
