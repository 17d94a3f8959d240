// Recipes (snip_formats) as OperandQuantizer hooks on LibTorch tensors.
#include "snip/model/quantizers.h"

#include <cstring>
#include <map>
#include <mutex>
#include <set>

#include <spdlog/spdlog.h>

#include "snip/formats/fake_quant.h"
#include "snip/formats/fake_quant_cuda.h"
#include "snip/formats/hadamard.h"
#include "snip/formats/scaling.h"
#include "snip/model/matmul.h"
#include "snip/recipes/recipe.h"
#include "snip/core/error.h"

namespace snip {

namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "residual state is stored as little-endian FP32 bytes");

// RFC 4648 base64 (with '=' padding) of `n` bytes at `p`.
std::string base64_encode(const void* p, size_t n) {
  static const char* abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const auto* b = static_cast<const unsigned char*>(p);
  std::string out;
  out.reserve((n + 2) / 3 * 4);
  for (size_t i = 0; i < n; i += 3) {
    const uint32_t v = uint32_t(b[i]) << 16 | (i + 1 < n ? uint32_t(b[i + 1]) << 8 : 0) | (i + 2 < n ? b[i + 2] : 0);
    out += abc[v >> 18 & 63];
    out += abc[v >> 12 & 63];
    out += i + 1 < n ? abc[v >> 6 & 63] : '=';
    out += i + 2 < n ? abc[v & 63] : '=';
  }
  return out;
}

// Inverse of base64_encode; throws UserError "<where>: ..." on other text.
std::string base64_decode(const std::string& s, const std::string& where) {
  auto val = [&](char c) -> uint32_t {
    if (c >= 'A' && c <= 'Z') return uint32_t(c - 'A');
    if (c >= 'a' && c <= 'z') return uint32_t(c - 'a' + 26);
    if (c >= '0' && c <= '9') return uint32_t(c - '0' + 52);
    if (c == '+') return 62;
    if (c == '/') return 63;
    fail(where, ": expected base64 text, got the character '", c, "'");
  };
  if (s.size() % 4 != 0) fail(where, ": expected base64 text (a multiple of 4 characters), got ", s.size());
  std::string out;
  out.reserve(s.size() / 4 * 3);
  for (size_t i = 0; i < s.size(); i += 4) {
    const bool last = i + 4 == s.size();
    const int pad = last ? (s[i + 3] == '=') + (s[i + 2] == '=') : 0;
    if (pad == 1 && s[i + 2] == '=') fail(where, ": expected base64 text, got misplaced '='");
    const uint32_t v = val(s[i]) << 18 | val(s[i + 1]) << 12 | (pad >= 2 ? 0 : val(s[i + 2]) << 6) |
                       (pad >= 1 ? 0 : val(s[i + 3]));
    out += char(v >> 16 & 255);
    if (pad < 2) out += char(v >> 8 & 255);
    if (pad < 1) out += char(v & 255);
  }
  return out;
}

// One recipe applied to every operand of every layer it is attached to.
// Delayed-scaling state (amax history) is kept per (layer, operand), the
// error-feedback residual (Recipe::error_feedback) per layer.
class RecipeQuantizer final : public OperandQuantizer {
 public:
  explicit RecipeQuantizer(recipes::Recipe r) : recipe_(std::move(r)) {}

  torch::Tensor quantize(const torch::Tensor& t, const QuantKey& key) const override {
    TORCH_CHECK(t.dim() == 2, "quantize: expected [rows, K], got ", t.sizes());
    if (t.is_cuda()) return quantize_cuda(t, key);
    // The CPU kernels read host memory through raw pointers.
    if (!t.device().is_cpu())
      fail("quantizer ", recipe_.name, ": ", t.device().str(), " tensors are not supported (CPU and CUDA only)");
    const torch::Tensor in = t.to(torch::kFloat).contiguous();  // [rows, K]
    const bool weight = weight_operand(key.operand);
    const torch::Tensor out = recipe_.error_feedback && weight ? quantize_weight_ef(in, key) : quantize_plain(in, key);
    return out.to(t.scalar_type());
  }

