// snip/formats/fake_quant.h: fake quantization ("quantize, then dequantize
// back to FP32") of a row-major operand, plus packed storage.
//
// Shapes: in, out: [R, C] row-major FP32, C = the GEMM reduction dim K
// (contiguous). Scaling blocks run along C (1xN tiles) or are 2-D [BR, BC]
// (quant_spec.h; partial last blocks are scaled from the elements present).
//
// Two implementations with identical results, bit for bit (NaN outputs are
// the canonical quiet NaN 0x7FC00000 in both):
//   fake_quantize_reference: simple loops over blocks and elements calling the
//     generic codec (encode/decode) and block_scale_reference. Slow, obvious.
//   fake_quantize: the fast path. OpenMP over rows / blocks, branch-free
//     inner loops that the compiler vectorises (FP32 bit tricks for the float
//     formats, runtime-dispatched SSE2/AVX2/AVX-512 clones on x86-64), Philox
//     words generated a row at a time.
// Stochastic rounding uses random_bits(key, row * C + col) (rounding.h), so
// results are independent of thread count. `out` may equal `in` (in place);
// partial overlap is undefined.
//
// Output, per element x with block scale (d, m): NaN if x is NaN or the block
// scale is NaN, else decode(encode(x * m)) * d, where a finite code whose
// value overflows FP32 (a code rounded up next to the format's largest value,
// times a scale rounded up: FLT_MAX under fp8, MX with RCEIL scales, int8,
// posit8) saturates to +-FLT_MAX, so a finite input never becomes Inf. An
// element format's own IEEE overflow (the non-saturating bf16 cast: FLT_MAX
// rounds to Inf) is kept.
#pragma once

#include <cstdint>
#include <vector>

#include "snip/formats/quant_spec.h"
#include "snip/formats/rounding.h"
#include "snip/formats/scaling.h"

namespace snip::formats {

/// Quantization statistics of one call (both paths fill them identically:
/// sums are accumulated per row in column order in double, then over rows in
/// row order, so they are also independent of thread count).
struct QuantStats {
  int64_t count = 0;       ///< elements seen
  float amax = 0.0f;       ///< max |x| over the input (NaN if any x is NaN)
  int64_t nonfinite = 0;   ///< inputs that are NaN or +-Inf
  int64_t underflow = 0;   ///< nonzero inputs whose output is exactly 0
  int64_t saturated = 0;   ///< finite inputs with |x * m| > the element max (clipped, or
                           ///< overflowed to Inf/NaN when not saturating)
  double sum_sq_err = 0;   ///< sum over finite inputs of (out - x)^2 (NaN if an output is NaN)
  double sum_sq_ref = 0;   ///< sum over finite inputs of x^2

  /// Relative error ||out - x|| / ||x|| (0 when both are 0).
  double rel_error() const;
  /// Signal-to-quantization-noise ratio 10*log10(sum_sq_ref / sum_sq_err) in
  /// dB (+Inf when the error is 0).
  double sqnr_db() const;
  double underflow_fraction() const { return count ? double(underflow) / double(count) : 0.0; }
  double saturated_fraction() const { return count ? double(saturated) / double(count) : 0.0; }
  /// Adds another call's statistics (amax: NaN-propagating max).
  void merge(const QuantStats& other);
};

/// The per-call error norms of a fake quantization, for per-step monitoring
/// (the trainer's "quant_err", docs/operations.md): the two sums of
/// QuantStats's relative error without the rest of its statistics, a
/// by-product of the quantizer's pass over each row while the row is in
/// cache (docs/benchmarks.md "Per-step quantization error" measures the
/// cost). Per row, the columns are summed in 16 interleaved FP32 lanes
/// (column c into lane c % 16), the lanes then added in double in a fixed
/// order; rows are added in row order, in double. So both paths give the
/// same bits on every CPU and thread count; the sums differ from
/// QuantStats's (plain column order, double) by the FP32 lanes' rounding,
/// about 1e-7 relative per term added to a lane. A row whose FP32 squares
/// overflow or underflow (|x| above ~1.8e19; a sum of squares below 1e-30)
/// is summed in double instead.
struct ErrorNorms {
  double sum_sq_err = 0;  ///< sum over finite inputs x of (out - x)^2 (NaN if such an output is NaN)
  double sum_sq_ref = 0;  ///< sum over finite inputs x of x^2
  int64_t calls = 0;      ///< fake quantizations summed in (1 after one call; merge adds)

