// The Llama decoder (HF LlamaForCausalLM semantics; see llama.h).
#include "snip/model/llama.h"

#include "snip/model/matmul.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "snip/config/config.h"
#include "snip/util/error.h"

namespace snip {

// ---------------------------------------------------------------- config --

LlamaConfig LlamaConfig::from_run_config(const ModelConfig& c, int64_t vocab) {
  LlamaConfig m;
  m.vocab_size = c.vocab_size > 0 ? c.vocab_size : vocab;
  m.hidden_size = c.hidden_size;
  m.intermediate_size = c.intermediate_size;
  m.num_hidden_layers = c.num_hidden_layers;
  m.num_attention_heads = c.num_attention_heads;
  m.num_key_value_heads = c.num_key_value_heads;
  m.rms_norm_eps = c.rms_norm_eps;
  m.rope_theta = c.rope_theta;
  m.tie_word_embeddings = c.tie_word_embeddings;
  m.max_position_embeddings = c.max_position_embeddings;
  m.init_std = c.init_std;
  m.validate("config [model]");
  return m;
}

LlamaConfig LlamaConfig::from_run_config(const Config& c, int64_t vocab) {
  return from_run_config(RunConfig::from(c).model, vocab);
}

namespace {
/// `key` is in `j` with a value other than null (transformers writes None
/// as null for the optional fields: num_key_value_heads, head_dim, ...).
bool present(const nlohmann::json& j, const char* key) { return j.contains(key) && !j.at(key).is_null(); }

/// j[key] as V; `def` (when given) for an absent or null key. Throws
/// UserError "<what>: missing field 'k'" / "field 'k': expected ..., got x".
template <typename V>
V field(const nlohmann::json& j, const char* key, const std::string& what, const V* def = nullptr) {
  if (!present(j, key)) {
    if (def) return *def;
    if (j.contains(key)) fail(what, ": field '", key, "': expected a value, got null");
    fail(what, ": missing field '", key, "'");
  }
  const auto& v = j.at(key);
  if constexpr (std::is_same_v<V, bool>) {
    if (!v.is_boolean()) fail(what, ": field '", key, "': expected a boolean, got ", v.dump());
  } else if constexpr (std::is_integral_v<V>) {
    if (!v.is_number_integer()) fail(what, ": field '", key, "': expected an integer, got ", v.dump());
  } else if constexpr (std::is_same_v<V, std::string>) {
    if (!v.is_string()) fail(what, ": field '", key, "': expected a string, got ", v.dump());
  } else {
    if (!v.is_number()) fail(what, ": field '", key, "': expected a number, got ", v.dump());
  }
  return v.get<V>();
}

/// The RoPE base of a config.json. transformers 4.x writes `rope_theta` at
/// the top and `rope_scaling` (null for plain RoPE); transformers 5 moves
/// both into `rope_parameters` = {"rope_type": "default", "rope_theta": x}
/// (modeling_rope_utils.py, standardize_rope_params; "type" is the older
/// spelling of "rope_type"). snip implements plain RoPE: any other
/// rope_type, or any parameter besides rope_theta, is refused. Absent
/// everywhere: 10000, transformers' default.
double rope_theta_of(const nlohmann::json& j, const std::string& what) {
  std::optional<double> top, inner;
  if (present(j, "rope_theta")) top = field<double>(j, "rope_theta", what);
  for (const char* k : {"rope_parameters", "rope_scaling"}) {
    if (!present(j, k)) continue;
    const nlohmann::json& r = j.at(k);
    if (!r.is_object()) fail(what, ": field '", k, "': expected an object or null, got ", r.dump());
    for (const char* t : {"rope_type", "type"})
      if (r.contains(t) && r[t] != "default")
        fail(what, ": field '", k, "': rope_type ", r[t].dump(),
             " is not supported: snip implements plain RoPE only (rope_type \"default\", or ", k, " null)");
    for (auto it = r.begin(); it != r.end(); ++it) {
      if (it.key() == "rope_type" || it.key() == "type") continue;
      if (it.key() != "rope_theta")
        fail(what, ": field '", k, "': parameter '", it.key(), "' = ", it.value().dump(),
             " is not supported: snip implements plain RoPE only (rope_type \"default\" with rope_theta)");
      if (!it.value().is_number())
        fail(what, ": field '", k, "': rope_theta: expected a number, got ", it.value().dump());
      const double t = it.value().get<double>();
      if (inner && *inner != t)
        fail(what, ": rope_parameters.rope_theta ", *inner, " and rope_scaling.rope_theta ", t, " disagree");
      inner = t;
    }
  }
  if (top && inner && *top != *inner)
    fail(what, ": rope_theta ", *top, " and rope_parameters.rope_theta ", *inner, " disagree");
  return inner ? *inner : top ? *top : 10000.0;
}
}  // namespace

LlamaConfig LlamaConfig::from_hf_json(const nlohmann::json& j, const std::string& what) {
  if (!j.is_object()) fail(what, ": expected a JSON object");
  // What the file says it is: a Llama with a language-model head, stored
  // unquantized.
  if (present(j, "model_type") && j["model_type"] != "llama")
    fail(what, ": field 'model_type': expected \"llama\", got ", j["model_type"].dump());
  if (present(j, "architectures")) {
    const auto& a = j["architectures"];
    if (!a.is_array() || std::find(a.begin(), a.end(), "LlamaForCausalLM") == a.end())
      fail(what, ": field 'architectures': expected [\"LlamaForCausalLM\"], got ", a.dump());
  }
  if (present(j, "quantization_config"))
    fail(what, ": field 'quantization_config': the weights are stored quantized (",
         j["quantization_config"].dump(), "); snip reads unquantized weights only: dequantize them first");
  // The fields of transformers' LlamaConfig that shape the model; absent
  // ones take transformers' defaults (configuration_llama.py).
  LlamaConfig m;
  m.vocab_size = field<int64_t>(j, "vocab_size", what);
  m.hidden_size = field<int64_t>(j, "hidden_size", what);
  m.intermediate_size = field<int64_t>(j, "intermediate_size", what);
  m.num_hidden_layers = field<int64_t>(j, "num_hidden_layers", what);
  m.num_attention_heads = field<int64_t>(j, "num_attention_heads", what);
  m.num_key_value_heads = field<int64_t>(j, "num_key_value_heads", what, &m.num_attention_heads);
  const double eps = 1e-6;
  const bool tie = false;
  const int64_t maxpos = 2048;
  m.rms_norm_eps = field<double>(j, "rms_norm_eps", what, &eps);
  m.rope_theta = rope_theta_of(j, what);
  m.tie_word_embeddings = field<bool>(j, "tie_word_embeddings", what, &tie);
  m.max_position_embeddings = field<int64_t>(j, "max_position_embeddings", what, &maxpos);
  // Fields whose only value snip implements (the default of each).
  const std::string silu = "silu";
  if (const std::string act = field<std::string>(j, "hidden_act", what, &silu); act != "silu")
    fail(what, ": field 'hidden_act': expected \"silu\", got \"", act, "\" (snip's MLP is SwiGLU)");
  const bool no = false;
  if (field<bool>(j, "attention_bias", what, &no))
    fail(what, ": field 'attention_bias': true, but snip's attention projections have no bias (expected false)");
  if (field<bool>(j, "mlp_bias", what, &no))
    fail(what, ": field 'mlp_bias': true, but snip's MLP projections have no bias (expected false)");
  const double zero = 0.0;
  if (const double p = field<double>(j, "attention_dropout", what, &zero); p != 0.0)
    fail(what, ": field 'attention_dropout': ", p, ", but snip trains without dropout (expected 0.0)");
  m.validate(what);
  if (present(j, "head_dim") && field<int64_t>(j, "head_dim", what) != m.head_dim())
    fail(what, ": field 'head_dim': ", j["head_dim"].dump(), ", but snip's head_dim is hidden_size / ",
         "num_attention_heads = ", m.head_dim(), " (expected that or null)");
  return m;
}

nlohmann::json LlamaConfig::to_hf_json() const {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", vocab_size},
          {"hidden_size", hidden_size},
          {"intermediate_size", intermediate_size},
          {"num_hidden_layers", num_hidden_layers},
          {"num_attention_heads", num_attention_heads},
          {"num_key_value_heads", num_key_value_heads},
          {"rms_norm_eps", rms_norm_eps},
          {"rope_theta", rope_theta},
          {"tie_word_embeddings", tie_word_embeddings},
          {"max_position_embeddings", max_position_embeddings},
          {"hidden_act", "silu"},
          {"attention_bias", false},
          {"rope_scaling", nullptr},
          {"torch_dtype", "float32"}};
}

