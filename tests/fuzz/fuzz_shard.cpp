// A token shard (train.bin / val.bin) -> data::ShardReader (header, sizes;
// it maps a path, so the input goes to an in-memory file named
// /proc/self/fd/N), then its tokens: find_out_of_range and read.
#include <string>
#include <vector>

#include "harness.h"
#include "snip/data/shard.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = snip::fuzz::input_as_file(data, size);
  snip::fuzz::guarded(data, size, [&](std::string_view) {
    const snip::data::ShardReader r(path);
    r.find_out_of_range();
    std::vector<int32_t> out(std::min<uint64_t>(r.size(), 4096));
    r.read(0, out.size(), out.data());
  });
  return 0;
}
