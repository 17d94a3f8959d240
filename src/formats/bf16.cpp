// FP32 -> BF16 -> FP32 rounding in one pass (see bf16.h).
#include "snip/formats/bf16.h"

#include "fast_math.h"

namespace snip::formats {

namespace {

SNIP_CLONES void round_span(const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = fast::bits_of(x[i]);
    const uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    y[i] = fast::float_of((u & fast::kAbsMask) > fast::kInfBits ? fast::kCanonicalNaN : r);
  }
}

}  // namespace

void round_to_bf16(const float* x, float* y, int64_t n) {
  constexpr int64_t kChunk = 1 << 14;  // 64 KiB of FP32 per task
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  // One thread for small arrays: a parallel region costs more than it saves.
#pragma omp parallel for schedule(static) if (n >= 4 * kChunk)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t b = c * kChunk;
    round_span(x + b, y + b, (n - b) < kChunk ? (n - b) : kChunk);
  }
}

}  // namespace snip::formats