void LlamaConfig::validate(const std::string& what) const {
  auto pos = [&](const char* k, int64_t v) {
    if (v <= 0) fail(what, ": ", k, ": expected a positive integer, got ", v);
    // Tensor sizes and the parameter count must not overflow (an int64
    // product of two sizes past 2^31 can).
    if (v > 0x7FFFFFFF) fail(what, ": ", k, ": expected at most 2^31 - 1 = 2147483647, got ", v);
  };
  pos("vocab_size", vocab_size);
  pos("hidden_size", hidden_size);
  pos("intermediate_size", intermediate_size);
  pos("num_hidden_layers", num_hidden_layers);
  pos("num_attention_heads", num_attention_heads);
  pos("num_key_value_heads", num_key_value_heads);
  pos("max_position_embeddings", max_position_embeddings);
  if (hidden_size % num_attention_heads)
    fail(what, ": hidden_size ", hidden_size, " is not divisible by num_attention_heads ", num_attention_heads);
  if (head_dim() % 2) fail(what, ": head_dim ", head_dim(), " must be even for RoPE");
  if (num_attention_heads % num_key_value_heads)
    fail(what, ": num_attention_heads ", num_attention_heads, " is not divisible by num_key_value_heads ",
         num_key_value_heads);
  if (!(rms_norm_eps > 0)) fail(what, ": rms_norm_eps: expected > 0");
  if (!(rope_theta > 0)) fail(what, ": rope_theta: expected > 0");
}

