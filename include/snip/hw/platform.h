// snip/hw/platform.h: process-level runtime settings, applied once at
// program start.
#pragma once

namespace snip {

/// Applies two runtime settings that must be in the environment before the
/// shared libraries initialise (they read it before main()), re-executing the
/// program (/proc/self/exe, same argv) once when it changed anything:
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
///
/// A user's own setting of either variable wins; SNIP_NO_RUNTIME_TUNE=1
/// turns both off. Returns normally (doing nothing) if the re-exec fails.
void tune_runtime_or_reexec(char** argv);

}  // namespace snip
