// snip/model/linear.h: the one linear layer every `*_proj` goes through.
//
// Shapes (the glossary is in model/llama.h): N = B·T tokens of the
// micro-batch (rows of the layer's input), IN = in_features, OUT =
// out_features.
//
// The layer's three GEMMs are explicit in a custom autograd function
// (docs/method.md section 1):
//
//   fprop  Y  = X  · Wᵀ     X [N, IN],  W [OUT, IN]   reduction dim K = IN
//   dgrad  dX = dY · W      dY [N, OUT], W [OUT, IN]  reduction dim K = OUT
//   wgrad  dW = dYᵀ · X     dY [N, OUT], X [N, IN]    reduction dim K = N
//
// Each of the six operands passes through the layer's OperandQuantizer
// before its GEMM, laid out [rows, K] with K contiguous, because scaling
// blocks always run along the GEMM's reduction dimension. So W is handed over
// as W [OUT, IN] for fprop and as Wᵀ [IN, OUT] for dgrad; X as X [N, IN] for
// fprop and as Xᵀ [IN, N] for wgrad; dY as dY [N, OUT] for dgrad and as
// dYᵀ [OUT, N] for wgrad. With no quantizer the hook is skipped entirely
// (identity, zero cost). The GEMM itself runs in `gemm_dtype` (BF16 with FP32
// accumulation, or the input dtype) and its output is cast back to the input
// dtype (FP32 master weights and activations, or FP64 in tests).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <array>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>
#include <optional>

#include "snip/formats/fake_quant.h"
#include "snip/recipes/gemm.h"

namespace snip {

/// One layer's per-step quantization error (docs/operations.md "Per-step
/// quantization error"): per operand, the ErrorNorms (formats/fake_quant.h)
/// of every quantization of that operand since the last take(), summed
/// (micro-batches of a step add up). Filled by the recipe quantizers while
/// training; evaluation and sampling (QuantStateFreeze) add nothing.
/// Thread-safe.
class OperandErrors {
 public:
  /// Adds one call's sums to operand `op`.
  void add(Operand op, const formats::ErrorNorms& n);
  /// The sums since the last take(), per operand (calls = 0: not quantized),
  /// and starts afresh.
  std::array<formats::ErrorNorms, kNumOperands> take();

 private:
  std::mutex mu_;
  std::array<formats::ErrorNorms, kNumOperands> sums_{};
};

/// What identifies one quantization call, for stochastic rounding's
/// counter-based generator: results depend only on this key and the element
/// index, never on thread count.
struct QuantKey {
  uint64_t seed = 0;   ///< run seed
  int64_t step = 0;    ///< optimizer step
  int64_t layer = 0;   ///< index of the linear layer in the model
  Operand operand = Operand::kFpropX;
  /// Where a recipe quantizer adds the call's error norms (the layer's
  /// QuantLinearImpl::operand_errors during training); nullptr = not recorded.
  /// Not part of the rounding key.
  OperandErrors* errors = nullptr;
};

/// The quantizer hook: fake-quantizes one GEMM operand.
class OperandQuantizer {
 public:
  virtual ~OperandQuantizer() = default;
  /// t: [rows, K], contiguous, K = the GEMM's reduction dimension; float32 or
  /// float64. Returns the dequantized tensor, same shape and dtype.
  virtual torch::Tensor quantize(const torch::Tensor& t, const QuantKey& key) const = 0;
  /// The GEMM's input for operand t: quantize(t, key) as gemm_operand(.., gemm_dtype)
  /// (model/matmul.h) would hand it to the GEMM, bit for bit, layout included
  /// ([rows, K] contiguous). The default calls the two; a quantizer may do both
  /// in one buffer (the recipes round to BF16 in place, no second tensor).
  virtual torch::Tensor quantize_for_gemm(const torch::Tensor& t, const QuantKey& key,
                                          at::ScalarType gemm_dtype) const;
  /// A short name for logs ("fp8", "nvfp4", ...).
  virtual std::string name() const = 0;