int64_t LlamaConfig::num_parameters() const {
  const int64_t C = hidden_size, F = intermediate_size, KVD = num_key_value_heads * head_dim();
  const int64_t per_layer = C * C * 2 + C * KVD * 2 + 3 * C * F + 2 * C;
  return vocab_size * C * (tie_word_embeddings ? 1 : 2) + num_hidden_layers * per_layer + C;
}

double LlamaConfig::train_flops_per_token(int64_t T) const {
  const double C = hidden_size, F = intermediate_size, KVD = double(num_key_value_heads) * head_dim();
  const double gemm_weights = num_hidden_layers * (2 * C * C + 2 * C * KVD + 3 * C * F) + vocab_size * C;
  // 6 FLOPs per weight per token (2 fprop, 2 dgrad, 2 wgrad); attention QKᵀ and
  // AV: 2·2·T·C per token forward, x3 for training.
  return 6.0 * gemm_weights + 12.0 * num_hidden_layers * T * C;
}

// ----------------------------------------------------------------- modules --

std::pair<torch::Tensor, torch::Tensor> rope_tables(int64_t T, int64_t hd, double theta,
                                                    at::ScalarType dtype) {
  auto opts = torch::TensorOptions().dtype(torch::kDouble);
  // inv_freq[i] = θ^(-2i/HD), i = 0..HD/2-1
  torch::Tensor inv_freq = 1.0 / torch::pow(theta, torch::arange(0, hd, 2, opts) / double(hd));
  torch::Tensor freqs = torch::outer(torch::arange(T, opts), inv_freq);  // [T, HD/2]
  torch::Tensor emb = torch::cat({freqs, freqs}, -1);                    // [T, HD]
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps_) : eps(eps_) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  // x [..., C]: x · rsqrt(mean(x², -1) + eps) · w
  return x * torch::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps) * weight;
}

