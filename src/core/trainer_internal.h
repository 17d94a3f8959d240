// Trainer pieces shared with the correlation study (study.cpp); not public API.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "snip/core/config.h"
#include "snip/core/llama.h"

namespace snip::detail {

/// Token ids [B*T] (int32) -> [B, T] int64 tensor.
torch::Tensor to_ids(const std::vector<int32_t>& v, int64_t B, int64_t T);
/// AdamW of `snip train` (decay on 2-D weights only; train.* options).
std::unique_ptr<torch::optim::AdamW> make_optimizer(LlamaForCausalLM& model, const Config& cfg);
/// Sets every parameter group's learning rate.
void set_lr(torch::optim::Optimizer& opt, double lr);
/// trainer_state.json of a checkpoint, its file checksums verified. UserError
/// when missing or corrupt.
nlohmann::json read_checkpoint_state(const std::string& dir);

}  // namespace snip::detail
