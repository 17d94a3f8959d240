// A run folder's summary.json -> report::read_run_record (report/compare.cpp),
// what `snip report --compare` reads of each run: the input is written as
// summary.json of a scratch run folder (no checkpoint, no config.toml).
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "harness.h"
#include "snip/report/compare.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = [] {
    const std::string d = (std::filesystem::temp_directory_path() / ("snip-fuzz-run-" + std::to_string(getpid())))
                              .string();
    std::filesystem::create_directories(d);
    return d;
  }();
  std::FILE* f = std::fopen((dir + "/summary.json").c_str(), "wb");
  if (!f || (size && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) std::abort();
  snip::fuzz::guarded(data, size, [](std::string_view) { snip::report::read_run_record(dir); });
  return 0;
}