namespace {
// HF rotate_half: x [..., HD] -> cat(-x2, x1)
torch::Tensor rotate_half(const torch::Tensor& x) {
  const int64_t h = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, h, h), x.narrow(-1, 0, h)}, -1);
}
}  // namespace

AttentionImpl::AttentionImpl(const LlamaConfig& c)
    : nh(c.num_attention_heads), nkv(c.num_key_value_heads), hd(c.head_dim()) {
  q_proj = register_module("q_proj", QuantLinear(c.hidden_size, nh * hd, c.init_std));
  k_proj = register_module("k_proj", QuantLinear(c.hidden_size, nkv * hd, c.init_std));
  v_proj = register_module("v_proj", QuantLinear(c.hidden_size, nkv * hd, c.init_std));
  o_proj = register_module("o_proj", QuantLinear(nh * hd, c.hidden_size, c.init_std));
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                     const torch::Tensor& sin) {
  const int64_t B = x.size(0), T = x.size(1);
  // [B, T, NH*HD] -> [B, NH, T, HD]
  torch::Tensor q = q_proj(x).view({B, T, nh, hd}).transpose(1, 2);
  torch::Tensor k = k_proj(x).view({B, T, nkv, hd}).transpose(1, 2);  // [B, NKV, T, HD]
  torch::Tensor v = v_proj(x).view({B, T, nkv, hd}).transpose(1, 2);  // [B, NKV, T, HD]
  q = q * cos + rotate_half(q) * sin;
  k = k * cos + rotate_half(k) * sin;
  // Grouped-query attention without copies of K and V (HF repeat_kv): KV
  // head j serves query heads j*rep .. (j+1)*rep-1, so those heads' queries
  // stack into one [rep*T, HD] operand per KV head and each product is one
  // GEMM per (batch, KV head): q [B, NKV, rep*T, HD] x kᵀ [B, NKV, HD, T].
  const int64_t rep = nh / nkv;
  const torch::Tensor qg = q.reshape({B, nkv, rep * T, hd});
  // The two attention products run in `bmm_dtype` (BF16 in the BF16
  // baseline: METHOD.md section 1 keeps them BF16); scores, mask and softmax
  // stay in the activation dtype.
  torch::Tensor att = matmul_in(qg, k.transpose(-2, -1), bmm_dtype);
  // Causal mask as an additive [T, T] bias (0 on/below the diagonal, -inf
  // above), repeated for the rep stacked heads: [rep*T, T].
  torch::Tensor bias = torch::full({T, T}, -std::numeric_limits<double>::infinity(), q.options()).triu(1);
  if (rep > 1) bias = bias.repeat({rep, 1});
  att = att.mul_(1.0 / std::sqrt(double(hd))).add_(bias).softmax(-1);  // [B, NKV, rep*T, T]
  torch::Tensor y = matmul_in(att, v, bmm_dtype);  // [B, NKV, rep*T, HD]
  y = y.view({B, nh, T, hd});
  return o_proj(y.transpose(1, 2).reshape({B, T, nh * hd}));
}

MLPImpl::MLPImpl(const LlamaConfig& c) {
  gate_proj = register_module("gate_proj", QuantLinear(c.hidden_size, c.intermediate_size, c.init_std));
  up_proj = register_module("up_proj", QuantLinear(c.hidden_size, c.intermediate_size, c.init_std));
  down_proj = register_module("down_proj", QuantLinear(c.intermediate_size, c.hidden_size, c.init_std));
}

torch::Tensor MLPImpl::forward(const torch::Tensor& x) {
  return down_proj(torch::silu(gate_proj(x)) * up_proj(x));
}

DecoderLayerImpl::DecoderLayerImpl(const LlamaConfig& c) {
  // Registration order = HF state_dict order.
  self_attn = register_module("self_attn", Attention(c));
  mlp = register_module("mlp", MLP(c));
  input_layernorm = register_module("input_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  post_attention_layernorm = register_module("post_attention_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
}

torch::Tensor DecoderLayerImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                        const torch::Tensor& sin) {
  torch::Tensor h = x + self_attn(input_layernorm(x), cos, sin);
  return h + mlp(post_attention_layernorm(h));
}

