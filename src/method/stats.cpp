// The stats step (docs/method.md section 3): local GEMM errors per layer and
// option, reduced to LD, WD and Q. Formulas and their sources: stats.h.
#include "snip/method/nonfinite.h"
#include "snip/method/stats.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <exception>
#include <limits>
#include <set>
#include <utility>

#include "snip/model/quantizers.h"
#include "snip/plan/cost_table.h"
#include "snip/core/error.h"
#include "snip/core/kill_point.h"

namespace snip {

namespace {

using torch::Tensor;

// ---------------------------------------------------------------------------
// Per-layer sums (per rank), the all-reduce unit. Each is a 0-dim float64
// tensor on the layer's device, so nothing syncs until the one reduction.

enum Field : int {
  kYSq = 0,   // ||Y||²
  kDxSq,      // ||dX||²
  kDwSq,      // ||dW||²
  kWSq,       // ||W||²
  kCNum,      // Σ_k <ε_k, g(ε_k) − g(0)>
  kCDen,      // Σ_k ||ε_k||²
  kCalDuSq,   // ||U(dW + δ) − U(dW)||² of the calibration pass
  kTokens,    // N (rows of X): known only where the layer was measured
  kGroup,     // the first layer index sharing this layer's input tensor (siblings: q/k/v, gate/up)
  kNumCommon
};
enum OptField : int {
  kGe = 0,  // <g, e_fprop>
  kEfSq,    // ||e_fprop||²
  kEdSq,    // ||e_dgrad||²
  kEwSq,    // ||e_wgrad||²
  kDuSq,    // ||U(dW + e_wgrad) − U(dW)||²
  kUfF,     // fprop's two operands (X, W): non-zero elements that quantize to zero
  kNzF,     //   ... and their non-zero elements
  kUfD,     // dgrad's (dY, W): the same
  kNzD,
  kUfW,     // wgrad's (dYᵀ, Xᵀ): the same
  kNzW,
  kNumPerOption
};

Tensor sq_sum(const Tensor& t) { return t.pow(2).sum(at::kDouble); }
Tensor inner_sum(const Tensor& a, const Tensor& b) { return (a * b).sum(at::kDouble); }
// The non-zero mask of an operand and its count (0-d float64), taken once
// per layer: every option's underflow reads them (a transposed operand's mask
// is the mask's transpose, its count the same).
struct NonZero {
  Tensor mask, count;
  explicit NonZero(const Tensor& a) : mask(a.ne(0)), count(mask.sum(at::kDouble)) {}
};
// Of the non-zero elements of `a` (nz), those its quantization `qa` sends to
// zero (TE's "underflow"), as a 0-d float64 count; an identity quantizer has none.
Tensor underflow_count(const Tensor& a, const Tensor& nz_mask, const Tensor& qa) {
  if (qa.is_same(a)) return torch::zeros({}, a.options().dtype(torch::kDouble));
  return nz_mask.logical_and(qa.eq(0)).sum(at::kDouble);
}

// splitmix64's finaliser (Steele, Lea, Flood 2014): a bijective 64-bit mix.
uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Purposes of the probe noise streams: curvature probe k uses k, the
// WD-upstream calibration this one.
constexpr uint64_t kCalibrationStream = 0xca11b4a7e0000000ULL;

uint64_t noise_seed(uint64_t seed, int64_t step, int64_t layer, uint64_t stream) {
  uint64_t h = mix64(seed);
  h = mix64(h ^ uint64_t(step));
  h = mix64(h ^ uint64_t(layer));
  return mix64(h ^ stream);
}

// z ~ N(0, 1) [rows, cols], drawn on the CPU (the same numbers on every
// device), in `like`'s dtype and device.
Tensor gaussian(int64_t rows, int64_t cols, uint64_t seed, const Tensor& like) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  // Drawn directly in the operand dtype: no float64 copy of an activation-sized tensor.
  return torch::randn({rows, cols}, gen, like.options().device(torch::kCPU)).to(like.device());
}

// ---------------------------------------------------------------------------
// AdamW, read-only.

// U(g) of torch::optim::AdamW, weight decay left out (it cancels in every
// difference we take). Same operation order as LibTorch 1.13 adamw.cpp.
Tensor adam_update(const AdamwState& s, const Tensor& g) {
  const double t = double(s.step + 1);
  const double bc1 = 1.0 - std::pow(s.beta1, t);
  const double bc2 = 1.0 - std::pow(s.beta2, t);
  Tensor m = s.m.defined() ? s.m * s.beta1 : torch::zeros_like(g);
  m = m.add(g, 1.0 - s.beta1);
  Tensor v = s.v.defined() ? s.v * s.beta2 : torch::zeros_like(g);
  v = v.addcmul(g, g, 1.0 - s.beta2);
  if (s.amsgrad && s.vmax.defined()) v = torch::max(s.vmax, v);
  Tensor denom = (v.sqrt() / std::sqrt(bc2)).add_(s.eps);
  return m.div(denom).mul_(-s.lr / bc1);
}

// ---------------------------------------------------------------------------
// Saves and restores every probe and precision of the layers (RAII, so a
// throwing loss_fn leaves nothing behind).
class LayerStateGuard {
 public:
  explicit LayerStateGuard(const std::vector<QuantLinear>& layers) : layers_(layers) {
    for (const auto& l : layers_) {
      precision_.push_back(l->precision);
      probe_.push_back(l->probe);
    }
  }
  ~LayerStateGuard() {
    for (size_t i = 0; i < layers_.size(); ++i) {
      layers_[i]->precision = precision_[i];
      layers_[i]->probe = probe_[i];
    }
  }
  LayerStateGuard(const LayerStateGuard&) = delete;
  LayerStateGuard& operator=(const LayerStateGuard&) = delete;

