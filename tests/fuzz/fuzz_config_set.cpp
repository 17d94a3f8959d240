// `snip train --set section.key=value ...`: each line of the input is one
// --set argument -> Config::set_override, then RunConfig::from.
#include "harness.h"
#include "snip/config/config.h"

using namespace snip;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::guarded(data, size, [](std::string_view in) {
    Config c;
    size_t start = 0;
    while (start <= in.size()) {
      size_t end = in.find('\n', start);
      if (end == std::string_view::npos) end = in.size();
      c.set_override(std::string(in.substr(start, end - start)));
      start = end + 1;
    }
    RunConfig::from(c);
  });
  return 0;
}
