// snip/train/optimizer.h: the optimizer and learning-rate schedule of
// `snip train`.
//
// AdamW with decoupled weight decay (Loshchilov & Hutter, "Decoupled Weight
// Decay Regularization", ICLR 2019; as torch.optim.AdamW), decay on the 2-D
// weights only (RMSNorm weights are not decayed); FP32 master weights and
// moments. Learning rate: linear warmup, then cosine decay to a floor.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>

#include "snip/config/config.h"
#include "snip/model/llama.h"

namespace snip {

/// AdamW over `model`'s parameters in two groups: 2-D weights with
/// train.weight_decay, the rest without; lr train.lr, betas (train.beta1,
/// train.beta2), eps train.eps.
std::unique_ptr<torch::optim::AdamW> make_optimizer(LlamaForCausalLM& model, const TrainConfig& t);
/// The same over `params` only (model order), e.g. the parameters one rank
/// owns under ZeRO (dist/zero.h); a group may be empty.
std::unique_ptr<torch::optim::AdamW> make_optimizer(const std::vector<torch::Tensor>& params, const TrainConfig& t);

/// Sets every parameter group's learning rate (a fraction per step, unitless).
void set_lr(torch::optim::Optimizer& opt, double lr);

/// Learning rate at `step` (0-based optimizer step): linear warmup over
/// `warmup` steps from lr/warmup to lr, then cosine decay to lr·min_ratio at
/// `total` steps (and flat after).
double lr_at(int64_t step, int64_t total, int64_t warmup, double lr, double min_ratio);

}  // namespace snip