 private:
  std::vector<QuantLinear> layers_;
  std::vector<LinearPrecision> precision_;
  std::vector<std::shared_ptr<LinearProbe>> probe_;
};

void validate(const StatsOptions& o) {
  if (o.options.empty()) fail("stats.options: expected at least one option, got none");
  std::set<std::string> seen;
  for (const auto& p : o.options) {
    if (p.empty()) fail("stats.options: expected non-empty option names, got \"\"");
    if (!seen.insert(p).second) fail("stats.options: expected unique names, got '", p, "' twice");
    if (p == o.reference)
      fail("stats.options: expected candidate options, got the reference '", p,
           "' (its Q is 0 by definition; leave it out)");
  }
  if (!seen.count(o.low_option))
    fail("stats.low_option: expected one of the options, got '", o.low_option, "'");
  if (o.curvature_probes < 0)
    fail("stats.curvature_probes: expected an integer >= 0, got ", o.curvature_probes);
  if (!(o.noise_scale > 0) || !std::isfinite(o.noise_scale))
    fail("stats.noise_scale: expected a finite number > 0, got ", o.noise_scale);
  if (!(o.alpha >= 0 && o.alpha <= 1)) fail("stats.alpha: expected a number in [0, 1], got ", o.alpha);
  if (!(o.dgrad_noise_rel > 0) || !std::isfinite(o.dgrad_noise_rel))
    fail("stats.dgrad_noise_rel: expected a finite number > 0, got ", o.dgrad_noise_rel);
  if (!(o.grad_scale > 0) || !std::isfinite(o.grad_scale))
    fail("stats.grad_scale: expected a finite number > 0, got ", o.grad_scale);
}

std::shared_ptr<const OperandQuantizer> resolve_quantizer(const StatsOptions& o, const std::string& name) {
  auto it = o.quantizers.find(name);
  if (it != o.quantizers.end()) return it->second;
  try {
    return make_recipe_quantizer(o.recipes, name);
  } catch (const UserError& e) {
    fail("stats.options: option '", name, "': ", e.what());
  }
}

// What run_stats_step() keeps of one layer between passes.
struct LayerWork {
  std::shared_ptr<LinearProbe> probe;  // pass A's X; released after pass A
  bool processed = false;                   // pass A's on_dy hook ran
  const void* x_ptr = nullptr;              // pass A's X: storage and shape (siblings share X)
  size_t group = 0;                         // the first local layer with the same X (its own index if none)
  std::vector<int64_t> x_sizes;
  bool calibrated = false;                  // pass C's on_dy hook ran
  int probed = 0;                           // curvature probes whose on_dy hook ran
  std::vector<Tensor> f;                   // [kNumCommon + kNumPerOption·options] sums
  Tensor row_rms;                          // [T, 1] rms of Y's rows
  std::vector<Tensor> eps_dot_g0;          // [K] <ε_k, g(0)>
  std::vector<int> upstream;               // U(l), indices into layers
  int64_t T = 0;
};

double ratio_sqrt(double num, double den) {
  if (den > 0) return std::sqrt(num / den);
  return num > 0 ? std::numeric_limits<double>::infinity() : 0.0;
}

}  // namespace

AdamwState adamw_state_of(const torch::optim::AdamW& opt, const Tensor& param, const std::string& what) {
  const c10::TensorImpl* impl = param.unsafeGetTensorImpl();
  const torch::optim::AdamWOptions* o = nullptr;
  for (const auto& g : opt.param_groups())
    for (const auto& p : g.params())
      if (p.unsafeGetTensorImpl() == impl)
        o = &static_cast<const torch::optim::AdamWOptions&>(g.options());
  if (!o) fail("stats: ", what, ": expected the weight to be a parameter of the optimizer, got one it does not hold");
  AdamwState s;
  s.lr = o->lr();
  s.beta1 = std::get<0>(o->betas());
  s.beta2 = std::get<1>(o->betas());
  s.eps = o->eps();
  s.amsgrad = o->amsgrad();
  // LibTorch keys the state by the TensorImpl address (optim/adamw.cpp).
  auto it = opt.state().find(const_cast<c10::TensorImpl*>(impl));
  if (it != opt.state().end()) {
    const auto& st = static_cast<const torch::optim::AdamWParamState&>(*it->second);
    s.m = st.exp_avg();
    s.v = st.exp_avg_sq();
    s.vmax = st.max_exp_avg_sq();
    s.step = st.step();
  }
  return s;
}

torch::Tensor adamw_update(const torch::optim::AdamW& opt, const torch::Tensor& param,
                           const torch::Tensor& grad) {
  torch::NoGradGuard ng;
  return adam_update(adamw_state_of(opt, param, "adamw_update"), grad.detach());
}

int64_t stats_fields(size_t n_options) { return int64_t(kNumCommon + kNumPerOption * n_options); }

static_assert(int(StatsField::kDxSq) == kDxSq && int(StatsField::kGroup) == kGroup && int(StatsField::kCurvatureNum) == kCNum &&
              int(StatsField::kCalibrationDuSq) == kCalDuSq);

torch::Tensor curvature_noise(const StatsOptions& o, int64_t step, const LayerShape& layer, int k,
                              const torch::Tensor& row_rms) {
  return gaussian(row_rms.size(0), layer.out_features, noise_seed(o.seed, step, layer.layer_index, uint64_t(k)), row_rms)
      .mul_(row_rms * o.noise_scale);
}

torch::Tensor calibration_noise(const StatsOptions& o, int64_t step, const LayerShape& layer, int64_t rows,
                                const torch::Tensor& dx_sq, const torch::Tensor& like) {
  Tensor z = gaussian(rows, layer.in_features, noise_seed(o.seed, step, layer.layer_index, kCalibrationStream), like);
  return z.mul_((dx_sq.sqrt() * o.dgrad_noise_rel / z.pow(2).sum(at::kDouble).sqrt()).to(z.scalar_type()));
}

torch::Tensor calibration_du_sq(const torch::Tensor& x, const torch::Tensor& dy, const torch::Tensor& dw,
                                const AdamwState& st, const StatsOptions& o) {
  const Tensor dWc = torch::mm(dy.reshape({x.size(0), -1}).t(), x).to(dw.scalar_type());
  const Tensor du = adam_update(st, dWc * o.grad_scale) - adam_update(st, dw * o.grad_scale);
  return sq_sum(du);
}

