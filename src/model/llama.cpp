// The Llama decoder (HF LlamaForCausalLM semantics; see llama.h).
#include "snip/model/llama.h"

#include "snip/model/matmul.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "snip/config/config.h"
#include "snip/core/error.h"

namespace snip {

// ----------------------------------------------------------------- modules --

std::pair<torch::Tensor, torch::Tensor> rope_tables(int64_t T, int64_t hd, double theta,
                                                    at::ScalarType dtype, const torch::Device& device) {
  auto opts = torch::TensorOptions().dtype(torch::kDouble);
  // inv_freq[i] = θ^(-2i/HD), i = 0..HD/2-1
  torch::Tensor inv_freq = 1.0 / torch::pow(theta, torch::arange(0, hd, 2, opts) / double(hd));
  torch::Tensor freqs = torch::outer(torch::arange(T, opts), inv_freq);  // [T, HD/2]
  torch::Tensor emb = torch::cat({freqs, freqs}, -1);                    // [T, HD]
  return {emb.cos().to(device, dtype), emb.sin().to(device, dtype)};
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
  if (sdpa) {
    // [B, NH, T, HD] with K, V [B, NKV, T, HD] (enable_gqa: query head h
    // reads KV head h / rep, as above); softmax in FP32 inside the kernel.
    const at::ScalarType act = q.scalar_type();
    const at::ScalarType dt = bmm_dtype == at::ScalarType::Undefined ? act : bmm_dtype;
    torch::Tensor y = at::scaled_dot_product_attention(q.to(dt), k.to(dt), v.to(dt), /*attn_mask=*/{},
                                                       /*dropout_p=*/0.0, /*is_causal=*/true,
                                                       /*scale=*/1.0 / std::sqrt(double(hd)), /*enable_gqa=*/rep > 1)
                          .to(act);
    return o_proj(y.transpose(1, 2).reshape({B, T, nh * hd}));
  }
  const torch::Tensor qg = q.reshape({B, nkv, rep * T, hd});
  // The two attention products run in `bmm_dtype` (BF16 in the BF16
  // baseline: docs/method.md section 1 keeps them BF16); scores, mask and softmax
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
  auto [cos, sin] = rope_tables(T, cfg.head_dim(), cfg.rope_theta, h.scalar_type(), h.device());
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

torch::Tensor LlamaForCausalLMImpl::forward_stage(const torch::Tensor& x, int64_t first, int64_t end, bool embed,
                                                  bool head) {
  if (first < 0 || end > cfg.num_hidden_layers || first > end)
    fail("pipeline stage: blocks [", first, ", ", end, ") outside the model's ", cfg.num_hidden_layers, " blocks");
  const int64_t T = x.size(1);
  if (T > cfg.max_position_embeddings)
    fail("sequence length ", T, " exceeds max_position_embeddings ", cfg.max_position_embeddings);
  torch::Tensor h = embed ? model->embed_tokens(x) : x;  // [B, T, C]
  auto [cos, sin] = rope_tables(T, cfg.head_dim(), cfg.rope_theta, h.scalar_type(), h.device());
  for (int64_t i = first; i < end; ++i) h = model->layers->ptr(i)->as<DecoderLayer>()->forward(h, cos, sin);
  if (!head) return h;
  h = model->norm(h);
  if (lm_head) return lm_head(h);
  return matmul_in(h, model->embed_tokens->weight.t(), head_gemm_dtype);
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

void LlamaForCausalLMImpl::set_attention_sdpa(bool sdpa) {
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) model->layers->ptr(i)->as<DecoderLayer>()->self_attn->sdpa = sdpa;
}

bool LlamaForCausalLMImpl::attention_sdpa() const {
  return cfg.num_hidden_layers > 0 && model->layers->ptr(0)->as<DecoderLayer>()->self_attn->sdpa;
}

bool resolve_attention_sdpa(const std::string& option, const torch::Device& device, bool native_bf16) {
  if (option == "math") return false;
  if (option == "sdpa") return true;
  if (option == "auto") return device.is_cuda() && native_bf16;
  fail("train.attention: expected auto, sdpa or math, got '", option, "'");
}

void LlamaForCausalLMImpl::set_step(uint64_t seed, int64_t step) {
  for (auto& l : linear_layers()) {
    l->key_base.seed = seed;
    l->key_base.step = step;
  }
}

std::vector<std::pair<std::string, torch::Tensor>> LlamaForCausalLMImpl::hf_parameters() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& p : named_parameters(/*recurse=*/true)) {
    const std::string& n = p.key();
    if (n.find(".lora_A.") != std::string::npos || n.find(".lora_B.") != std::string::npos) continue;  // model/lora.h
    out.emplace_back(n, p.value());
  }
  return out;
}

}  // namespace snip
