// The fast fake-quantization path.
//
// Work split: OpenMP over rows (static schedule; results never depend on
// it). For 1xN tiles and per-row scales each row is self-contained: block
// amax, block scale and quantization happen while the row is in cache. For
// 2-D blocks, per-tensor scales and NVFP4 (whose tensor scale needs the
// whole tensor first) a first parallel pass stores per-row block amaxes
// (1/BC of the data), reduced per block band and to the tensor amax; then
// the scale grid; then the rows are quantized. `x` and `y` may be the same
// array: every loop reads x[i] before writing y[i] at the same index only
// (`omp simd` asserts no loop-carried dependence, so no restrict is needed).
//
// Inner loops are branch-free FP32/uint32 code that GCC/Clang vectorise at
// -O3; on x86-64 the row kernels are compiled for AVX-512, AVX2 and the
// SSE2 baseline and picked at load time (target_clones), so the library
// itself needs no -march flag. FMA contraction is off (CMake), so every
// clone rounds exactly like the reference path.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "fast_math.h"
#include "fq_common.h"
#include "snip/formats/fake_quant.h"

namespace snip::formats {
namespace detail {
BlockScale delayed_call_scale(const DelayedScaling& state, float amax_tensor);
}

namespace {

using fast::bits_of;
using fast::float_of;
using fast::kAbsMask;
using fast::kCanonicalNaN;
using fast::kInfBits;

// ---------------------------------------------------------------------------
// Element kernels: one span of one block, scale (m, d) fixed.
// ---------------------------------------------------------------------------

enum class Kernel { kMiniFloat, kFloat8Exp, kInt, kScalar };

struct KernelParams {
  Kernel kernel = Kernel::kScalar;
  fast::MiniFloatParams mf;   // kMiniFloat
  uint32_t max_bits = 0;      // bits of the largest finite value
  float maxv = 0;             // largest finite value (kInt: 2^(b-1)-1)
  int shift = 0;              // kFloat8Exp: 23 - mbits
  bool saturate = true;
  const QuantSpec* spec = nullptr;  // kScalar
};

// Minifloat formats (E2M1 .. E5M2): fast::round_magnitude on |x*m|, then
// overflow, Inf and NaN selects.
template <bool kSR, int N>
inline void span_minifloat(const float* x, float* y, int64_t n_rt, float m,
                           float d, const uint32_t* __restrict rnd, const KernelParams& kp) {
  const fast::MiniFloatParams p = kp.mf;
  const uint32_t ovf_bits = fast::minifloat_overflow_bits(p, kp.saturate);
  const bool inf_keeps = p.has_inf;
  const int64_t n = N > 0 ? N : n_rt;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    float u = 0.0f;
    if constexpr (kSR) u = float(rnd[i] >> 8) * 0x1p-24f;
    y[i] = fast::minifloat_element<kSR>(x[i], m, d, u, p, ovf_bits, inf_keeps);
  }
}

// Float formats with FP32's exponent (E8, bias 127, IEEE Inf/NaN; BF16):
// round the FP32 bit pattern to mbits mantissa bits.
template <bool kSR, int N>
inline void span_float8exp(const float* x, float* y, int64_t n_rt, float m,
                           float d, const uint32_t* __restrict rnd, const KernelParams& kp) {
  const int shift = kp.shift;
  const uint32_t low_mask = (1u << shift) - 1;
  const uint32_t half_m1 = (1u << (shift - 1)) - 1;
  const uint32_t max_bits = kp.max_bits;
  const bool saturate = kp.saturate;
  const int64_t n = N > 0 ? N : n_rt;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i] * m;
    const uint32_t vb = bits_of(v);
    const uint32_t sign = vb & 0x80000000u;
    const uint32_t ab = vb & kAbsMask;
    uint32_t rb;
    if constexpr (kSR) {
      // up iff u < frac  <=>  (rnd >> 8) < low * 2^(24 - shift)
      const uint32_t low = ab & low_mask;
      const uint32_t up = (rnd[i] >> 8) < (low << (24 - shift)) ? (1u << shift) : 0u;
      rb = (ab & ~low_mask) + up;
    } else {
      rb = (ab + half_m1 + ((ab >> shift) & 1u)) & ~low_mask;
    }
    rb = (saturate && rb >= kInfBits && ab != kInfBits) ? max_bits : rb;
    rb = ab > kInfBits ? kCanonicalNaN : (rb | sign);
    y[i] = fast::dequantize(rb, d);
  }
}

