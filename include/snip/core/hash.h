// snip/core/hash.h: FNV-1a, the one non-cryptographic hash snip uses (cross-
// rank agreement of settings and weights, stable colours in the report).
// Fowler, Noll, Vo: the offset bases and primes of
// http://www.isthe.com/chongo/tech/comp/fnv/ ("FNV-1a"): 64-bit basis
// 14695981039346656037 (0xcbf29ce484222325), prime 1099511628211
// (0x100000001b3); 32-bit basis 2166136261, prime 16777619. Not for
// checksums of files (CRC-32) or identities (SHA-256, data/data_folder.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace snip {

/// FNV-1a 64 of `n` bytes at `data`; `h` continues an earlier hash.
inline uint64_t fnv1a64(const void* data, size_t n, uint64_t h = 0xcbf29ce484222325ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}
inline uint64_t fnv1a64(std::string_view s) { return fnv1a64(s.data(), s.size()); }

/// FNV-1a 32 of the bytes of `s`.
inline uint32_t fnv1a32(std::string_view s) {
  uint32_t h = 2166136261u;
  for (unsigned char c : s) h = (h ^ c) * 16777619u;
  return h;
}

}  // namespace snip
