// /proc/cpuinfo text -> hw::parse_cpu (hw/capabilities.cpp), with a sysfs
// CPU folder that does not exist (its caches then unknown): `snip doctor`'s
// CPU detection on any machine's cpuinfo.
#include "harness.h"
#include "snip/hw/capabilities.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  snip::fuzz::guarded(data, size, [](std::string_view in) {
    snip::hw::parse_cpu(std::string(in), "/nonexistent/sys/devices/system/cpu");
  });
  return 0;
}
