// snip/core/error.h: the two kinds of failure snip distinguishes.
//
// UserError: bad input from a person (config field, missing file, corrupt
// checkpoint, infeasible budget). Its message is ONE line that names the file
// or field, what was expected and what was found ("expected X, got Y"), and,
// where useful, what to do. The CLI prints it as `snip: error: <message>` and
// exits with status 2, never with a stack dump.
//
// Internal invariants use SNIP_CHECK, which throws std::logic_error naming the
// broken condition, file and line (c10's TORCH_INTERNAL_ASSERT habit).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace snip {

/// A user-facing error: one line, names what and where. Exit status 2.
class UserError : public std::runtime_error {
 public:
  explicit UserError(const std::string& msg) : std::runtime_error(msg) {}
};

namespace detail {
inline void concat_into(std::ostringstream&) {}
template <typename T, typename... Rest>
void concat_into(std::ostringstream& os, const T& v, const Rest&... rest) {
  os << v;
  concat_into(os, rest...);
}
}  // namespace detail

/// Concatenates its arguments with operator<< into one string.
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  detail::concat_into(os, args...);
  return os.str();
}

/// Throws UserError with the concatenated message.
template <typename... Args>
[[noreturn]] void fail(const Args&... args) {
  throw UserError(str_cat(args...));
}

}  // namespace snip

/// Internal invariant check: throws std::logic_error("internal error: ...").
#define SNIP_CHECK(cond, ...)                                                  \
  do {                                                                         \
    if (!(cond))                                                               \
      throw std::logic_error(::snip::str_cat("internal error: ", #cond,        \
                                             " failed at ", __FILE__, ":",     \
                                             __LINE__, ": ", ##__VA_ARGS__)); \
  } while (0)
