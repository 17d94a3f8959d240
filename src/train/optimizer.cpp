// The optimizer and learning-rate schedule (see optimizer.h).
#include "snip/train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace snip {

double lr_at(int64_t step, int64_t total, int64_t warmup, double lr, double min_ratio) {
  if (warmup > 0 && step < warmup) return lr * double(step + 1) / double(warmup);
  const double span = std::max<int64_t>(1, total - warmup);
  const double progress = std::min(1.0, double(step - warmup) / span);
  return lr * (min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + std::cos(M_PI * progress)));
}

std::unique_ptr<torch::optim::AdamW> make_optimizer(LlamaForCausalLM& model, const TrainConfig& t) {
  return make_optimizer(model->parameters(), t);
}

std::unique_ptr<torch::optim::AdamW> make_optimizer(const std::vector<torch::Tensor>& params, const TrainConfig& t) {
  std::vector<torch::Tensor> decay, no_decay;
  for (auto& p : params) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  auto opts = [&](double wd) {
    auto o = std::make_unique<torch::optim::AdamWOptions>(t.lr);
    o->betas({t.beta1, t.beta2});
    o->eps(t.eps);
    o->weight_decay(wd);
    return o;
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, opts(t.weight_decay));
  groups.emplace_back(no_decay, opts(0.0));
  return std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(t.lr));
}

void set_lr(torch::optim::Optimizer& opt, double lr) {
  for (auto& g : opt.param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr);
}

}  // namespace snip