  // quantize() returns a tensor of its own, so the emulated BF16 rounding can
  // happen in it (no second tensor per operand).
  torch::Tensor quantize_for_gemm(const torch::Tensor& t, const QuantKey& key,
                                  at::ScalarType gemm_dtype) const override {
    return gemm_operand_fresh(quantize(t, key), gemm_dtype);
  }

  std::string name() const override { return recipe_.name; }

  bool scaled_operand(Operand op) const override {
    const formats::QuantSpec& s = recipe_.operands[size_t(op)];
    const bool weight = weight_operand(op);
    return (s.element == formats::kE4M3 || s.element == formats::kE5M2) && s.block == formats::BlockShape::tensor() &&
           (s.rule == formats::ScaleRule::kCurrent || s.rule == formats::ScaleRule::kDelayed) && s.hadamard_size == 0 &&
           !(recipe_.error_feedback && weight);
  }

  // The call's decode scale is the one quantize() is about to use: delayed
  // scaling's current scale (before this call records its amax), or the
  // current rule's scale of this tensor's amax (block_scale, the codec's).
  ScaledOperand quantize_scaled(const torch::Tensor& t, const QuantKey& key) const override {
    if (!scaled_operand(key.operand))
      throw std::logic_error("quantize_scaled: operand " + std::string(operand_name(key.operand)) + " of recipe " + recipe_.name +
                             " is not a per-tensor FP8 operand");
    const formats::QuantSpec& spec = recipe_.operands[size_t(key.operand)];
    const torch::Tensor in = t.to(torch::kFloat).contiguous();  // [rows, K]
    auto amax = [&] { return in.numel() ? in.abs().amax().item<float>() : 0.0f; };  // NaN-propagating, as the codec's
    float d = 0;
    if (spec.rule == formats::ScaleRule::kDelayed) {
      bool has = false;
      {
        std::lock_guard<std::mutex> g(mu_);
        const auto it = delayed_.find({key.layer, int(key.operand)});
        if (it != delayed_.end() && it->second.has_scale()) has = true, d = it->second.scale().decode;
      }
      if (!has) {  // the bootstrap call: current scaling of its own amax (fake_quant_ref.cpp delayed_call_scale)
        formats::QuantSpec cur = spec;
        cur.rule = formats::ScaleRule::kCurrent;
        d = formats::block_scale(amax(), cur).decode;
      }
    } else {
      d = formats::block_scale(amax(), spec).decode;
    }
    ScaledOperand o;
    o.values = quantize(in, key);  // records as quantize() does
    o.scale = torch::full({}, d, in.options());
    // values = code * d rounded to FP32: / d comes back within 2^-23 of the code, which the cast restores.
    o.codes = (o.values / o.scale).to(spec.element == formats::kE4M3 ? at::kFloat8_e4m3fn : at::kFloat8_e5m2);
    return o;
  }

  std::optional<formats::QuantizedTensor> quantize_packed(const torch::Tensor& t, const QuantKey& key) const override {
    const bool weight = weight_operand(key.operand);
    const formats::QuantSpec& spec = recipe_.operands[size_t(key.operand)];
    if (!weight || recipe_.error_feedback || spec.rule == formats::ScaleRule::kDelayed ||
        spec.rounding != formats::Rounding::kRNE || spec.hadamard_size != 0 || spec.is_bf16_passthrough() ||
        spec.element.bits > 8)
      return std::nullopt;
    TORCH_CHECK(t.dim() == 2, "quantize_packed: expected a [rows, K] tensor, got ", t.sizes());
    const torch::Tensor in = t.to(torch::kCPU, torch::kFloat).contiguous();  // packed codes live on the host
    formats::RoundingKey rk{key.seed, uint64_t(key.step), uint64_t(key.layer), uint32_t(key.operand)};
    return formats::quantize_packed(in.data_ptr<float>(), in.size(0), in.size(1), spec, rk);
  }