// Symmetric integers: round x*m to an integer in [-max, max].
template <bool kSR, int N>
inline void span_int(const float* x, float* y, int64_t n_rt, float m, float d,
                     const uint32_t* __restrict rnd, const KernelParams& kp) {
  const float maxv = kp.maxv;
  const float lim = maxv + 1.0f;
  const int64_t n = N > 0 ? N : n_rt;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i] * m;
    float vc = v < -lim ? -lim : v;
    vc = vc > lim ? lim : vc;
    float r;
    if constexpr (kSR) {
      const float t = float(int32_t(vc));  // truncation toward 0
      const float fl = t > vc ? t - 1.0f : t;
      const float u = float(rnd[i] >> 8) * 0x1p-24f;
      r = fl + (u < vc - fl ? 1.0f : 0.0f);
    } else {
      r = (vc + 12582912.0f) - 12582912.0f;  // 1.5 * 2^23: RNE to an integer, either sign
    }
    r = r > maxv ? maxv : r;
    r = r < -maxv ? -maxv : r;
    const uint32_t rb = (bits_of(v) & kAbsMask) > kInfBits ? kCanonicalNaN : bits_of(r);
    y[i] = fast::dequantize(rb, d);
  }
}

// Anything else (posits, exotic registered formats): the generic codec.
inline void span_scalar(const float* x, float* y, int64_t n, float m, float d,
                        const uint32_t* rnd, const KernelParams& kp) {
  BlockScale s;
  s.encode = m;
  s.decode = d;
  for (int64_t i = 0; i < n; ++i)
    y[i] = detail::reference_element(x[i], s, *kp.spec, rnd ? rnd[i] : 0u);
}

// ---------------------------------------------------------------------------
// Row kernels (multi-versioned): all blocks of one row. The common block
// widths 16 and 32 get fixed-trip-count inner loops.
// ---------------------------------------------------------------------------

struct RowArgs {
  const float* x;
  float* y;
  int64_t cols;
  int64_t bc;                 // block width (the last block may be partial)
  const float* enc;           // [ceil(cols / bc)] encode multipliers m of this row's blocks
  const float* dec;           // [ceil(cols / bc)] decode scales d
  const uint32_t* rnd;        // [cols] random words, or null for RNE
  const KernelParams* kp;
};

#define SNIP_ROW_KERNEL(NAME, SPAN, SR)                                                    \
  template <int N>                                                                         \
  inline __attribute__((always_inline)) void NAME##_impl(const RowArgs& a) {               \
    const int64_t full = a.cols / a.bc;                                                    \
    for (int64_t g = 0; g < full; ++g) {                                                   \
      const int64_t c0 = g * a.bc;                                                         \
      SPAN<SR, N>(a.x + c0, a.y + c0, a.bc, a.enc[g], a.dec[g], SR ? a.rnd + c0 : nullptr, \
                  *a.kp);                                                                  \
    }                                                                                      \
    const int64_t c0 = full * a.bc;                                                        \
    if (c0 < a.cols)                                                                       \
      SPAN<SR, 0>(a.x + c0, a.y + c0, a.cols - c0, a.enc[full], a.dec[full],               \
                  SR ? a.rnd + c0 : nullptr, *a.kp);                                       \
  }                                                                                        \
  SNIP_CLONES void NAME(const RowArgs& a) {                                                \
    if (a.bc == 16) {                                                                      \
      NAME##_impl<16>(a);                                                                  \
    } else if (a.bc == 32) {                                                               \
      NAME##_impl<32>(a);                                                                  \
    } else {                                                                               \
      NAME##_impl<0>(a);                                                                   \
    }                                                                                      \
  }

