// The model shape (see snip/config/llama_config.h).
#include "snip/config/llama_config.h"

#include <optional>
#include <type_traits>

#include "snip/config/config.h"
#include "snip/core/error.h"

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
  // The shapes need no recipes: precision.recipe_file is not read here.
  return from_run_config(RunConfig::from(c, recipes::RecipeSet()).model, vocab);
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

}  // namespace snip