  // {"recipe": name, "delayed": [{"layer": L, "operand": "fprop.x", "history":
  //   [...], "calls": n, "skipped": n, "since_refresh": n, "scale_amax": a |
  //   null}, ...], "residuals": [{"layer": L, "step": t, "shape": [OUT, IN],
  //   "f32_base64": "..."}, ...]} in (layer, operand) / layer order; null
  // before any delayed-scaling or error-feedback call. FP32 values survive
  // JSON exactly (17 significant digits); a residual r_{t+1} (as large as the
  // weight) is its raw little-endian FP32 bytes in base64 (RFC 4648), also
  // exact. "residuals" appears only for recipes with error feedback.
  nlohmann::json state() const override {
    nlohmann::json list = nlohmann::json::array(), res = nlohmann::json::array();
    {
      std::lock_guard<std::mutex> g(mu_);
      for (const auto& [k, d] : delayed_) {
        const formats::DelayedScaling::State s = d.state();
        nlohmann::json e = {{"layer", k.first},
                            {"operand", operand_name(Operand(k.second))},
                            {"history", s.history},
                            {"calls", s.calls},
                            {"skipped", s.skipped},
                            {"since_refresh", s.since_refresh}};
        e["scale_amax"] = s.has_scale ? nlohmann::json(s.scale_amax) : nlohmann::json(nullptr);
        list.push_back(std::move(e));
      }
    }
    {
      std::lock_guard<std::mutex> g(ef_mu_);
      for (const auto& [layer, e] : residual_) {
        if (!e.next.defined()) continue;
        const torch::Tensor r = e.next.contiguous();  // [OUT, IN] FP32
        res.push_back({{"layer", layer},
                       {"step", e.step},
                       {"shape", {r.size(0), r.size(1)}},
                       {"f32_base64", base64_encode(r.data_ptr<float>(), size_t(r.numel()) * sizeof(float))}});
      }
    }
    if (list.empty() && res.empty()) return nullptr;
    nlohmann::json st = {{"recipe", recipe_.name}, {"delayed", std::move(list)}};
    if (recipe_.error_feedback) st["residuals"] = std::move(res);
    return st;
  }

  void restore_state(const nlohmann::json& st, const std::string& what, int64_t num_layers) const override {
    std::map<std::pair<int64_t, int>, formats::DelayedScaling> restored;
    std::map<int64_t, Residual> residuals;
    if (!st.is_null()) {
      try {
        if (st.at("recipe").get<std::string>() != recipe_.name)
          fail(what, ": state of recipe '", st.at("recipe").get<std::string>(), "', expected '", recipe_.name, "'");
        if (!st.at("delayed").is_array()) fail(what, ".delayed: expected a list, got ", st.at("delayed").type_name());
        auto count = [&](const nlohmann::json& e, const char* key, const std::string& where) {
          const nlohmann::json& v = e.at(key);
          if (!v.is_number_integer()) fail(where, ": ", key, ": expected an integer, got ", v.dump());
          return v.get<int64_t>();
        };
        for (const auto& e : st.at("delayed")) {
          const int64_t layer = count(e, "layer", what + ".delayed");
          if (layer < 0 || layer >= num_layers)
            fail(what, ".delayed: layer ", layer, " is not a linear layer of this model (0 .. ", num_layers - 1, ")");
          const Operand op = parse_operand(e.at("operand").get<std::string>(), what + ": operand");
          const formats::QuantSpec& spec = recipe_.operands[size_t(op)];
          const std::string where = str_cat(what, ": layer ", layer, " ", operand_name(op));
          if (spec.rule != formats::ScaleRule::kDelayed)
            fail(where, ": recipe '", recipe_.name, "' does not use delayed scaling for this operand");
          formats::DelayedScaling::State s;
          s.history = e.at("history").get<std::vector<float>>();
          s.calls = count(e, "calls", where);
          s.skipped = count(e, "skipped", where);
          s.since_refresh = count(e, "since_refresh", where);
          s.has_scale = !e.at("scale_amax").is_null();
          if (s.has_scale) s.scale_amax = e.at("scale_amax").get<float>();
          formats::DelayedScaling d(spec);
          d.restore(s, where);
          if (!restored.emplace(std::make_pair(layer, int(op)), std::move(d)).second)
            fail(where, ": appears twice");
        }
        if (st.contains("residuals")) {
          if (!recipe_.error_feedback)
            fail(what, ".residuals: recipe '", recipe_.name, "' has no error feedback (its recipe file changed?)");
          if (!st.at("residuals").is_array())
            fail(what, ".residuals: expected a list, got ", st.at("residuals").type_name());
          for (const auto& e : st.at("residuals")) {
            const int64_t layer = count(e, "layer", what + ".residuals");
            if (layer < 0 || layer >= num_layers)
              fail(what, ".residuals: layer ", layer, " is not a linear layer of this model (0 .. ", num_layers - 1,
                   ")");
            const std::string where = str_cat(what, ".residuals: layer ", layer);
            const auto shape = e.at("shape").get<std::vector<int64_t>>();
            if (shape.size() != 2 || shape[0] < 1 || shape[1] < 1)
              fail(where, ": shape: expected [OUT, IN] with both >= 1, got ", e.at("shape").dump());
            const std::string bytes = base64_decode(e.at("f32_base64").get<std::string>(), where + ": f32_base64");
            if (bytes.size() != size_t(shape[0] * shape[1]) * sizeof(float))
              fail(where, ": f32_base64: expected ", shape[0] * shape[1], " FP32 values (shape [", shape[0], ", ",
                   shape[1], "]), got ", bytes.size(), " bytes");
            Residual r;
            r.step = count(e, "step", where);
            r.next = torch::empty({shape[0], shape[1]}, torch::kFloat);
            std::memcpy(r.next.data_ptr<float>(), bytes.data(), bytes.size());
            if (!residuals.emplace(layer, std::move(r)).second) fail(where, ": appears twice");
          }
        }
      } catch (const nlohmann::json::exception& e) {
        fail(what, ": malformed quantizer state (", e.what(), ")");
      }
    }
    {
      std::lock_guard<std::mutex> g(mu_);
      delayed_ = std::move(restored);
    }
    std::lock_guard<std::mutex> g(ef_mu_);
    residual_ = std::move(residuals);
  }

