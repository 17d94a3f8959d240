// snip/config/llama_config.h: the model shape, Hugging Face's LlamaConfig
// (dimension letters as in snip/model/llama.h). LibTorch-free, so that
// config.json parsing is testable and fuzzable alone (tests/fuzz).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace snip {

class Config;
struct ModelConfig;

/// The model shape: field names and meaning of HF's LlamaConfig.
struct LlamaConfig {
  int64_t vocab_size = 8192;         ///< V
  int64_t hidden_size = 256;         ///< C
  int64_t intermediate_size = 688;   ///< F
  int64_t num_hidden_layers = 4;     ///< L
  int64_t num_attention_heads = 8;   ///< NH
  int64_t num_key_value_heads = 4;   ///< NKV
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  bool tie_word_embeddings = true;
  int64_t max_position_embeddings = 2048;  ///< tokens
  double init_std = 0.02;                  ///< not an HF field; init only

  int64_t head_dim() const { return hidden_size / num_attention_heads; }

  /// From the [model] section of a run config (vocab_size 0 -> `vocab`).
  static LlamaConfig from_run_config(const ModelConfig& cfg, int64_t vocab);
  /// The same from an unparsed configuration (RunConfig::from checks it first).
  static LlamaConfig from_run_config(const Config& cfg, int64_t vocab);
  /// From a Hugging Face config.json object (transformers' LlamaConfig,
  /// configuration_llama.py, 4.x and 5.x); `what` names the file in errors.
  /// Required: vocab_size, hidden_size, intermediate_size, num_hidden_layers,
  /// num_attention_heads. Absent or null optional fields take transformers'
  /// defaults: num_key_value_heads = num_attention_heads, rms_norm_eps 1e-6,
  /// rope_theta 10000, tie_word_embeddings false, max_position_embeddings
  /// 2048. The RoPE base is read from rope_theta, or from rope_parameters /
  /// rope_scaling {"rope_type": "default", "rope_theta": x} (transformers 5).
  /// Throws UserError, one line naming the field and the value found, for a
  /// missing/mistyped field, an inconsistent shape, and any value snip does
  /// not implement: model_type other than "llama"; architectures without
  /// "LlamaForCausalLM"; a quantization_config; hidden_act other than
  /// "silu"; attention_bias or mlp_bias true; attention_dropout != 0; a
  /// head_dim other than hidden_size / num_attention_heads; RoPE scaling (a
  /// rope_type other than "default", or parameters besides rope_theta);
  /// rope_theta and rope_parameters.rope_theta that disagree. Every other
  /// key is left to the caller (model/hf.h, adopt_hf_config, says what
  /// --init-from does with each).
  static LlamaConfig from_hf_json(const nlohmann::json& j, const std::string& what);
  /// As a Hugging Face config.json object (architectures, model_type, ...).
  nlohmann::json to_hf_json() const;
  /// Throws UserError naming the field when shapes are inconsistent or a size
  /// is outside [1, 2^31 - 1].
  void validate(const std::string& what) const;

  /// Parameters (count) with tied embeddings counted once.
  int64_t num_parameters() const;
  /// Training FLOPs per token (fprop+dgrad+wgrad = 6 FLOPs per weight of every
  /// GEMM incl. lm_head, plus the attention score/value products
  /// 6·2·L·T·C for causal length T, halved for causality is NOT applied:
  /// this is the PaLM appendix B "model FLOPs" convention).
  double train_flops_per_token(int64_t seq_len) const;
};

}  // namespace snip
