// JSON files (see json.h).
#include "snip/io/json.h"

#include "snip/io/atomic_file.h"
#include "snip/util/error.h"

namespace snip::io {

void save_json_atomic(const nlohmann::json& j, const std::string& path) {
  write_file_atomic(path, j.dump(2) + "\n");
}

nlohmann::json read_json_file(const std::string& path, const std::string& what) {
  const std::string text = read_file(path);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    fail(path, ": not a valid ", what, " JSON file (", e.what(), ")");
  }
}

}  // namespace snip::io
