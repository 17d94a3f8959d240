// A prepared data folder's meta.json, checked with the folder as a whole
// (`snip train`, `snip eval --data`) -> data::verify_data_folder, beside a
// fixed tokenizer.model ("a tokenizer") and two valid shards (vocabulary
// 512, uint16, 16 and 8 tokens). Shard headers alone: fuzz_shard.
#include <unistd.h>

#include <cstdio>
#include <string>

#include "harness.h"
#include "snip/data/data_folder.h"
#include "snip/data/shard.h"

using namespace snip;

namespace {
const std::string& folder() {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/snip_fuzz_folder_XXXXXX";
    const std::string d = mkdtemp(tmpl);
    for (auto [name, n] : {std::pair<const char*, int>{"train.bin", 16}, {"val.bin", 8}}) {
      data::ShardWriter w(d + "/" + name, 512);
      for (int i = 0; i < n; ++i) w.append({i * 31 % 512});
      w.commit();
    }
    FILE* f = std::fopen((d + "/tokenizer.model").c_str(), "wb");
    if (!f || std::fputs("a tokenizer", f) < 0 || std::fclose(f) != 0) std::abort();
    return d;
  }();
  return dir;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& dir = folder();
  FILE* f = std::fopen((dir + "/meta.json").c_str(), "wb");
  if (!f || std::fwrite(data, 1, size, f) != size || std::fclose(f) != 0) std::abort();
  fuzz::guarded(data, size, [&](std::string_view) { data::verify_data_folder(dir, "data.dir"); });
  return 0;
}
