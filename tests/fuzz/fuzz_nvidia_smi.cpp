// `nvidia-smi --query-gpu=... --format=csv,noheader,nounits` output ->
// hw::parse_nvidia_smi_csv (hw/capabilities.cpp): `snip doctor`'s GPU list.
// Its documented rejection is std::runtime_error naming the line (the doctor
// reports it); anything else escaping is a finding.
#include <stdexcept>

#include "harness.h"
#include "snip/hw/capabilities.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  snip::fuzz::guarded(data, size, [](std::string_view in) {
    try {
      snip::hw::parse_nvidia_smi_csv(std::string(in));
    } catch (const std::runtime_error&) {
    }
  });
  return 0;
}
