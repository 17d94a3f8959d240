// The model of configs/tiny.toml (with the Brown tokenizer's 8192 pieces),
// shared by the benchmarks.
#pragma once
#include "snip/model/llama.h"

namespace snip::bench {

inline LlamaConfig tiny_model() {
  LlamaConfig c;
  c.vocab_size = 8192;
  c.hidden_size = 256;
  c.intermediate_size = 688;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  c.max_position_embeddings = 256;
  return c;
}

}  // namespace snip::bench
