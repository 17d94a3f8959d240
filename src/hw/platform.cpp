// Process-level runtime settings (see platform.h).
#include "snip/hw/platform.h"

#include <unistd.h>

#include <strings.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <initializer_list>
#include <string>
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

namespace snip::hw {

namespace {
// The first number in `path` after `key` (a /proc/meminfo line "Key: N kB"
// with key "Key:"), or of the whole file when key is empty; -1 if absent.
long long number_in(const char* path, const char* key) {
  std::FILE* f = std::fopen(path, "r");
  if (!f) return -1;
  char line[256];
  long long v = -1;
  while (std::fgets(line, sizeof line, f)) {
    const size_t k = std::strlen(key);
    if (k && std::strncmp(line, key, k) != 0) continue;
    char* end = nullptr;
    const long long x = std::strtoll(line + k, &end, 10);
    if (end != line + k) v = x;
    break;
  }
  std::fclose(f);
  return v;
}

// The process's cgroup v2 folder (/proc/self/cgroup line "0::/path"), "" if none.
std::string cgroup_dir() {
  std::FILE* f = std::fopen("/proc/self/cgroup", "r");
  if (!f) return "";
  char line[4096];
  std::string dir;
  while (std::fgets(line, sizeof line, f)) {
    if (std::strncmp(line, "0::", 3) != 0) continue;
    dir = line + 3;
    while (!dir.empty() && (dir.back() == '\n' || dir.back() == '\r')) dir.pop_back();
    break;
  }
  std::fclose(f);
  return dir.empty() ? "" : "/sys/fs/cgroup" + (dir == "/" ? std::string() : dir);
}
}  // namespace

long long available_memory_bytes() {
  long long avail = number_in("/proc/meminfo", "MemAvailable:");
  if (avail > 0) avail *= 1024;  // kB
  auto lower_to = [&](long long max, long long cur) {
    if (max > 0 && cur >= 0) {
      const long long left = max > cur ? max - cur : 0;
      avail = avail > 0 ? std::min(avail, left) : left;
    }
  };
  const std::string cg = cgroup_dir();
  // cgroup v2: memory.max is "max" (no limit: strtoll reads nothing) or bytes.
  if (!cg.empty())
    lower_to(number_in((cg + "/memory.max").c_str(), ""), number_in((cg + "/memory.current").c_str(), ""));
  // cgroup v1 (a container sees its own group at the mount's root); "no
  // limit" reads as a huge number there.
  lower_to(number_in("/sys/fs/cgroup/memory/memory.limit_in_bytes", ""),
           number_in("/sys/fs/cgroup/memory/memory.usage_in_bytes", ""));
  return avail > 0 ? avail : 0;
}

}  // namespace snip::hw
