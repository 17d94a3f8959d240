// snip/formats/scaling.h: scale computation for the scaling schemes of
// quant_spec.h (formulas and sources there), the scale array of a quantized
// operand, and the state of delayed (amax-history) scaling.
//
// Vocabulary: R, C = rows and columns of the row-major operand (C = the
// GEMM's reduction dim K); BR, BC = block shape resolved against [R, C];
// GR = ceil(R / BR), GC = ceil(C / BC) = the scale grid.
#pragma once

#include <cstdint>
#include <vector>

#include "snip/formats/quant_spec.h"

namespace snip::formats {

/// One block's scale. The quantized block is e_i = Q(x_i * encode), the
/// dequantized one e_i * decode.
struct BlockScale {
  float decode = 1.0f;  ///< d (FP32 value of the stored scale, times the tensor scale under kTwoLevel)
  float encode = 1.0f;  ///< m, the rule's encode multiplier (quant_spec.h); NaN when d is NaN
  uint32_t code = 0;    ///< stored code: E8M0 / E4M3 code, or the FP32 bits of d
};

/// The FP32 second level of kTwoLevel (NVFP4) scaling: S_enc = 448 * T /
/// amax_tensor (clamped to FLT_MAX; 1 if amax_tensor = 0), S_dec = 1 / S_enc
/// (TE's compute_global_encode_scaling_factor_FP4). Both NaN if amax_tensor
/// is NaN or Inf. Identity (1, 1) for every other rule.
struct TensorScale {
  float decode = 1.0f;  ///< S_dec
  float encode = 1.0f;  ///< S_enc
};

/// kTwoLevel tensor scale for a tensor whose max |x| is `amax_tensor`.
TensorScale two_level_tensor_scale(float amax_tensor, const QuantSpec& spec);

/// Scale of one block with max |x| = `amax` (NaN-propagating: NaN if any
/// element is NaN) under spec.rule (for kDelayed pass the history max; for
/// kTwoLevel also the tensor scale). Fast bit-level implementation used by
/// the kernels. Never throws.
BlockScale block_scale(float amax, const QuantSpec& spec, const TensorScale& tensor = {});

/// The same as block_scale, written as the references write it (TE's FP32
/// operations in their order, frexp/ilogb/ldexp, the generic E4M3 codec):
/// the obviously-correct twin the tests compare the fast kernels against.
BlockScale block_scale_reference(float amax, const QuantSpec& spec,
                                 const TensorScale& tensor = {});

/// All scales of one quantized operand.
struct ScaleArray {
  int64_t block_rows = 0, block_cols = 0;  ///< BR, BC (resolved, >= 1 unless R or C is 0)
  int64_t grid_rows = 0, grid_cols = 0;    ///< GR, GC
  std::vector<BlockScale> blocks;          ///< [GR, GC] row-major
  TensorScale tensor;                      ///< kTwoLevel second level
  const BlockScale& at(int64_t r, int64_t c) const {
    return blocks[size_t((r / block_rows) * grid_cols + c / block_cols)];
  }
};

/// Reference computation of every block's scale of the row-major `in`
/// [rows, cols] (simple loops, block_scale_reference). For kDelayed,
/// `delayed` is the scale to use (from DelayedScaling::scale()); it must be
/// non-null then. Throws std::invalid_argument on negative sizes or a
/// missing delayed scale.
ScaleArray compute_scales_reference(const float* in, int64_t rows, int64_t cols,
                                    const QuantSpec& spec, const BlockScale* delayed = nullptr);

/// State of per-tensor delayed scaling (TransformerEngine DelayedScaling with
/// amax_compute_algo "max", margin 0): the scale used by a call comes from the
/// amaxes recorded by earlier calls; the call's own amax is recorded after it
/// ran. The history keeps the last spec.amax_history_len finite amaxes; the
/// scale is recomputed from max(history) every spec.scale_refresh_interval
/// records. Before the first record there is no scale: the first call uses
/// current scaling (bootstrap; TE starts from scale 1 instead). Non-finite
/// amaxes are not recorded (counted in skipped()), so one NaN step cannot
/// poison the next history_len steps. Not thread-safe (one per operand).
class DelayedScaling {
 public:
  /// Throws snip::UserError if `spec` is invalid or not kDelayed.
  explicit DelayedScaling(const QuantSpec& spec);

  bool has_scale() const { return has_scale_; }
  /// The scale for the next call (valid when has_scale()).
  const BlockScale& scale() const { return scale_; }
  /// Records the amax of a call and refreshes the scale when due.
  void record(float amax);
  /// Recorded amaxes, oldest first (at most amax_history_len).
  const std::vector<float>& history() const { return history_; }
  /// Number of record() calls, and how many of them were non-finite.
  int64_t calls() const { return calls_; }
  int64_t skipped() const { return skipped_; }
  const QuantSpec& spec() const { return spec_; }

  /// Everything that decides the scales of later calls (for checkpoints).
  struct State {
    std::vector<float> history;   ///< oldest first, finite, >= 0
    int64_t calls = 0;            ///< record() calls so far
    int64_t skipped = 0;          ///< ... of which non-finite (not recorded)
    int64_t since_refresh = 0;    ///< records since the scale was last recomputed
    bool has_scale = false;
    float scale_amax = 0.0f;      ///< the history max the current scale was computed from
  };
  State state() const;
  /// Replaces the state with `s`, so that later calls behave bit for bit as
  /// in the object `s` was taken from. Throws snip::UserError "<what>: ..."
  /// when `s` cannot come from this spec: history longer than
  /// amax_history_len or holding a negative / non-finite value, negative
  /// counts, skipped > calls, since_refresh >= scale_refresh_interval, a
  /// scale without history (or a history without scale), or a scale_amax
  /// that is negative or not finite. The scale itself is recomputed from
  /// scale_amax (block_scale), so it always is the spec's scale.
  void restore(const State& s, const std::string& what);

 private:
  QuantSpec spec_;
  std::vector<float> history_;
  BlockScale scale_;
  float scale_amax_ = 0.0f;
  bool has_scale_ = false;
  int64_t calls_ = 0, skipped_ = 0, since_refresh_ = 0;
};

}  // namespace snip::formats
