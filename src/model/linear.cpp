// The quantized linear layer: fprop/dgrad/wgrad as an explicit autograd
// function, each operand through the layer's quantizer hook.
#include "snip/model/linear.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/cuda.h>

#include <atomic>
#include <chrono>

#include "snip/model/gemm_timer.h"
#include "snip/model/lora.h"
#include "snip/model/blas.h"
#include "snip/model/matmul.h"
#include "snip/core/error.h"

#include <stdexcept>

namespace snip {

namespace {

// What one forward fixed for its backward: the layer's precision and
// stochastic-rounding key at forward time (a plan change between forward and
// backward cannot reach a step already running). Held in the autograd context
// as a capsule, so the quantizer stays alive as long as the graph.
struct StepPrecision : torch::CustomClassHolder {
  LinearPrecision precision;
  QuantKey key;  // seed, step and layer; the operand is set per call
  /// The layer's frozen base when it was made for this precision (LoRA):
  /// the weight operands come from it instead of quantizing `w`.
  std::shared_ptr<const FrozenWeight> frozen;
};

// t: [rows, K] (a view; made contiguous only when a quantizer runs) -> the
// GEMM's input [rows, K]: quantized and cast as gemm_operand does (model/matmul.h).
// Without a quantizer, just the cast (no copy when there is none to make).
torch::Tensor q(const StepPrecision& sp, const torch::Tensor& t, Operand op) {
  const auto dt = sp.precision.gemm_dtype;
  if (!sp.precision.quantizer) return gemm_operand(t, dt);
  QuantKey k = sp.key;
  k.operand = op;
  return sp.precision.quantizer->quantize_for_gemm(t.contiguous(), k, dt);
}

// a: [M, K], b: [N, K], both GEMM inputs from q() -> a · bᵀ [M, N] with FP32
// accumulation (model/matmul.h), as `out` (the activation dtype). Strided
// views are fine: the GEMM reads transposed operands without copies.
torch::Tensor gemm_nt(const torch::Tensor& a, const torch::Tensor& b, at::ScalarType dtype, at::ScalarType out) {
  return gemm_result(fp32_mm(a, b.t()), dtype, out);
}

// a_in [M, K] · b_in [N, K]ᵀ for operands oa, ob (b_in = W or Wᵀ for the
// weight operands): with both operands per-tensor FP8 (scaled_operand) and
// native FP8 GEMMs on (train.fp8_gemm; model/matmul.h), at::_scaled_mm on
// their codes (BF16 out for a BF16 GEMM dtype, else FP32), as `out` through
// gemm_result; else gemm_nt of the
// quantized operands. A GEMM the device refuses runs on the same operands'
// values (native_fp8_gemm_refused says whether it may).
torch::Tensor qgemm(const StepPrecision& sp, const torch::Tensor& a_in, Operand oa, const torch::Tensor& b_in,
                    Operand ob, at::ScalarType out) {
  const auto dt = sp.precision.gemm_dtype;
  const auto& qz = sp.precision.quantizer;
  const bool b_weight = ob == Operand::kFpropW || ob == Operand::kDgradW;
  const bool b_frozen = b_weight && sp.frozen;
  if (!qz || b_frozen || !qz->scaled_operand(oa) || !qz->scaled_operand(ob) || !native_fp8_gemm(a_in.device()))
    return gemm_nt(q(sp, a_in, oa), b_frozen ? sp.frozen->operand(ob) : q(sp, b_in, ob), dt, out);
  QuantKey ka = sp.key, kb = sp.key;
  ka.operand = oa;
  kb.operand = ob;
  const OperandQuantizer::ScaledOperand a = qz->quantize_scaled(a_in.contiguous(), ka);
  const OperandQuantizer::ScaledOperand b = qz->quantize_scaled(b_in.contiguous(), kb);
  // cuBLASLt's FP8 GEMMs need K and N in multiples of 16; smaller or odd
  // GEMMs take the values.
  const bool shape_ok = !a_in.is_cuda() || (a_in.size(1) % 16 == 0 && b_in.size(0) % 16 == 0);
  if (shape_ok) {
    try {
      // b.codes [N, K] row-major: its transpose is the column-major [K, N] _scaled_mm expects.
      // Stored as the GEMM dtype's outputs are: BF16 rounds once, from the scaled FP32 accumulator.
      const at::ScalarType y_dtype = dt == at::kBFloat16 ? at::kBFloat16 : at::kFloat;
      torch::Tensor y = at::_scaled_mm(a.codes, b.codes.t(), a.scale, b.scale, std::nullopt, std::nullopt, y_dtype);
      count_native_fp8_gemm();
      return gemm_result(y, dt, out);
    } catch (const c10::Error& e) {
      native_fp8_gemm_refused(e.what_without_backtrace());
    }
  }
  return gemm_nt(gemm_operand_fresh(a.values, dt), gemm_operand_fresh(b.values, dt), dt, out);
}

// f() (one GEMM of layer `layer`, its operands' quantization included),
// timed into the installed GemmTimer (model/gemm_timer.h) if any.
template <class F>
torch::Tensor timed(const QuantLinearImpl& layer, Gemm g, F&& f) {
  GemmTimer* t = GemmTimer::active();
  if (!t) return f();
  if (t->cuda_sync()) torch::cuda::synchronize();
  const auto a = std::chrono::steady_clock::now();
  torch::Tensor r = f();
  if (t->cuda_sync()) torch::cuda::synchronize();
  t->add(&layer, g, std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
  return r;
}

struct QuantLinearFunction : public torch::autograd::Function<QuantLinearFunction> {
  // x: [T, IN], w: [OUT, IN] -> y [T, OUT]
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x, torch::Tensor w,
                               int64_t layer_ptr) {
    const auto& l = *reinterpret_cast<const QuantLinearImpl*>(layer_ptr);
    auto sp = c10::make_intrusive<StepPrecision>();
    sp->precision = l.precision;
    sp->key = l.key_base;
    sp->key.layer = l.layer_index;
    sp->key.errors = l.operand_errors.get();
    if (l.frozen && l.frozen->made_for(sp->precision)) sp->frozen = l.frozen;
    if (!sp->frozen && w.numel() == 0)
      fail("layer ", l.name, ": its frozen base weight was released but has no packed form for this precision "
           "(internal: FrozenBase::sync was not called after a plan change)");
    ctx->saved_data["precision"] = c10::IValue::make_capsule(sp);
    // The layer outlives the graph of the step it runs in; backward reads
    // only its stats-step probes (probe) through this pointer.
    ctx->saved_data["layer"] = layer_ptr;
    const auto dt = sp->precision.gemm_dtype;
    if (!sp->precision.quantizer && dt != at::ScalarType::Undefined && dt != x.scalar_type()) {
      // Identity hook with a narrower GEMM dtype (the BF16 baseline): cast X
      // and W once and keep the casts for dgrad/wgrad, as autograd's own
      // linear on cast operands does (half the saved bytes, no re-casts).
      torch::Tensor xc, wc;
      torch::Tensor y = timed(l, Gemm::kFprop, [&] {
        xc = gemm_operand(x, dt);
        wc = sp->frozen ? sp->frozen->operand(Operand::kFpropW) : gemm_operand(w, dt);
        return gemm_result(fp32_mm(xc, wc.t()), dt, x.scalar_type());
      });
      ctx->save_for_backward({xc, wc});
      ctx->saved_data["cast"] = true;
      return y;
    }
    // With a quantizer, backward re-quantizes the originals along its own
    // reduction dims (blocks differ per GEMM), so the originals are saved.
    ctx->save_for_backward({x, w});
    ctx->saved_data["cast"] = false;
    return timed(l, Gemm::kFprop,
                 [&] { return qgemm(*sp, x, Operand::kFpropX, w, Operand::kFpropW, x.scalar_type()); });
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto& l = *reinterpret_cast<const QuantLinearImpl*>(ctx->saved_data["layer"].toInt());
    const auto sp = c10::static_intrusive_pointer_cast<StepPrecision>(ctx->saved_data["precision"].toCapsule());
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];  // [N, IN]
    const torch::Tensor& w = saved[1];  // [OUT, IN]
    const torch::Tensor& dy = grads[0];  // [N, OUT]
    if (l.probe) {
      if (l.probe->on_dy) l.probe->on_dy(dy.detach());
      else l.probe->dy = dy.detach();
    }
    const auto dt = sp->precision.gemm_dtype;
    torch::Tensor dx, dw;
    if (ctx->saved_data["cast"].toBool()) {  // x, w are the GEMM-dtype casts from forward
      // dY cast once for both GEMMs (timed with the first that runs).
      torch::Tensor dyc;
      auto cast_dy = [&]() -> const torch::Tensor& {
        if (!dyc.defined()) dyc = gemm_operand(dy, dt);
        return dyc;
      };
      if (ctx->needs_input_grad(0)) {
        dx = timed(l, Gemm::kDgrad, [&] { return gemm_result(fp32_mm(cast_dy(), w), dt, dy.scalar_type()); });  // dgrad [N, IN]
        if (l.probe && l.probe->input_grad_noise) dx.add_(l.probe->input_grad_noise());
      }
      // wgrad [OUT, IN] as (Xᵀ·dY)ᵀ: oneDNN is faster with the long N dim of X leading.
      if (ctx->needs_input_grad(1) && !(l.probe && l.probe->skip_wgrad))
        dw = timed(l, Gemm::kWgrad,
                   [&] { return gemm_result(fp32_mm(x.t(), cast_dy()).t().contiguous(), dt, dy.scalar_type()); });
      return {dx, dw, torch::Tensor()};
    }
    if (ctx->needs_input_grad(0)) {
      // dgrad: dX [N, IN] = dY [N, OUT] · W [OUT, IN]; K = OUT, so W goes in as Wᵀ [IN, OUT].
      dx = timed(l, Gemm::kDgrad,
                 [&] { return qgemm(*sp, dy, Operand::kDgradDY, w.t(), Operand::kDgradW, dy.scalar_type()); });
      if (l.probe && l.probe->input_grad_noise) dx.add_(l.probe->input_grad_noise());
    }
    if (ctx->needs_input_grad(1) && !(l.probe && l.probe->skip_wgrad)) {
      // wgrad: dW [OUT, IN] = dYᵀ [OUT, N] · X [N, IN]; K = N: dYᵀ [OUT, N], Xᵀ [IN, N].
      dw = timed(l, Gemm::kWgrad,
                 [&] { return qgemm(*sp, dy.t(), Operand::kWgradDY, x.t(), Operand::kWgradX, dy.scalar_type()); });
    }
    return {dx, dw, torch::Tensor()};
  }
};

}  // namespace

