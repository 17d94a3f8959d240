// The quantized linear layer: fprop/dgrad/wgrad as an explicit autograd
// function, each operand through the layer's quantizer hook.
#include "snip/model/linear.h"

#include "snip/model/matmul.h"

#include <stdexcept>

namespace snip {

namespace {

// t: [rows, K] (a view; made contiguous only when a quantizer runs) ->
// quantized [rows, K]. Identity, and no copy, when the layer has no quantizer.
torch::Tensor q(const QuantLinearImpl& l, const torch::Tensor& t, Operand op) {
  if (!l.precision.quantizer) return t;
  QuantKey k = l.key_base;
  k.layer = l.layer_index;
  k.operand = op;
  return l.precision.quantizer->quantize(t.contiguous(), k);
}

// a: [M, K], b: [N, K] -> a · bᵀ [M, N] in `dtype` (FP32 accumulation,
// model/matmul.h), cast back to a's dtype. Strided views are fine: mm reads
// transposed operands without copies.
torch::Tensor gemm_nt(const torch::Tensor& a, const torch::Tensor& b, at::ScalarType dtype) {
  if (dtype == at::ScalarType::Undefined || dtype == a.scalar_type()) return torch::mm(a, b.t());
  return gemm_result(torch::mm(gemm_operand(a, dtype), gemm_operand(b, dtype).t()), dtype, a.scalar_type());
}

struct QuantLinearFunction : public torch::autograd::Function<QuantLinearFunction> {
  // x: [T, IN], w: [OUT, IN] -> y [T, OUT]
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x, torch::Tensor w,
                               int64_t layer_ptr) {
    const auto& l = *reinterpret_cast<const QuantLinearImpl*>(layer_ptr);
    // The layer outlives the graph of the step it runs in; the pointer is the
    // only non-tensor state backward needs (its precision at forward time is
    // the one used: plans change only at step boundaries).
    ctx->saved_data["layer"] = layer_ptr;
    const auto dt = l.precision.gemm_dtype;
    if (!l.precision.quantizer && dt != at::ScalarType::Undefined && dt != x.scalar_type()) {
      // Identity hook with a narrower GEMM dtype (the BF16 baseline): cast X
      // and W once and keep the casts for dgrad/wgrad, as autograd's own
      // linear on cast operands does (half the saved bytes, no re-casts).
      const torch::Tensor xc = gemm_operand(x, dt), wc = gemm_operand(w, dt);
      ctx->save_for_backward({xc, wc});
      ctx->saved_data["cast"] = true;
      return gemm_result(torch::mm(xc, wc.t()), dt, x.scalar_type());
    }
    // With a quantizer, backward re-quantizes the originals along its own
    // reduction dims (blocks differ per GEMM), so the originals are saved.
    ctx->save_for_backward({x, w});
    ctx->saved_data["cast"] = false;
    return gemm_nt(q(l, x, Operand::kFpropX), q(l, w, Operand::kFpropW), dt);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto& l = *reinterpret_cast<const QuantLinearImpl*>(ctx->saved_data["layer"].toInt());
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];  // [T, IN]
    const torch::Tensor& w = saved[1];  // [OUT, IN]
    const torch::Tensor& dy = grads[0];  // [T, OUT]
    if (l.capture) {
      if (l.capture->on_dy) l.capture->on_dy(dy.detach());
      else l.capture->dy = dy.detach();
    }
    const auto dt = l.precision.gemm_dtype;
    torch::Tensor dx, dw;
    if (ctx->saved_data["cast"].toBool()) {  // x, w are the GEMM-dtype casts from forward
      const torch::Tensor dyc = gemm_operand(dy, dt);
      if (ctx->needs_input_grad(0)) {
        dx = gemm_result(torch::mm(dyc, w), dt, dy.scalar_type());  // dgrad [T, IN]
        if (l.capture && l.capture->input_grad_noise) dx.add_(l.capture->input_grad_noise());
      }
      // wgrad [OUT, IN] as (Xᵀ·dY)ᵀ: oneDNN is faster with the long T dim of X leading.
      if (ctx->needs_input_grad(1) && !(l.capture && l.capture->skip_wgrad))
        dw = gemm_result(torch::mm(x.t(), dyc).t().contiguous(), dt, dy.scalar_type());
      return {dx, dw, torch::Tensor()};
    }
    if (ctx->needs_input_grad(0)) {
      // dgrad: dX [T, IN] = dY [T, OUT] · W [OUT, IN]; K = OUT, so W goes in as Wᵀ [IN, OUT].
      dx = gemm_nt(q(l, dy, Operand::kDgradDY), q(l, w.t(), Operand::kDgradW), dt);
      if (l.capture && l.capture->input_grad_noise) dx.add_(l.capture->input_grad_noise());
    }
    if (ctx->needs_input_grad(1) && !(l.capture && l.capture->skip_wgrad)) {
      // wgrad: dW [OUT, IN] = dYᵀ [OUT, T] · X [T, IN]; K = T: dYᵀ [OUT, T], Xᵀ [IN, T].
      dw = gemm_nt(q(l, dy.t(), Operand::kWgradDY), q(l, x.t(), Operand::kWgradX), dt);
    }
    return {dx, dw, torch::Tensor()};
  }
};

}  // namespace

QuantLinearImpl::QuantLinearImpl(int64_t in, int64_t out, double init_std)
    : in_features(in), out_features(out) {
  if (in <= 0 || out <= 0) throw std::invalid_argument("QuantLinear: sizes must be positive");
  weight = register_parameter("weight", torch::randn({out, in}) * init_std);
}

torch::Tensor QuantLinearImpl::forward(const torch::Tensor& x) {
  auto sizes = x.sizes().vec();
  TORCH_CHECK(sizes.back() == in_features, "QuantLinear ", name, ": expected last dim ", in_features,
              ", got ", sizes.back());
  const torch::Tensor x2 = x.reshape({-1, in_features});
  if (capture) capture->x = x2.detach();
  torch::Tensor y = QuantLinearFunction::apply(x2, weight, reinterpret_cast<int64_t>(this));
  if (capture && capture->output_noise) y = y + capture->output_noise();
  sizes.back() = out_features;
  return y.view(sizes);
}

}  // namespace snip
