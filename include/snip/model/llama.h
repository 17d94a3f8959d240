// snip/model/llama.h: the Llama decoder, with Hugging Face parameter names.
//
// Dimension vocabulary of the whole project (llm.c habit); a letter means
// the same thing in every header:
//   B  batch size (sequences)     T   sequence length (tokens)   N  B·T tokens of a micro-batch
//   C  hidden_size                NH  query heads                NKV key/value heads
//   HD head_dim = C / NH          F   intermediate_size          V   vocab_size
//   L  num_hidden_layers          IN, OUT  a linear layer's in/out features
//   K  a GEMM's reduction dimension (IN for fprop, OUT for dgrad, N for wgrad)
// Counts of steps, FLOPs and fractions are spelled out, not lettered.
//
// Semantics follow Hugging Face `LlamaForCausalLM` (transformers
// modeling_llama.py): RMSNorm x·rsqrt(mean(x²)+eps)·w; RoPE in the
// rotate_half convention with inv_freq = θ^(-2i/HD); grouped-query attention
// where KV head j serves query heads j·NH/NKV .. (j+1)·NH/NKV-1; causal
// softmax attention scaled by 1/sqrt(HD); SwiGLU MLP down(silu(gate(x))·up(x));
// optional tied embeddings. Parameter names are exactly HF's:
// model.embed_tokens.weight, model.layers.{i}.self_attn.{q,k,v,o}_proj.weight,
// model.layers.{i}.mlp.{gate,up,down}_proj.weight,
// model.layers.{i}.{input,post_attention}_layernorm.weight, model.norm.weight,
// lm_head.weight (absent when tied). tools/ref_llama.py is the independent
// plain-PyTorch reference the tests compare against.
#pragma once

#include <torch/torch.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "snip/config/llama_config.h"
#include "snip/model/linear.h"

namespace snip {

/// RMSNorm over the last dim: x [..., C] -> [..., C]; parameter `weight` [C].
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;  ///< [C], initialised to 1
  double eps;
};
TORCH_MODULE(RMSNorm);

/// Grouped-query self-attention with RoPE.
class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const LlamaConfig& cfg);
  /// x [B, T, C], cos/sin [T, HD] -> [B, T, C].
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);
  QuantLinear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  int64_t nh, nkv, hd;
  /// dtype of QKᵀ and AV (Undefined = the activation dtype).
  at::ScalarType bmm_dtype = at::ScalarType::Undefined;
  /// true: the causal attention runs as LibTorch's fused
  /// at::scaled_dot_product_attention (flash / memory-efficient / cuDNN
  /// kernels on CUDA; GQA through enable_gqa) on Q, K, V cast to bmm_dtype,
  /// the output cast back to the activation dtype. false: the explicit
  /// products and softmax above (the CPU default; bit-reproducible).
  /// Both compute softmax(QKᵀ/sqrt(HD) + causal mask)·V; they differ by
  /// rounding only (test_llama.cpp Sdpa.* states the bound).
  bool sdpa = false;
};
TORCH_MODULE(Attention);

/// Resolves train.attention for a run on `device`: "math" -> false,
/// "sdpa" -> true, "auto" -> true on CUDA when the attention products run
/// in native BF16 (`native_bf16`: train.gemm_dtype = bf16 and
/// train.gemm_backend not emulated: the fused kernels take half types only,
/// FP32 would fall back to LibTorch's math kernel, which copies K and V per
/// query head), else false (the CPU keeps the explicit products: the
/// reference numbers). Throws UserError naming train.attention for another word.
bool resolve_attention_sdpa(const std::string& option, const torch::Device& device, bool native_bf16 = true);

