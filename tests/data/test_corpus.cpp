// Input expansion and document reading: folders, blank-line files, JSONL,
// UTF-8 validation. Expected document lists are written out by hand.
#include <gtest/gtest.h>

#include "data/corpus.h"  // beside its .cpp in src/
#include "test_util.h"

namespace snip::data {
namespace {

using testing::TempDir;
using testing::user_error_of;
using testing::write_text;

std::vector<std::string> read_all(const std::string& path, const std::string& field = "text") {
  std::vector<std::string> docs;
  for (const auto& f : list_input_files(path)) read_documents(f, field, docs);
  return docs;
}

TEST(Corpus, FolderIsRecursiveSortedOneDocumentPerFileSkippingHidden) {
  TempDir t;
  write_text(t / "in/b.txt", "second file\n\nstill second\n");
  write_text(t / "in/a/z.txt", "in subfolder a\n");
  write_text(t / "in/a/c/deep.txt", "deepest\r\n");
  write_text(t / "in/.hidden.txt", "hidden file\n");
  write_text(t / "in/.git/x.txt", "hidden folder\n");
  write_text(t / "in/c.jsonl", "{\"text\": \"json one\"}\n\n{\"text\": \"json two\", \"id\": 2}\n");
  write_text(t / "in/empty.txt", "  \n\t\n");
  const auto files = list_input_files(t / "in");
  ASSERT_EQ(files.size(), 5u);  // a/c/deep.txt a/z.txt b.txt c.jsonl empty.txt
  EXPECT_EQ(files[0].path, t / "in/a/c/deep.txt");
  EXPECT_EQ(files[0].kind, InputKind::kWholeFile);
  EXPECT_EQ(files[3].kind, InputKind::kJsonl);
  EXPECT_EQ(files[2].bytes, 26u);  // "second file\n\nstill second\n"
  const std::vector<std::string> expected = {"deepest", "in subfolder a", "second file\n\nstill second", "json one",
                                             "json two"};
  EXPECT_EQ(read_all(t / "in"), expected);
}

TEST(Corpus, SingleTextFileSplitsAtBlankLines) {
  TempDir t;
  write_text(t / "big.txt", "\n\ndoc one line one\ndoc one line two  \n\n \t\n\ndoc two\n   indented third\n\nlast");
  const std::vector<std::string> expected = {"doc one line one\ndoc one line two", "doc two\n   indented third", "last"};
  EXPECT_EQ(read_all(t / "big.txt"), expected);
  const auto files = list_input_files(t / "big.txt");
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0].kind, InputKind::kBlankLines);
}

TEST(Corpus, JsonlCustomFieldAndUnicode) {
  TempDir t;
  write_text(t / "d.jsonl", "{\"body\": \"caf\\u00e9 \\ud83d\\ude00\"}\n{\"body\": \"line\\nbreak\", \"text\": 1}\n");
  const std::vector<std::string> expected = {"caf\xc3\xa9 \xf0\x9f\x98\x80", "line\nbreak"};
  EXPECT_EQ(read_all(t / "d.jsonl", "body"), expected);
}