 private:
  // t: [rows, K] on a CUDA device -> Q(t) there, in t's dtype, the CPU's bits.
  // The CUDA kernels (formats/fake_quant_cuda.h) take what they cover,
  // delayed scaling included (its history stays in the host object); the
  // rest (error feedback, whose residual lives on the host; the Hadamard
  // transform; BF16/integer/posit elements) goes
  // through the host codec: copied to the CPU, quantized, copied back, one
  // warning per recipe and operand naming why. The per-step error
  // (QuantKey::errors) is summed on the device in FP64, not in the CPU's
  // lane order: the same value up to summation order.
  torch::Tensor quantize_cuda(const torch::Tensor& t, const QuantKey& key) const {
    const bool weight = weight_operand(key.operand);
    const formats::QuantSpec& spec = recipe_.operands[size_t(key.operand)];
    std::string why;
    if (recipe_.error_feedback && weight) why = "error feedback keeps its residual on the host";
    else if (!formats::cuda::supported(spec, &why) && why.empty()) why = "not covered by the CUDA kernels";
    if (!why.empty()) {
      {
        std::lock_guard<std::mutex> g(mu_);
        if (host_warned_.insert(int(key.operand)).second)
          spdlog::warn("quantizer {}: {} runs on the host codec (copied off the GPU and back): {}", recipe_.name,
                       operand_name(key.operand), why);
      }
      return quantize(t.to(torch::kCPU), key).to(t.device());
    }
    const c10::DeviceGuard dg(t.device());
    const torch::Tensor in = t.to(torch::kFloat).contiguous();  // [rows, K]
    torch::Tensor out = torch::empty_like(in);
    const int64_t rows = in.size(0), cols = in.size(1);
    // On PyTorch's current stream, scratch from its caching allocator (freed
    // in stream order): no device-wide synchronisation, no cudaMalloc.
    const torch::Tensor scratch = torch::empty(
        {int64_t(formats::cuda::fake_quantize_scratch_bytes(rows, cols, spec))}, in.options().dtype(torch::kUInt8));
    const formats::cuda::DeviceLaunch launch{
        c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(t.device()).native_handle(),
        scratch.numel() > 0 ? scratch.data_ptr() : nullptr};
    const formats::RoundingKey rk{key.seed, uint64_t(key.step), uint64_t(key.layer), uint32_t(key.operand)};
    if (spec.rule == formats::ScaleRule::kDelayed) {
      // The history lives here, on the host; the amax comes back from the device.
      with_delayed(key, spec, [&](formats::DelayedScaling& st) {
        formats::cuda::fake_quantize_device(in.data_ptr<float>(), out.data_ptr<float>(), rows, cols, rk, st, launch);
      });
    } else {
      formats::cuda::fake_quantize_device(in.data_ptr<float>(), out.data_ptr<float>(), rows, cols, spec, rk, launch);
    }
    if (key.errors && !QuantStateFreeze::active()) {
      // The difference in FP32 as the CPU's lanes take it, squared and summed in FP64; one read-back.
      const torch::Tensor fin = torch::isfinite(in), zero = torch::zeros({}, in.options());
      const torch::Tensor sums =
          torch::stack({torch::where(fin, out - in, zero).to(torch::kDouble).square().sum(),
                        torch::where(fin, in, zero).to(torch::kDouble).square().sum()})
              .to(torch::kCPU);
      formats::ErrorNorms n;
      n.sum_sq_err = sums[0].item<double>();
      n.sum_sq_ref = sums[1].item<double>();
      n.calls = 1;
      key.errors->add(key.operand, n);
    }
    return out.to(t.scalar_type());
  }

