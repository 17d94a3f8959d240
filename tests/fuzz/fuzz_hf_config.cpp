// A Hugging Face config.json (`snip train --init-from`, `snip eval
// --checkpoint HF_DIR`, a checkpoint's config.json) -> io::parse_json ->
// LlamaConfig::from_hf_json; a config that parses must survive
// to_hf_json -> from_hf_json unchanged.
#include "harness.h"
#include "snip/config/llama_config.h"
#include "snip/io/json.h"

using namespace snip;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::guarded(data, size, [](std::string_view in) {
    const LlamaConfig c = LlamaConfig::from_hf_json(io::parse_json(in, "config.json"), "config.json");
    const LlamaConfig back = LlamaConfig::from_hf_json(c.to_hf_json(), "round trip");
    if (back.to_hf_json() != c.to_hf_json()) fuzz::finding("config.json round trip changed the model");
  });
  return 0;
}
