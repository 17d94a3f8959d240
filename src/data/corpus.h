// src/data/corpus.h: turning input paths into documents (plain UTF-8 text).
//
// Rules for an `--input PATH` (documented for `snip data prepare`):
//   - PATH is a folder: every regular file under it, recursively, in sorted
//     path order (byte-wise, so the result does not depend on the file
//     system); names starting with '.' (files or folders) are skipped.
//     A `*.jsonl` file is read as JSONL (below); any other file is ONE
//     document (its whole text).
//   - PATH is a `*.jsonl` file: JSONL.
//   - PATH is any other file: split into documents at blank lines (a blank
//     line is empty or whitespace-only; one or more of them separate two
//     documents). This suits one large file of paragraphs or articles.
//   - JSONL: one JSON object per line; the document is the string field
//     `text_field` (default "text"). Blank lines are skipped. A line that is
//     not valid JSON, not an object, or lacks a string `text_field` is a
//     UserError naming `file:line`.
// Every document has its trailing whitespace removed; documents with no
// non-whitespace character are dropped. Text must be valid UTF-8 (a binary
// file in a folder is a UserError naming it, not silently tokenized).
// Normalisation at read (normalize_text): a UTF-8 byte-order mark (EF BB BF)
// at the start of a file is dropped; CRLF and a lone CR are line ends, read
// as LF (in text files and in JSONL text values); a NUL byte is rejected
// (UserError naming the file and byte offset, or file:line for JSONL), as is
// invalid UTF-8: nothing is replaced silently.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace snip::data {

/// How one input file is read.
enum class InputKind {
  kWholeFile,    ///< one document (a file found inside a folder)
  kBlankLines,   ///< split at blank lines (a text file given directly)
  kJsonl,        ///< one JSON object per line
};

/// One file to read, with what identifies its content for up-to-date checks.
struct InputFile {
  std::string path;      ///< as found (input path joined with the relative name)
  InputKind kind;
  uint64_t bytes = 0;    ///< file size in bytes
  int64_t mtime_ns = 0;  ///< last modification time, ns since the file-clock epoch
};

/// Expands one input path into its files (rules above). Throws UserError
/// "input path <p> does not exist" / "... is not a file or folder" /
/// "input folder <p> contains no files".
std::vector<InputFile> list_input_files(const std::string& path);

/// Appends the documents of `file` to `out` (rules above). Throws UserError
/// naming the file (and line for JSONL) on unreadable files, invalid UTF-8,
/// bad JSON or a missing/non-string `text_field`.
void read_documents(const InputFile& file, const std::string& text_field, std::vector<std::string>& out);

/// Splits `text` into documents at blank lines (rule above), appending the
/// non-empty ones, trailing whitespace removed, to `out`.
void split_at_blank_lines(std::string_view text, std::vector<std::string>& out);

/// Normalises text read from `what` (a file name, or "file:line") in place:
/// drops a leading UTF-8 BOM when `at_file_start`, turns CRLF and lone CR
/// into LF. Throws UserError "<what>: NUL byte at offset N" (N counted in
/// the text as given, before normalisation).
void normalize_text(std::string& text, const std::string& what, bool at_file_start);

/// True if `text` has a character other than ASCII whitespace.
bool has_text(std::string_view text);

/// Byte offset of the first invalid UTF-8 sequence in `text` (overlong
/// forms, surrogates and code points above U+10FFFF are invalid, RFC 3629
/// section 3), or std::string::npos if `text` is valid UTF-8.
size_t find_invalid_utf8(std::string_view text);

}  // namespace snip::data