LayerSums measure_layer(const torch::Tensor& x, const torch::Tensor& dy, const torch::Tensor& weight,
                        const std::vector<std::shared_ptr<const OperandQuantizer>>& quant, const AdamwState& st,
                        const StatsOptions& o, uint64_t key_seed, const LayerShape& layer, int64_t step) {
  torch::NoGradGuard ng;
  const size_t n_opt = quant.size();
  const int64_t T = x.size(0);
  const auto dopt = torch::TensorOptions().dtype(torch::kDouble).device(weight.device());
  LayerSums out;
  std::vector<Tensor>& f0 = out.sums;
  f0.assign(size_t(stats_fields(n_opt)), Tensor());
  for (auto& t : f0) t = torch::zeros({}, dopt);
  const Tensor X = x;                                           // [T, IN]
  const Tensor G = dy.reshape({T, -1});                         // [T, OUT]
  const Tensor W = weight.detach().to(X.scalar_type());         // [OUT, IN]
  // dW [OUT, IN] = dYᵀ·X in the operand dtype (the pass itself runs no wgrad GEMM).
  const Tensor dWl = torch::mm(G.t(), X);
  const Tensor Y = torch::mm(X, W.t());                         // [T, OUT]
  const Tensor dX = torch::mm(G, W);                            // [T, IN]
  f0[kYSq] = sq_sum(Y);
  f0[kDxSq] = sq_sum(dX);
  f0[kDwSq] = sq_sum(dWl);
  f0[kWSq] = sq_sum(W);
  f0[kTokens] = torch::full({}, double(T), dopt);
  out.row_rms = Y.pow(2).mean(1, /*keepdim=*/true).sqrt();     // [T, 1]
  for (int k = 0; k < o.curvature_probes; ++k) {
    const Tensor eps = curvature_noise(o, step, layer, k, out.row_rms);  // [T, OUT]
    out.eps_dot_g0.push_back(inner_sum(eps, G));
    f0[kCDen] = f0[kCDen] + sq_sum(eps);
  }
  const NonZero nzX(X), nzG(G), nzW(W);
  const Tensor dWp = dWl.to(weight.scalar_type());
  // A frozen base has no update: WD stays 0 (StatsOptions::frozen).
  const Tensor u0 = o.frozen ? Tensor() : adam_update(st, dWp * o.grad_scale);  // [OUT, IN], param dtype
  for (size_t p = 0; p < n_opt; ++p) {
    const OperandQuantizer* q = quant[p].get();
    auto Q = [&](const Tensor& t, Operand op) {
      if (!q) return t;
      QuantKey key{key_seed, step, layer.layer_index, op};
      return q->quantize(t.contiguous(), key);
    };
    // e = Q(a)·Q(b)ᵀ − ref. An option that leaves both operands of a GEMM
    // unchanged (an identity quantizer) has no error there by definition:
    // e = 0 exactly, the product not recomputed (a second GEMM over copied
    // operands, in another layout, differs from the first in the last bits).
    auto gemm_error = [](const Tensor& a, const Tensor& qa, const Tensor& b, const Tensor& qb, const Tensor& ref) {
      auto same = [](const Tensor& t, const Tensor& q) { return q.is_same(t) || torch::equal(q, t); };
      if (same(a, qa) && same(b, qb)) return torch::zeros_like(ref);
      Tensor e = torch::mm(qa, qb.t());
      e.sub_(ref);  // in place: one temporary of ref's shape, not two
      return e;
    };
    Tensor* f = &f0[kNumCommon + kNumPerOption * p];
    // Underflow of one GEMM: both operands' counts summed; `ta` / `tb` say
    // whether a / b is the transpose of the operand its NonZero was taken on.
    auto underflow = [&](const Tensor& a, const NonZero& za, bool ta, const Tensor& qa, const Tensor& b,
                         const NonZero& zb, bool tb, const Tensor& qb, int uf, int nz) {
      f[uf] = underflow_count(a, ta ? za.mask.t() : za.mask, qa) + underflow_count(b, tb ? zb.mask.t() : zb.mask, qb);
      f[nz] = za.count + zb.count;
    };
    {
      const Tensor qx = Q(X, Operand::kFpropX), qw = Q(W, Operand::kFpropW);
      const Tensor ef = gemm_error(X, qx, W, qw, Y);  // [T, OUT]
      f[kGe] = inner_sum(G, ef);
      f[kEfSq] = sq_sum(ef);
      underflow(X, nzX, false, qx, W, nzW, false, qw, kUfF, kNzF);
    }
    {
      const Tensor Wt = W.t();
      const Tensor qg = Q(G, Operand::kDgradDY), qwt = Q(Wt, Operand::kDgradW);
      const Tensor ed = gemm_error(G, qg, Wt, qwt, dX);  // [T, IN]
      f[kEdSq] = sq_sum(ed);
      underflow(G, nzG, false, qg, Wt, nzW, true, qwt, kUfD, kNzD);
    }
    {
      const Tensor Gt = G.t(), Xt = X.t();
      const Tensor qgt = Q(Gt, Operand::kWgradDY), qxt = Q(Xt, Operand::kWgradX);
      const Tensor ew = gemm_error(Gt, qgt, Xt, qxt, dWl);  // [OUT, IN]
      f[kEwSq] = sq_sum(ew);
      underflow(Gt, nzG, true, qgt, Xt, nzX, true, qxt, kUfW, kNzW);
      if (!o.frozen) {
        const Tensor g1 = (dWp + ew.to(weight.scalar_type())) * o.grad_scale;
        f[kDuSq] = sq_sum(adam_update(st, g1) - u0);
      }
    }
  }
  out.dw = dWp;
  return out;
}

