// Process-level runtime settings (see platform.h).
#include "snip/hw/platform.h"

#include <unistd.h>

#include <strings.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace snip {

namespace {

// SNIP_NO_RUNTIME_TUNE set to anything but "" or "0".
bool no_tune_set() {
  const char* v = std::getenv("SNIP_NO_RUNTIME_TUNE");
  return v && *v && std::strcmp(v, "0") != 0;
}

// OpenBLAS kernel sets that execute AVX-512 instructions.
bool avx512_coretype(const char* v) {
  for (const char* name : {"skylakex", "cooperlake", "sapphirerapids"})
    if (strcasecmp(v, name) == 0) return true;
  return false;
}

}  // namespace

bool opted_out_of_runtime_tuning() { return no_tune_set() && !std::getenv("SNIP_RUNTIME_TUNED"); }

void tune_allocator() {
#if defined(__GLIBC__)
  if (opted_out_of_runtime_tuning()) return;
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") || std::getenv("MALLOC_TRIM_THRESHOLD_")) return;
  constexpr int kOneGiB = 1 << 30;
  mallopt(M_MMAP_THRESHOLD, kOneGiB);
  mallopt(M_TRIM_THRESHOLD, kOneGiB);
#endif
}

void tune_runtime_or_reexec(char** argv) {
  if (no_tune_set()) {
    tune_allocator();  // after our own re-exec (SNIP_RUNTIME_TUNED): still wanted
    return;
  }
  bool changed = false;
  // A kernel set this CPU cannot execute would end the process with SIGILL
  // at the first GEMM, without a word.
  if (const char* ct = std::getenv("OPENBLAS_CORETYPE"); ct && avx512_coretype(ct) && !__builtin_cpu_supports("avx512f")) {
    std::fprintf(stderr, "snip: warning: OPENBLAS_CORETYPE=%s needs AVX-512, which this CPU lacks: ignored\n", ct);
    unsetenv("OPENBLAS_CORETYPE");
    changed = true;
  }
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
