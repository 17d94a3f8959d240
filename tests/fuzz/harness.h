// tests/fuzz/harness.h: what every snip fuzz target shares. A target hands
// the input to one parser; snip::UserError is the documented clean
// rejection. Anything else that escapes (SNIP_CHECK's std::logic_error, an
// nlohmann or toml++ exception the parser did not wrap, std::bad_alloc) is
// what the CLI would print as `snip: internal error: ...` (exit 3): the
// harness prints it so and aborts, which libFuzzer records as a crash with
// the input. Sanitizer reports and signals end the run by themselves.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>

#include "snip/core/error.h"

namespace snip::fuzz {

/// Runs `parse(input)`; returns normally when it succeeds or throws
/// UserError, aborts on any other exception.
template <typename F>
void guarded(const uint8_t* data, size_t size, F&& parse) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  try {
    parse(input);
  } catch (const UserError&) {
    // The clean rejection: `snip: error: ...`, exit 2.
  } catch (const std::exception& e) {
    std::fprintf(stderr, "snip: internal error: %s\n", e.what());
    std::abort();
  } catch (...) {
    std::fprintf(stderr, "snip: internal error: unknown exception\n");
    std::abort();
  }
}

/// The input as a file, for parsers that read a path: one in-memory file
/// per process (memfd), rewritten for each input; returns its name,
/// /proc/self/fd/N.
inline std::string input_as_file(const uint8_t* data, size_t size) {
  static const int fd = memfd_create("fuzz-input", 0);
  if (fd < 0 || ftruncate(fd, 0) != 0 || (size && pwrite(fd, data, size, 0) != ssize_t(size))) std::abort();
  return "/proc/self/fd/" + std::to_string(fd);
}

/// A property the parser promises (a round trip) did not hold.
[[noreturn]] inline void finding(const char* what) {
  std::fprintf(stderr, "fuzz finding: %s\n", what);
  std::abort();
}

}  // namespace snip::fuzz