StatsStep run_stats_step(std::vector<QuantLinear> layers, const std::function<torch::Tensor()>& loss_fn,
                  torch::optim::AdamW& opt, const StatsOptions& o, int64_t step) {
  validate(o);
  const size_t L = layers.size();
  if (L == 0) fail("stats: expected at least one layer, got none");
  for (size_t i = 0; i < L; ++i) SNIP_CHECK(!layers[i].is_empty(), "layer ", i, " is null");
  const size_t n_opt = o.options.size();
  std::vector<std::shared_ptr<const OperandQuantizer>> quant;
  for (const auto& p : o.options) quant.push_back(resolve_quantizer(o, p));
  const int K = o.curvature_probes;
  if (!o.local.empty() && o.local.size() != L) fail("stats: local: expected ", L, " flags, got ", o.local.size());
  auto is_local = [&](size_t l) { return o.local.empty() || o.local[l] != 0; };
  std::vector<size_t> mine;  // the layers this rank measures
  for (size_t l = 0; l < L; ++l)
    if (is_local(l)) mine.push_back(l);
  auto what = [&](size_t l) {
    return str_cat("layer '", layers[l]->name, "' (index ", layers[l]->layer_index, ")");
  };

  LayerStateGuard guard(layers);
  torch::AutoGradMode grad_on(true);
  std::vector<Tensor> weights;
  for (auto& l : layers) {
    l->precision = LinearPrecision{};  // measure at full precision (operand dtype GEMMs)
    l->probe = nullptr;
    weights.push_back(l->weight);
  }
  auto scalar_loss = [&](const char* pass) {
    Tensor loss = loss_fn();
    if (!loss.defined() || loss.numel() != 1 || !loss.requires_grad())
      fail("stats: loss_fn (", pass, "): expected a scalar loss that requires grad, got ",
           loss.defined() ? str_cat("a tensor of shape ", loss.sizes(), loss.requires_grad() ? "" : " without grad")
                          : std::string("an undefined tensor"));
    return loss.reshape({});
  };
  std::vector<AdamwState> adam(L);
  if (!o.frozen)
    for (size_t l : mine) adam[l] = adamw_state_of(opt, layers[l]->weight, what(l));
  std::vector<Tensor> local_weights;
  for (size_t l : mine) local_weights.push_back(weights[l]);
  // A frozen base: its weights ask for gradients while the passes run (each
  // layer's backward must run to hand over dY), and stop asking after.
  struct FrozenMark {
    std::vector<Tensor> w;
    ~FrozenMark() {
      for (auto& t : w) t.set_requires_grad(false);
    }
  } frozen_mark;
  if (o.frozen)
    for (auto& t : local_weights)
      if (!t.requires_grad()) {
        t.set_requires_grad(true);
        frozen_mark.w.push_back(t);
      }
  // One pass: forward + backward of the micro-batch (no wgrad wanted: the
  // probes compute what they need in the layers' backward).
  auto run_pass = [&](const char* pass) {
    if (o.pass_fn) return o.pass_fn(local_weights);
    Tensor loss = scalar_loss(pass);
    torch::autograd::grad({loss}, local_weights, {}, /*retain_graph=*/false, /*create_graph=*/false,
                          /*allow_unused=*/true);
  };


  const auto dopt = torch::TensorOptions().dtype(torch::kDouble).device(weights[0].device());
  auto zero = [&] { return torch::zeros({}, dopt); };
  std::vector<LayerWork> work(L);

  // ---- per layer: errors of every option on pass A's operands, computed in
  // the layer's own backward as its dY arrives (LinearProbe::on_dy), so only
  // the layer being processed holds temporaries and no dY is kept.
  std::vector<LayerShape> shapes(L);
  for (size_t l = 0; l < L; ++l)
    shapes[l] = LayerShape{layers[l]->name, layers[l]->layer_index, layers[l]->in_features, layers[l]->out_features};
  auto process = [&](size_t l, const Tensor& dy) {
    torch::NoGradGuard ng;
    LayerWork& w = work[l];
    w.T = w.probe->x.size(0);
    LayerSums m = measure_layer(w.probe->x, dy, layers[l]->weight, quant, adam[l], o, layers[l]->key_base.seed,
                                shapes[l], step);
    w.f = std::move(m.sums);
    w.row_rms = std::move(m.row_rms);
    w.eps_dot_g0 = std::move(m.eps_dot_g0);
    const Tensor dWp = std::move(m.dw);
    // Kept until pass C in the weight's .grad (the scratch run_stats_step() borrows).
    if (!o.frozen) layers[l]->weight.mutable_grad().copy_(dWp);
    // Identity of X for the upstream sets, then let autograd free it.
    work[l].x_ptr = w.probe->x.data_ptr();
    work[l].x_sizes = w.probe->x.sizes().vec();
    w.probe->x = Tensor();
    work[l].processed = true;
  };

  // dW of pass A lives in each weight's .grad until pass C: at a step boundary
  // (after zero_grad) those are allocated zeros, so the stats step needs no
  // gradient copy of its own. Whatever they held is put back at the end.
  struct GradBackup {
    std::vector<Tensor>& w;
    std::vector<int> kind;  // 0 undefined, 1 zeros, 2 saved copy
    std::vector<Tensor> saved;
    ~GradBackup() {
      torch::NoGradGuard ng;
      for (size_t i = 0; i < w.size(); ++i) {
        if (kind[i] < 0) continue;
        if (kind[i] == 0) w[i].mutable_grad() = Tensor();
        else if (kind[i] == 1) w[i].mutable_grad().zero_();
        else w[i].mutable_grad().copy_(saved[i]);
      }
    }
  } grads{weights, std::vector<int>(L, 0), std::vector<Tensor>(L)};
  if (o.frozen) grads.kind.assign(L, -1);  // a frozen base's .grad is never touched
  if (!o.frozen) {
    torch::NoGradGuard ng;
    for (size_t l : mine) {
      Tensor& g = weights[l].mutable_grad();
      if (!g.defined()) {
        g = torch::zeros_like(weights[l]);
      } else if (g.count_nonzero().item<int64_t>() == 0) {
        grads.kind[l] = 1;
      } else {
        grads.kind[l] = 2;
        grads.saved[l] = g.clone();
      }
    }
  }

  // ---- pass A: clean forward + backward with capture on; each layer is
  // processed in its backward (no wgrad: process() computes dW itself).
  std::exception_ptr hook_error;
  auto guarded = [&](auto&& f) {
    if (hook_error) return;
    try {
      f();
    } catch (...) {
      hook_error = std::current_exception();
    }
  };
  for (size_t l : mine) {
    work[l].probe = std::make_shared<LinearProbe>();
    work[l].probe->skip_wgrad = true;
    work[l].probe->on_dy = [&, l](const Tensor& dy) { guarded([&] { process(l, dy); }); };
    layers[l]->probe = work[l].probe;
  }
  // Not retained: pass C runs its own forward, so activations are freed as
  // this backward proceeds, as in a training step.
  run_pass("pass A");
  test_kill_point("stats@" + std::to_string(step));  // tests/cli/kill_resume.py
  for (auto& l : layers) l->probe = nullptr;
  if (o.all_gather) {
    // Several ranks: every rank must have measured every layer before the
    // one reduction below (a rank that stopped alone would leave the others
    // waiting in it until dist.timeout_s). [L + 1] int64: 1 per measured
    // layer, then 1 when this rank's hooks raised an error.
    Tensor measured = torch::zeros({int64_t(L) + 1}, torch::kLong);
    for (size_t l = 0; l < L; ++l) measured[int64_t(l)] = int64_t(work[l].processed || !is_local(l));
    measured[int64_t(L)] = int64_t(bool(hook_error));
    const std::vector<Tensor> all = o.all_gather(measured);
    SNIP_CHECK(!all.empty(), "all_gather returned no tensors");
    for (size_t k = 0; k < all.size(); ++k) {
      const Tensor t = all[k].to(torch::kCPU).contiguous();
      SNIP_CHECK(t.numel() == int64_t(L) + 1 && t.scalar_type() == torch::kLong,
                 "all_gather changed the mask's shape or dtype");
      if (t[int64_t(L)].item<int64_t>() != 0) {
        if (hook_error) std::rethrow_exception(hook_error);
        fail("stats step at step ", step, ": rank ", k, " failed while measuring (its own error is in its log)");
      }
      for (size_t l = 0; l < L; ++l)
        if (t[int64_t(l)].item<int64_t>() == 0)
          fail("stats step at step ", step, ": rank ", k, " did not measure ", what(l),
               " (no input/gradient reached it in loss_fn's forward and backward there); every rank must "
               "measure every layer");
    }
  }
  if (hook_error) std::rethrow_exception(hook_error);
  for (size_t l : mine) {
    if (!work[l].processed)
      fail("stats: ", what(l), ": expected it to take part in loss_fn's forward and backward, ",
           "got no input/gradient (is it in the model loss_fn runs?)");
  }
  // U(l): earlier layers whose input is not l's input tensor (q/k/v and
  // gate/up share one input: siblings, not upstream of each other); a layer
  // of another stage never shares its input. Measured here as a group id
  // (the first layer with the same input), which travels in the reduction;
  // the local U(l) only decides where pass C injects noise.
  for (size_t l : mine) {
    size_t g = l;
    for (size_t k : mine) {
      if (k >= l) break;
      const bool same = work[k].x_ptr == work[l].x_ptr && work[k].x_sizes == work[l].x_sizes;
      if (same) {
        g = k;
        break;
      }
    }
    work[l].group = g;
    work[l].f[kGroup] = torch::full({}, double(g), dopt);
    for (size_t k = 0; k < l; ++k)
      if (!is_local(k) || work[k].group != g) work[l].upstream.push_back(int(k));
  }

  // ---- pass C: one extra backward of pass A's graph with relative noise ξ_l
  // on every dX that has upstream layers (WD upstream calibration). Each
  // layer's dW + δ = (dY + δdY)ᵀ·X and its update change are computed in its
  // backward; ξ_l is generated when the layer's dgrad needs it. Not for a
  // frozen base (no weight update to calibrate).
  if (!o.frozen) {
    std::vector<std::shared_ptr<LinearProbe>> cap(L);
    for (size_t l : mine) {
      cap[l] = std::make_shared<LinearProbe>();
      cap[l]->skip_wgrad = true;
      cap[l]->on_dy = [&, l](const Tensor& dy) {
        guarded([&] {
          torch::NoGradGuard ng;
          const Tensor X = cap[l]->x;  // [T, IN] of pass C's forward (= pass A's: deterministic)
          cap[l]->x = Tensor();
          work[l].f[kCalDuSq] = calibration_du_sq(X, dy, weights[l].grad(), adam[l], o);
          work[l].calibrated = true;
        });
      };
      if (!work[l].upstream.empty()) {
        cap[l]->input_grad_noise = [&, l] {
          torch::NoGradGuard ng;
          return calibration_noise(o, step, shapes[l], work[l].T, work[l].f[kDxSq],
                                   torch::empty({0}, weights[l].options()));
        };
      }
      layers[l]->probe = cap[l];
    }
    run_pass("calibration");
    for (auto& l : layers) l->probe = nullptr;
    if (hook_error) std::rethrow_exception(hook_error);
    for (size_t l : mine) SNIP_CHECK(work[l].calibrated, "calibration backward lost ", what(l));
  }
  for (auto& w : work) w.probe.reset();

  // ---- pass B: curvature probes, one forward + backward each, output noise
  // ε_l on every layer, generated in the layer's forward and again in its
  // backward, where dL/dY = g_l(ε) arrives (no wgrad GEMMs, no stored ε).
  for (int k = 0; k < K; ++k) {
    for (size_t l : mine) {
      auto c = std::make_shared<LinearProbe>();
      c->skip_wgrad = true;
      c->output_noise = [&, l, k] {
        torch::NoGradGuard ng;
        return curvature_noise(o, step, shapes[l], k, work[l].row_rms);
      };
      c->on_dy = [&, l, k](const Tensor& dy) {
        guarded([&] {
          torch::NoGradGuard ng;
          const Tensor eps = curvature_noise(o, step, shapes[l], k, work[l].row_rms);
          work[l].f[kCNum] = work[l].f[kCNum] + inner_sum(eps, dy.reshape(eps.sizes())) - work[l].eps_dot_g0[size_t(k)];
          work[l].probed = k + 1;
        });
      };
      layers[l]->probe = c;
    }
    run_pass("curvature probe");
    for (auto& l : layers) l->probe = nullptr;
    if (hook_error) std::rethrow_exception(hook_error);
    for (size_t l : mine)
      if (work[l].probed != k + 1)
        fail("stats: ", what(l), ": expected its output to reach the loss in the curvature probe, got no gradient");
  }

  // ---- one reduction: [L·fields + 1] float64 sums (the last is the rank count).
  const size_t F = kNumCommon + kNumPerOption * n_opt;
  std::vector<Tensor> flat;
  for (size_t l = 0; l < L; ++l) {
    if (is_local(l))
      for (const Tensor& t : work[l].f) flat.push_back(t.to(dopt));
    else
      for (size_t i = 0; i < F; ++i) flat.push_back(zero());
  }
  flat.push_back(torch::full({}, o.count_weight, dopt));
  Tensor buf = torch::stack(flat);
  if (o.all_reduce_sum) o.all_reduce_sum(buf);
  buf = buf.to(torch::kCPU).contiguous();
  SNIP_CHECK(buf.numel() == int64_t(flat.size()) && buf.scalar_type() == torch::kDouble,
             "all_reduce_sum changed the buffer's shape or dtype");
  return derive_stats(buf, shapes, o, step);
}

