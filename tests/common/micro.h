// Shared by the LibTorch tests: the prepared Brown data (CTest fixture
// prepare_brown512, BPE vocabulary 512) and a micro model that trains on it in
// about a second on one thread.
#pragma once

#include <functional>
#include <string>

#include "snip/config/config.h"
#include "snip/util/error.h"

namespace snip::test {

inline const std::string kBrown512 = std::string(SNIP_BINARY_DIR) + "/test-data/brown512";

/// ~0.1M parameters: C=64, L=2, NH=4, NKV=2, F=172; B=8, T=64; one thread.
inline Config micro_config() {
  Config c;
  c.load_toml_string(R"(
[model]
hidden_size = 64
intermediate_size = 172
num_hidden_layers = 2
num_attention_heads = 4
num_key_value_heads = 2
max_position_embeddings = 64
[train]
batch_size = 8
seq_len = 64
lr = 1e-2
warmup_steps = 10
eval_interval = 1000
eval_batches = 8
log_interval = 1000
threads = 1
)", "micro");
  c.set("data.dir", kBrown512, "test");
  return c;
}

/// The message of the UserError that f throws, or "(no error)".
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace snip::test