/// SwiGLU MLP: x [B, T, C] -> down(silu(gate(x)) * up(x)) [B, T, C].
class MLPImpl : public torch::nn::Module {
 public:
  explicit MLPImpl(const LlamaConfig& cfg);
  torch::Tensor forward(const torch::Tensor& x);
  QuantLinear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(MLP);

/// One pre-norm decoder block.
class DecoderLayerImpl : public torch::nn::Module {
 public:
  explicit DecoderLayerImpl(const LlamaConfig& cfg);
  /// x [B, T, C] -> [B, T, C].
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  Attention self_attn{nullptr};
  MLP mlp{nullptr};
};
TORCH_MODULE(DecoderLayer);

/// The decoder stack without the head ("model." prefix in HF names).
class LlamaModelImpl : public torch::nn::Module {
 public:
  explicit LlamaModelImpl(const LlamaConfig& cfg);
  /// ids [B, T] (int64) -> hidden states [B, T, C].
  torch::Tensor forward(const torch::Tensor& ids);
  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};
  LlamaConfig cfg;
};
TORCH_MODULE(LlamaModel);

/// Llama with the language-model head.
class LlamaForCausalLMImpl : public torch::nn::Module {
 public:
  /// Builds and initialises the model (weights N(0, init_std²), norms 1) with
  /// the current torch seed. Throws UserError if the shape is inconsistent.
  explicit LlamaForCausalLMImpl(const LlamaConfig& cfg);
  /// ids [B, T] -> logits [B, T, V].
  torch::Tensor forward(const torch::Tensor& ids);
  /// One pipeline stage (dist/pipeline.h): decoder blocks [first, end). `x`
  /// is ids [B, T] (int64) when `embed` (the first stage: embed_tokens
  /// first), else the previous stage's hidden states [B, T, C]. Returns
  /// logits [B, T, V] when `head` (the last stage: model.norm and lm_head
  /// after the blocks), else hidden states [B, T, C]. The same operations as
  /// forward(): forward_stage(ids, 0, L, true, true) == forward(ids) bit for
  /// bit. Throws UserError for a block range outside [0, L].
  torch::Tensor forward_stage(const torch::Tensor& x, int64_t first, int64_t end, bool embed, bool head);
  /// Mean cross-entropy (nats per token) of logits [B, T, V] vs targets [B, T].
  static torch::Tensor loss(const torch::Tensor& logits, const torch::Tensor& targets);

  /// Every quantizable linear layer (q/k/v/o/gate/up/down_proj), block order,
  /// with `name` and `layer_index` set.
  std::vector<QuantLinear> linear_layers() const;
  /// Sets the same precision on every quantizable linear layer.
  void set_precision(const LinearPrecision& p);
  /// dtype of the GEMMs outside the quantizable layers: lm_head (tied or
  /// not) and the attention products QKᵀ, AV. at::kBFloat16 for the BF16
  /// baseline; Undefined = the activation dtype.
  void set_non_linear_gemm_dtype(at::ScalarType dtype);
  /// Sets AttentionImpl::sdpa on every decoder block.
  void set_attention_sdpa(bool sdpa);
  /// AttentionImpl::sdpa of the blocks (false for a model without blocks).
  bool attention_sdpa() const;
  /// Sets the optimizer step and seed used to key stochastic rounding.
  void set_step(uint64_t seed, int64_t step);

  /// Parameters by Hugging Face name (tied lm_head omitted; LoRA adapters,
  /// model/lora.h, omitted: lora_parameters has them).
  std::vector<std::pair<std::string, torch::Tensor>> hf_parameters() const;

  LlamaModel model{nullptr};
  QuantLinear lm_head{nullptr};  ///< untied head [V, C] (never quantized: pinned BF16); null when tied
  at::ScalarType head_gemm_dtype = at::ScalarType::Undefined;  ///< head GEMM dtype (Undefined = input's)
  LlamaConfig cfg;
};
TORCH_MODULE(LlamaForCausalLM);

/// RoPE tables for positions 0..T-1: returns {cos, sin}, each [T, HD], in
/// `dtype` on `device` (computed in FP64 on the host), HF's cat(freqs, freqs)
/// layout.
std::pair<torch::Tensor, torch::Tensor> rope_tables(int64_t T, int64_t head_dim, double theta,
                                                    at::ScalarType dtype, const torch::Device& device = torch::kCPU);

}  // namespace snip