namespace {
// The identity hook with a narrower GEMM dtype (the BF16 baseline): X and W
// are cast once and the casts feed every GEMM (QuantLinearFunction's "cast").
bool cast_path(const LinearPrecision& p, const torch::Tensor& x) {
  const auto dt = p.gemm_dtype;
  return !p.quantizer && dt != at::ScalarType::Undefined && dt != x.scalar_type();
}
}  // namespace

torch::Tensor linear_fprop(const torch::Tensor& x, const torch::Tensor& w, const LinearPrecision& p,
                           const QuantKey& key) {
  StepPrecision sp;
  sp.precision = p;
  sp.key = key;
  const auto dt = p.gemm_dtype;
  if (cast_path(p, x)) return gemm_result(fp32_mm(gemm_operand(x, dt), gemm_operand(w, dt).t()), dt, x.scalar_type());
  return qgemm(sp, x, Operand::kFpropX, w, Operand::kFpropW, x.scalar_type());
}

std::pair<torch::Tensor, torch::Tensor> linear_backward(const torch::Tensor& dy, const torch::Tensor& x,
                                                        const torch::Tensor& w, const LinearPrecision& p,
                                                        const QuantKey& key, bool need_dx, bool need_dw) {
  StepPrecision sp;
  sp.precision = p;
  sp.key = key;
  const auto dt = p.gemm_dtype;
  torch::Tensor dx, dw;
  if (cast_path(p, x)) {
    const torch::Tensor dyc = gemm_operand(dy, dt);
    if (need_dx) dx = gemm_result(fp32_mm(dyc, gemm_operand(w, dt)), dt, dy.scalar_type());
    if (need_dw) dw = gemm_result(fp32_mm(gemm_operand(x, dt).t(), dyc).t().contiguous(), dt, dy.scalar_type());
    return {dx, dw};
  }
  if (need_dx) dx = qgemm(sp, dy, Operand::kDgradDY, w.t(), Operand::kDgradW, dy.scalar_type());
  if (need_dw) dw = qgemm(sp, dy.t(), Operand::kWgradDY, x.t(), Operand::kWgradX, dy.scalar_type());
  return {dx, dw};
}

