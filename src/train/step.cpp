// One optimizer step (see step.h).
#include "snip/train/step.h"

#include <cmath>
#include <limits>

#include "snip/train/optimizer.h"
#include "snip/util/error.h"

namespace snip {

torch::Tensor to_ids(const std::vector<int32_t>& ids, int64_t B, int64_t T) {
  return torch::from_blob(const_cast<int32_t*>(ids.data()), {B, T}, torch::kInt).to(torch::kLong);
}

StepResult train_step(StepContext& c, int64_t step, double lr) {
  set_lr(c.optimizer, lr);
  c.model->set_step(c.seed, step);
  c.optimizer.zero_grad();
  StepResult r;
  double loss_sum = 0;
  std::vector<int32_t> in, tg;
  for (int64_t m = 0; m < c.grad_accum; ++m) {
    c.loader.next(in, tg);
    const torch::Tensor ids = to_ids(in, c.B, c.T), targets = to_ids(tg, c.B, c.T);
    if (m == 0 && c.controller && c.controller->active())  // step boundary: stats step / re-plan
      r.precision = c.controller->begin_step(
          step, [&] { return LlamaForCausalLMImpl::loss(c.model(ids), targets); }, c.optimizer);
    torch::Tensor loss = LlamaForCausalLMImpl::loss(c.model(ids), targets);
    (loss / double(c.grad_accum)).backward();
    loss_sum += loss.item<double>();
  }
  r.loss = loss_sum / double(c.grad_accum);
  if (!std::isfinite(r.loss))
    fail("training diverged: loss is ", r.loss, " at step ", step + 1, " (lower train.lr or raise precision)");
  std::vector<torch::Tensor> params = c.model->parameters();
  r.grad_norm = torch::nn::utils::clip_grad_norm_(
      params, c.grad_clip > 0 ? c.grad_clip : std::numeric_limits<double>::infinity());
  c.optimizer.step();
  return r;
}

}  // namespace snip