  static bool weight_operand(Operand op) { return op == Operand::kFpropW || op == Operand::kDgradW; }

  // Runs f on operand key's delayed-scaling state, under mu_; under a
  // QuantStateFreeze on a copy that is dropped (the same scale as the next
  // training call would use, nothing recorded). CPU and CUDA calls share it.
  template <typename F>
  void with_delayed(const QuantKey& key, const formats::QuantSpec& spec, F&& f) const {
    std::lock_guard<std::mutex> g(mu_);
    if (QuantStateFreeze::active()) {
      const auto it = delayed_.find({key.layer, int(key.operand)});
      formats::DelayedScaling copy = it != delayed_.end() ? it->second : formats::DelayedScaling(spec);
      f(copy);
    } else {
      f(delayed_.try_emplace({key.layer, int(key.operand)}, spec).first->second);
    }
  }

  // in: [rows, K] FP32 contiguous -> Q(in) by the spec of key.operand (its
  // delayed-scaling state recorded unless a QuantStateFreeze is active).
  torch::Tensor quantize_plain(const torch::Tensor& in, const QuantKey& key) const {
    torch::Tensor out = torch::empty_like(in);
    const formats::QuantSpec& spec = recipe_.operands[size_t(key.operand)];
    formats::RoundingKey rk{key.seed, uint64_t(key.step), uint64_t(key.layer), uint32_t(key.operand)};
    // The per-step error (QuantKey::errors), a by-product of the pass over
    // each row; never under QuantStateFreeze (evaluation, sampling).
    formats::ErrorNorms norms;
    formats::ErrorNorms* np = key.errors && !QuantStateFreeze::active() ? &norms : nullptr;
    if (spec.rule == formats::ScaleRule::kDelayed) {
      // np is null under QuantStateFreeze.
      with_delayed(key, spec, [&](formats::DelayedScaling& st) {
        formats::fake_quantize(in.data_ptr<float>(), out.data_ptr<float>(), in.size(0), in.size(1), rk, st, nullptr,
                               np);
      });
    } else {
      formats::fake_quantize(in.data_ptr<float>(), out.data_ptr<float>(), in.size(0), in.size(1), spec, rk,
                             nullptr, np);
    }
    if (np) key.errors->add(key.operand, norms);
    return out;
  }

