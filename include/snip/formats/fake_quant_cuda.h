// snip/formats/fake_quant_cuda.h: fake quantization on an NVIDIA GPU, with
// the CPU's codec (src/formats/fast_math.h: the same host-device functions
// for block scales and element rounding), so a GPU result equals
// fake_quantize's (fake_quant.h) bit for bit.
//
// Built when CMake finds nvcc (SNIP_WITH_CUDA; the CUDA 13 toolkit in
// /usr/local/cuda), for sm_80, sm_89, sm_90 and sm_100 (+ PTX of sm_100),
// with --fmad=false (no FMA contraction, as the CPU library's
// -ffp-contract=off). What it covers today, and what it refuses (`supported`):
//   covered   minifloat elements E2M1 .. E5M2 (E4M3, E5M2, E2M1, E3M2, E2M3,
//             E1M2), any block shape (1xN tiles, 2-D
//             blocks, per-row, per-tensor), rules none, current (FP32, FP32
//             power-of-two and E8M0 scales), mx_floor and two_level (NVFP4:
//             the tensor scale from the block amaxes, on the host); RNE and
//             stochastic rounding (the CPU's Philox4x32-10 words, rounding.h,
//             on the device)
//   refused   delayed scaling (its history lives in a host object), the
//             Hadamard transform, BF16 / integer / posit elements
// Shapes: in, out [rows, cols] FP32 row-major, cols = the GEMM's K; `in` may
// equal `out`. The kernels run on the legacy default stream and synchronise
// the device at the end (no stream argument yet: that comes with the
// trainer's CUDA quantizers, docs/gpu.md).
#pragma once

#include <cstdint>
#include <string>

#include "snip/formats/quant_spec.h"
#include "snip/formats/rounding.h"

namespace snip::formats::cuda {

/// CUDA devices this process sees: 0 when the driver is missing or too old
/// for the CUDA 13 runtime, or no device is present; `why` (if given) then
/// says which, in one line. (snip_formats_cuda; in a build without nvcc,
/// src/formats/fake_quant_nocuda.cpp: 0 devices, nothing supported, and
/// the fake_quantize functions throw std::runtime_error saying so.)
int device_count(std::string* why = nullptr);

/// Whether fake_quantize below covers `spec` (validated first); when not,
/// `why` (if given) names what is missing.
bool supported(const QuantSpec& spec, std::string* why = nullptr);

/// fake_quantize (fake_quant.h) of device arrays on the current device,
/// synchronous: the same results bit for bit (stochastic rounding draws the
/// CPU's Philox words for `key`), NaN outputs canonical. Throws
/// std::invalid_argument for a spec that is not supported (the line of
/// `supported`), an out-of-range key or negative sizes, std::runtime_error
/// naming the CUDA call that failed (no device included).
void fake_quantize_device(const float* in, float* out, int64_t rows, int64_t cols, const QuantSpec& spec,
                          const RoundingKey& key = {});

/// The same on host arrays: copied to the device, quantized there, copied
/// back (the tests). Nothing to do for 0 elements (no device touched).
void fake_quantize_host(const float* in, float* out, int64_t rows, int64_t cols, const QuantSpec& spec,
                        const RoundingKey& key = {});

}  // namespace snip::formats::cuda
