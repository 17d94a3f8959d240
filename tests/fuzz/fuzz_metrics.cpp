// RUN/metrics.jsonl -> report::read_metrics (report/report.cpp), what
// `snip report` draws its curves from (the input goes to an in-memory file
// named /proc/self/fd/N).
#include <string>

#include "harness.h"
#include "snip/report/report.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = snip::fuzz::input_as_file(data, size);
  snip::fuzz::guarded(data, size, [&](std::string_view) { snip::report::read_metrics(path); });
  return 0;
}
