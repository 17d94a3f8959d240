// The built-in Debian corpora: the King James Bible (`bible -f`) and
// WordNet's glosses. Formats and sources in src/data/debian_corpus.h.
#include "debian_corpus.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include <sys/wait.h>

#include "snip/io/atomic_file.h"
#include "snip/core/error.h"

namespace fs = std::filesystem;

namespace snip::data {
namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_alpha(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }

// Output of a shell command (stdout only) and its exit status.
std::string run_command(const std::string& cmd, int& status) {
  std::unique_ptr<FILE, int (*)(FILE*)> p(::popen(cmd.c_str(), "r"), ::pclose);
  if (!p) fail("cannot run ", cmd);
  std::string out;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p.get())) > 0) out.append(buf, n);
  const int rc = ::pclose(p.release());
  status = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + (WIFSIGNALED(rc) ? WTERMSIG(rc) : 0);
  return out;
}

// Appends `text` to `doc` with single spaces between words.
void append_words(std::string& doc, std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && (text[i] == ' ' || text[i] == '\t' || text[i] == '\r')) ++i;
    size_t j = i;
    while (j < text.size() && text[j] != ' ' && text[j] != '\t' && text[j] != '\r') ++j;
    if (j > i) {
      if (!doc.empty()) doc += ' ';
      doc.append(text.substr(i, j - i));
    }
    i = j;
  }
}

}  // namespace

std::vector<std::string> kjv_chapters(std::string_view out) {
  std::vector<std::string> docs;
  std::string prev_chapter;  // "Ge1"
  size_t line_no = 0, pos = 0;
  while (pos < out.size()) {
    size_t end = out.find('\n', pos);
    if (end == std::string_view::npos) end = out.size();
    const std::string_view line = out.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (line.empty()) continue;
    // Reference: optional book number 1-3, letters, chapter digits, ':', verse digits.
    size_t i = 0;
    if (i < line.size() && line[i] >= '1' && line[i] <= '3') ++i;
    const size_t letters = i;
    while (i < line.size() && is_alpha(line[i])) ++i;
    const size_t chap = i;
    while (i < line.size() && is_digit(line[i])) ++i;
    const size_t colon = i;
    bool ok = i > letters && chap > letters && colon > chap && i < line.size() && line[i] == ':';
    if (ok) {
      ++i;
      const size_t v = i;
      while (i < line.size() && is_digit(line[i])) ++i;
      ok = i > v && (i == line.size() || line[i] == ' ');
    }
    if (!ok)
      fail("bible -f output, line ", line_no, ": expected a verse reference such as \"Ge1:1\" at its start, got \"",
           std::string(line.substr(0, 40)), "\"");
    const std::string chapter(line.substr(0, colon));
    if (chapter != prev_chapter) {
      docs.emplace_back();
      prev_chapter = chapter;
    }
    append_words(docs.back(), line.substr(i));
  }
  return docs;
}

std::vector<std::string> read_kjv() {
  if (std::system("command -v bible >/dev/null 2>&1") != 0)
    fail("the King James Bible needs Debian's ", kKjvPackages, " (apt-get install bible-kjv; scripts/setup.sh "
         "installs it), or pass --input PATH");
  int status = 0;
  const std::string out = run_command("bible -f Gen1:1-Rev22:21 2>/dev/null", status);
  if (status != 0) fail("bible -f Gen1:1-Rev22:21 failed (exit status ", status, "): reinstall ", kKjvPackages);
  size_t verses = 0;
  for (char c : out) verses += c == '\n';
  auto docs = kjv_chapters(out);
  if (verses != size_t(kKjvVerses) || docs.size() != size_t(kKjvChapters))
    fail("bible -f Gen1:1-Rev22:21 printed ", verses, " verses in ", docs.size(), " chapters, expected ", kKjvVerses,
         " in ", kKjvChapters, ": reinstall ", kKjvPackages);
  return docs;
}

std::string wordnet_document(std::string_view line, const std::string& where) {
  if (line.empty() || line.rfind("  ", 0) == 0) return "";
  const size_t bar = line.find(" | ");
  if (bar == std::string_view::npos) fail(where, ": expected a gloss after \" | \" on a synset line");
  // synset_offset lex_filenum ss_type w_cnt word lex_id [word lex_id ...] ...
  std::vector<std::string_view> f;
  size_t i = 0;
  const std::string_view head = line.substr(0, bar);
  while (i < head.size() && f.size() < 4) {
    size_t j = head.find(' ', i);
    if (j == std::string_view::npos) j = head.size();
    f.push_back(head.substr(i, j - i));
    i = j + 1;
  }
  if (f.size() < 4) fail(where, ": expected synset_offset lex_filenum ss_type w_cnt before the words");
  char* endp = nullptr;
  const std::string cnt(f[3]);
  const long w_cnt = std::strtol(cnt.c_str(), &endp, 16);
  if (endp == cnt.c_str() || *endp != '\0' || w_cnt < 1)
    fail(where, ": expected w_cnt as two hex digits, got \"", cnt, "\"");
  std::string doc;
  for (long w = 0; w < w_cnt; ++w) {
    size_t j = head.find(' ', i);
    if (j == std::string_view::npos) fail(where, ": declares ", w_cnt, " words but holds ", w);
    std::string word(head.substr(i, j - i));
    i = head.find(' ', j + 1);  // skip lex_id
    if (i == std::string_view::npos) fail(where, ": word ", w + 1, " has no lex_id");
    ++i;
    if (const size_t paren = word.find('('); paren != std::string::npos && word.back() == ')') word.resize(paren);
    for (char& c : word) c = c == '_' ? ' ' : c;
    doc += (w ? ", " : "") + word;
  }
  doc += ": ";
  std::string gloss;
  append_words(gloss, line.substr(bar + 3));
  return doc + gloss;
}

std::vector<std::string> read_wordnet(const std::string& dir) {
  std::vector<std::string> docs;
  for (const char* pos : {"noun", "verb", "adj", "adv"}) {
    const std::string path = (fs::path(dir) / (std::string("data.") + pos)).string();
    std::error_code ec;
    if (!fs::is_regular_file(path, ec))
      fail("WordNet's ", path, " is missing: apt-get install ", kWordnetPackage,
           " (scripts/setup.sh installs it), or pass --input PATH");
    const std::string text = io::read_file(path);
    size_t pos0 = 0, line_no = 0;
    while (pos0 < text.size()) {
      size_t end = text.find('\n', pos0);
      if (end == std::string::npos) end = text.size();
      ++line_no;
      std::string d = wordnet_document(std::string_view(text).substr(pos0, end - pos0),
                                       path + ":" + std::to_string(line_no));
      if (!d.empty()) docs.push_back(std::move(d));
      pos0 = end + 1;
    }
  }
  return docs;
}

std::string debian_package_version(const std::string& package) {
  int status = 0;
  std::string v = run_command("dpkg-query -W -f='${Version}' " + package + " 2>/dev/null", status);
  return status == 0 ? v : "";
}

}  // namespace snip::data