namespace {
thread_local int freeze_depth = 0;
}  // namespace

void OperandErrors::add(Operand op, const formats::ErrorNorms& n) {
  std::lock_guard<std::mutex> g(mu_);
  sums_[size_t(op)].merge(n);
}

std::array<formats::ErrorNorms, kNumOperands> OperandErrors::take() {
  std::lock_guard<std::mutex> g(mu_);
  std::array<formats::ErrorNorms, kNumOperands> out = sums_;
  sums_ = {};
  return out;
}

namespace {
std::atomic<GemmTimer*> installed_timer{nullptr};
}  // namespace

GemmTimer::GemmTimer(bool cuda_sync) : cuda_sync_(cuda_sync) {
  GemmTimer* none = nullptr;
  if (!installed_timer.compare_exchange_strong(none, this))
    throw std::logic_error("GemmTimer: another timer is installed (one at a time)");
}
GemmTimer::~GemmTimer() { installed_timer.store(nullptr); }
GemmTimer* GemmTimer::active() { return installed_timer.load(std::memory_order_acquire); }
void GemmTimer::add(const void* layer, Gemm gemm, double seconds) {
  std::lock_guard<std::mutex> g(mu_);
  seconds_[layer][size_t(gemm)] += seconds;
}
std::map<const void*, std::array<double, 3>> GemmTimer::take() {
  std::lock_guard<std::mutex> g(mu_);
  std::map<const void*, std::array<double, 3>> out;
  out.swap(seconds_);
  return out;
}

