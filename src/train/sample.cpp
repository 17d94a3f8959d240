// Autoregressive sampling (see sample.h).
#include "snip/train/sample.h"

#include <algorithm>

#include "snip/core/error.h"
#include "snip/model/device.h"

namespace snip {

std::vector<int32_t> sample(LlamaForCausalLM& model, const std::vector<int32_t>& prompt, const SampleOptions& o) {
  const int64_t V = model->cfg.vocab_size, ctx = model->cfg.max_position_embeddings;
  if (prompt.empty()) fail("sample: expected a prompt of at least one token");
  if (!(o.temperature >= 0)) fail("sample: --temperature: expected >= 0, got ", o.temperature);
  if (o.top_k < 0) fail("sample: --top-k: expected >= 0 (0 = every token), got ", o.top_k);
  if (o.max_new_tokens < 0) fail("sample: --max-new-tokens: expected >= 0, got ", o.max_new_tokens);
  for (int32_t id : prompt)
    if (id < 0 || id >= V) fail("sample: prompt token id ", id, " is outside the vocabulary [0, ", V, ")");
  torch::NoGradGuard ng;
  at::Generator gen = at::detail::createCPUGenerator(o.seed);
  std::vector<int32_t> ids = prompt;
  for (int64_t n = 0; n < o.max_new_tokens; ++n) {
    const int64_t start = std::max<int64_t>(0, int64_t(ids.size()) - ctx);
    const torch::Tensor in =
        torch::tensor(std::vector<int64_t>(ids.begin() + start, ids.end()), torch::kLong).unsqueeze(0);  // [1, T]
    // On the model's device; the logits back on the host for the CPU generator.
    torch::Tensor logits = model(in.to(compute_device())).select(1, in.size(1) - 1).squeeze(0).to(torch::kCPU,
                                                                                                    torch::kFloat);  // [V]
    if (o.vocab_limit > 0 && o.vocab_limit < V) logits = logits.slice(0, 0, o.vocab_limit);              // [vocab_limit]
    int64_t next;
    if (o.temperature == 0) {
      next = logits.argmax().item<int64_t>();
    } else {
      logits = logits / o.temperature;
      if (o.top_k > 0 && o.top_k < logits.size(0)) {
        const torch::Tensor kth = std::get<0>(logits.topk(o.top_k)).min();
        logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
      }
      next = torch::multinomial(torch::softmax(logits, 0), 1, false, gen).item<int64_t>();
    }
    ids.push_back(int32_t(next));
    if (next == o.eos_id) break;
  }
  return ids;
}

}  // namespace snip
