// Process-level tuning (see platform.h).
#include "snip/core/platform.h"

#include <unistd.h>

#include <cstdlib>

namespace snip {

void tune_openblas_or_reexec(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") || std::getenv("SNIP_NO_BLAS_TUNE")) return;
  if (!__builtin_cpu_supports("avx512f")) return;
  setenv("OPENBLAS_CORETYPE", "SkylakeX", 1);
  setenv("SNIP_NO_BLAS_TUNE", "1", 1);  // never loop
  execv("/proc/self/exe", argv);
}

}  // namespace snip