StatsStep derive_stats(const torch::Tensor& reduced, const std::vector<LayerShape>& layers, const StatsOptions& o,
                       int64_t step) {
  const size_t L = layers.size(), n_opt = o.options.size();
  const size_t F = size_t(stats_fields(n_opt));
  const double r = o.dgrad_noise_rel;
  const Tensor buf = reduced.to(torch::kCPU).contiguous();
  if (buf.scalar_type() != torch::kDouble || buf.numel() != int64_t(L * F + 1))
    fail("stats: expected a float64 buffer of ", L * F + 1, " sums (", L, " layers x ", F, " + 1), got ",
         c10::toString(buf.scalar_type()), " ", buf.sizes());
  const double* b = buf.data_ptr<double>();
  const double R = b[L * F];
  SNIP_CHECK(R >= 1, "all_reduce_sum produced a rank count of ", R);
  auto field = [&](size_t l, size_t i) { return b[l * F + i] / R; };

  // ---- derive.
  StatsStep out;
  out.step = step;
  out.options = o.options;
  out.low_option = o.low_option;
  out.reference = o.reference;
  out.first_order = o.first_order;
  out.alpha = o.frozen ? 1.0 : o.alpha;
  out.ranks = int64_t(std::llround(R));
  // U(l) of every layer from the group ids every stage measured (the same
  // sets as the local ones in one process).
  std::vector<std::vector<int>> upstream(L);
  std::vector<int64_t> tokens(L);
  for (size_t l = 0; l < L; ++l) {
    tokens[l] = int64_t(std::llround(field(l, kTokens)));
    for (size_t k = 0; k < l; ++k)
      if (std::llround(field(k, kGroup)) != std::llround(field(l, kGroup))) upstream[l].push_back(int(k));
  }
  std::vector<double> delta2(L, 0.0), energy(L, 0.0), den(L, 0.0);
  for (size_t l = 0; l < L; ++l) {
    const double w_sq = field(l, kWSq);
    delta2[l] = w_sq > 0 ? field(l, kCalDuSq) / w_sq : 0.0;
    if (!upstream[l].empty()) energy[l] = r * r * field(l, kDxSq);
  }
  for (size_t l = 0; l < L; ++l)
    for (int k : upstream[l]) den[size_t(k)] += energy[l];
  for (size_t l = 0; l < L; ++l) {
    LayerStats ls;
    ls.name = layers[l].name;
    ls.layer_index = layers[l].layer_index;
    ls.tokens = tokens[l];
    ls.in_features = layers[l].in_features;
    ls.out_features = layers[l].out_features;
    ls.gemm_flops = 2.0 * double(ls.tokens) * double(ls.in_features) * double(ls.out_features);
    const double cden = field(l, kCDen);
    ls.curvature = cden > 0 ? field(l, kCNum) / cden : 0.0;
    ls.n_upstream = int(upstream[l].size());
    double s = 0;
    for (int k : upstream[l])
      if (den[size_t(k)] > 0) s += std::sqrt(delta2[size_t(k)] * energy[l] / den[size_t(k)]);
    ls.upstream_sensitivity = s / r;
    for (size_t p = 0; p < n_opt; ++p) {
      const size_t base = kNumCommon + kNumPerOption * p;
      OptionStats os;
      const double ge = field(l, base + kGe), ef_sq = field(l, base + kEfSq);
      os.ld_first_order = ge;
      os.ld_curvature = 0.5 * std::max(ls.curvature, 0.0) * ef_sq;
      const double first = o.first_order == FirstOrder::kAbs ? std::abs(ge) : o.first_order == FirstOrder::kSigned ? ge : 0.0;
      os.ld = std::max(0.0, first + os.ld_curvature);
      os.rel_err[Gemm::kFprop] = ratio_sqrt(ef_sq, field(l, kYSq));
      os.rel_err[Gemm::kDgrad] = ratio_sqrt(field(l, base + kEdSq), field(l, kDxSq));
      os.rel_err[Gemm::kWgrad] = ratio_sqrt(field(l, base + kEwSq), field(l, kDwSq));
      os.wd_own = ratio_sqrt(field(l, base + kDuSq), field(l, kWSq));
      os.wd_upstream = os.rel_err[Gemm::kDgrad] * ls.upstream_sensitivity;
      // Per-element mean squared output error (per rank, as every field):
      // fprop [N, OUT], dgrad [N, IN], wgrad [OUT, IN].
      const double n_tok = double(tokens[l]), in = double(ls.in_features), outf = double(ls.out_features);
      auto per = [](double sq, double n) { return n > 0 ? sq / n : 0.0; };
      os.mse[Gemm::kFprop] = per(ef_sq, n_tok * outf);
      os.mse[Gemm::kDgrad] = per(field(l, base + kEdSq), n_tok * in);
      os.mse[Gemm::kWgrad] = per(field(l, base + kEwSq), outf * in);
      os.underflow[Gemm::kFprop] = per(field(l, base + kUfF), field(l, base + kNzF));
      os.underflow[Gemm::kDgrad] = per(field(l, base + kUfD), field(l, base + kNzD));
      os.underflow[Gemm::kWgrad] = per(field(l, base + kUfW), field(l, base + kNzW));
      ls.options[o.options[p]] = os;
    }
    out.layers.push_back(std::move(ls));
  }
  for (const LayerStats& ls : out.layers) {
    const OptionStats& lo = ls.options.at(o.low_option);
    out.ld_sum_low += lo.ld;
    out.wd_sum_low += lo.wd_own + lo.wd_upstream;
  }
  const double ld_n = out.ld_sum_low > 0 ? out.ld_sum_low : 1.0;
  const double wd_n = out.wd_sum_low > 0 ? out.wd_sum_low : 1.0;
  for (LayerStats& ls : out.layers) {
    for (auto& [name, os] : ls.options) {
      os.q = out.alpha * os.ld / ld_n + (1.0 - out.alpha) * (os.wd_own + os.wd_upstream) / wd_n;
      const double vals[] = {os.ld_first_order, os.ld_curvature, os.ld, os.wd_own, os.wd_upstream, os.q,
                             os.rel_err[Gemm::kFprop], os.rel_err[Gemm::kDgrad], os.rel_err[Gemm::kWgrad], ls.curvature};
      for (double v : vals)
        if (!std::isfinite(v))
          throw NonFiniteStatsError(str_cat("stats step ", step, ": layer '", ls.name, "' option '", name,
                                            "': expected finite statistics, got ", v,
                                            " (non-finite loss, activations or gradients?)"));
    }
  }
  return out;
}