LlamaModelImpl::LlamaModelImpl(const LlamaConfig& c) : cfg(c) {
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(c.vocab_size, c.hidden_size));
  torch::NoGradGuard ng;
  embed_tokens->weight.normal_(0.0, c.init_std);
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers->push_back(DecoderLayer(c));
  norm = register_module("norm", RMSNorm(c.hidden_size, c.rms_norm_eps));
}

torch::Tensor LlamaModelImpl::forward(const torch::Tensor& ids) {
  const int64_t T = ids.size(1);
  if (T > cfg.max_position_embeddings)
    fail("sequence length ", T, " exceeds max_position_embeddings ", cfg.max_position_embeddings);
  torch::Tensor h = embed_tokens(ids);  // [B, T, C]
  auto [cos, sin] = rope_tables(T, cfg.head_dim(), cfg.rope_theta, h.scalar_type());
  for (const auto& layer : *layers) h = layer->as<DecoderLayer>()->forward(h, cos, sin);
  return norm(h);
}

LlamaForCausalLMImpl::LlamaForCausalLMImpl(const LlamaConfig& c) : cfg(c) {
  c.validate("model config");
  model = register_module("model", LlamaModel(c));
  if (!c.tie_word_embeddings) {
    lm_head = register_module("lm_head", QuantLinear(c.hidden_size, c.vocab_size, c.init_std));
    lm_head->name = "lm_head";
  }
  int64_t idx = 0;
  for (auto& l : linear_layers()) l->layer_index = idx++;
}

torch::Tensor LlamaForCausalLMImpl::forward(const torch::Tensor& ids) {
  torch::Tensor h = model(ids);  // [B, T, C]
  if (lm_head) return lm_head(h);
  // Tied head: logits = h · embed_tokensᵀ in the head's GEMM dtype.
  const torch::Tensor& w = model->embed_tokens->weight;  // [V, C]
  return matmul_in(h, w.t(), head_gemm_dtype);
}

torch::Tensor LlamaForCausalLMImpl::loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

std::vector<QuantLinear> LlamaForCausalLMImpl::linear_layers() const {
  std::vector<QuantLinear> out;
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    auto layer = model->layers->ptr(i)->as<DecoderLayer>();
    const std::string p = "model.layers." + std::to_string(i) + ".";
    auto add = [&](QuantLinear l, const std::string& n) {
      l->name = p + n;
      out.push_back(l);
    };
    add(layer->self_attn->q_proj, "self_attn.q_proj");
    add(layer->self_attn->k_proj, "self_attn.k_proj");
    add(layer->self_attn->v_proj, "self_attn.v_proj");
    add(layer->self_attn->o_proj, "self_attn.o_proj");
    add(layer->mlp->gate_proj, "mlp.gate_proj");
    add(layer->mlp->up_proj, "mlp.up_proj");
    add(layer->mlp->down_proj, "mlp.down_proj");
  }
  return out;
}

void LlamaForCausalLMImpl::set_precision(const LinearPrecision& p) {
  for (auto& l : linear_layers()) l->precision = p;
}

void LlamaForCausalLMImpl::set_non_linear_gemm_dtype(at::ScalarType dtype) {
  head_gemm_dtype = dtype;
  if (lm_head) lm_head->precision.gemm_dtype = dtype;
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i)
    model->layers->ptr(i)->as<DecoderLayer>()->self_attn->bmm_dtype = dtype;
}

void LlamaForCausalLMImpl::set_step(uint64_t seed, int64_t step) {
  for (auto& l : linear_layers()) {
    l->key_base.seed = seed;
    l->key_base.step = step;
  }
}

std::vector<std::pair<std::string, torch::Tensor>> LlamaForCausalLMImpl::hf_parameters() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& p : named_parameters(/*recurse=*/true)) out.emplace_back(p.key(), p.value());
  return out;
}

}  // namespace snip
