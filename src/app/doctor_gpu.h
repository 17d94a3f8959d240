// src/app/doctor_gpu.h: the GPU part of `snip doctor` (src/app/doctor.cpp,
// docs/gpu.md "snip doctor on a GPU"): the CUDA devices LibTorch sees, and on
// device 0 a measured GEMM throughput in BF16 and on each recipe's path.
//
// Shapes: a GEMM [M, K] x [K, N] (X [M, K] times Wᵀ, W [N, K] row-major),
// 2*M*K*N floating-point operations. Two are measured (kGpuShapes):
//   tiny  M = 2048, K = 256,  N = 688   configs/tiny.toml's MLP gate/up
//                                       projection (B*T = 16*128 tokens,
//                                       C = 256, F = 688; the CPU matrix's shape)
//   1b    M = 8192, K = 2048, N = 5632  TinyLlama-1.1B's MLP gate/up
//                                       projection (4*2048 tokens, C = 2048,
//                                       F = 5632)
// Units: TFLOP/s = 2*M*K*N / seconds / 1e12, seconds per GEMM = the median of
// 5 timed batches of back-to-back calls (the device synchronised around each
// batch, launch overhead included), after warm-up calls.
//
// A recipe's path on the measured device (`path`):
//   native    its GEMMs run in the operands' own format on tensor cores: the
//             bf16 recipe (BF16 tensor cores, compute capability >= 8.0), and
//             recipes whose every operand is FP8 E4M3/E5M2 with one FP32 scale
//             per tensor (fp8_tensor), on compute capability >= 8.9 through
//             at::_scaled_mm (timed: E4M3 x E4M3 per-tensor scaled, FP32
//             accumulation, BF16 out)
//   emulated  fake-quantized operands (values of the format) in a BF16 GEMM
//             with FP32 accumulation (compute capability >= 8.0); its GEMM
//             rate is the BF16 rate of the same run (the quantization is not
//             timed), and `operands_exact_in_bf16` says, measured on the tiny
//             fprop operands quantized on the CPU, whether the quantized
//             values survive the cast to BF16 (hw::Support "emulated exactly")
//   none      compute capability < 8.0: no BF16 tensor cores to emulate on
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include <nlohmann/json.hpp>

namespace snip::recipes {
class RecipeSet;
}

namespace snip::app {

/// One measured GEMM shape: [M, K] x [K, N].
struct GpuGemmShape {
  const char* name;  ///< "tiny" or "1b": the key of the rates in the JSON
  int64_t m, k, n;   ///< M tokens, K the reduction dimension, N outputs
  const char* what;  ///< where the shape comes from, one line
};

/// The shapes measured, in order (tiny, 1b; see the file comment).
extern const GpuGemmShape kGpuShapes[2];

/// The GPU record of `snip doctor` (out["gpu"]). Without a usable CUDA
/// device: {"present": false, "reason": "no CUDA device: ..."} (the reason
/// from torch and the CUDA runtime's cudaGetDeviceCount, or "this LibTorch is
/// built without CUDA"). With one:
///   {"present": true,
///    "driver_version": "570.86.15" (nvidia-smi's, `nvidia_smi_driver`; ""
///                      when nvidia-smi gave none),
///    "driver_cuda_version": "12.8" (cudaDriverGetVersion; "unknown"),
///    "runtime_cuda_version": "13.0" (cudaRuntimeGetVersion of the runtime
///                      LibTorch loaded; "unknown"),
///    "devices": [{"index", "name", "compute_capability": "9.0", "cc_major",
///                 "cc_minor", "memory_bytes", "memory_gib", "sm_count"}],
///    "measured_device": 0,
///    "units": string, "shapes": [{"name", "M", "K", "N", "what"}],
///    "bf16": {"gemm": string, "tiny": {"tflops", "ms"}, "1b": {...}},
///    "fp8": {"gemm": string, "tiny": {"tflops", "ms"}, "1b": {...}}
///           (at::_scaled_mm; only when a recipe takes that path),
///    "recipes": [{"recipe", "path": "native" | "emulated" | "none", "how",
///                 "tflops": {"tiny", "1b"}, "vs_bf16": {"tiny", "1b"},
///                 "timed": string, "operands_exact_in_bf16": bool (emulated),
///                 "reason": string (none), "error": string (a failed step),
///                 "native_error": string (a per-tensor FP8 recipe emulated
///                 because at::_scaled_mm failed)}],
///    "seconds": the measurement's wall time}
/// A measurement that throws leaves "error" (the exception's line) in place
/// of its rate instead of failing the doctor. `recipes`: the recipes listed
/// (the built-in set, or a --config run's). `cuda_built`: whether LibTorch
/// is built with CUDA. `min_time_s`: seconds each rate is measured for (four
/// rates: BF16 and FP8 at two shapes, plus warm-up and cuBLAS start-up,
/// about 2 s at the default 0.5 s on an H100). `progress`: a line on stderr
/// per measurement.
nlohmann::json measure_gpu(const recipes::RecipeSet& recipes, bool cuda_built, const std::string& nvidia_smi_driver,
                           double min_time_s, bool progress);

/// The human lines of measure_gpu's record, under a "GPU" heading (one line
/// with the reason when no device is present).
void print_gpu(const nlohmann::json& gpu, std::ostream& os);

}  // namespace snip::app