TEST(Corpus, JsonlErrorsNameFileAndLine) {
  TempDir t;
  write_text(t / "missing.jsonl", "{\"text\": \"ok\"}\n\n{\"txt\": \"typo\"}\n");
  std::string msg = user_error_of([&] { read_all(t / "missing.jsonl"); });
  EXPECT_NE(msg.find(t / "missing.jsonl:3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"text\""), std::string::npos) << msg;

  write_text(t / "bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"unterminated}\n");
  msg = user_error_of([&] { read_all(t / "bad.jsonl"); });
  EXPECT_NE(msg.find(t / "bad.jsonl:2: invalid JSON"), std::string::npos) << msg;

  write_text(t / "num.jsonl", "{\"text\": 42}\n");
  msg = user_error_of([&] { read_all(t / "num.jsonl"); });
  EXPECT_NE(msg.find("num.jsonl:1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("number"), std::string::npos) << msg;

  write_text(t / "arr.jsonl", "[1, 2]\n");
  msg = user_error_of([&] { read_all(t / "arr.jsonl"); });
  EXPECT_NE(msg.find("arr.jsonl:1: expected a JSON object, found array"), std::string::npos) << msg;
}

TEST(Corpus, MissingPathAndEmptyFolder) {
  TempDir t;
  std::string msg = user_error_of([&] { list_input_files(t / "nope"); });
  EXPECT_EQ(msg, "input path " + (t / "nope") + " does not exist");
  std::filesystem::create_directories(t / "empty/.hidden");
  msg = user_error_of([&] { list_input_files(t / "empty"); });
  EXPECT_NE(msg.find("contains no files"), std::string::npos) << msg;
}

TEST(Corpus, BinaryFileIsRejectedWithOffset) {
  TempDir t;
  write_text(t / "in/blob.bin", std::string("ok\x89PNG", 6));
  const std::string msg = user_error_of([&] { read_all(t / "in"); });
  EXPECT_NE(msg.find("blob.bin"), std::string::npos) << msg;
  EXPECT_NE(msg.find("0x89 at offset 2"), std::string::npos) << msg;
}

TEST(Corpus, ByteOrderMarkAndCarriageReturnsAreNormalised) {
  // A Windows-made file: BOM, CRLF line ends, a blank line made of CRLFs, a
  // lone CR (old Mac line end). Read as if it were plain LF text.
  TempDir t;
  write_text(t / "win.txt", "\xEF\xBB\xBF" "doc one\r\nline two\r\n\r\ndoc two\rlast line\r\n");
  const std::vector<std::string> expected = {"doc one\nline two", "doc two\nlast line"};
  EXPECT_EQ(read_all(t / "win.txt"), expected);
  // In a folder (one document per file) the same; a U+FEFF inside the text
  // is a character (zero-width no-break space), not a byte-order mark: kept.
  write_text(t / "in/a.txt", "\xEF\xBB\xBF" "first\r\nsecond \xEF\xBB\xBF" "word\r\n");
  EXPECT_EQ(read_all(t / "in"), std::vector<std::string>{"first\nsecond \xEF\xBB\xBF" "word"});
  // JSONL: a BOM before the first object, CRLF line ends, and CR/CRLF inside
  // a text value.
  write_text(t / "d.jsonl", "\xEF\xBB\xBF{\"text\": \"a\\r\\nb\\rc\"}\r\n{\"text\": \"two\"}\r\n");
  const std::vector<std::string> jexpected = {"a\nb\nc", "two"};
  EXPECT_EQ(read_all(t / "d.jsonl"), jexpected);
}

TEST(Corpus, NulBytesAreRejectedWithFileAndOffset) {
  TempDir t;
  write_text(t / "nul.txt", std::string("abc\0def", 7));
  std::string msg = user_error_of([&] { read_all(t / "nul.txt"); });
  EXPECT_NE(msg.find("nul.txt: NUL byte at offset 3"), std::string::npos) << msg;
  write_text(t / "nul.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"x\\u0000y\"}\n");
  msg = user_error_of([&] { read_all(t / "nul.jsonl"); });
  EXPECT_NE(msg.find("nul.jsonl:2: field \"text\": NUL byte at offset 1"), std::string::npos) << msg;
}

TEST(Utf8, ValidityTable) {
  const size_t ok = std::string::npos;
  struct Case {
    std::string s;
    size_t bad;
  } cases[] = {
      {"plain ascii", ok},
      {"\xc3\xa9", ok},                  // U+00E9
      {"\xe2\x82\xac", ok},              // U+20AC
      {"\xf0\x9f\x98\x80", ok},          // U+1F600
      {"\xf4\x8f\xbf\xbf", ok},          // U+10FFFF, the largest code point
      {"\xef\xbf\xbf", ok},              // U+FFFF
      {"a\x80", 1},                      // stray continuation byte
      {"\xc0\x80", 0},                   // overlong NUL
      {"\xc1\xbf", 0},                   // overlong
      {"\xe0\x9f\xbf", 0},               // overlong 3-byte
      {"\xed\xa0\x80", 0},               // surrogate U+D800
      {"\xf0\x8f\xbf\xbf", 0},           // overlong 4-byte
      {"\xf4\x90\x80\x80", 0},           // U+110000
      {"\xf5\x80\x80\x80", 0},           // invalid lead byte
      {"xy\xe2\x82", 2},                 // truncated at end
      {"\xe2(\xa1", 0},                  // bad continuation
      {"\xff", 0},
  };
  for (const auto& c : cases) EXPECT_EQ(find_invalid_utf8(c.s), c.bad) << "case of size " << c.s.size();
}

TEST(Corpus, HasText) {
  EXPECT_FALSE(has_text(""));
  EXPECT_FALSE(has_text(" \t\r\n\f\v"));
  EXPECT_TRUE(has_text("  x "));
}

}  // namespace
}  // namespace snip::data