SNIP_ROW_KERNEL(row_minifloat_rne, span_minifloat, false)
SNIP_ROW_KERNEL(row_minifloat_sr, span_minifloat, true)
SNIP_ROW_KERNEL(row_float8exp_rne, span_float8exp, false)
SNIP_ROW_KERNEL(row_float8exp_sr, span_float8exp, true)
SNIP_ROW_KERNEL(row_int_rne, span_int, false)
SNIP_ROW_KERNEL(row_int_sr, span_int, true)
#undef SNIP_ROW_KERNEL

void row_scalar(const RowArgs& a) {
  for (int64_t c0 = 0, g = 0; c0 < a.cols; c0 += a.bc, ++g)
    span_scalar(a.x + c0, a.y + c0, std::min(a.bc, a.cols - c0), a.enc[g], a.dec[g],
                a.rnd ? a.rnd + c0 : nullptr, *a.kp);
}

using RowFn = void (*)(const RowArgs&);

// Max of |x| as FP32 bits per block of a row: out[g] for g < ceil(cols/bc).
// Unsigned max of the magnitude bits orders finite < Inf < NaN, so a NaN
// anywhere makes the result a NaN (NaN-propagating, unlike fmaxf).
template <int N>
inline __attribute__((always_inline)) uint32_t block_amax(const float* x, int64_t n_rt) {
  const int64_t n = N > 0 ? N : n_rt;
  uint32_t mx = 0;
#pragma omp simd reduction(max : mx)
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t b = bits_of(x[i]) & kAbsMask;
    mx = b > mx ? b : mx;
  }
  return mx;
}

template <int N>
inline __attribute__((always_inline)) void row_block_amax_impl(const float* x, int64_t cols,
                                                               int64_t bc, uint32_t* out) {
  const int64_t full = cols / bc;
  for (int64_t g = 0; g < full; ++g) out[g] = block_amax<N>(x + g * bc, bc);
  if (full * bc < cols) out[full] = block_amax<0>(x + full * bc, cols - full * bc);
}

SNIP_CLONES void row_block_amax(const float* x, int64_t cols, int64_t bc, uint32_t* out) {
  if (bc == 16) {
    row_block_amax_impl<16>(x, cols, bc, out);
  } else if (bc == 32) {
    row_block_amax_impl<32>(x, cols, bc, out);
  } else {
    row_block_amax_impl<0>(x, cols, bc, out);
  }
}

// Scales of n blocks from their amax bits (vectorised over blocks).
template <void (*kLane)(uint32_t, const fast::ScaleCtx&, float&, float&, uint32_t&)>
inline __attribute__((always_inline)) void scales_loop(const uint32_t* __restrict amax, int64_t n,
                                                       const fast::ScaleCtx& ctx_in,
                                                       float* __restrict enc,
                                                       float* __restrict dec) {
  const fast::ScaleCtx ctx = ctx_in;  // local copy: loop-invariant loads
#pragma omp simd
  for (int64_t g = 0; g < n; ++g) {
    float e, d;
    uint32_t code;
    kLane(amax[g], ctx, e, d, code);
    enc[g] = e;
    dec[g] = d;
  }
}

SNIP_CLONES void scales_from_amax(const uint32_t* amax, int64_t n, const fast::ScaleCtx& ctx,
                                  float* enc, float* dec) {
  switch (ctx.rule) {
    case ScaleRule::kMxFloor:
      return scales_loop<fast::lane_mx_floor>(amax, n, ctx, enc, dec);
    case ScaleRule::kTwoLevel:
      return scales_loop<fast::lane_two_level>(amax, n, ctx, enc, dec);
    case ScaleRule::kCurrent:
    case ScaleRule::kDelayed:
      if (ctx.format == ScaleFormat::kFP32) return scales_loop<fast::lane_fp32>(amax, n, ctx, enc, dec);
      if (ctx.format == ScaleFormat::kE8M0)
        return scales_loop<fast::lane_e8m0_rceil>(amax, n, ctx, enc, dec);
      return scales_loop<fast::lane_pow2>(amax, n, ctx, enc, dec);
    case ScaleRule::kNone:
      std::fill(enc, enc + n, 1.0f);
      std::fill(dec, dec + n, 1.0f);
      return;
  }
}

