// Shared by the LibTorch tests: the prepared KJV data (CTest fixture
// prepare_kjv512, BPE vocabulary 512) and a micro model that trains on it in
// about a second on one thread.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "snip/config/config.h"
#include "snip/config/llama_config.h"
#include "snip/core/error.h"

namespace snip::test {

inline const std::string kKjv512 = std::string(SNIP_BINARY_DIR) + "/test-data/kjv512";

/// A two-block Llama for unit tests that build the model by hand: C=32,
/// F=48, NH=4, NKV=2 (q/o 32->32, k/v 32->16, gate/up 32->48, down 48->32:
/// four distinct linear shapes), vocabulary 64, up to 16 positions.
inline LlamaConfig two_block_llama() {
  LlamaConfig c;
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 16;
  return c;
}

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
device = "cpu"
)", "micro");
  c.set("data.dir", kKjv512, "test");
  return c;
}

/// An empty path in the temp folder for this test process: snip-test-NAME-PID.
inline std::string fresh_dir(const std::string& name) {
  namespace fs = std::filesystem;
  const std::string d = (fs::temp_directory_path() / ("snip-test-" + name + "-" + std::to_string(getpid()))).string();
  fs::remove_all(d);
  return d;
}

/// The records of RUN/metrics.jsonl, one per step.
inline std::vector<nlohmann::json> read_metrics(const std::string& run) {
  std::ifstream in(run + "/metrics.jsonl");
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
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