QuantStateFreeze::QuantStateFreeze() { ++freeze_depth; }
QuantStateFreeze::~QuantStateFreeze() { --freeze_depth; }
bool QuantStateFreeze::active() { return freeze_depth > 0; }

void OperandQuantizer::restore_state(const nlohmann::json& st, const std::string& what, int64_t) const {
  if (!st.is_null()) fail(what, ": quantizer '", name(), "' keeps no state, got ", st.dump());
}

OperandQuantizer::ScaledOperand OperandQuantizer::quantize_scaled(const torch::Tensor&, const QuantKey& key) const {
  throw std::logic_error("quantize_scaled: quantizer " + name() + " has no per-tensor FP8 operand " +
                         std::string(operand_name(key.operand)));
}

torch::Tensor OperandQuantizer::quantize_for_gemm(const torch::Tensor& t, const QuantKey& key,
                                                  at::ScalarType gemm_dtype) const {
  return gemm_operand(quantize(t, key), gemm_dtype);
}

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
  if (probe) probe->x = x2.detach();
  if (weight.numel() == 0 && refreeze && !(frozen && frozen->made_for(precision))) refreeze(*this);
  torch::Tensor y = QuantLinearFunction::apply(x2, weight, reinterpret_cast<int64_t>(this));
  if (lora_rank > 0) {
    // The adapter in FP32 (model/lora.h): y + (alpha/r) · dropout(x) · Aᵀ · Bᵀ.
    torch::Tensor xa = x2;
    if (lora_dropout > 0 && torch::GradMode::is_enabled()) {
      // Keyed by (seed, step, layer, call within the step): a resumed run
      // draws the same masks.
      if (dropout_step_ != key_base.step) dropout_step_ = key_base.step, dropout_calls_ = 0;
      const uint64_t k = key_base.seed * 0x9E3779B97F4A7C15ull ^ uint64_t(key_base.step) * 0xBF58476D1CE4E5B9ull ^
                         uint64_t(layer_index) * 0x94D049BB133111EBull ^ uint64_t(dropout_calls_++);
      auto gen = at::make_generator<at::CPUGeneratorImpl>(k);
      // Drawn on the host (the same masks on CPU and GPU), then moved to x's device.
      const torch::Tensor keep =
          at::bernoulli(torch::full(x2.sizes(), 1.0 - lora_dropout, x2.options().device(torch::kCPU)), gen)
              .div_(1.0 - lora_dropout)
              .to(x2.device());
      xa = x2 * keep;
    }
    y = y + torch::mm(torch::mm(xa, lora_A.t()), lora_B.t()).mul(lora_scale);
  }
  if (probe && probe->output_noise) y = y + probe->output_noise();
  sizes.back() = out_features;
  return y.view(sizes);
}

void QuantLinearImpl::add_lora(const torch::Tensor& a, const torch::Tensor& b, double scale, double dropout) {
  if (lora_rank > 0) throw std::invalid_argument("QuantLinear " + name + ": already has an adapter");
  if (a.dim() != 2 || b.dim() != 2 || a.size(1) != in_features || b.size(0) != out_features || a.size(0) != b.size(1) ||
      a.size(0) < 1)
    throw std::invalid_argument("QuantLinear " + name + ": adapter shapes must be A [r, IN], B [OUT, r]");
  lora_rank = a.size(0);
  lora_scale = scale;
  lora_dropout = dropout;
  auto ma = std::make_shared<torch::nn::Module>();
  auto mb = std::make_shared<torch::nn::Module>();
  // On the layer's device (train.device; model/device.h).
  lora_A = ma->register_parameter("weight", a.detach().to(weight.device(), torch::kFloat).clone());
  lora_B = mb->register_parameter("weight", b.detach().to(weight.device(), torch::kFloat).clone());
  register_module("lora_A", ma);
  register_module("lora_B", mb);
}

void QuantLinearImpl::remove_lora() {
  if (lora_rank == 0) return;
  unregister_module("lora_A");
  unregister_module("lora_B");
  lora_A = lora_B = torch::Tensor();
  lora_rank = 0;
  lora_scale = lora_dropout = 0;
}

}  // namespace snip