// Philox4x32-10 words for elements first..first+n-1 into out[0..n).
// Generates whole counter blocks into `tmp` (>= n + 8 words). Two loop
// bodies with identical results: 32-bit lanes (best for SSE2/AVX2), and
// 64-bit lanes whose low halves carry the state (AVX-512: vpmuludq works on
// 64-bit lanes, so no 32<->64-bit shuffles between rounds; ~1.5x faster).
struct PhiloxArgs {
  uint64_t b0;
  int64_t nblocks;
  uint32_t k0, k1, c1hi, c2, c3;
};

SNIP_CLONES_NO512 void philox_blocks32(const PhiloxArgs& a, uint32_t* tmp) {
#pragma omp simd
  for (int64_t j = 0; j < a.nblocks; ++j) {
    const uint64_t b = a.b0 + uint64_t(j);
    uint32_t x0 = uint32_t(b), x1 = uint32_t(b >> 32) | a.c1hi, x2 = a.c2, x3 = a.c3;
    uint32_t ka = a.k0, kb = a.k1;
    for (int round = 0; round < 10; ++round) {
      const uint64_t p0 = uint64_t(0xD2511F53u) * x0;
      const uint64_t p1 = uint64_t(0xCD9E8D57u) * x2;
      const uint32_t n0 = uint32_t(p1 >> 32) ^ x1 ^ ka;
      const uint32_t n2 = uint32_t(p0 >> 32) ^ x3 ^ kb;
      x1 = uint32_t(p1);
      x3 = uint32_t(p0);
      x0 = n0;
      x2 = n2;
      ka += 0x9E3779B9u;
      kb += 0xBB67AE85u;
    }
    tmp[4 * j + 0] = x0;
    tmp[4 * j + 1] = x1;
    tmp[4 * j + 2] = x2;
    tmp[4 * j + 3] = x3;
  }
}

#ifdef SNIP_HAVE_X86_CLONES
__attribute__((target("avx512f"))) void philox_blocks64(const PhiloxArgs& a, uint32_t* tmp) {
  constexpr uint64_t kLo = 0xFFFFFFFFull;
#pragma omp simd
  for (int64_t j = 0; j < a.nblocks; ++j) {
    const uint64_t b = a.b0 + uint64_t(j);
    uint64_t x0 = b & kLo, x1 = (b >> 32) | a.c1hi, x2 = a.c2, x3 = a.c3;
    uint64_t ka = a.k0, kb = a.k1;
    for (int round = 0; round < 10; ++round) {  // only the low 32 bits of each lane matter
      const uint64_t p0 = uint64_t(0xD2511F53u) * (x0 & kLo);
      const uint64_t p1 = uint64_t(0xCD9E8D57u) * (x2 & kLo);
      const uint64_t n0 = (p1 >> 32) ^ x1 ^ ka;
      const uint64_t n2 = (p0 >> 32) ^ x3 ^ kb;
      x1 = p1;
      x3 = p0;
      x0 = n0;
      x2 = n2;
      ka += 0x9E3779B9u;
      kb += 0xBB67AE85u;
    }
    tmp[4 * j + 0] = uint32_t(x0);
    tmp[4 * j + 1] = uint32_t(x1);
    tmp[4 * j + 2] = uint32_t(x2);
    tmp[4 * j + 3] = uint32_t(x3);
  }
}
#endif

void philox_row(const RoundingKey& key, uint64_t first, int64_t n, uint32_t* tmp, uint32_t* out) {
  PhiloxArgs a;
  a.b0 = first >> 2;
  a.nblocks = int64_t(((first + uint64_t(n) + 3) >> 2) - a.b0);
  a.k0 = uint32_t(key.seed);
  a.k1 = uint32_t(key.seed >> 32);
  a.c1hi = key.operand << 24;
  a.c2 = uint32_t(key.step);
  a.c3 = uint32_t(key.layer);
#ifdef SNIP_HAVE_X86_CLONES
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  if (avx512) {
    philox_blocks64(a, tmp);
  } else {
    philox_blocks32(a, tmp);
  }
#else
  philox_blocks32(a, tmp);
#endif
  std::memcpy(out, tmp + (first & 3), size_t(n) * sizeof(uint32_t));
}

