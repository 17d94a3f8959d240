// snip/core/platform.h: process-level tuning done once at program start.
#pragma once

namespace snip {

/// OpenBLAS 0.3.21 (Debian 12) does not recognise recent Xeons (Sapphire
/// Rapids) and falls back to a generic kernel: FP32 GEMMs measured at
/// 12-17 GFLOP/s instead of ~90 with its SkylakeX (AVX-512) kernel on the same
/// machine (docs/benchmarks.md). OpenBLAS reads its core type when it loads,
/// before main(), so when OPENBLAS_CORETYPE is unset on an AVX-512 CPU this
/// sets it to SkylakeX and re-executes the program (/proc/self/exe, same argv)
/// once. No-op when OPENBLAS_CORETYPE or SNIP_NO_BLAS_TUNE is set, or on CPUs
/// without AVX-512F. Returns normally (doing nothing) if the re-exec fails.
void tune_openblas_or_reexec(char** argv);

}  // namespace snip
