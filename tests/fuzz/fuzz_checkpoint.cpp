// A checkpoint folder (`snip train --resume`, `snip eval`, `snip export`)
// -> verify_checkpoint, checkpoint_loader_state, checkpoint_model_config,
// checkpoint_tokenizer_sha256, checkpoint_data_dir
// (snip/run/checkpoint_files.h). The first byte of the input picks the
// file the rest replaces in an otherwise valid step-4 folder: 0
// trainer_state.json, 1 config.json, 2 manifest.json. For 0 and 1 the
// manifest is recomputed (as write_checkpoint_manifest would, without its
// fsyncs), so that the fields are reached past the checksums (an edit by
// hand with the checksums recomputed).
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "harness.h"
#include "snip/run/checkpoint_files.h"

using namespace snip;
namespace fs = std::filesystem;

namespace {

const char* kState = R"({"crc32": {}, "elapsed_s": 0.5, "loader": {"cursor": 8, "epoch": 0}, "seed": 1234,
  "step": 4, "val_loss": 6.2, "data": {"dir": "/d", "vocab_size": 512, "tokenizer_sha256":
  "aadd110998b9c06c8c39612d50e67dc9a78babcd16f85e5dc9602caf2d3a14dd"}})";
const char* kConfig = R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 512,
  "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
  "num_key_value_heads": 1, "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": true,
  "max_position_embeddings": 32, "hidden_act": "silu"})";

void put(const std::string& path, std::string_view bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() || std::fclose(f) != 0) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = [] {
    spdlog::set_level(spdlog::level::off);  // a checkpoint without manifest.json warns
    char tmpl[] = "/tmp/snip_fuzz_ckpt_XXXXXX";
    const std::string d = std::string(mkdtemp(tmpl)) + "/step-4";
    fs::create_directories(d);
    return d;
  }();
  if (size < 1) return 0;
  const int which = data[0] % 3;
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  put(dir + "/model.safetensors", "weights");
  put(dir + "/optimizer.pt", "adamw");
  put(dir + "/config.json", which == 1 ? rest : std::string_view(kConfig));
  put(dir + "/trainer_state.json", which == 0 ? rest : std::string_view(kState));
  fuzz::guarded(data, size, [&](std::string_view) {
    if (which == 2) {
      put(dir + "/manifest.json", rest);
    } else {  // write_checkpoint_manifest's content, without its fsyncs (speed)
      nlohmann::json m = {{"format", "snip-checkpoint"}, {"version", 1}, {"files", nlohmann::json::object()}};
      for (const char* f : {"model.safetensors", "optimizer.pt", "config.json", "trainer_state.json"}) {
        const std::string b = f == std::string("config.json")          ? std::string(which == 1 ? rest : kConfig)
                              : f == std::string("trainer_state.json") ? std::string(which == 0 ? rest : kState)
                              : f == std::string("optimizer.pt")       ? std::string("adamw")
                                                                       : std::string("weights");
        m["files"][f] = {{"bytes", b.size()}, {"crc32", crc32_of(b)}};
      }
      put(dir + "/manifest.json", m.dump());
    }
    const nlohmann::json st = verify_checkpoint(dir);
    checkpoint_loader_state(st, 2, 1, 100, "trainer_state.json");
    checkpoint_tokenizer_sha256(st);
    checkpoint_data_dir(st);
    checkpoint_model_config(dir);
  });
  return 0;
}