  /// An operand of a native FP8 GEMM (at::_scaled_mm): `values` is
  /// quantize(t, key) bit for bit (FP32 [rows, K], the state recorded as
  /// quantize records it), `codes` the same as float8_e4m3fn or
  /// float8_e5m2 [rows, K] (values = codes * scale exactly, up to FP32's
  /// rounding of the product), `scale` the per-tensor decode scale (FP32,
  /// 0-dim, on t's device).
  struct ScaledOperand {
    torch::Tensor values, codes, scale;
  };
  /// Whether operand `op` can be a native FP8 GEMM operand: E4M3 or E5M2
  /// elements with one scale per tensor (current or delayed scaling), no
  /// Hadamard transform, no error feedback on weights. False by default.
  virtual bool scaled_operand(Operand op) const {
    (void)op;
    return false;
  }
  /// For scaled_operand(key.operand): t quantized as quantize() does, with its
  /// codes and scale. Throws std::logic_error for another operand.
  virtual ScaledOperand quantize_scaled(const torch::Tensor& t, const QuantKey& key) const;

  /// The weight operand t ([rows, K] FP32 contiguous: W [OUT, IN] for
  /// kFpropW, Wᵀ [IN, OUT] for kDgradW) as element codes and block scales
  /// whose formats::dequantize equals quantize(t, key) bit for bit, for a
  /// frozen weight stored packed (model/lora.h FrozenWeight). nullopt (the
  /// default) when the operand's quantization is not a fixed function of t
  /// (delayed scaling, stochastic rounding, error feedback, a Hadamard
  /// transform) or not an element format.
  virtual std::optional<formats::QuantizedTensor> quantize_packed(const torch::Tensor& t, const QuantKey& key) const {
    (void)t, (void)key;
    return std::nullopt;
  }

  /// The quantizer's own state that decides later calls (e.g. delayed
  /// scaling's amax histories), as JSON for checkpoints; null when it has
  /// none (the default). Like that state, it changes under const quantize().
  virtual nlohmann::json state() const { return nullptr; }
  /// Restores state() output bit for bit, for a model of `num_layers` linear
  /// layers (layer indices 0 .. num_layers-1). Throws UserError "<what>: ..."
  /// when `st` does not fit this quantizer or model. The default accepts
  /// only null.
  virtual void restore_state(const nlohmann::json& st, const std::string& what, int64_t num_layers) const;
};

/// While an object of this type lives on a thread, quantizers on that thread
/// leave their state() untouched: evaluation and sampling quantize exactly
/// as the next training step would, without recording anything into amax
/// histories. (The statistics passes need none: they run at full precision
/// and build their own quantizers per call.) Nests.
class QuantStateFreeze {
 public:
  QuantStateFreeze();
  ~QuantStateFreeze();
  QuantStateFreeze(const QuantStateFreeze&) = delete;
  QuantStateFreeze& operator=(const QuantStateFreeze&) = delete;
  /// True while a QuantStateFreeze lives on the calling thread.
  static bool active();
};

/// The precision a linear layer runs at during one step. A value: the
/// trainer swaps it between steps (a plan change at a step boundary).
struct LinearPrecision {
  /// nullptr = identity on every operand (no quantization).
  std::shared_ptr<const OperandQuantizer> quantizer;
  /// dtype the GEMMs run in: at::kBFloat16 (FP32 accumulation inside
  /// oneDNN/cuBLAS, output rounded to BF16 then cast back), or
  /// at::ScalarType::Undefined = the input's dtype (FP32, or FP64 in tests).
  at::ScalarType gemm_dtype = at::ScalarType::Undefined;
};

/// What a layer records for the stats step (docs/method.md section 3) while
/// QuantLinearImpl::probe is set: the real operands of one step.
struct LinearProbe {
  torch::Tensor x;   ///< [N, IN] input of the last forward (detached)
  torch::Tensor dy;  ///< [N, OUT] dL/dY of the last backward (detached; not kept when on_dy is set)
  /// When set, called in the layer's backward with dL/dY [N, OUT] (detached)
  /// instead of storing it in `dy`: the stats step processes each layer as its
  /// gradient arrives, so no layer's dY outlives its own backward.
  std::function<void(const torch::Tensor& dy)> on_dy;
  /// When set, backward skips the wgrad GEMM and returns no dW (probe passes
  /// that need only dY, which on_dy receives).
  bool skip_wgrad = false;
  /// When set, called in forward; its [N, OUT] result is added to Y after the
  /// GEMM (curvature probe; generated on the fly, so one layer's noise is
  /// alive at a time). dL/dY is unchanged.
  std::function<torch::Tensor()> output_noise;
  /// When set, called in backward; its [N, IN] result is added to dX after the
  /// dgrad GEMM (WD-upstream calibration).
  std::function<torch::Tensor()> input_grad_noise;
};

/// QuantLinear's GEMMs as functions of tensors, for callers with no
/// QuantLinear: the Python package's custom operators (snip::linear_fprop,
/// snip::linear_backward; docs/python.md). The arithmetic of QuantLinear
/// with precision `p` and key `key` (its operand set per call) bit for bit,
/// without LoRA, a frozen base or stats-step probes.
/// x [N, IN], w [OUT, IN] -> Y = Q(X) · Q(W)ᵀ [N, OUT], in x's dtype.
torch::Tensor linear_fprop(const torch::Tensor& x, const torch::Tensor& w, const LinearPrecision& p,
                           const QuantKey& key);
/// dy [N, OUT], x [N, IN], w [OUT, IN] -> {dX = Q(dY) · Q(Wᵀ)ᵀ [N, IN],
/// dW = Q(dYᵀ) · Q(Xᵀ)ᵀ [OUT, IN]}, in dy's dtype; a result not asked for
/// (need_dx, need_dw) is an undefined tensor.
std::pair<torch::Tensor, torch::Tensor> linear_backward(const torch::Tensor& dy, const torch::Tensor& x,
                                                        const torch::Tensor& w, const LinearPrecision& p,
                                                        const QuantKey& key, bool need_dx, bool need_dw);

struct FrozenWeight;  // model/lora.h

/// A bias-free linear layer y = x · Wᵀ with explicit fprop/dgrad/wgrad GEMMs,
/// and optionally a LoRA adapter: y = x · Wᵀ + (alpha/r) · dropout(x) · Aᵀ · Bᵀ
/// (model/lora.h).
/// Parameter: `weight` [OUT, IN] (Hugging Face name `<layer>.weight`).
class QuantLinearImpl : public torch::nn::Module {
 public:
  /// Weight initialised N(0, init_std²). Throws std::invalid_argument if a
  /// size is not positive.
  QuantLinearImpl(int64_t in_features, int64_t out_features, double init_std);

