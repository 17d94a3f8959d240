// snip/train/sample.h: text from a trained model, to see what it learned
// (`snip sample`, and a short sample at each evaluation of `snip train`, as
// llm.c and nanoGPT print).
//
// Autoregressive sampling without a KV cache (the model is small): at each
// step the whole context, cropped to the last max_position_embeddings tokens,
// is run forward and the next token is drawn from the last position's logits
// [V]: divided by the temperature, restricted to the top_k largest, softmax,
// one draw with a generator seeded by `seed` alone (the global LibTorch
// generator is not touched, so training numbers do not move).
#pragma once

#include <cstdint>
#include <vector>

#include "snip/model/llama.h"

namespace snip {

struct SampleOptions {
  int64_t max_new_tokens = 64;  ///< tokens to generate, >= 0
  double temperature = 0.8;     ///< > 0; 0 = greedy (argmax)
  int64_t top_k = 40;           ///< keep the k most likely tokens; 0 = all V
  uint64_t seed = 0;            ///< same seed, same model, same prompt: same tokens
  int64_t eos_id = -1;          ///< stop after generating this id (-1 = never)
  /// Draw only ids below this (the tokenizer's vocabulary when the model's
  /// is larger: those extra embeddings decode to nothing); <= 0 = all V.
  int64_t vocab_limit = 0;
};

/// The prompt's token ids [P] followed by up to max_new_tokens generated
/// ids. No gradients. Throws UserError for an empty prompt, an id outside
/// [0, V), a negative temperature or top_k, or max_new_tokens < 0.
std::vector<int32_t> sample(LlamaForCausalLM& model, const std::vector<int32_t>& prompt, const SampleOptions& o);

}  // namespace snip
