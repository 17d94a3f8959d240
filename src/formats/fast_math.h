// Private to snip_formats: bit-level helpers shared by the fast scale
// computation (scale.cpp), the fast kernels (fake_quant_fast.cpp, bf16.cpp)
// and the CUDA kernels (fake_quant_cuda.cu): the one codec of the CPU and
// the GPU. Everything here is exact FP32 arithmetic; no FMA contraction (the
// library is built with -ffp-contract=off, the CUDA one with --fmad=false),
// so results equal the reference path's on every device.
#pragma once

#include <cfloat>
#include <cstdint>
#include <cstring>

#include "snip/formats/quant_spec.h"
#include "snip/formats/scaling.h"

// The kernels' ISA clones: AVX-512, AVX2 and the baseline, picked at load
// time (target_clones), so the library itself needs no -march flag.
#if defined(__x86_64__) && defined(__GNUC__) && defined(__ELF__)
#define SNIP_HAVE_X86_CLONES 1
#define SNIP_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#define SNIP_CLONES_NO512 __attribute__((target_clones("avx2", "default")))
#else
#define SNIP_CLONES
#define SNIP_CLONES_NO512
#endif

// Host and device: nvcc compiles the functions below for both (SNIP_HD).
#include "snip/formats/hd.h"

namespace snip::formats::fast {

SNIP_HD inline uint32_t bits_of(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  return u;
}
SNIP_HD inline float float_of(uint32_t u) {
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

inline constexpr uint32_t kCanonicalNaN = 0x7FC00000u;  // +qNaN, the only NaN we output
inline constexpr uint32_t kAbsMask = 0x7FFFFFFFu;
inline constexpr uint32_t kInfBits = 0x7F800000u;

/// A quantized element's value: code x d (d the block's decode scale). The
/// product of a finite code that overflows FP32 (a code rounded up next to
/// FLT_MAX, times a scale rounded up) saturates to +-FLT_MAX: a finite input
/// never dequantizes to Inf. Inf and NaN codes pass through as code x d.
SNIP_HD inline float dequantize(uint32_t code_bits, float d) {
  const float y = float_of(code_bits) * d;
  const uint32_t yb = bits_of(y);
  const bool ovf = (yb & kAbsMask) == kInfBits && (code_bits & kAbsMask) < kInfBits;
  return float_of(ovf ? ((yb & 0x80000000u) | 0x7F7FFFFFu) : yb);
}

/// 2^k as an FP32 value for k in [-149, 127] (subnormal below -126).
SNIP_HD inline float pow2f(int k) {
  return k >= -126 ? float_of(uint32_t(k + 127) << 23) : float_of(1u << (k + 149));
}

/// Parameters of the branch-free minifloat rounding of a magnitude, derived
/// from an ElementFormat of kind kFloat with ebits <= 7 (the grid lies in
/// the FP32 normal range).
struct MiniFloatParams {
  int mbits = 0;
  uint32_t emin32 = 0;  ///< FP32 biased exponent of the format's min normal: 127 + 1 - bias
  float maxv = 0;       ///< largest finite value
  float lim = 0;        ///< maxv + ulp at maxv: first value of the unbounded grid above maxv
  bool has_inf = false;
  bool has_nan = false;

  explicit MiniFloatParams(const ElementFormat& f)
      : mbits(f.mbits),
        emin32(uint32_t(128 - f.bias)),
        maxv(float(f.max_value())),
        lim(float(f.max_value() +
                  detail::pow2(f.max_exponent_field() - f.bias - f.mbits))),
        has_inf(f.has_inf),
        has_nan(f.has_nan()) {}
  MiniFloatParams() = default;
};

/// True if the fast minifloat kernel covers `f`: every grid spacing 2^q and
/// its inverse must be FP32 normal numbers, i.e. with FP32 biased exponents
/// e in [emin32, emax32 + 1]: e - mbits >= 1 and 254 + mbits - e <= 254 at
/// the bottom, 254 + mbits - e >= 1 at the top (E2M1 .. E5M2 qualify; BF16,
/// whose subnormals are FP32's, has its own kernel).
inline bool minifloat_fast_ok(const ElementFormat& f) {
  if (f.kind != ElementKind::kFloat || f.ebits > 7) return false;
  const int emin32 = 128 - f.bias;
  const int etop32 = f.max_exponent_field() - f.bias + 1 + 127;
  return emin32 >= f.mbits + 1 && etop32 <= 253 + f.mbits;
}

/// Rounds the magnitude a (a >= 0, not NaN) onto the format's unbounded
/// grid after clamping to [0, lim], with RNE (sr = false) or stochastic
/// rounding with threshold u (sr = true). Returns the grid value; values
/// > maxv mean overflow. Exact: a * 2^-q and n * 2^q are power-of-two
/// scalings of FP32 values inside the normal range, and q + 2^23 - 2^23 is
/// FP32's own RNE to an integer (valid for 0 <= q < 2^22).
template <bool kSR>
SNIP_HD inline float round_magnitude(float a, const MiniFloatParams& p, float u) {
  const float ac = a < p.lim ? a : p.lim;
  uint32_t e = bits_of(ac) >> 23;
  e = e < p.emin32 ? p.emin32 : e;
  const float inv_quantum = float_of((254u + uint32_t(p.mbits) - e) << 23);  // 2^(127+M-e)
  const float quantum = float_of((e - uint32_t(p.mbits)) << 23);             // 2^(e-127-M)
  const float q = ac * inv_quantum;  // in [0, 2^(M+1)]
  float n;
  if constexpr (kSR) {
    const float fl = float(int32_t(q));  // floor: q >= 0
    n = fl + (u < q - fl ? 1.0f : 0.0f);
  } else {
    n = (q + 8388608.0f) - 8388608.0f;  // 2^23: RNE to an integer
  }
  return n * quantum;
}

/// The bits of an overflow's value under minifloat parameters `p`:
/// saturating -> the largest finite value (Inf stays Inf where the format
/// has it, minifloat_element); IEEE -> Inf, else NaN, else the largest.
SNIP_HD inline uint32_t minifloat_overflow_bits(const MiniFloatParams& p, bool saturate) {
  const uint32_t max_bits = bits_of(p.maxv);
  return saturate ? max_bits : p.has_inf ? kInfBits : p.has_nan ? kCanonicalNaN : max_bits;
}

/// One element of the minifloat kernels (E2M1 .. E5M2), CPU and GPU: x
/// scaled by the block's encode multiplier m, its magnitude rounded onto the
/// grid (round_magnitude; u the stochastic-rounding threshold in [0, 1)),
/// then the overflow, Inf and NaN selects, dequantized with d. `ovf_bits`
/// is the bits of an overflow's value (saturating: the largest finite;
/// IEEE: Inf, else NaN, else the largest), `inf_keeps` whether an Inf input
/// stays Inf (the format has Inf).
template <bool kSR>
SNIP_HD inline float minifloat_element(float x, float m, float d, float u, const MiniFloatParams& p,
                                       uint32_t ovf_bits, bool inf_keeps) {
  const float v = x * m;
  const uint32_t vb = bits_of(v);
  const uint32_t sign = vb & 0x80000000u;
  const uint32_t ab = vb & kAbsMask;
  const float r = round_magnitude<kSR>(float_of(ab), p, u);
  uint32_t rb = r > p.maxv ? ovf_bits : bits_of(r);
  rb = (inf_keeps && ab == kInfBits) ? kInfBits : rb;
  rb = rb == kCanonicalNaN ? rb : (rb | sign);
  rb = ab > kInfBits ? kCanonicalNaN : rb;
  return dequantize(rb, d);
}

/// E4M3 code of a value r already on the E4M3 grid, 0 <= r <= 448.
SNIP_HD inline uint32_t e4m3_code_of(float r) {
  const uint32_t b = bits_of(r);
  const uint32_t e = b >> 23;
  const uint32_t normal = ((e - 120) << 3) | ((b >> 20) & 7u);  // E = e - 127 + 7
  const uint32_t sub = uint32_t(int32_t(r * 512.0f));            // r / 2^-9
  return e >= 121 ? normal : sub;
}

/// Everything block_scale needs, resolved once per call.
struct ScaleCtx {
  ScaleRule rule = ScaleRule::kNone;
  ScaleFormat format = ScaleFormat::kFP32;
  float target = 1.0f;       ///< T = element.scale_target()
  float rcp_target = 1.0f;   ///< fl(1 / T): TE's max_norm_rcp / fp4_max_inv
  int emax_elem = 0;         ///< element.emax() (kMxFloor)
  TensorScale tensor;        ///< kTwoLevel second level
  MiniFloatParams e4m3;      ///< E4M3 rounding of kTwoLevel block scales

  ScaleCtx(const QuantSpec& spec, const TensorScale& t)
      : rule(spec.rule),
        format(spec.scale_format),
        target(float(spec.element.scale_target())),
        rcp_target(1.0f / target),
        emax_elem(spec.element.emax()),
        tensor(t),
        e4m3(kE4M3) {}
};

/// floor(log2(a)) for the bits b of a finite a > 0, FP32 subnormals
/// included, branch-free (vectorisable): a subnormal's bits are an integer
/// m < 2^23 with a = m * 2^-149, and (float)m is exact.
SNIP_HD inline int floor_log2_bits(uint32_t b) {
  const int e = int(b >> 23) - 127;
  const int sub = int(bits_of(float(int32_t(b & 0x7FFFFFu))) >> 23) - 127 - 149;
  return (b >> 23) != 0 ? e : sub;
}

/// 2^k as FP32 for k in [-127, 127] (2^-127 is subnormal).
SNIP_HD inline float pow2_scale_value(int k) {
  return k >= -126 ? float_of(uint32_t(k + 127) << 23) : float_of(0x00400000u);
}

// One block's scale from the bits of its amax (|x| bits; >= 0x7F800000
// means Inf or NaN), one branch-free function per rule so that loops over
// blocks vectorise. Contract: scaling.h block_scale; formulas: quant_spec.h.

SNIP_HD inline void nan_if(bool bad, const ScaleCtx& c, float& enc, float& dec, uint32_t& code) {
  const float nan = float_of(kCanonicalNaN);
  enc = bad ? nan : enc;
  dec = bad ? nan : dec;
  code = bad ? (c.format == ScaleFormat::kE8M0   ? 0xFFu
                : c.format == ScaleFormat::kE4M3 ? 0x7Fu
                                                 : kCanonicalNaN)
             : code;
}

/// kMxFloor: 2^(floor(log2 amax) - emax_elem), clamped to E8M0.
SNIP_HD inline void lane_mx_floor(uint32_t ab, const ScaleCtx& c, float& enc, float& dec, uint32_t& code) {
  const bool zero = ab == 0;
  const int fl = floor_log2_bits(zero ? 1u : ab);
  int k = (zero ? -126 : fl) - c.emax_elem;
  k = k < kE8M0MinExp ? kE8M0MinExp : (k > kE8M0MaxExp ? kE8M0MaxExp : k);
  dec = pow2_scale_value(k);
  enc = pow2_scale_value(-k);
  code = uint32_t(k + 127);
  nan_if(ab >= kInfBits, c, enc, dec, code);
}

/// kTwoLevel (TransformerEngine core_nvfp4.cuh, compute_decoding_scaling_factor):
/// s_b = E4M3_RNE_sat(min(amax * (S_enc * fl(1/T)), FLT_MAX)), in that FP32
/// order; d = s_b * S_dec; m = min(1 / d, FLT_MAX) (TE's block_scale_inverse).
SNIP_HD inline void lane_two_level(uint32_t ab, const ScaleCtx& c, float& enc, float& dec,
                           uint32_t& code) {
  const float per_amax = c.tensor.encode * c.rcp_target;
  float sb = float_of(ab) * per_amax;
  sb = sb < FLT_MAX ? sb : FLT_MAX;
  const float r = round_magnitude<false>(sb, c.e4m3, 0.0f);
  const float rq = r > c.e4m3.maxv ? c.e4m3.maxv : r;  // saturate
  dec = rq * c.tensor.decode;
  const float inv = 1.0f / dec;
  enc = inv < FLT_MAX ? inv : FLT_MAX;
  code = e4m3_code_of(rq);
  nan_if(ab >= kInfBits || c.tensor.decode != c.tensor.decode, c, enc, dec, code);
}

/// The FP32 encode multiplier of TE's compute_scale_from_amax (recipe_common.cuh,
/// margin 0, epsilon 0): m = fl(T / amax), Inf -> FLT_MAX; amax = 0 -> 1.
SNIP_HD inline float te_encode_scale(uint32_t ab, const ScaleCtx& c) {
  float m = c.target / float_of(ab);  // computed unconditionally: no branch
  m = m < FLT_MAX ? m : FLT_MAX;
  return ab == 0 ? 1.0f : m;
}

/// kCurrent / kDelayed with FP32 scales (TE Float8CurrentScaling and
/// DelayedScaling): m = te_encode_scale, d = fl(1 / m) (TE's reciprocal).
SNIP_HD inline void lane_fp32(uint32_t ab, const ScaleCtx& c, float& enc, float& dec, uint32_t& code) {
  const float m = te_encode_scale(ab, c);
  enc = m;
  dec = 1.0f / m;  // >= 1 / FLT_MAX: nonzero
  code = bits_of(dec);
  nan_if(ab >= kInfBits, c, enc, dec, code);
}

/// kCurrent / kDelayed with FP32 power-of-two scales (TE Float8BlockScaling,
/// force_pow_2_scales): m = te_encode_scale with its mantissa cleared
/// (rounded down to 2^j), j >= -126 (TE leaves a subnormal m undefined; it
/// needs T / FLT_MAX < 2^-126, i.e. T < 4); d = 2^-j.
SNIP_HD inline void lane_pow2(uint32_t ab, const ScaleCtx& c, float& enc, float& dec, uint32_t& code) {
  uint32_t mb = bits_of(te_encode_scale(ab, c)) & 0xFF800000u;
  mb = mb < 0x00800000u ? 0x00800000u : mb;  // j >= -126
  const int j = int(mb >> 23) - 127;
  enc = float_of(mb);
  dec = pow2_scale_value(-j);
  code = bits_of(dec);
  nan_if(ab >= kInfBits, c, enc, dec, code);
}

/// kCurrent with E8M0 scales, the "RCEIL" rule of TE / cuBLAS MXFP8
/// (ptx::float_to_e8m0(amax * max_norm_rcp), cvt.rp.satfinite.ue8m0):
/// v = fl(amax * fl(1/T)); code = v's biased exponent, plus one when v is
/// not a power of two (rounding toward +Inf), except that v <= 2^-127 gives
/// code 0 and code 0xFE is not rounded further (satfinite); d = 2^(code-127).
SNIP_HD inline void lane_e8m0_rceil(uint32_t ab, const ScaleCtx& c, float& enc, float& dec,
                            uint32_t& code) {
  const uint32_t vb = bits_of(float_of(ab) * c.rcp_target);
  const uint32_t e = vb >> 23, mant = vb & 0x7FFFFFu;
  const bool up = mant != 0 && e != 0xFEu && !(e == 0 && mant <= 0x400000u);
  uint32_t cd = e + (up ? 1u : 0u);
  cd = cd > 0xFEu ? 0xFEu : cd;
  const int k = int(cd) - 127;
  dec = pow2_scale_value(k);
  enc = pow2_scale_value(-k);
  code = cd;
  nan_if(ab >= kInfBits, c, enc, dec, code);
}

/// Dispatch on the rule (scalar use).
SNIP_HD inline void scale_lane(uint32_t ab, const ScaleCtx& c, float& enc, float& dec, uint32_t& code) {
  switch (c.rule) {
    case ScaleRule::kNone:
      enc = dec = 1.0f;
      code = 0x3F800000u;
      return;
    case ScaleRule::kMxFloor:
      return lane_mx_floor(ab, c, enc, dec, code);
    case ScaleRule::kTwoLevel:
      return lane_two_level(ab, c, enc, dec, code);
    default:
      if (c.format == ScaleFormat::kFP32) return lane_fp32(ab, c, enc, dec, code);
      if (c.format == ScaleFormat::kE8M0) return lane_e8m0_rceil(ab, c, enc, dec, code);
      return lane_pow2(ab, c, enc, dec, code);
  }
}

/// The fast block scale (contract: scaling.h block_scale).
inline BlockScale block_scale_fast(float amax, const ScaleCtx& c) {
  BlockScale s;
  scale_lane(bits_of(amax) & kAbsMask, c, s.encode, s.decode, s.code);
  return s;
}

}  // namespace snip::formats::fast
