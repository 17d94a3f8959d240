// src/data/rng.h (private): seeded permutations that are identical on every
// platform and standard library. std::shuffle and std::uniform_int_distribution
// are implementation-defined (libstdc++ and libc++ give different orders), so
// the validation split and the loader's epoch order would change with the
// toolchain; std::mt19937_64's output sequence, by contrast, is fixed by the
// C++ standard ([rand.eng.mers], 10000th value 9981545732273789042).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace snip::data::detail {

/// SplitMix64 finalizer (Steele, Lea, Flood 2014): a bijective 64-bit mix
/// used to derive independent stream keys from (seed, epoch).
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// Key of the stream for (seed, salt): distinct salts give unrelated streams.
inline uint64_t stream_key(uint64_t seed, uint64_t salt) { return splitmix64(splitmix64(seed) ^ splitmix64(~salt)); }

/// Uniform integer in [0, bound) by rejection (no modulo bias); bound >= 1.
inline uint64_t uniform_below(std::mt19937_64& g, uint64_t bound) {
  const uint64_t limit = -bound % bound;  // 2^64 mod bound: values below it are rejected
  for (;;) {
    const uint64_t r = g();
    if (r >= limit) return r % bound;
  }
}

/// A permutation of 0..n-1 by Fisher-Yates (Knuth vol. 2, Algorithm 3.4.2 P)
/// driven by mt19937_64 seeded with `key`.
template <typename Index = uint64_t>
std::vector<Index> seeded_permutation(uint64_t n, uint64_t key) {
  std::vector<Index> p(n);
  for (uint64_t i = 0; i < n; ++i) p[i] = static_cast<Index>(i);
  std::mt19937_64 g(key);
  for (uint64_t i = n; i > 1; --i) {
    const uint64_t j = uniform_below(g, i);
    std::swap(p[i - 1], p[j]);
  }
  return p;
}

}  // namespace snip::data::detail
