// snip/hw/platform.h: process-level runtime settings, applied once at
// program start.
#pragma once

namespace snip {

/// Applies the runtime settings that must be in the environment before the
/// shared libraries initialise (they read it before main()), re-executing the
/// program (/proc/self/exe, same argv) once when it changed anything, then
/// the allocator settings (tune_allocator):
///
/// - OPENBLAS_CORETYPE=SkylakeX on AVX-512 CPUs when unset. OpenBLAS 0.3.21
///   (Debian 12) does not recognise recent Xeons (Sapphire Rapids) and falls
///   back to a generic kernel: FP32 GEMM 12-17 GFLOP/s instead of ~90 on the
///   same machine (docs/benchmarks.md).
/// - OMP_WAIT_POLICY=PASSIVE when unset. With libgomp's default spinning,
///   OpenMP barriers collapse when the cores are shared (another job, a
///   compiler, ctest -j): a micro training run measured 2.6 s with PASSIVE
///   against > 120 s with ACTIVE on the same loaded 2-core machine, and the
///   same speed on an idle one (docs/benchmarks.md).
/// - OPENBLAS_THREAD_TIMEOUT=12 when unset: OpenBLAS's (pthreads) workers
///   sleep after 2^12 cycles without work instead of 2^28 (~0.1 s) of
///   sched_yield() loops, which otherwise take the cores from LibTorch's
///   OpenMP threads between GEMMs (20% of a training step's samples were in
///   sched_yield on a 2-core AMD EPYC; docs/benchmarks.md).
///
/// A user's own setting of any of these variables wins, except an AVX-512
/// OPENBLAS_CORETYPE (SkylakeX, Cooperlake, SapphireRapids) on a CPU without
/// AVX-512: OpenBLAS would die with SIGILL at the first GEMM, so it is
/// removed with a warning on stderr. SNIP_NO_RUNTIME_TUNE (any value but ""
/// or "0") turns all of this off, the allocator settings too. Returns
/// normally (doing nothing more) if the re-exec fails.
void tune_runtime_or_reexec(char** argv);

/// True when the user opted out with SNIP_NO_RUNTIME_TUNE (not snip's own
/// re-exec, which sets it too, with SNIP_RUNTIME_TUNED).
bool opted_out_of_runtime_tuning();

/// glibc malloc: M_MMAP_THRESHOLD and M_TRIM_THRESHOLD raised to 1 GiB, so
/// that tensors of 32 MiB .. 1 GiB (the logits [B*T, V] and their gradient)
/// are reused from the heap instead of being mmap()ed, page-faulted in and
/// munmap()ed at every step: 5.5M minor page faults and 31 s of system time
/// in 40 steps of the tiny config became 0.3M and 7 s (2-core AMD EPYC,
/// docs/benchmarks.md). Freed memory stays in the process (as in a caching
/// allocator): the peak resident size grew 21% there. Applied in-process
/// (mallopt(3)); no effect without glibc, or when SNIP_NO_RUNTIME_TUNE or
/// glibc's own MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ are set.
void tune_allocator();

}  // namespace snip

namespace snip::hw {

/// Memory this process may still allocate, in bytes: MemAvailable of
/// /proc/meminfo (proc(5): the kernel's estimate of memory available without
/// swapping), lowered to memory.max - memory.current of the process's cgroup
/// v2 when that is set (cgroups(7); a container's limit), or to
/// memory.limit_in_bytes - memory.usage_in_bytes of a cgroup v1 memory
/// controller mounted at /sys/fs/cgroup/memory. 0 when none of these can
/// be read (then callers skip their check). Never throws.
long long available_memory_bytes();

}  // namespace snip::hw
