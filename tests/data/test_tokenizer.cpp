// SentencePiece tokenizer: exact round trip on varied text (byte fallback),
// Llama-style id layout, deterministic training, errors.
#include <gtest/gtest.h>

#include "snip/data/tokenizer.h"
#include "test_util.h"

namespace snip::data {
namespace {

using testing::TempDir;
using testing::user_error_of;

constexpr int kVocab = 320;

const Tokenizer& small_tokenizer() {
  static const Tokenizer tok = train_tokenizer(testing::synthetic_docs(300), {kVocab, 0.9995, 1234});
  return tok;
}

TEST(Tokenizer, IdLayoutFollowsLlama) {
  const Tokenizer& t = small_tokenizer();
  EXPECT_EQ(t.vocab_size(), kVocab);
  EXPECT_EQ(t.unk_id(), 0);
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  // byte_fallback puts the 256 byte pieces right after the specials.
  EXPECT_EQ(t.id_to_piece(3), "<0x00>");
  EXPECT_EQ(t.id_to_piece(3 + 0x0A), "<0x0A>");
  EXPECT_EQ(t.id_to_piece(258), "<0xFF>");
  // '\n' never occurs in training sentences, so it is the byte piece 0x0A.
  const auto ids = t.encode("\n");
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.back(), 3 + 0x0A);
}

TEST(Tokenizer, RoundTripIsExact) {
  const Tokenizer& t = small_tokenizer();
  const std::vector<std::string> texts = {
      "the model trains on text",
      "The Model TRAINS, with UPPER case & symbols: #$%^*()[]{}<>~`|\\/@!?",
      "  leading spaces, double  spaces and trailing   ",
      "tabs\tand\nnew\n\nlines\r\nCRLF",
      "digits 1234567890 and 3.14159 and -42",
      "na\xc3\xafve caf\xc3\xa9 \xe2\x80\x94 \xe6\x9d\xb1\xe4\xba\xac \xf0\x9f\x98\x80 \xd0\xbf\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82",
      "",
      " ",
      "\x01\x7f control bytes",
  };
  for (const auto& s : texts) {
    EXPECT_EQ(t.decode(t.encode(s)), s) << "text: " << s;
    const auto doc = t.encode_document(s);
    ASSERT_GE(doc.size(), 2u);
    EXPECT_EQ(doc.front(), t.bos_id());
    EXPECT_EQ(doc.back(), t.eos_id());
    EXPECT_EQ(doc.size(), t.encode(s).size() + 2);
    EXPECT_EQ(t.decode(doc), s) << "BOS/EOS decode to nothing";
  }
}

TEST(Tokenizer, BpeCompressesInDomainText) {
  const Tokenizer& t = small_tokenizer();
  const std::string s = "the model learns to predict the next token with low precision";
  // 62 characters; with ~30 merges in the vocabulary, frequent words must
  // merge (one piece per character would be 62 + the dummy-prefix space).
  EXPECT_LT(t.encode(s).size(), s.size() * 4 / 5);
  for (int id : t.encode(s)) EXPECT_GE(id, 259) << "in-domain text needs no byte fallback";
}

TEST(Tokenizer, TrainingIsDeterministicAndSeedAware) {
  const auto docs = testing::synthetic_docs(300);
  const Tokenizer a = train_tokenizer(docs, {kVocab, 0.9995, 1234});
  EXPECT_EQ(a.serialized(), small_tokenizer().serialized());
}

TEST(Tokenizer, SaveLoadRoundTrip) {
  TempDir d;
  small_tokenizer().save(d / "tokenizer.model");
  const Tokenizer t = Tokenizer::load(d / "tokenizer.model");
  EXPECT_EQ(t.serialized(), small_tokenizer().serialized());
  EXPECT_EQ(t.encode("every step of the loader"), small_tokenizer().encode("every step of the loader"));
}

TEST(Tokenizer, Errors) {
  TempDir d;
  testing::write_text(d / "junk.model", "this is not a protobuf \xff\xff\xff");
  std::string msg = user_error_of([&] { Tokenizer::load(d / "junk.model"); });
  EXPECT_NE(msg.find("tokenizer " + (d / "junk.model")), std::string::npos) << msg;
  msg = user_error_of([&] { Tokenizer::load(d / "missing.model"); });
  EXPECT_NE(msg.find("missing.model"), std::string::npos) << msg;

  const auto docs = testing::synthetic_docs(20);
  msg = user_error_of([&] { train_tokenizer(docs, {100000, 0.9995, 1}); });
  EXPECT_NE(msg.find("vocab_size 100000 is too large for this corpus"), std::string::npos) << msg;
  EXPECT_NE(msg.find("<= "), std::string::npos) << msg;
  msg = user_error_of([&] { train_tokenizer(docs, {200, 0.9995, 1}); });
  EXPECT_NE(msg.find("vocab_size 200 is too small"), std::string::npos) << msg;
  msg = user_error_of([&] { train_tokenizer({" ", "\n\n"}, {300, 0.9995, 1}); });
  EXPECT_NE(msg.find("corpus is empty"), std::string::npos) << msg;

  msg = user_error_of([&] { small_tokenizer().decode({5, kVocab}); });
  EXPECT_NE(msg.find("token id 320 out of range [0, 320)"), std::string::npos) << msg;
}

}  // namespace
}  // namespace snip::data
