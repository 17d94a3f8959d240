// Test-only faults (snip/train/faults.h).
#include "snip/train/faults.h"

#include <cstdlib>

#include "snip/util/error.h"

namespace snip {

FaultInjector FaultInjector::parse(const std::string& v) {
  FaultInjector f;
  if (v.empty()) return f;
  const size_t at = v.find('@'), colon = v.find(':');
  const std::string kind = v.substr(0, at);
  if (at == std::string::npos || (kind != "grad-inf" && kind != "lr-spike"))
    fail("SNIP_TEST_FAULT: expected grad-inf@N or lr-spike@N:F, got '", v, "'");
  const int64_t step = std::atoll(v.c_str() + at + 1);
  if (kind == "grad-inf") {
    f.grad_inf_step = step;
  } else {
    if (colon == std::string::npos) fail("SNIP_TEST_FAULT: expected lr-spike@N:F, got '", v, "'");
    f.lr_spike_step = step;
    f.lr_factor = std::atof(v.c_str() + colon + 1);
  }
  return f;
}

FaultInjector FaultInjector::from_env() {
  const char* spec = std::getenv("SNIP_TEST_FAULT");
  FaultInjector f = parse(spec ? spec : "");
  if (const char* r = std::getenv("SNIP_TEST_PERTURB_RANK")) f.perturb_rank = std::atoi(r);
  if (const char* s = std::getenv("SNIP_TEST_PERTURB_STEP")) f.perturb_step = std::atoll(s);
  return f;
}

}  // namespace snip
