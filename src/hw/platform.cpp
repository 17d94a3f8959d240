// Process-level runtime settings (see platform.h).
#include "snip/hw/platform.h"

#include <unistd.h>

#include <cstdlib>

namespace snip {

void tune_runtime_or_reexec(char** argv) {
  if (std::getenv("SNIP_NO_RUNTIME_TUNE")) return;
  bool changed = false;
  if (!std::getenv("OPENBLAS_CORETYPE") && __builtin_cpu_supports("avx512f")) {
    setenv("OPENBLAS_CORETYPE", "SkylakeX", 1);
    changed = true;
  }
  if (!std::getenv("OMP_WAIT_POLICY")) {
    setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    changed = true;
  }
  if (!changed) return;
  setenv("SNIP_NO_RUNTIME_TUNE", "1", 1);  // never loop
  execv("/proc/self/exe", argv);
}

}  // namespace snip