void smooth(StatsStep& prev, const StatsStep& fresh, double s) {
  if (!(s >= 0 && s <= 1)) fail("stats smoothing: expected s in [0, 1], got ", s);
  if (prev.layers.empty()) {
    prev = fresh;
    return;
  }
  if (prev.layers.size() != fresh.layers.size())
    fail("stats smoothing: expected the same ", prev.layers.size(), " layers as before, got ",
         fresh.layers.size());
  for (size_t i = 0; i < fresh.layers.size(); ++i)
    if (prev.layers[i].name != fresh.layers[i].name)
      fail("stats smoothing: layers[", i, "]: expected '", prev.layers[i].name, "', got '",
           fresh.layers[i].name, "'");
  auto mix = [s](double old_v, double new_v) { return (1.0 - s) * new_v + s * old_v; };
  StatsStep out = fresh;
  out.ld_sum_low = mix(prev.ld_sum_low, fresh.ld_sum_low);
  out.wd_sum_low = mix(prev.wd_sum_low, fresh.wd_sum_low);
  for (size_t i = 0; i < out.layers.size(); ++i) {
    LayerStats& n = out.layers[i];
    const LayerStats& old = prev.layers[i];
    n.curvature = mix(old.curvature, n.curvature);
    n.upstream_sensitivity = mix(old.upstream_sensitivity, n.upstream_sensitivity);
    for (auto& [name, os] : n.options) {
      auto it = old.options.find(name);
      if (it == old.options.end()) continue;  // a new option starts from its fresh value
      const OptionStats& po = it->second;
      os.ld_first_order = mix(po.ld_first_order, os.ld_first_order);
      os.ld_curvature = mix(po.ld_curvature, os.ld_curvature);
      os.ld = mix(po.ld, os.ld);
      os.wd_own = mix(po.wd_own, os.wd_own);
      os.wd_upstream = mix(po.wd_upstream, os.wd_upstream);
      os.q = mix(po.q, os.q);
      for (Gemm g : kAllGemms) {
        os.rel_err[g] = mix(po.rel_err[g], os.rel_err[g]);
        os.mse[g] = mix(po.mse[g], os.mse[g]);
        os.underflow[g] = mix(po.underflow[g], os.underflow[g]);
      }
    }
  }
  prev = std::move(out);
}

