// snip/io/json.h: JSON files (plans, stats, summaries, cost tables), read
// and written whole, and the one strict parser every JSON document a user
// hands snip goes through.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace snip::io {

/// Deepest nesting of arrays and objects parse_json accepts. snip's own
/// files nest at most 5 levels; the bound keeps every recursive walk over a
/// parsed value (nlohmann's dump(), error messages) far from the stack's end.
constexpr size_t kMaxJsonDepth = 128;

/// Parses `text`, one JSON document from outside snip; `source` (a path)
/// starts every message. Stricter than nlohmann::json::parse, and no
/// library exception gets out: throws UserError, one line,
///   "<source>: expected valid JSON, got a syntax error: <nlohmann's reason>"
///   "<source>: <where>: expected each key once, got \"k\" twice"
///   "<source>: <where>: expected at most 128 nested arrays/objects, got more"
///   "<source>: <where>: expected a number a double can hold (|x| <= 1.8e308), got 1e309"
/// where <where> is the JSON path of the object or value ("layers[1].q",
/// "(top level)"). nlohmann keeps the last of duplicate keys silently, and
/// throws out_of_range, not parse_error, for an overflowing number.
nlohmann::json parse_json(std::string_view text, const std::string& source);

/// A short one-line rendering of `v` for "got ..." messages: its compact
/// JSON, cut to `max` characters with "..." (values parse_json returns nest
/// at most kMaxJsonDepth deep, so rendering them is safe).
std::string json_excerpt(const nlohmann::json& v, size_t max = 40);

/// Writes `j` (indented 2, newline-terminated) to `path` atomically
/// (write_file_atomic: temporary file in the same folder, fsync, rename). On
/// failure nothing new is left at `path` or beside it; throws UserError naming
/// the path and the OS error.
void save_json_atomic(const nlohmann::json& j, const std::string& path);

/// The JSON document in `path`, through parse_json. Throws UserError
/// "<path>: cannot read ..." or parse_json's messages; `what` ("plan",
/// "stats") names the kind of file in the syntax-error message.
nlohmann::json read_json_file(const std::string& path, const std::string& what);

}  // namespace snip::io
