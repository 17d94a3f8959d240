// snip/core/strings.h: small string helpers shared by the parsers and the
// command line (header-only).
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

namespace snip {

/// Levenshtein distance (insertions, deletions, substitutions, each 1)
/// between `a` and `b`: what "did you mean ..." suggestions rank by.
inline size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1] ? 1 : 0)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace snip
