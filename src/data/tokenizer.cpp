// SentencePiece wrapper: load, encode/decode, deterministic BPE training.
#include "snip/data/tokenizer.h"

#include <regex>
#include <unordered_map>

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include "corpus.h"
#include "snip/io/atomic_file.h"
#include "snip/core/error.h"

namespace snip::data {
namespace {

constexpr size_t kMaxSentenceBytes = 65536;

// Feeds SentencePiece one line at a time without copying the corpus.
class LineIterator : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(const std::vector<std::string>& texts) : texts_(texts) { advance(); }
  bool done() const override { return doc_ >= texts_.size(); }
  void Next() override { advance(); }
  const std::string& value() const override { return value_; }
  sentencepiece::util::Status status() const override { return sentencepiece::util::Status(); }
  uint64_t count() const { return count_; }

 private:
  // Moves to the next non-blank line (or piece of an over-long line).
  void advance() {
    while (doc_ < texts_.size()) {
      const std::string& t = texts_[doc_];
      if (pos_ >= t.size()) {
        ++doc_;
        pos_ = 0;
        continue;
      }
      size_t eol = t.find('\n', pos_);
      if (eol == std::string::npos) eol = t.size();
      size_t end = eol;
      if (end - pos_ > kMaxSentenceBytes) {
        end = pos_ + kMaxSentenceBytes;
        while (end > pos_ && (static_cast<unsigned char>(t[end]) & 0xC0) == 0x80) --end;  // char boundary
      }
      std::string_view line(t.data() + pos_, end - pos_);
      pos_ = end == eol ? eol + 1 : end;
      if (has_text(line)) {
        value_.assign(line.data(), line.size());
        ++count_;
        return;
      }
    }
  }

  const std::vector<std::string>& texts_;
  size_t doc_ = 0;
  size_t pos_ = 0;
  std::string value_;
  uint64_t count_ = 0;
};

}  // namespace

Tokenizer Tokenizer::from_serialized(std::string bytes, const std::string& what) {
  auto sp = std::make_shared<sentencepiece::SentencePieceProcessor>();
  const auto st = sp->LoadFromSerializedProto(bytes);
  if (!st.ok()) fail(what, ": not a SentencePiece model (", st.ToString(), ")");
  if (sp->GetPieceSize() <= 0) fail(what, ": SentencePiece model has no pieces");
  Tokenizer t;
  t.sp_ = std::move(sp);
  t.bytes_ = std::move(bytes);
  return t;
}

Tokenizer Tokenizer::load(const std::string& path) {
  std::string bytes;
  try {
    bytes = io::read_file(path);
  } catch (const UserError& e) {
    fail("tokenizer ", path, ": ", e.what());
  }
  return from_serialized(std::move(bytes), "tokenizer " + path);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  const std::vector<int> ids = sp_->EncodeAsIds(text);
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::vector<int32_t> Tokenizer::encode_document(std::string_view text) const {
  std::vector<int32_t> out;
  const std::vector<int> ids = sp_->EncodeAsIds(text);
  out.reserve(ids.size() + 2);
  if (bos_id() >= 0) out.push_back(bos_id());
  out.insert(out.end(), ids.begin(), ids.end());
  if (eos_id() >= 0) out.push_back(eos_id());
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  const int v = vocab_size();
  std::vector<int> in;
  in.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= v) fail("token id ", id, " out of range [0, ", v, ") of the tokenizer");
    in.push_back(id);
  }
  return sp_->DecodeIds(in);
}

int Tokenizer::vocab_size() const { return sp_->GetPieceSize(); }
int Tokenizer::bos_id() const { return sp_->bos_id(); }
int Tokenizer::eos_id() const { return sp_->eos_id(); }
int Tokenizer::unk_id() const { return sp_->unk_id(); }
std::string Tokenizer::id_to_piece(int id) const {
  if (id < 0 || id >= vocab_size()) fail("token id ", id, " out of range [0, ", vocab_size(), ") of the tokenizer");
  return sp_->IdToPiece(id);
}

void Tokenizer::save(const std::string& path) const { io::write_file_atomic(path, bytes_); }

Tokenizer train_tokenizer(const std::vector<std::string>& texts, const TokenizerTrainOptions& options) {
  if (options.vocab_size < 1) fail("vocab_size must be a positive number of pieces, got ", options.vocab_size);
  if (!(options.character_coverage > 0.0 && options.character_coverage <= 1.0))
    fail("character_coverage must be in (0, 1], got ", options.character_coverage);
  {
    LineIterator probe(texts);
    if (probe.done()) fail("corpus is empty: no non-whitespace text to train the tokenizer on");
  }
  const std::unordered_map<std::string, std::string> kwargs = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(options.vocab_size)},
      {"character_coverage", std::to_string(options.character_coverage)},
      {"byte_fallback", "true"},
      {"split_digits", "true"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "true"},
      {"allow_whitespace_only_pieces", "true"},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      {"num_threads", "1"},
      {"max_sentence_length", std::to_string(kMaxSentenceBytes)},
      {"input_sentence_size", "10000000"},
      {"shuffle_input_sentence", "true"},
      {"minloglevel", "2"},
  };
  // SentencePiece reserves seed (unsigned)-1 for "seed from std::random_device".
  unsigned sp_seed = static_cast<unsigned>(options.seed ^ (options.seed >> 32));
  if (sp_seed == static_cast<unsigned>(-1)) sp_seed = 0;
  sentencepiece::SetRandomGeneratorSeed(sp_seed);
  LineIterator it(texts);
  std::string proto;
  const auto st = sentencepiece::SentencePieceTrainer::Train(kwargs, &it, &proto);
  if (!st.ok()) {
    const std::string msg = st.ToString();
    std::smatch m;
    static const std::regex kTooHigh("Vocabulary size too high \\((\\d+)\\)\\. Please set it to a value <= (\\d+)");
    static const std::regex kTooSmall("Vocabulary size is smaller than required_chars\\. (\\d+) vs (\\d+)");
    if (std::regex_search(msg, m, kTooHigh))
      fail("vocab_size ", options.vocab_size, " is too large for this corpus: SentencePiece can build at most ",
           m[2].str(), " pieces from it; use a vocab size <= ", m[2].str(), " or more text");
    if (std::regex_search(msg, m, kTooSmall))
      fail("vocab_size ", options.vocab_size, " is too small: this corpus needs at least ", m[2].str(),
           " pieces (3 special + 256 byte-fallback + one per covered character)");
    fail("SentencePiece training failed: ", msg);
  }
  return Tokenizer::from_serialized(std::move(proto), "trained tokenizer");
}

}  // namespace snip::data