  /// x: [..., IN] -> [..., OUT] (same dtype as x).
  torch::Tensor forward(const torch::Tensor& x);

  torch::Tensor weight;  ///< [OUT, IN]
  int64_t in_features, out_features;
  std::string name;      ///< Hugging Face module name, e.g. "model.layers.0.self_attn.q_proj"
  int64_t layer_index = 0;
  /// The precision of the next forward; a forward captures it (and the key)
  /// in its autograd context, and its backward uses that capture, so a change
  /// takes effect from the next forward on (plans change at step boundaries).
  LinearPrecision precision;
  QuantKey key_base;     ///< seed and step; layer and operand are filled per call
  /// This layer's per-step quantization error, filled by its forward and
  /// backward (QuantKey::errors); the trainer takes it after each step.
  /// nullptr = not measured (monitor.quant_error = false).
  std::shared_ptr<OperandErrors> operand_errors = std::make_shared<OperandErrors>();

  // ---- stats-step probes (off unless set; see docs/method.md section 3)
  /// When set, forward stores X and backward stores dY into it, and its noise
  /// functions inject the curvature and dgrad probes.
  std::shared_ptr<LinearProbe> probe;

  // ---- LoRA (model/lora.h; off unless lora_rank > 0)
  /// Adds the adapter A [r, IN], B [OUT, r] (copied; submodules "lora_A" and
  /// "lora_B", parameter "weight" each: HF PEFT names) with output scale
  /// `scale` (alpha / r) and input dropout `dropout` (fraction). Throws
  /// std::invalid_argument for mismatched shapes or a second adapter.
  void add_lora(const torch::Tensor& a, const torch::Tensor& b, double scale, double dropout);
  /// Removes the adapter (after merge_lora folded it into `weight`).
  void remove_lora();
  int64_t lora_rank = 0;    ///< r; 0 = no adapter
  double lora_scale = 0;    ///< alpha / r
  double lora_dropout = 0;  ///< fraction of adapter inputs zeroed while gradients are on
  torch::Tensor lora_A;     ///< [r, IN] FP32
  torch::Tensor lora_B;     ///< [OUT, r] FP32
  /// A frozen base weight in the form its precision feeds the GEMMs; used
  /// when made for the forward's precision (then `weight` may be empty).
  std::shared_ptr<const FrozenWeight> frozen;
  /// Called by forward() when `weight` was released and `frozen` was made
  /// for another precision (a precision change outside the step's sync, e.g.
  /// by the guard): re-freezes this layer (FrozenBase::refreeze).
  std::function<void(QuantLinearImpl&)> refreeze;

 private:
  int64_t dropout_step_ = -1, dropout_calls_ = 0;  // the dropout generator's key within a step
};
TORCH_MODULE(QuantLinear);

}  // namespace snip
