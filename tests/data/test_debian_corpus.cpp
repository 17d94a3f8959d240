// The built-in Debian corpora (src/data/debian_corpus.h): the parsers on
// hand-made input with hand-derived documents, and the real packages when
// they are installed (scripts/setup.sh installs bible-kjv and wordnet-base;
// the tests say so and skip where they are not).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "data/debian_corpus.h"  // beside its .cpp in src/
#include "snip/data/prepare.h"
#include "snip/core/error.h"
#include "test_util.h"

namespace snip::data {
namespace {

TEST(KjvChapters, OneDocumentPerChapterVersesJoined) {
  const std::string out =
      "Ge1:1 In the beginning God created the heaven and the earth.\n"
      "Ge1:2 And the earth was  without form.\n"
      "Ge2:1 Thus the heavens\tand the earth were finished.\n"
      "1Jo1:1 That which was from the beginning,\n"
      "1Jo1:10 If we say that we have not sinned.\n"
      "Re22:21 The grace of our Lord Jesus Christ be with you all. Amen.\n";
  const auto d = kjv_chapters(out);
  ASSERT_EQ(d.size(), 4u);
  EXPECT_EQ(d[0], "In the beginning God created the heaven and the earth. And the earth was without form.");
  EXPECT_EQ(d[1], "Thus the heavens and the earth were finished.");
  EXPECT_EQ(d[2], "That which was from the beginning, If we say that we have not sinned.");
  EXPECT_EQ(d[3], "The grace of our Lord Jesus Christ be with you all. Amen.");
}

TEST(KjvChapters, ALineWithoutAReferenceIsAnErrorNamingIt) {
  for (const char* bad : {"Ge1:1 fine\nno reference here\n", "Ge:1 no chapter\n", "Ge1 no verse\n", "Ge1:x\n"}) {
    try {
      kjv_chapters(bad);
      ADD_FAILURE() << "accepted: " << bad;
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("line"), std::string::npos) << e.what();
    }
  }
}

TEST(WordnetDocument, WordsThenGloss) {
  // /usr/share/wordnet/data.noun and data.adj lines (WordNet 3.0), shortened pointers.
  EXPECT_EQ(wordnet_document("00001740 03 n 01 entity 0 003 ~ 00001930 n 0000 | that which is perceived or "
                             "known  ",
                             "t"),
            "entity: that which is perceived or known");
  EXPECT_EQ(wordnet_document("00020103 00 s 02 outback(a) 0 remote 0 003 & 00019874 a 0000 | inaccessible and "
                             "sparsely populated; \"remote parts of the world\"  ",
                             "t"),
            "outback, remote: inaccessible and sparsely populated; \"remote parts of the world\"");
  EXPECT_EQ(wordnet_document("09999999 05 n 0a a_b 0 c 1 d 2 e 3 f 4 g 5 h 6 i 7 j 8 k_l_m 9 000 | gloss", "t"),
            "a b, c, d, e, f, g, h, i, j, k l m: gloss");  // w_cnt is hex: 0a = 10 words
  EXPECT_EQ(wordnet_document("  1 This software and database is being provided", "t"), "");
  EXPECT_EQ(wordnet_document("", "t"), "");
}

TEST(WordnetDocument, MalformedLinesNameTheirPlace) {
  for (const char* bad : {"00001740 03 n 01 entity 0 003 no gloss", "00001740 03 n zz entity 0 | g",
                          "00001740 03 n 03 entity 0 | g", "00001740 | g"}) {
    try {
      wordnet_document(bad, "data.noun:7");
      ADD_FAILURE() << "accepted: " << bad;
    } catch (const UserError& e) {
      EXPECT_EQ(std::string(e.what()).rfind("data.noun:7", 0), 0u) << e.what();
    }
  }
}

TEST(DebianCorpus, TheRealKingJamesBible) {
  if (std::system("command -v bible >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "Debian's bible-kjv is not installed (scripts/setup.sh installs it)";
  const auto d = read_kjv();
  ASSERT_EQ(d.size(), size_t(kKjvChapters));
  EXPECT_EQ(d.front().rfind("In the beginning God created the heaven and the earth.", 0), 0u);
  EXPECT_NE(d.back().find("The grace of our Lord Jesus Christ be with you all. Amen."), std::string::npos);
  size_t bytes = 0;
  for (const auto& c : d) bytes += c.size();
  EXPECT_GT(bytes, 4'000'000u);  // ~4.1 MB of ASCII
  EXPECT_FALSE(debian_package_version("bible-kjv-text").empty());
}

TEST(DebianCorpus, TheRealWordnet) {
  if (!std::filesystem::exists(std::string(kWordnetDir) + "/data.noun"))
    GTEST_SKIP() << "Debian's wordnet-base is not installed (scripts/setup.sh installs it)";
  const auto d = read_wordnet();
  EXPECT_EQ(d.size(), 117659u);  // WordNet 3.0: 82,115 + 13,767 + 18,156 + 3,621 synsets
  EXPECT_EQ(d.front().rfind("entity: that which is perceived", 0), 0u) << d.front();
}

TEST(DebianCorpus, PreparedKjvHoldsOutOnePercentOfTheChapters) {
  if (std::system("command -v bible >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "Debian's bible-kjv is not installed (scripts/setup.sh installs it)";
  testing::TempDir t;
  PrepareOptions o;
  o.corpus = "kjv";
  o.out_dir = t / "kjv";
  o.vocab_size = 512;
  const PrepareSummary s = prepare_data(o);
  EXPECT_EQ(s.documents, 1189u);
  EXPECT_EQ(s.val_documents, 12u);  // round(0.01 x 1189)
  EXPECT_TRUE(prepare_data(o).up_to_date);  // a rerun is up to date
}

TEST(DebianCorpus, UnknownCorpusIsRefused) {
  PrepareOptions o;
  o.corpus = "gutenberg";
  o.out_dir = "unused";
  try {
    prepare_data(o);
    FAIL() << "accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("\"kjv\", \"wordnet\", \"brown\""), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace snip::data