plan::CostTable to_cost_table(const StatsStep& s, bool per_gemm) {
  const double ld_n = s.ld_sum_low > 0 ? s.ld_sum_low : 1.0;
  const double wd_n = s.wd_sum_low > 0 ? s.wd_sum_low : 1.0;
  plan::CostTable t;
  t.source = str_cat("stats step ", s.step);
  for (const LayerStats& ls : s.layers) {
    plan::LayerCost lc;
    lc.name = ls.name;
    if (!per_gemm) {
      for (const auto& p : s.options) {
        const OptionStats& os = ls.options.at(p);
        lc.q[p] = os.q;
        lc.rel_err[p] = (os.rel_err[Gemm::kFprop] + os.rel_err[Gemm::kDgrad] + os.rel_err[Gemm::kWgrad]) / 3.0;
      }
      lc.q[s.reference] = 0.0;
      lc.flops = 3.0 * ls.gemm_flops;
    } else {
      lc.has_gemms = true;
      for (Gemm g : kAllGemms) {
        plan::GemmCost& gc = lc.gemms[size_t(g)];
        for (const auto& p : s.options) {
          const OptionStats& os = ls.options.at(p);
          gc.q[p] = g == Gemm::kFprop ? s.alpha * os.ld / ld_n
                    : g == Gemm::kDgrad ? (1.0 - s.alpha) * os.wd_upstream / wd_n
                                        : (1.0 - s.alpha) * os.wd_own / wd_n;
          gc.rel_err[p] = os.rel_err[g];
        }
        gc.q[s.reference] = 0.0;
        gc.flops = ls.gemm_flops;
      }
    }
    t.layers.push_back(std::move(lc));
  }
  return t;
}

