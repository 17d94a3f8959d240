// snip/data/token_client.h: a run's SentencePiece tokenizer, for processes
// that must not load SentencePiece (LibTorch ones: Debian's libsentencepiece
// carries a protobuf that clashes with LibTorch's, src/data/CMakeLists.txt).
// Each call runs `snip-data data encode|decode` (src/cli/cmd_tokens.cpp) as a
// child process with pipes; a call costs a process start and a model load
// (milliseconds), meant for prompts and samples, not for corpora.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace snip::data {

/// What a prepared data folder's meta.json (`snip data prepare`) says of its
/// tokenizer; -1 where it says nothing (no file, unreadable, key missing).
struct TokenizerMeta {
  int64_t vocab_size = -1;  ///< pieces V
  int64_t eos_id = -1;      ///< id of </s>, where a sample stops
  /// Reads FOLDER/meta.json; never throws.
  static TokenizerMeta read(const std::string& folder);
};

class TokenizerClient {
 public:
  /// `program`: the snip-data executable; `model`: a tokenizer.model file.
  /// Nothing runs until the first call.
  TokenizerClient(std::string program, std::string model);

  /// Token ids of `text`, with the BOS id first when `bos` and the model has
  /// one (a prepared shard's documents start with it). Throws UserError
  /// naming the program and its last error line when it fails.
  std::vector<int32_t> encode(const std::string& text, bool bos) const;

  /// Text of `ids` (BOS/EOS decode to nothing). Throws UserError as encode().
  std::string decode(const std::vector<int32_t>& ids) const;

  /// The snip-data program beside the running executable
  /// (/proc/self/exe's folder), "" if there is none.
  static std::string sibling_program();

 private:
  std::string run(const std::string& verb, const std::string& input, bool bos) const;
  std::string program_, model_;
};

}  // namespace snip::data