KernelParams make_params(const QuantSpec& spec) {
  KernelParams kp;
  kp.spec = &spec;
  kp.saturate = spec.saturate;
  kp.maxv = float(spec.element.max_value());
  kp.max_bits = bits_of(kp.maxv);
  const ElementFormat& f = spec.element;
  if (fast::minifloat_fast_ok(f)) {
    kp.kernel = Kernel::kMiniFloat;
    kp.mf = fast::MiniFloatParams(f);
  } else if (f.kind == ElementKind::kFloat && f.ebits == 8 && f.bias == 127 && f.has_inf &&
             f.nan == NanEncoding::kIeee && f.mbits >= 1 && f.mbits <= 22) {
    kp.kernel = Kernel::kFloat8Exp;
    kp.shift = 23 - f.mbits;
  } else if (f.kind == ElementKind::kInt && f.bits <= 16) {
    kp.kernel = Kernel::kInt;
  } else {
    kp.kernel = Kernel::kScalar;
  }
  return kp;
}

RowFn pick_row_fn(const KernelParams& kp, bool sr) {
  switch (kp.kernel) {
    case Kernel::kMiniFloat: return sr ? row_minifloat_sr : row_minifloat_rne;
    case Kernel::kFloat8Exp: return sr ? row_float8exp_sr : row_float8exp_rne;
    case Kernel::kInt: return sr ? row_int_sr : row_int_rne;
    case Kernel::kScalar: return row_scalar;
  }
  return row_scalar;
}

// Statistics of one row, in column order (same order as the reference).
void row_stats(const float* x, const float* y, int64_t cols, int64_t bc, const float* enc,
               float maxv, QuantStats& st) {
  for (int64_t c = 0; c < cols; ++c) detail::stats_add(st, x[c], y[c], enc[c / bc], maxv);
}

}  // namespace

namespace detail {
namespace {
// row_error_norms in double lanes, element by element: the rare row whose
// FP32 squares overflow or underflow.
void row_error_norms_double(const float* x, const float* y, int64_t cols, double& err, double& ref) {
  constexpr int L = 16;
  double el[L] = {}, rl[L] = {};
  for (int64_t c = 0; c < cols; ++c) {
    const float xv = x[c];
    const bool fin = (bits_of(xv) & kAbsMask) < kInfBits;
    const double xm = fin ? double(xv) : 0.0;
    const double d = fin ? double(y[c]) - double(xv) : 0.0;
    el[c % L] += d * d;
    rl[c % L] += xm * xm;
  }
  err = ref = 0;
  for (int l = 0; l < L; ++l) err += el[l], ref += rl[l];
}
}  // namespace

SNIP_CLONES void row_error_norms(const float* x, const float* y, int64_t cols, double& err, double& ref) {
  // GCC vector types: lane-wise arithmetic, lowered to each clone's width.
  constexpr int L = 16;
  typedef float vf __attribute__((vector_size(L * sizeof(float))));
  typedef uint32_t vu __attribute__((vector_size(L * sizeof(uint32_t))));
  vf e = {}, r = {};
  int64_t c = 0;
  for (; c + L <= cols; c += L) {
    vf xv, yv;
    std::memcpy(&xv, x + c, sizeof xv);
    std::memcpy(&yv, y + c, sizeof yv);
    vu xb, db;
    std::memcpy(&xb, &xv, sizeof xb);
    const vu fin = (xb & kAbsMask) < kInfBits;  // all ones where x is finite
    xb &= fin;
    const vf d0 = yv - xv;
    std::memcpy(&db, &d0, sizeof db);
    db &= fin;
    vf xm, d;
    std::memcpy(&xm, &xb, sizeof xm);
    std::memcpy(&d, &db, sizeof d);
    e += d * d;
    r += xm * xm;
  }
  float el[L], rl[L];
  std::memcpy(el, &e, sizeof el);
  std::memcpy(rl, &r, sizeof rl);
  for (; c < cols; ++c) {
    const float xv = x[c];
    const bool fin = (bits_of(xv) & kAbsMask) < kInfBits;
    const float xm = fin ? xv : 0.0f;
    const float d = fin ? y[c] - xv : 0.0f;
    el[c % L] += d * d;
    rl[c % L] += xm * xm;
  }
  double se[L / 2], sr[L / 2];
  for (int l = 0; l < L / 2; ++l) {
    se[l] = double(el[2 * l]) + double(el[2 * l + 1]);
    sr[l] = double(rl[2 * l]) + double(rl[2 * l + 1]);
  }
  err = ((se[0] + se[1]) + (se[2] + se[3])) + ((se[4] + se[5]) + (se[6] + se[7]));
  ref = ((sr[0] + sr[1]) + (sr[2] + sr[3])) + ((sr[4] + sr[5]) + (sr[6] + sr[7]));
  // FP32 squares that overflowed (|x| above ~1.8e19), or a row so small
  // that its squares are subnormal in FP32 (|x| below ~1e-19) or zero: the
  // row again in double (a NaN error, from a NaN output, stays NaN).
  if (std::isinf(err) || std::isinf(ref) || ref < 1e-30) row_error_norms_double(x, y, cols, err, ref);
}
}  // namespace detail

