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
//             delayed scaling through the DelayedScaling overload (the
//             tensor amax on the device, the history in the host object)
//   refused   the Hadamard transform, BF16 / integer / posit elements
// Shapes: in, out [rows, cols] FP32 row-major, cols = the GEMM's K; `in` may
// equal `out`. Where they run: DeviceLaunch (a stream and scratch memory
// from the caller, e.g. PyTorch's current stream and caching allocator), or
// by default the legacy default stream with cudaMalloc'd scratch and a
// device synchronisation at the end.
#pragma once

#include <cstdint>
#include <string>

#include "snip/formats/quant_spec.h"
#include "snip/formats/rounding.h"
#include "snip/formats/scaling.h"

namespace snip::formats::cuda {

/// CUDA devices this process sees: 0 when the driver is missing or too old
/// for the CUDA 13 runtime, or no device is present; `why` (if given) then
/// says which, in one line. (snip_formats_cuda; in a build without nvcc,
/// src/formats/fake_quant_nocuda.cpp: 0 devices, nothing supported, and
/// the fake_quantize functions throw std::runtime_error saying so.)
int device_count(std::string* why = nullptr);

/// Free and total memory of CUDA device `device` in bytes (cudaMemGetInfo;
/// the caller's current device is kept). False, with `why`, when there is
/// no such device or the runtime fails.
bool memory_info(int device, size_t* free_bytes, size_t* total_bytes, std::string* why = nullptr);

/// Whether fake_quantize below covers `spec` (validated first; delayed
/// scaling through its DelayedScaling overload); when not, `why` (if given)
/// names what is missing.
bool supported(const QuantSpec& spec, std::string* why = nullptr);

/// Where a device call runs. stream: a cudaStream_t (nullptr = the legacy
/// default stream); the call is ordered on it. scratch: device memory of at
/// least fake_quantize_scratch_bytes(rows, cols, spec) bytes, valid until
/// the stream has run the call (nullptr = cudaMalloc'd and freed by the call,
/// which then synchronises the device). With neither, the call returns when
/// the device is done; with both it returns once the work is queued, except
/// that two-level (NVFP4) and delayed scaling wait for the stream to read
/// the tensor amax back to the host.
struct DeviceLaunch {
  void* stream = nullptr;
  void* scratch = nullptr;
};

/// Bytes of scratch a call on [rows, cols] under `spec` needs (block amaxes
/// per row, per block, and the block scales; a few percent of the operand
/// for 1x16 blocks, 16 bytes for a per-tensor scale).
size_t fake_quantize_scratch_bytes(int64_t rows, int64_t cols, const QuantSpec& spec);

/// fake_quantize (fake_quant.h) of device arrays on the current device, as
/// `launch` says (above): the same results bit for bit (stochastic rounding
/// draws the CPU's Philox words for `key`), NaN outputs canonical. Throws
/// std::invalid_argument for a spec that is not supported (the line of
/// `supported`) or is delayed (use the DelayedScaling overload), an
/// out-of-range key or negative sizes, std::runtime_error naming the CUDA
/// call that failed (no device included).
void fake_quantize_device(const float* in, float* out, int64_t rows, int64_t cols, const QuantSpec& spec,
                          const RoundingKey& key = {}, const DeviceLaunch& launch = {});

/// Delayed scaling (TransformerEngine's DelayedScaling; scaling.h), as the
/// CPU's fake_quantize overload: this call's tensor amax (max |x|, NaN when
/// any x is NaN) is reduced on the device and read back, the call uses
/// `state`'s scale (or, before the first record, current scaling of that
/// amax), then the amax is recorded in `state`. The same bits and the same
/// state as the CPU. Throws as above (a spec the kernels do not cover,
/// e.g. with a Hadamard transform).
void fake_quantize_device(const float* in, float* out, int64_t rows, int64_t cols, const RoundingKey& key,
                          DelayedScaling& state, const DeviceLaunch& launch = {});

/// The same on host arrays: copied to the device, quantized there, copied
/// back (the tests). Nothing to do for 0 elements (no device touched).
void fake_quantize_host(const float* in, float* out, int64_t rows, int64_t cols, const QuantSpec& spec,
                        const RoundingKey& key = {});
/// The DelayedScaling overload on host arrays (the tests).
void fake_quantize_host(const float* in, float* out, int64_t rows, int64_t cols, const RoundingKey& key,
                        DelayedScaling& state);

}  // namespace snip::formats::cuda
