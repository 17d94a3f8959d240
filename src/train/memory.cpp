// Memory needed by a model and batch (see memory.h).
#include "snip/train/memory.h"

#include <algorithm>
#include <cstdio>

#include "snip/core/error.h"

namespace snip {

namespace {
// Parameters as a double (num_parameters() is int64 and overflows for
// shapes this check exists to refuse).
double parameters(const LlamaConfig& c) {
  const double C = double(c.hidden_size), F = double(c.intermediate_size);
  const double KVD = double(c.num_key_value_heads) * (double(c.hidden_size) / double(c.num_attention_heads));
  const double per_layer = C * C * 2 + C * KVD * 2 + 3 * C * F + 2 * C;
  return double(c.vocab_size) * C * (c.tie_word_embeddings ? 1 : 2) + double(c.num_hidden_layers) * per_layer + C;
}

std::string gib(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g", bytes / double(1ull << 30));
  return b;
}
}  // namespace

MemoryEstimate training_memory(const LlamaConfig& cfg, int64_t batch, int64_t seq_len, const RankLayout& layout) {
  MemoryEstimate e;
  const double P = parameters(cfg), B = double(batch), T = double(seq_len);
  const double local = double(std::max(layout.local_ranks, 1));
  const double owned = local / double(std::max(layout.ranks, 1));  // ZeRO: this machine's share of the shards
  e.weights = local * 4 * P;
  e.gradients = (layout.zero_stage >= 2 ? owned : local) * 4 * P;
  e.adamw = (layout.zero_stage >= 1 ? owned : local) * 8 * P;
  e.activations = local * 4 * B * T * double(cfg.num_hidden_layers) *
                  (3.0 * double(cfg.hidden_size) + 3.0 * double(cfg.intermediate_size) +
                   double(cfg.num_attention_heads) * T);
  e.logits = local * 8 * B * T * double(cfg.vocab_size);
  return e;
}

MemoryEstimate inference_memory(const LlamaConfig& cfg, int64_t batch, int64_t seq_len) {
  MemoryEstimate e;
  e.weights = 4 * parameters(cfg);
  e.logits = 8 * double(batch) * double(seq_len) * double(cfg.vocab_size);
  return e;
}

void check_memory(const MemoryEstimate& est, long long available_bytes, const std::string& what) {
  if (available_bytes <= 0 || est.total() <= double(available_bytes)) return;
  std::string terms = "weights " + gib(est.weights);
  if (est.gradients > 0) terms += " + gradients " + gib(est.gradients);
  if (est.adamw > 0) terms += " + AdamW moments " + gib(est.adamw);
  if (est.activations > 0) terms += " + activations " + gib(est.activations);
  if (est.logits > 0) terms += " + logits " + gib(est.logits);
  fail(what, ": the model and batch need at least ", gib(est.total()), " GiB (", terms, ") but ",
       gib(double(available_bytes)), " GiB of memory are available: lower the batch size, the sequence length "
       "or the model's size");
}

}  // namespace snip
