// RUN/metrics.jsonl -> report::read_metrics (report/report.cpp), what
// `snip report` draws its curves from (the input goes to an in-memory file
// named /proc/self/fd/N).
#include <sys/mman.h>
#include <unistd.h>

#include <string>

#include "harness.h"
#include "snip/report/report.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const int fd = memfd_create("metrics", 0);
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (fd < 0 || ftruncate(fd, 0) != 0 || (size && pwrite(fd, data, size, 0) != ssize_t(size))) std::abort();
  snip::fuzz::guarded(data, size, [](std::string_view) { snip::report::read_metrics(path); });
  return 0;
}