  /// ||out - x|| / ||x||, a fraction: 0 when both sums are 0, +Inf when only
  /// the reference is 0, NaN when the error sum is NaN.
  double rel_error() const;
  /// Adds another call's (or rank's, or micro-batch's) sums.
  void merge(const ErrorNorms& other);
};

/// Fast path. Fake-quantizes `in` [rows, cols] into `out` [rows, cols] under
/// `spec` (validated: throws snip::UserError like validate_quant_spec),
/// stochastic rounding keyed by `key` (check_rounding_key), statistics into
/// `stats` if non-null (overwritten), error norms into `norms` if non-null
/// (overwritten, calls = 1; with a Hadamard transform against x·R). Throws std::invalid_argument for
/// negative sizes, null pointers with a nonzero size, or spec.rule kDelayed
/// (use the DelayedScaling overload). With spec.hadamard_size > 0 the
/// operand is first transformed along each row (x·R, hadamard.h) and `out`
/// holds Q(x·R), the value the GEMM reads (it approximates x·R, not x; the
/// statistics compare it with x·R, which has the same norm as x). `in` may
/// equal `out`.
void fake_quantize(const float* in, float* out, int64_t rows, int64_t cols,
                   const QuantSpec& spec, const RoundingKey& key, QuantStats* stats = nullptr,
                   ErrorNorms* norms = nullptr);

/// Reference path: same contract and results as fake_quantize.
void fake_quantize_reference(const float* in, float* out, int64_t rows, int64_t cols,
                             const QuantSpec& spec, const RoundingKey& key,
                             QuantStats* stats = nullptr, ErrorNorms* norms = nullptr);

/// Delayed scaling (spec.rule == kDelayed, which must equal state.spec()):
/// quantizes with state.scale() (or current scaling before the first record)
/// and then records this call's amax into `state`.
void fake_quantize(const float* in, float* out, int64_t rows, int64_t cols,
                   const RoundingKey& key, DelayedScaling& state, QuantStats* stats = nullptr,
                   ErrorNorms* norms = nullptr);
/// Reference twin of the delayed overload.
void fake_quantize_reference(const float* in, float* out, int64_t rows, int64_t cols,
                             const RoundingKey& key, DelayedScaling& state,
                             QuantStats* stats = nullptr, ErrorNorms* norms = nullptr);

// ---------------------------------------------------------------------------
// Packed storage: element codes, packed, plus the scale array.
// ---------------------------------------------------------------------------

/// Bytes that n codes of `bits` bits occupy: ceil(n / 2) for bits <= 4 (two
/// per byte), n for bits <= 8, 2n for bits <= 16.
int64_t packed_bytes(int64_t n, int bits);
/// Packs codes[0..n) (each < 2^bits): bits <= 4 -> two per byte, element 2i
/// in the low nibble and 2i+1 in the high nibble of byte i (the layout of
/// PyTorch float4_e2m1fn_x2 / TE NVFP4); bits <= 8 -> one byte each; bits <=
/// 16 -> two bytes each, little-endian. Throws std::invalid_argument for
/// bits outside [1, 16].
std::vector<uint8_t> pack_codes(const std::vector<uint16_t>& codes, int bits);
/// Inverse of pack_codes for n codes.
std::vector<uint16_t> unpack_codes(const std::vector<uint8_t>& bytes, int64_t n, int bits);

/// A quantized operand: packed element codes of the row-major [rows, cols]
/// input (flat index row * cols + col) and its scales.
struct QuantizedTensor {
  QuantSpec spec;
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> data;  ///< packed codes, packed_bytes(rows * cols, element.bits) bytes
  ScaleArray scales;          ///< [GR, GC] block scales (+ tensor scale)
};

/// Quantizes to codes + scales with the reference codec. For kDelayed pass
/// the scale to use in `delayed`. dequantize(quantize_packed(x)) equals
/// fake_quantize(x) bit for bit, except that an input NaN in a block with a
/// finite scale has no code in NaN-less formats (it comes back as -0).
QuantizedTensor quantize_packed(const float* in, int64_t rows, int64_t cols,
                                const QuantSpec& spec, const RoundingKey& key,
                                const BlockScale* delayed = nullptr);
/// Decodes every code and multiplies by its block's decode scale: out
/// [rows, cols] = decode(code) * d (NaN where d is NaN).
void dequantize(const QuantizedTensor& q, float* out);

}  // namespace snip::formats