namespace {

float amax_of_bits(uint32_t mx) { return mx > kInfBits ? float_of(kCanonicalNaN) : float_of(mx); }

float tensor_amax_fast(const float* in, int64_t n) {
  uint32_t mx = 0;
#pragma omp parallel for simd reduction(max : mx) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t b = bits_of(in[i]) & kAbsMask;
    mx = b > mx ? b : mx;
  }
  return amax_of_bits(mx);
}

// The fast path. Scale grid of [GR, GC] blocks of [BR, BC]:
//  * row-local (BR = 1, data-dependent rule other than kTwoLevel): each row
//    computes its block amaxes and scales while it is in cache;
//  * otherwise a first parallel pass stores every row's block amaxes
//    ([R, GC], 1/BC of the data), reduced over the block rows (and, for
//    kTwoLevel, to the tensor amax), then the scale grid, then the rows.
void fast_core(const float* in, float* out, int64_t rows, int64_t cols, const QuantSpec& spec,
               const RoundingKey& key, QuantStats* stats, const BlockScale* delayed, ErrorNorms* norms) {
  if (rows == 0 || cols == 0) {
    if (stats) *stats = QuantStats{};
    if (norms) *norms = ErrorNorms{0, 0, 1};
    return;
  }
  const KernelParams kp = make_params(spec);
  const bool sr = spec.rounding == Rounding::kStochastic;
  const RowFn row_fn = pick_row_fn(kp, sr);
  const int64_t br = std::max<int64_t>(1, spec.block.rows_over(rows));
  const int64_t bc = std::max<int64_t>(1, spec.block.cols_over(cols));
  const int64_t gr = (rows + br - 1) / br, gc = (cols + bc - 1) / bc;
  const bool fixed_scale = spec.rule == ScaleRule::kNone || spec.rule == ScaleRule::kDelayed;
  const bool row_local = br == 1 && !fixed_scale && spec.rule != ScaleRule::kTwoLevel;

  // Scale grid [GR, GC] (unless row-local).
  std::vector<float> grid_enc, grid_dec;
  if (!row_local) {
    grid_enc.resize(size_t(gr * gc));
    grid_dec.resize(size_t(gr * gc));
    if (fixed_scale) {
      BlockScale s;  // kNone: identity
      if (spec.rule == ScaleRule::kDelayed) s = *delayed;
      std::fill(grid_enc.begin(), grid_enc.end(), s.encode);
      std::fill(grid_dec.begin(), grid_dec.end(), s.decode);
    } else {
      std::vector<uint32_t> row_amax(size_t(rows * gc));
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < rows; ++r)
        row_block_amax(in + r * cols, cols, bc, &row_amax[size_t(r * gc)]);
      std::vector<uint32_t> grid_amax;
      if (br == 1) {
        grid_amax.swap(row_amax);
      } else {
        grid_amax.assign(size_t(gr * gc), 0u);
        for (int64_t r = 0; r < rows; ++r) {  // cheap: 1/BC of the data
          uint32_t* ga = &grid_amax[size_t((r / br) * gc)];
          const uint32_t* ra = &row_amax[size_t(r * gc)];
          for (int64_t g = 0; g < gc; ++g) ga[g] = std::max(ga[g], ra[g]);
        }
      }
      TensorScale tensor;
      if (spec.rule == ScaleRule::kTwoLevel) {
        uint32_t mx = 0;
        for (uint32_t v : grid_amax) mx = std::max(mx, v);
        tensor = two_level_tensor_scale(amax_of_bits(mx), spec);
      }
      const fast::ScaleCtx gctx(spec, tensor);
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < gr; ++i)
        scales_from_amax(&grid_amax[size_t(i * gc)], gc, gctx, &grid_enc[size_t(i * gc)],
                         &grid_dec[size_t(i * gc)]);
    }
  }
  const fast::ScaleCtx ctx(spec, TensorScale{});  // row-local rules need no tensor scale

  std::vector<QuantStats> per_row(stats ? size_t(rows) : 0);
  std::vector<double> row_norms(norms ? size_t(2 * rows) : 0);
  const bool need_copy = (stats != nullptr || norms != nullptr) && in == out;
