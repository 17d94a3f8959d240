// Process-level runtime settings (see platform.h).
#include "snip/hw/platform.h"

#include <unistd.h>

#include <cstdlib>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace snip {

void tune_allocator() {
#if defined(__GLIBC__)
  if (std::getenv("SNIP_NO_RUNTIME_TUNE") && !std::getenv("SNIP_RUNTIME_TUNED")) return;
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") || std::getenv("MALLOC_TRIM_THRESHOLD_")) return;
  constexpr int kOneGiB = 1 << 30;
  mallopt(M_MMAP_THRESHOLD, kOneGiB);
  mallopt(M_TRIM_THRESHOLD, kOneGiB);
#endif
}

void tune_runtime_or_reexec(char** argv) {
  if (std::getenv("SNIP_NO_RUNTIME_TUNE")) {
    tune_allocator();  // after our own re-exec (SNIP_RUNTIME_TUNED): still wanted
    return;
  }
  bool changed = false;
  if (!std::getenv("OPENBLAS_CORETYPE") && __builtin_cpu_supports("avx512f")) {
    setenv("OPENBLAS_CORETYPE", "SkylakeX", 1);
    changed = true;
  }
  if (!std::getenv("OMP_WAIT_POLICY")) {
    setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    changed = true;
  }
  if (!std::getenv("OPENBLAS_THREAD_TIMEOUT")) {
    setenv("OPENBLAS_THREAD_TIMEOUT", "12", 1);
    changed = true;
  }
  if (changed) {
    setenv("SNIP_NO_RUNTIME_TUNE", "1", 1);  // never loop
    setenv("SNIP_RUNTIME_TUNED", "1", 1);    // ... but the allocator settings still apply
    execv("/proc/self/exe", argv);
  }
  tune_allocator();
}

}  // namespace snip
