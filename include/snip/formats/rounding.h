// snip/formats/rounding.h: the random bits behind stochastic rounding.
//
// Stochastic rounding draws one 32-bit word per element from Philox4x32-10
// (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3",
// SC'11; the generator of cuRAND, PyTorch and JAX), a counter-based
// generator: the word is a pure function of (key, counter), so results do not
// depend on the number of threads, the order of work, or the fast/reference
// path. Counter and key layout (injective, so no two streams overlap):
//
//   key     = (seed mod 2^32, seed >> 32)
//   counter = (c0, c1, c2, c3) with
//     c0 = (index / 4) mod 2^32, c1 = (index / 4) >> 32 | operand << 24,
//     c2 = step, c3 = layer
//   word    = output[index mod 4]
//
// where `index` = row * cols + col is the element's position in the
// row-major [rows, cols] operand passed to fake_quantize. Ranges: step and
// layer < 2^32, operand < 256, index < 2^58.
#pragma once

#include <array>
#include <cstdint>

#include "snip/formats/hd.h"

namespace snip::formats {

/// What identifies one quantization call for stochastic rounding.
struct RoundingKey {
  uint64_t seed = 0;     ///< run seed
  uint64_t step = 0;     ///< optimizer step, < 2^32
  uint64_t layer = 0;    ///< linear-layer index, < 2^32
  uint32_t operand = 0;  ///< GEMM operand id (Operand), < 256
};

/// Throws std::invalid_argument if a field of `key` is out of range.
void check_rounding_key(const RoundingKey& key);

/// One Philox4x32-10 block: 10 rounds of the Philox S-box on the 128-bit
/// counter with the 64-bit key (Random123 philox4x32_R with R = 10).
/// Constants from the paper: multipliers 0xD2511F53, 0xCD9E8D57; Weyl key
/// increments 0x9E3779B9 (golden ratio), 0xBB67AE85 (sqrt(3) - 1).
/// Known answer (Random123 kat_vectors): counter 0, key 0 ->
/// {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}.
SNIP_HD inline std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> ctr,
                                                     std::array<uint32_t, 2> key) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key[0] += kW0;
      key[1] += kW1;
    }
    const uint64_t p0 = uint64_t(kM0) * ctr[0];
    const uint64_t p1 = uint64_t(kM1) * ctr[2];
    ctr = {uint32_t(p1 >> 32) ^ ctr[1] ^ key[0], uint32_t(p1),
           uint32_t(p0 >> 32) ^ ctr[3] ^ key[1], uint32_t(p0)};
  }
  return ctr;
}

/// The 32 random bits of element `index` under `key` (layout above).
SNIP_HD inline uint32_t random_bits(const RoundingKey& key, uint64_t index) {
  const uint64_t block = index >> 2;
  const std::array<uint32_t, 4> out = philox4x32_10(
      {uint32_t(block), uint32_t(block >> 32) | (key.operand << 24), uint32_t(key.step),
       uint32_t(key.layer)},
      {uint32_t(key.seed), uint32_t(key.seed >> 32)});
  return out[index & 3];
}

/// The uniform draw u in [0, 1) that stochastic rounding compares against:
/// u = (bits >> 8) * 2^-24, exact in FP32.
SNIP_HD inline float uniform_from_bits(uint32_t bits) { return float(bits >> 8) * 0x1p-24f; }

}  // namespace snip::formats