nlohmann::json to_json(const StatsStep& s, bool per_gemm) {
  using nlohmann::json;
  json details_layers = json::array();
  for (const LayerStats& ls : s.layers) {
    json opts = json::object();
    for (const auto& p : s.options) {
      const OptionStats& os = ls.options.at(p);
      opts[p] = {{"ld", os.ld},
                 {"ld_first", os.ld_first_order},
                 {"ld_second", os.ld_curvature},
                 {"wd_own", os.wd_own},
                 {"wd_up", os.wd_upstream},
                 {"q", os.q},
                 {"rel_err", {{"fprop", os.rel_err[Gemm::kFprop]}, {"dgrad", os.rel_err[Gemm::kDgrad]}, {"wgrad", os.rel_err[Gemm::kWgrad]}}},
                 {"mse", {{"fprop", os.mse[Gemm::kFprop]}, {"dgrad", os.mse[Gemm::kDgrad]}, {"wgrad", os.mse[Gemm::kWgrad]}}},
                 {"underflow", {{"fprop", os.underflow[Gemm::kFprop]}, {"dgrad", os.underflow[Gemm::kDgrad]},
                                {"wgrad", os.underflow[Gemm::kWgrad]}}}};
    }
    details_layers.push_back({{"name", ls.name},
                              {"layer_index", ls.layer_index},
                              {"tokens", ls.tokens},
                              {"in_features", ls.in_features},
                              {"out_features", ls.out_features},
                              {"gemm_flops", ls.gemm_flops},
                              {"curvature", ls.curvature},
                              {"up_sensitivity", ls.upstream_sensitivity},
                              {"n_upstream", ls.n_upstream},
                              {"options", std::move(opts)}});
  }
  json details = {{"options", s.options},       {"low_option", s.low_option},
                  {"reference", s.reference},   {"first_order", to_string(s.first_order)},
                  {"alpha", s.alpha},           {"ld_sum_low", s.ld_sum_low},
                  {"wd_sum_low", s.wd_sum_low}, {"ranks", s.ranks},
                  {"layers", std::move(details_layers)}};
  json j = plan::to_json(to_cost_table(s, per_gemm));
  j["step"] = s.step;
  j["details"] = std::move(details);
  return j;
}

StatsStep stats_from_json(const nlohmann::json& j, const std::string& what) {
  StatsStep s;
  try {
    s.step = j.at("step").get<int64_t>();
    const nlohmann::json& d = j.at("details");
    s.options = d.at("options").get<std::vector<std::string>>();
    s.low_option = d.at("low_option").get<std::string>();
    s.reference = d.at("reference").get<std::string>();
    s.first_order = parse_first_order(d.at("first_order").get<std::string>(), what + ": first_order");
    s.alpha = d.at("alpha").get<double>();
    s.ld_sum_low = d.at("ld_sum_low").get<double>();
    s.wd_sum_low = d.at("wd_sum_low").get<double>();
    s.ranks = d.at("ranks").get<int64_t>();
    for (const nlohmann::json& l : d.at("layers")) {
      LayerStats ls;
      ls.name = l.at("name").get<std::string>();
      ls.layer_index = l.at("layer_index").get<int64_t>();
      ls.tokens = l.at("tokens").get<int64_t>();
      ls.in_features = l.at("in_features").get<int64_t>();
      ls.out_features = l.at("out_features").get<int64_t>();
      ls.gemm_flops = l.at("gemm_flops").get<double>();
      ls.curvature = l.at("curvature").get<double>();
      ls.upstream_sensitivity = l.at("up_sensitivity").get<double>();
      ls.n_upstream = l.at("n_upstream").get<int>();
      for (const auto& [name, o] : l.at("options").items()) {
        OptionStats os;
        os.ld = o.at("ld").get<double>();
        os.ld_first_order = o.at("ld_first").get<double>();
        os.ld_curvature = o.at("ld_second").get<double>();
        os.wd_own = o.at("wd_own").get<double>();
        os.wd_upstream = o.at("wd_up").get<double>();
        os.q = o.at("q").get<double>();
        const nlohmann::json& re = o.at("rel_err");
        os.rel_err.v = {re.at("fprop").get<double>(), re.at("dgrad").get<double>(), re.at("wgrad").get<double>()};
        // Written since the autoswitch policy; older files read as 0.
        for (const char* key : {"mse", "underflow"})
          if (o.contains(key)) {
            const nlohmann::json& m = o.at(key);
            (std::string(key) == "mse" ? os.mse : os.underflow).v = {
                m.at("fprop").get<double>(), m.at("dgrad").get<double>(), m.at("wgrad").get<double>()};
          }
        ls.options[name] = os;
      }
      for (const auto& p : s.options)
        if (!ls.options.count(p)) fail(what, ": layer '", ls.name, "': expected stats for option '", p, "'");
      s.layers.push_back(std::move(ls));
    }
  } catch (const nlohmann::json::exception& e) {
    fail(what, ": malformed stats JSON (", e.what(), ")");
  }
  return s;
}


plan::PlanProblem to_plan_problem(const StatsStep& s, plan::Granularity g) {
  plan::PlanProblem p = plan::make_problem(to_cost_table(s, g == plan::Granularity::gemm), g);
  // The autoswitch rule's measures (PlanItem::mse / underflow): per GEMM
  // item its GEMM's, per layer item the largest of its three.
  std::map<std::string, const LayerStats*> by_name;
  for (const LayerStats& ls : s.layers) by_name[ls.name] = &ls;
  for (plan::PlanItem& it : p.items) {
    const auto f = by_name.find(it.layer.empty() ? it.name : it.layer);
    if (f == by_name.end()) continue;
    for (const auto& [opt, os] : f->second->options) {
      double m = 0, u = 0;
      for (Gemm k : kAllGemms)
        if (it.gemm.empty() || it.gemm == gemm_name(k)) m = std::max(m, os.mse[k]), u = std::max(u, os.underflow[k]);
      it.mse[opt] = m;
      it.underflow[opt] = u;
    }
  }
  return p;
}

}  // namespace snip
