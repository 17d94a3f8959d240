// snip/data/tokenizer.h: SentencePiece tokenizer (Kudo & Richardson 2018),
// trained as BPE on the corpus or loaded from any `tokenizer.model`
// (Llama's included; nothing assumes a vocabulary size or special ids).
//
// Training settings follow Llama's tokenizer (model_type=bpe,
// byte_fallback=true, split_digits=true, normalization "identity",
// remove_extra_whitespaces=false, add_dummy_prefix=true,
// allow_whitespace_only_pieces=true, ids unk=0 bos=1 eos=2, no pad), so
// decode(encode(s)) == s for every valid UTF-8 string s: characters outside
// the vocabulary (and '\n', which training never sees because it reads one
// line per sentence) are encoded as <0xNN> byte pieces.
// character_coverage = 0.9995 (SentencePiece's recommendation for large
// alphabets; rarer characters go through byte fallback).
// Determinism: num_threads=1 (the trained model differs with the thread
// count), SentencePiece's global random seed set from `seed`, sentences
// sampled/shuffled only beyond 10 M lines. Same text + options => same
// model bytes.
//
// Documents are encoded as [bos] + pieces + [eos] (encode_document): BOS
// lets the model see where a document starts even when a training window
// begins mid-stream; EOS teaches it to end one. A loaded model without a
// BOS or EOS id (id < 0) simply omits that token.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace snip::data {

class Tokenizer {
 public:
  /// Loads a SentencePiece model file. Throws UserError "tokenizer <path>:
  /// cannot read file ..." or "tokenizer <path>: not a SentencePiece model
  /// (<reason>)".
  static Tokenizer load(const std::string& path);

  /// Loads a model from its serialized ModelProto bytes; `what` names it in
  /// errors. Throws UserError like load().
  static Tokenizer from_serialized(std::string bytes, const std::string& what = "tokenizer");

  /// Token ids of `text` (no BOS/EOS). `text` should be valid UTF-8.
  std::vector<int32_t> encode(std::string_view text) const;

  /// [bos] + encode(text) + [eos]; BOS/EOS omitted where the model has none.
  std::vector<int32_t> encode_document(std::string_view text) const;

  /// Text of `ids`; BOS/EOS/UNK/control pieces decode to nothing. Throws
  /// UserError "token id X out of range [0, V)" for an id outside the vocab.
  std::string decode(const std::vector<int32_t>& ids) const;

  /// Number of pieces V; valid ids are 0..V-1.
  int vocab_size() const;
  /// Id of <s> (BOS), or -1 if the model has none.
  int bos_id() const;
  /// Id of </s> (EOS), or -1 if the model has none.
  int eos_id() const;
  /// Id of <unk>.
  int unk_id() const;
  /// The piece string of `id` (e.g. "▁the", "<0x0A>").
  std::string id_to_piece(int id) const;

  /// The serialized model (the exact bytes of a tokenizer.model file).
  const std::string& serialized() const { return bytes_; }

  /// Writes serialized() to `path` atomically (snip::io::write_file_atomic).
  void save(const std::string& path) const;

 private:
  Tokenizer() = default;
  std::shared_ptr<const sentencepiece::SentencePieceProcessor> sp_;
  std::string bytes_;
};

/// Options of train_tokenizer(); see the file comment for fixed settings.
struct TokenizerTrainOptions {
  int vocab_size = 8192;              ///< pieces, including 3 special + 256 byte pieces
  double character_coverage = 0.9995; ///< fraction of characters covered by char pieces
  uint64_t seed = 1234;               ///< SentencePiece random seed (sampling/shuffling)
};

/// Trains a BPE SentencePiece model on `texts` (each split into lines; a
/// line is one training sentence; whitespace-only lines are skipped, lines
/// longer than 65536 bytes are cut at UTF-8 character boundaries).
/// Throws UserError:
///   "vocab_size V is too large for this corpus: SentencePiece can build at
///    most N pieces from it; use a vocab size <= N or more text",
///   "vocab_size V is too small: this corpus needs at least N pieces (...)",
///   "corpus is empty ...", or "SentencePiece training failed: <reason>".
Tokenizer train_tokenizer(const std::vector<std::string>& texts, const TokenizerTrainOptions& options);

}  // namespace snip::data