#pragma omp parallel
  {
    std::vector<uint32_t> amax_bits(row_local ? size_t(gc) : 0);
    std::vector<float> enc_row(row_local ? size_t(gc) : 0), dec_row(row_local ? size_t(gc) : 0);
    std::vector<uint32_t> rnd(sr ? size_t(cols) : 0), rnd_tmp(sr ? size_t(cols + 8) : 0);
    std::vector<float> xcopy(need_copy ? size_t(cols) : 0);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = in + r * cols;
      float* y = out + r * cols;
      if (need_copy) {
        std::memcpy(xcopy.data(), x, size_t(cols) * sizeof(float));
        x = xcopy.data();
      }
      const float *enc, *dec;
      if (row_local) {
        row_block_amax(x, cols, bc, amax_bits.data());
        scales_from_amax(amax_bits.data(), gc, ctx, enc_row.data(), dec_row.data());
        enc = enc_row.data();
        dec = dec_row.data();
      } else {
        enc = &grid_enc[size_t((r / br) * gc)];
        dec = &grid_dec[size_t((r / br) * gc)];
      }
      if (sr) philox_row(key, uint64_t(r) * uint64_t(cols), cols, rnd_tmp.data(), rnd.data());
      row_fn(RowArgs{x, y, cols, bc, enc, dec, sr ? rnd.data() : nullptr, &kp});
      if (stats) row_stats(x, y, cols, bc, enc, kp.maxv, per_row[size_t(r)]);
      if (norms) detail::row_error_norms(x, y, cols, row_norms[size_t(2 * r)], row_norms[size_t(2 * r + 1)]);
    }
  }
  if (stats) *stats = detail::sum_rows(per_row);
  if (norms) *norms = detail::sum_row_norms(row_norms);
}

}  // namespace

void fake_quantize(const float* in, float* out, int64_t rows, int64_t cols, const QuantSpec& spec,
                   const RoundingKey& key, QuantStats* stats, ErrorNorms* norms) {
  detail::check_fq_args(in, out, rows, cols, spec, key, /*delayed_ok=*/false);
  in = detail::hadamard_input(in, out, rows, cols, spec);
  fast_core(in, out, rows, cols, spec, key, stats, nullptr, norms);
}

void fake_quantize(const float* in, float* out, int64_t rows, int64_t cols,
                   const RoundingKey& key, DelayedScaling& state, QuantStats* stats, ErrorNorms* norms) {
  detail::check_fq_args(in, out, rows, cols, state.spec(), key, /*delayed_ok=*/true);
  in = detail::hadamard_input(in, out, rows, cols, state.spec());
  const float amax = rows * cols > 0 ? tensor_amax_fast(in, rows * cols) : 0.0f;
  const BlockScale s = detail::delayed_call_scale(state, amax);
  fast_core(in, out, rows, cols, state.spec(), key, stats, &s, norms);
  state.record(amax);
}

}  // namespace snip::formats
