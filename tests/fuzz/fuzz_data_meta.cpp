// A prepared data folder's meta.json -> data::TokenizerMeta::read (what
// `snip train` and `snip sample` read of it: vocab_size, eos_id). It never
// throws by contract, so any exception is a finding.
#include <unistd.h>

#include <cstdio>
#include <string>

#include "harness.h"
#include "snip/data/token_client.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/snip_fuzz_meta_XXXXXX";
    return std::string(mkdtemp(tmpl));
  }();
  FILE* f = std::fopen((dir + "/meta.json").c_str(), "wb");
  if (!f || std::fwrite(data, 1, size, f) != size || std::fclose(f) != 0) std::abort();
  try {
    snip::data::TokenizerMeta::read(dir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "snip: internal error: %s\n", e.what());
    std::abort();
  }
  return 0;
}
