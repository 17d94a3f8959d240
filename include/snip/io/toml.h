// snip/io/toml.h: TOML text from outside snip (run configurations, recipe
// files), bounded before toml++ parses it and, for recipe files, turned into
// the JSON tree the rest of snip reads, with the checks io::parse_json makes.
#pragma once

#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

namespace snip::io {

/// Deepest nesting a TOML document may have: tables from headers and dotted
/// keys, arrays and inline tables together. snip's options are section.key
/// (2), list options arrays (3); recipe files recipes.NAME.operands.OP.key (5).
constexpr size_t kMaxTomlDepth = 64;

/// toml++ builds and destroys nested tables recursively and bounds only the
/// nesting of arrays and inline tables, not the parts of a dotted key: a
/// header [a.a. ... .a] of 31,287 parts overflowed the stack (SIGSEGV). This
/// lexical pass over `text` bounds the depth before toml++ sees it: per
/// statement, the dotted parts of its key (after its table header's) plus
/// the arrays and inline tables open around it. Strings and comments are
/// skipped; syntax errors are left to toml++ (the bound only over-counts).
/// Throws UserError "<what>:<line>: expected tables, dotted keys, arrays and
/// inline tables nested at most 64 deep, got more".
void check_toml_depth(const std::string& text, const std::string& what);

/// `text`, one TOML document, as a JSON object: tables become objects,
/// arrays arrays, strings, booleans, integers and floats themselves. Throws
/// UserError, one line, starting with `source`:
///   "<source>:<line>:<column>: TOML syntax error: <toml++'s reason>"
///   "<source>: <key path>: expected a finite number, got nan"   (nan, inf)
///   "<source>: <key path>: expected a string, number, boolean, table or
///    array, got a date/time"
/// and check_toml_depth's message. toml++ itself refuses a key defined twice.
nlohmann::json parse_toml_as_json(const std::string& text, const std::string& source);

}  // namespace snip::io
