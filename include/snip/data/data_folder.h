// snip/data/data_folder.h: a prepared data folder, checked as a whole before
// a run reads it.
//
// `snip data prepare` writes FOLDER/meta.json, tokenizer.model, train.bin and
// val.bin (include/snip/data/prepare.h; shard layout in shard.h). A trainer
// that read only the shards would accept a folder whose tokenizer was
// replaced or whose meta.json is gone: the ids would then mean other pieces
// than the samples and the exported tokenizer say. verify_data_folder()
// checks that the four files agree.
#pragma once

#include <cstdint>
#include <string>

#include "snip/data/shard.h"

namespace snip::data {

/// What a checked data folder holds.
struct DataFolderInfo {
  uint32_t vocab_size = 0;       ///< tokenizer pieces V; shard ids are in [0, V)
  ShardDtype dtype = ShardDtype::kUint16;  ///< token width of both shards
  uint64_t train_tokens = 0;     ///< tokens in train.bin
  uint64_t val_tokens = 0;       ///< tokens in val.bin
  int64_t bos_id = -1;           ///< id of <s>, -1 if none
  int64_t eos_id = -1;           ///< id of </s>, -1 if none
  std::string tokenizer_sha256;  ///< hex SHA-256 (FIPS 180-4) of tokenizer.model
  std::string tokenizer_path;    ///< FOLDER/tokenizer.model (as meta.json names it)
  /// The pieces of the BOS, EOS and UNK ids (meta.json "special_pieces";
  /// SentencePiece's defaults "<s>", "</s>", "<unk>" for folders prepared
  /// before it was recorded, when the ids are SentencePiece's 1, 2, 0; "" if
  /// unknown or the id is -1).
  std::string bos_piece, eos_piece, unk_piece;
  int64_t unk_id = -1;           ///< id of <unk>, -1 if none or unknown
};

/// Checks the prepared data folder `folder` as a whole: meta.json parses and
/// says "format": "snip-data", "version": 2; its "vocab_size" is in
/// [1, 2^31); for each split S of train and val, "shards".S."path" names a
/// file inside the folder whose shard header (ShardReader: magic, reserved
/// bytes, size) has the dtype "shards".S."dtype", vocab_size equal to
/// meta.json's, and as many tokens as "tokens".S; "tokenizer"."path" names a
/// file inside the folder whose SHA-256 equals "tokenizer"."sha256"; "bos_id"
/// and "eos_id" are -1 or ids in [0, V). Reads the shard headers only (not
/// the token values: TokenLoader checks those) and the whole tokenizer file.
/// Throws UserError "<what>: <file>: <field>: <problem>" (e.g. "data.dir:
/// data/brown/meta.json: missing (prepare the folder with `snip data
/// prepare`)", "... tokenizer.model: SHA-256 ... differs from meta.json's
/// tokenizer.sha256 ...").
DataFolderInfo verify_data_folder(const std::string& folder, const std::string& what);

/// How to make the data folder `dir`, for an error about a missing one:
/// "`snip data prepare --input YOUR_TEXT --out DIR` (or `snip data prepare
/// --out DIR` for the built-in KJV corpus)".
std::string prepare_hint(const std::string& dir);

/// Hex SHA-256 (FIPS 180-4) of `bytes`, lower case, 64 characters, via
/// OpenSSL's EVP_Digest.
std::string sha256_hex(const std::string& bytes);

}  // namespace snip::data