  // Error feedback on the weight operand (Recipe::error_feedback; docs/method.md
  // section 7, docs/formats.md "Error feedback"). in: W [OUT, IN] (fprop.w)
  // or Wᵀ [IN, OUT] (dgrad.w), FP32 contiguous. Per layer, with Q_f the
  // fprop.w quantization of this recipe:
  //   step t's first weight call:  v = W_t + r_t,  r_{t+1} = v - Q_f(v)   (r_0 = 0)
  //   (with a Hadamard transform R on fprop.w, Q_f(v) is taken back to W's
  //   domain first: r_{t+1} = v - Q(v·R)·Rᵀ; see unrotated())
  //   every weight call of step t: fprop.w -> Q_f(W_t + r_t), dgrad.w -> Q_dgrad.w((W_t + r_t)ᵀ)
  // so the residual advances once per optimizer step (key.step), however many
  // micro-batches and dgrad uses there are, and is measured against fprop's
  // quantization. Under QuantStateFreeze the residual the next step will add
  // (r_{t+1}) is used and nothing changes.
  torch::Tensor quantize_weight_ef(const torch::Tensor& in, const QuantKey& key) const {
    const bool fprop = key.operand == Operand::kFpropW;
    const torch::Tensor w = fprop ? in : in.t();  // W [OUT, IN] (a view for dgrad)
    std::lock_guard<std::mutex> g(ef_mu_);
    auto it = residual_.find(key.layer);
    if (it != residual_.end() && it->second.next.defined() && it->second.next.sizes() != w.sizes())
      fail("quantizer ", recipe_.name, ": layer ", key.layer, ": error-feedback residual of shape ",
           it->second.next.sizes(), " for a weight of shape ", w.sizes(), " (state of another model?)");
    torch::Tensor r;  // [OUT, IN]
    if (QuantStateFreeze::active()) {
      r = it != residual_.end() && it->second.next.defined() ? it->second.next : torch::zeros_like(w);
    } else if (it == residual_.end() || it->second.step != key.step) {
      Residual& e = residual_[key.layer];
      e.used = e.next.defined() ? e.next : torch::zeros_like(w);
      e.step = key.step;
      const torch::Tensor v = (w + e.used).contiguous();  // W_t + r_t [OUT, IN]
      QuantKey kf = key;
      kf.operand = Operand::kFpropW;
      if (!fprop) kf.errors = nullptr;  // fprop.w's own call records it
      const torch::Tensor qf = quantize_plain(v, kf);
      e.next = v - unrotated(qf, recipe_.operands[size_t(Operand::kFpropW)]);  // r_{t+1}, in W's own domain
      if (fprop) return qf;
      r = e.used;
    } else {
      if (!it->second.used.defined())
        fail("quantizer ", recipe_.name, ": layer ", key.layer, ": weight quantized again at step ", key.step,
             " after its state was restored at that step (internal: checkpoints are taken between steps)");
      r = it->second.used;
    }
    const torch::Tensor v = w + r;  // W_t + r_t [OUT, IN]
    return quantize_plain((fprop ? v : v.t()).contiguous(), key);
  }

  // Q_f(v) in v's own domain: with a Hadamard transform on fprop.w,
  // fake_quantize returns Q(v·R), the operand the GEMM reads (rows of W
  // rotated along IN); the residual needs Q(v·R)·Rᵀ ≈ v, so that v - it is
  // the quantization error of v and not v minus a rotated copy of itself.
  // q: [OUT, IN] FP32 contiguous; returned as is without a transform.
  static torch::Tensor unrotated(const torch::Tensor& q, const formats::QuantSpec& spec) {
    if (spec.hadamard_size == 0) return q;
    torch::Tensor back = q.clone();
    const std::vector<float> signs = formats::hadamard_signs(spec.hadamard_size, spec.hadamard_seed);
    formats::hadamard_rows_inverse(back.data_ptr<float>(), back.size(0), back.size(1), spec.hadamard_size,
                                   signs.data());
    return back;
  }

  // One layer's error-feedback state.
  struct Residual {
    int64_t step = -1;    // the step whose first weight call set `used` and `next`
    torch::Tensor used;   // r_t [OUT, IN] FP32, added in `step` (undefined after restore_state)
    torch::Tensor next;   // r_{t+1} [OUT, IN] FP32, added in the next step
  };

  recipes::Recipe recipe_;
  mutable std::mutex mu_;
  mutable std::map<std::pair<int64_t, int>, formats::DelayedScaling> delayed_;
  mutable std::mutex ef_mu_;                       // taken before mu_ when both are held
  mutable std::map<int64_t, Residual> residual_;   // by layer index
  mutable std::set<int> host_warned_;             // operands warned about the host codec on CUDA (under mu_)
};

}  // namespace

std::shared_ptr<const OperandQuantizer> make_recipe_quantizer(const recipes::RecipeSet& recipes,
                                                              const std::string& recipe) {
  if (recipe == "none" || recipe.empty()) return nullptr;
  try {
    return std::make_shared<RecipeQuantizer>(recipes.find(recipe));
  } catch (const UserError& e) {
    fail("precision.recipe: ", e.what());
  }
}

}  // namespace snip
