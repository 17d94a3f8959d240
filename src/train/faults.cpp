// Test-only faults (snip/train/faults.h).
#include "snip/train/faults.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "snip/core/error.h"

namespace snip {

namespace {

// A step number >= 1 that is the whole of `s`, or -1.
int64_t whole_step(const std::string& s) {
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos || s.size() > 12) return -1;
  const int64_t n = std::atoll(s.c_str());
  return n >= 1 ? n : -1;
}

}  // namespace

FaultInjector FaultInjector::parse(const std::string& v) {
  FaultInjector f;
  if (v.empty()) return f;
  const auto bad = [&] {
    fail("SNIP_TEST_FAULT: expected grad-inf@N or lr-spike@N:F (N a step >= 1, F a finite factor > 0), got '", v,
         "'");
  };
  const size_t at = v.find('@');
  if (at == std::string::npos) bad();
  const std::string kind = v.substr(0, at), rest = v.substr(at + 1);
  if (kind == "grad-inf") {
    f.grad_inf_step = whole_step(rest);
    if (f.grad_inf_step < 0) bad();
  } else if (kind == "lr-spike") {
    const size_t colon = rest.find(':');
    if (colon == std::string::npos) bad();
    f.lr_spike_step = whole_step(rest.substr(0, colon));
    const std::string factor = rest.substr(colon + 1);
    char* end = nullptr;
    errno = 0;
    f.lr_factor = factor.empty() ? 0.0 : std::strtod(factor.c_str(), &end);
    if (f.lr_spike_step < 0 || factor.empty() || *end != '\0' || errno != 0 || !std::isfinite(f.lr_factor) ||
        !(f.lr_factor > 0))
      bad();
  } else {
    bad();
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
