// Input expansion and document reading; rules in src/data/corpus.h.
#include "corpus.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "snip/io/atomic_file.h"
#include "snip/core/error.h"

namespace fs = std::filesystem;

namespace snip::data {
namespace {

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v'; }

std::string_view rtrim(std::string_view s) {
  while (!s.empty() && is_ws(s.back())) s.remove_suffix(1);
  return s;
}

bool has_jsonl_ext(const fs::path& p) { return p.extension() == ".jsonl"; }

InputFile make_input(const fs::path& p, InputKind kind) {
  InputFile f;
  f.path = p.string();
  f.kind = kind;
  std::error_code ec;
  f.bytes = fs::file_size(p, ec);
  if (ec) fail("cannot read input file ", f.path, ": ", ec.message());
  const auto t = fs::last_write_time(p, ec);
  if (!ec) f.mtime_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  return f;
}

void check_utf8(std::string_view text, const std::string& path) {
  const size_t bad = find_invalid_utf8(text);
  if (bad != std::string::npos) {
    static const char* hex = "0123456789abcdef";
    const auto b = static_cast<unsigned char>(text[bad]);
    fail("input file ", path, ": not UTF-8 text (invalid byte 0x", hex[b >> 4], hex[b & 15], " at offset ", bad,
         "); expected plain UTF-8 text or .jsonl");
  }
}

std::string json_type(const nlohmann::json& j) { return j.type_name(); }

}  // namespace

namespace {
constexpr std::string_view kUtf8Bom = "\xEF\xBB\xBF";  // U+FEFF as a byte-order mark
}  // namespace

void normalize_text(std::string& text, const std::string& what, bool at_file_start) {
  const size_t nul = text.find('\0');
  if (nul != std::string::npos) fail(what, ": NUL byte at offset ", nul, "; expected plain UTF-8 text");
  size_t from = 0;
  if (at_file_start && text.compare(0, kUtf8Bom.size(), kUtf8Bom) == 0) from = kUtf8Bom.size();
  if (from == 0 && text.find('\r') == std::string::npos) return;
  std::string out;
  out.reserve(text.size() - from);
  for (size_t i = from; i < text.size(); ++i) {
    if (text[i] != '\r') {
      out.push_back(text[i]);
    } else {
      out.push_back('\n');
      if (i + 1 < text.size() && text[i + 1] == '\n') ++i;  // CRLF: one line end
    }
  }
  text.swap(out);
}

bool has_text(std::string_view text) {
  return std::any_of(text.begin(), text.end(), [](char c) { return !is_ws(c); });
}

size_t find_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // no overlong 3-byte forms
      if (c == 0xED) hi = 0x9F;  // no UTF-16 surrogates D800-DFFF
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;  // no overlong 4-byte forms
      if (c == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
    } else {
      return i;  // C0, C1 (overlong 2-byte), F5..FF, or a stray continuation byte
    }
    if (i + len > n) return i;
    if (p[i + 1] < lo || p[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k)
      if ((p[i + k] & 0xC0) != 0x80) return i;
    i += len;
  }
  return std::string::npos;
}

std::vector<InputFile> list_input_files(const std::string& path) {
  std::error_code ec;
  const fs::path root(path);
  const auto st = fs::status(root, ec);
  if (ec || !fs::exists(st)) fail("input path ", path, " does not exist");
  std::vector<InputFile> files;
  if (fs::is_regular_file(st)) {
    files.push_back(make_input(root, has_jsonl_ext(root) ? InputKind::kJsonl : InputKind::kBlankLines));
    return files;
  }
  if (!fs::is_directory(st)) fail("input path ", path, " is not a regular file or a folder");
  std::vector<fs::path> found;
  fs::recursive_directory_iterator it(root, ec), end;
  if (ec) fail("cannot list input folder ", path, ": ", ec.message());
  for (; it != end; it.increment(ec)) {
    if (ec) fail("cannot list input folder ", path, ": ", ec.message());
    const std::string name = it->path().filename().string();
    if (!name.empty() && name[0] == '.') {
      if (it->is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file(ec)) found.push_back(it->path());
  }
  if (found.empty()) fail("input folder ", path, " contains no files");
  std::sort(found.begin(), found.end(), [](const fs::path& a, const fs::path& b) { return a.string() < b.string(); });
  for (const auto& p : found) files.push_back(make_input(p, has_jsonl_ext(p) ? InputKind::kJsonl : InputKind::kWholeFile));
  return files;
}

void split_at_blank_lines(std::string_view text, std::vector<std::string>& out) {
  size_t doc_begin = std::string_view::npos;  // start of the current document
  size_t doc_end = 0;                         // end of its last non-blank line
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    const std::string_view line = text.substr(pos, eol - pos);
    if (has_text(line)) {
      if (doc_begin == std::string_view::npos) doc_begin = pos;
      doc_end = eol;
    } else if (doc_begin != std::string_view::npos) {
      out.emplace_back(rtrim(text.substr(doc_begin, doc_end - doc_begin)));
      doc_begin = std::string_view::npos;
    }
    pos = eol + 1;
  }
  if (doc_begin != std::string_view::npos) out.emplace_back(rtrim(text.substr(doc_begin, doc_end - doc_begin)));
}

void read_documents(const InputFile& file, const std::string& text_field, std::vector<std::string>& out) {
  if (file.kind != InputKind::kJsonl) {
    std::string text = io::read_file(file.path);
    check_utf8(text, file.path);
    normalize_text(text, "input file " + file.path, /*at_file_start=*/true);
    if (file.kind == InputKind::kBlankLines) {
      split_at_blank_lines(text, out);
    } else if (has_text(text)) {
      out.emplace_back(rtrim(text));
    }
    return;
  }
  std::ifstream in(file.path, std::ios::binary);
  if (!in) fail("cannot read input file ", file.path);
  std::string line;
  size_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (lineno == 1 && line.compare(0, kUtf8Bom.size(), kUtf8Bom) == 0) line.erase(0, kUtf8Bom.size());
    if (!has_text(line)) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      std::string msg = e.what();
      const size_t close = msg.find("] ");
      if (close != std::string::npos) msg = msg.substr(close + 2);
      fail(file.path, ":", lineno, ": invalid JSON (", msg, ")");
    }
    if (!j.is_object()) fail(file.path, ":", lineno, ": expected a JSON object, found ", json_type(j));
    const auto f = j.find(text_field);
    if (f == j.end()) fail(file.path, ":", lineno, ": expected a string field \"", text_field, "\", found none (set --text-field)");
    if (!f->is_string())
      fail(file.path, ":", lineno, ": expected field \"", text_field, "\" to be a string, found ", json_type(*f));
    std::string s = f->get_ref<const std::string&>();
    normalize_text(s, file.path + ":" + std::to_string(lineno) + ": field \"" + text_field + "\"", false);
    if (has_text(s)) out.emplace_back(rtrim(s));
  }
  if (in.bad()) fail("cannot read input file ", file.path);
}

}  // namespace snip::data
