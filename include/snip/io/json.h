// snip/io/json.h: JSON files (plans, stats, summaries, cost tables), read
// and written whole.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace snip::io {

/// Writes `j` (indented 2, newline-terminated) to `path` atomically
/// (write_file_atomic: temporary file in the same folder, fsync, rename). On
/// failure nothing new is left at `path` or beside it; throws UserError naming
/// the path and the OS error.
void save_json_atomic(const nlohmann::json& j, const std::string& path);

/// The JSON document in `path`. Throws UserError "<path>: cannot read ..." or
/// "<path>: not valid JSON (line L, column C: ...)"; `what` ("plan", "stats")
/// names the kind of file in the message.
nlohmann::json read_json_file(const std::string& path, const std::string& what);

}  // namespace snip::io
