// A prepared data folder, checked as a whole (see data_folder.h).
#include "snip/data/data_folder.h"

#include <openssl/evp.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "snip/io/atomic_file.h"
#include "snip/io/json.h"
#include "snip/core/error.h"

namespace snip::data {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string sha256_hex(const std::string& bytes) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  const int ok = EVP_Digest(bytes.data(), bytes.size(), md, &len, EVP_sha256(), nullptr);
  SNIP_CHECK(ok == 1 && len == 32, "EVP_Digest(sha256) failed");
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < len; ++i) {
    out += hex[md[i] >> 4];
    out += hex[md[i] & 15];
  }
  return out;
}

DataFolderInfo verify_data_folder(const std::string& folder, const std::string& what) {
  const fs::path dir(folder);
  const std::string mp = (dir / "meta.json").string();
  if (!fs::is_regular_file(mp))
    fail(what, ": ", mp, ": missing (a data folder is what `snip data prepare` writes: meta.json, tokenizer.model, "
         "train.bin, val.bin)");
  const json meta = io::parse_json(io::read_file(mp), what + ": " + mp);
  if (!meta.is_object()) fail(what, ": ", mp, ": not a JSON object (corrupt)");
  auto bad = [&](const std::string& field, const std::string& problem) {
    fail(what, ": ", mp, ": ", field, ": ", problem, " (prepare the folder again with `snip data prepare --force`)");
  };
  auto at = [&](const json& j, const std::string& key, const std::string& field) -> const json& {
    if (!j.is_object() || !j.contains(key)) bad(field, "missing");
    return j[key];
  };
  auto string_at = [&](const json& j, const std::string& key, const std::string& field) {
    const json& v = at(j, key, field);
    if (!v.is_string()) bad(field, "expected a string");
    return v.get<std::string>();
  };
  auto unsigned_at = [&](const json& j, const std::string& key, const std::string& field) {
    const json& v = at(j, key, field);
    if (!v.is_number_unsigned()) bad(field, "expected a non-negative integer");
    return v.get<uint64_t>();
  };
  if (string_at(meta, "format", "format") != "snip-data") bad("format", "expected \"snip-data\"");
  if (unsigned_at(meta, "version", "version") != 2) bad("version", "expected 2 (written by another snip version)");
  const uint64_t vocab = unsigned_at(meta, "vocab_size", "vocab_size");
  if (vocab < 1 || vocab > 0x7FFFFFFFu) bad("vocab_size", "expected an integer in [1, 2^31)");
  DataFolderInfo info;
  info.vocab_size = static_cast<uint32_t>(vocab);
  for (const char* key : {"bos_id", "eos_id"}) {
    const json& v = at(meta, key, key);
    if (!v.is_number_integer() || v.get<int64_t>() < -1 || v.get<int64_t>() >= int64_t(vocab))
      bad(key, str_cat("expected -1 or an id in [0, ", vocab, ")"));
    (std::string(key) == "bos_id" ? info.bos_id : info.eos_id) = v.get<int64_t>();
  }
  // A file named by meta.json: a plain name inside the folder.
  auto file_in_folder = [&](const std::string& name, const std::string& field) {
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos)
      bad(field, "expected a file name inside the folder, got '" + name + "'");
    const fs::path p = dir / name;
    if (!fs::is_regular_file(p)) fail(what, ": ", p.string(), ": missing (", mp, " names it in ", field, ")");
    return p.string();
  };
  const json& shards = at(meta, "shards", "shards");
  const json& tokens = at(meta, "tokens", "tokens");
  for (const char* split : {"train", "val"}) {
    const std::string sf = std::string("shards.") + split;
    const json& s = at(shards, split, sf);
    const std::string path = file_in_folder(string_at(s, "path", sf + ".path"), sf + ".path");
    const ShardReader r(path);
    const std::string dt = string_at(s, "dtype", sf + ".dtype");
    if (dt != dtype_name(r.dtype()))
      fail(what, ": ", path, ": token dtype ", dtype_name(r.dtype()), " but ", mp, " says ", sf, ".dtype = ", dt);
    if (r.vocab_size() != info.vocab_size)
      fail(what, ": ", path, ": vocabulary ", r.vocab_size(), " but ", mp, " says vocab_size = ", vocab,
           " (the shard and the tokenizer come from different preparations)");
    const uint64_t n = unsigned_at(tokens, split, std::string("tokens.") + split);
    if (r.size() != n)
      fail(what, ": ", path, ": ", r.size(), " tokens but ", mp, " says tokens.", split, " = ", n);
    info.dtype = r.dtype();
    (std::string(split) == "train" ? info.train_tokens : info.val_tokens) = n;
  }
  if (meta.contains("unk_id")) {
    const json& v = meta["unk_id"];
    if (!v.is_number_integer() || v.get<int64_t>() < -1 || v.get<int64_t>() >= int64_t(vocab))
      bad("unk_id", str_cat("expected -1 or an id in [0, ", vocab, ")"));
    info.unk_id = v.get<int64_t>();
  } else {
    info.unk_id = 0;  // SentencePiece's default, what prepare always had
  }
  if (meta.contains("special_pieces")) {
    const json& sp = meta["special_pieces"];
    if (!sp.is_object()) bad("special_pieces", "expected an object");
    for (auto [key, out] : {std::pair<const char*, std::string*>{"bos", &info.bos_piece},
                            {"eos", &info.eos_piece}, {"unk", &info.unk_piece}}) {
      if (!sp.contains(key) || sp[key].is_null()) continue;
      if (!sp[key].is_string()) bad(std::string("special_pieces.") + key, "expected a string or null");
      *out = sp[key].get<std::string>();
    }
  } else {
    if (info.bos_id == 1) info.bos_piece = "<s>";
    if (info.eos_id == 2) info.eos_piece = "</s>";
    if (info.unk_id == 0) info.unk_piece = "<unk>";
  }
  const json& tok = at(meta, "tokenizer", "tokenizer");
  const std::string tp = file_in_folder(string_at(tok, "path", "tokenizer.path"), "tokenizer.path");
  const std::string want = string_at(tok, "sha256", "tokenizer.sha256");
  info.tokenizer_sha256 = sha256_hex(io::read_file(tp));
  info.tokenizer_path = tp;
  if (info.tokenizer_sha256 != want)
    fail(what, ": ", tp, ": SHA-256 ", info.tokenizer_sha256, " differs from ", mp, "'s tokenizer.sha256 ", want,
         " (the tokenizer was replaced after the shards were made; prepare the folder again)");
  return info;
}

std::string prepare_hint(const std::string& dir) {
  return "`snip data prepare --input YOUR_TEXT --out " + dir + "` (or `snip data prepare --out " + dir +
         "` for the built-in KJV corpus)";
}

}  // namespace snip::data
