// fake_quantize on an NVIDIA GPU (snip/formats/fake_quant_cuda.h), with the
// CPU's codec: block scales through fast::scale_lane (the lanes the CPU's
// scales_from_amax runs) and elements through fast::minifloat_element (the
// CPU's span_minifloat body), compiled for the device from fast_math.h.
//
// Three steps, as the CPU's 2-D/two-level path: (1) the max of |x|'s bits
// per scaling block (NaN bits above Inf's: NaN-propagating), in two passes:
// one thread per (row, block column) over its columns, then one thread per
// block over its rows; (2) two_level: the tensor scale from those amaxes, on
// the host (scale.cpp, the CPU's function); delayed: the state's scale, on
// the host (scaling.h); one thread per block computes its (encode, decode)
// scale; (3) one thread per element quantizes. Order of the max does not
// matter (max is exact), so the results are the CPU's bit for bit; NaN
// outputs are made the CPU's canonical 0x7FC00000 (the device writes
// 0x7FFFFFFF for an arithmetic NaN). Not tuned for speed yet.
#include "snip/formats/fake_quant_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "fast_math.h"
#include "snip/formats/fake_quant.h"
#include "snip/formats/rounding.h"
#include "snip/formats/scaling.h"

// Bit-for-bit with the CPU needs IEEE division and subnormals on the device.
#if defined(__USE_FAST_MATH__)
#error "fake_quant_cuda.cu must not be built with --use_fast_math (the CPU's results need IEEE arithmetic)"
#endif

namespace snip::formats {
namespace detail {
// fake_quant_ref.cpp: the scale a delayed-scaling call uses (the state's,
// or current scaling of this call's amax before the first record).
BlockScale delayed_call_scale(const DelayedScaling& state, float amax_tensor);
}  // namespace detail
}  // namespace snip::formats

namespace snip::formats::cuda {

namespace {

void check(cudaError_t e, const char* call) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA: ") + call + ": " + cudaGetErrorString(e));
}

// A device buffer of n T's, freed on scope exit.
template <typename T>
struct DeviceBuffer {
  T* p = nullptr;
  explicit DeviceBuffer(size_t n) {  // n = 0: none (the caller's scratch is used)
    if (n > 0) check(cudaMalloc(&p, n * sizeof(T)), "cudaMalloc");
  }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

struct Grid {
  int64_t rows, cols, br, bc, gr, gc;
};

// Pass 1: row_amax[r * gc + j] = max |x| bits over row r's block column j.
__global__ void row_amax_kernel(const float* x, Grid g, uint32_t* row_amax) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= g.rows * g.gc) return;
  const int64_t r = t / g.gc, c0 = (t % g.gc) * g.bc;
  const int64_t c1 = c0 + g.bc < g.cols ? c0 + g.bc : g.cols;
  const float* row = x + r * g.cols;
  uint32_t m = 0;
  for (int64_t c = c0; c < c1; ++c) {
    const uint32_t a = fast::bits_of(row[c]) & fast::kAbsMask;
    m = a > m ? a : m;
  }
  row_amax[t] = m;
}

// Pass 2: amax[b] = max over block b's rows of pass 1.
__global__ void block_amax_kernel(const uint32_t* row_amax, Grid g, uint32_t* amax) {
  const int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= g.gr * g.gc) return;
  const int64_t r0 = (b / g.gc) * g.br, j = b % g.gc;
  const int64_t r1 = r0 + g.br < g.rows ? r0 + g.br : g.rows;
  uint32_t m = 0;
  for (int64_t r = r0; r < r1; ++r) {
    const uint32_t a = row_amax[r * g.gc + j];
    m = a > m ? a : m;
  }
  amax[b] = m;
}

// Delayed scaling: every block takes the state's (encode, decode).
__global__ void fixed_scale_kernel(int64_t n, float e, float d, float* enc, float* dec) {
  const int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= n) return;
  enc[b] = e;
  dec[b] = d;
}

__global__ void block_scale_kernel(const uint32_t* amax, int64_t n, fast::ScaleCtx ctx, float* enc, float* dec) {
  const int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= n) return;
  float e, d;
  uint32_t code;
  fast::scale_lane(amax[b], ctx, e, d, code);
  enc[b] = e;
  dec[b] = d;
}

// Element i = row * cols + col; stochastic rounding draws the CPU's word,
// random_bits(key, i) (rounding.h: Philox4x32-10 on the host and device).
template <bool kSR>
__global__ void quantize_kernel(const float* x, float* y, Grid g, const float* enc, const float* dec,
                                fast::MiniFloatParams p, uint32_t ovf_bits, bool inf_keeps, RoundingKey key) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= g.rows * g.cols) return;
  const int64_t b = (i / g.cols / g.br) * g.gc + (i % g.cols) / g.bc;
  const float u = kSR ? uniform_from_bits(random_bits(key, uint64_t(i))) : 0.0f;
  const float v = fast::minifloat_element<kSR>(x[i], enc[b], dec[b], u, p, ovf_bits, inf_keeps);
  // The device's arithmetic NaN is 0x7FFFFFFF; the CPU's outputs are 0x7FC00000.
  y[i] = v != v ? fast::float_of(fast::kCanonicalNaN) : v;
}

unsigned blocks_for(int64_t n, unsigned threads) { return unsigned((n + threads - 1) / threads); }

}  // namespace

int device_count(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = std::string("no CUDA device: ") + cudaGetErrorString(e);
    cudaGetLastError();  // leave no error behind for the next call to report
    return 0;
  }
  if (n == 0 && why) *why = "no CUDA device: the driver sees none";
  return n;
}

bool memory_info(int device, size_t* free_bytes, size_t* total_bytes, std::string* why) {
  int prev = 0;
  cudaError_t e = cudaGetDevice(&prev);
  if (e == cudaSuccess) e = cudaSetDevice(device);
  if (e == cudaSuccess) {
    e = cudaMemGetInfo(free_bytes, total_bytes);
    cudaSetDevice(prev);
  }
  if (e != cudaSuccess) {
    if (why) *why = std::string("cudaMemGetInfo on device ") + std::to_string(device) + ": " + cudaGetErrorString(e);
    cudaGetLastError();
    return false;
  }
  return true;
}

bool supported(const QuantSpec& spec, std::string* why) {
  validate_quant_spec(spec, "fake_quantize (CUDA)");
  auto no = [&](const std::string& w) {
    if (why) *why = "fake_quantize (CUDA): " + w + " is not covered yet (" + spec.describe() + ")";
    return false;
  };
  if (!fast::minifloat_fast_ok(spec.element)) return no(std::string("element format ") + spec.element.name);
  if (spec.hadamard_size != 0) return no("the Hadamard transform");
  return true;
}

namespace {

Grid grid_of(int64_t rows, int64_t cols, const QuantSpec& spec) {
  Grid g{rows, cols, std::max<int64_t>(1, spec.block.rows_over(rows)), std::max<int64_t>(1, spec.block.cols_over(cols)),
         0, 0};
  g.gr = (rows + g.br - 1) / g.br;
  g.gc = (cols + g.bc - 1) / g.bc;
  return g;
}

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

// The scratch layout: row amaxes [rows * gc] u32, block amaxes [nb] u32,
// encode and decode scales [nb] f32 each.
struct Scratch {
  uint32_t *row_amax, *amax;
  float *enc, *dec;
  static size_t bytes(const Grid& g) {
    const size_t nb = size_t(g.gr * g.gc);
    return align256(size_t(g.rows * g.gc) * 4) + 3 * align256(nb * 4);
  }
  Scratch(void* base, const Grid& g) {
    char* p = static_cast<char*>(base);
    const size_t nb = size_t(g.gr * g.gc);
    row_amax = reinterpret_cast<uint32_t*>(p);
    p += align256(size_t(g.rows * g.gc) * 4);
    amax = reinterpret_cast<uint32_t*>(p);
    p += align256(nb * 4);
    enc = reinterpret_cast<float*>(p);
    p += align256(nb * 4);
    dec = reinterpret_cast<float*>(p);
  }
};

// The checks every entry point makes, in the CPU's words.
void check_args(int64_t rows, int64_t cols, const QuantSpec& spec, const RoundingKey& key) {
  std::string why;
  if (!supported(spec, &why)) throw std::invalid_argument(why);
  check_rounding_key(key);
  if (rows < 0 || cols < 0) throw std::invalid_argument("fake_quantize (CUDA): negative size");
}

// check_args for the QuantSpec overloads, which have no state for a delayed spec.
void check_stateless(int64_t rows, int64_t cols, const QuantSpec& spec, const RoundingKey& key) {
  check_args(rows, cols, spec, key);
  if (spec.rule == ScaleRule::kDelayed)
    throw std::invalid_argument("fake_quantize (CUDA): delayed scaling needs its state (the DelayedScaling overload)");
}

// One call: block amaxes (pass 1, 2), then `scales` (host side: fills enc/dec
// of every block, or returns false to have them computed from the amaxes
// with `tensor`), then the elements. `tensor_amax` (if non-null) gets the
// tensor's amax read back. The scratch and stream come from `launch`.
template <typename HostScales>
void run(const float* in, float* out, const Grid& g, const QuantSpec& spec, const RoundingKey& key,
         const DeviceLaunch& launch, bool need_tensor_amax, HostScales&& host_scales) {
  const cudaStream_t st = static_cast<cudaStream_t>(launch.stream);
  const int64_t nb = g.gr * g.gc;
  constexpr unsigned kThreads = 256;
  DeviceBuffer<char> own(launch.scratch ? 0 : Scratch::bytes(g));
  const Scratch sc(launch.scratch ? launch.scratch : own.p, g);
  row_amax_kernel<<<blocks_for(g.rows * g.gc, kThreads), kThreads, 0, st>>>(in, g, sc.row_amax);
  check(cudaGetLastError(), "row_amax_kernel");
  block_amax_kernel<<<blocks_for(nb, kThreads), kThreads, 0, st>>>(sc.row_amax, g, sc.amax);
  check(cudaGetLastError(), "block_amax_kernel");
  float amax = 0.0f;
  if (need_tensor_amax) {  // the block amaxes back to the host (the stream waits), their max there
    std::vector<uint32_t> a(static_cast<size_t>(nb));
    check(cudaMemcpyAsync(a.data(), sc.amax, a.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost, st),
          "cudaMemcpyAsync");
    check(cudaStreamSynchronize(st), "cudaStreamSynchronize");
    uint32_t mx = 0;
    for (uint32_t v : a) mx = std::max(mx, v);
    amax = mx > fast::kInfBits ? fast::float_of(fast::kCanonicalNaN) : fast::float_of(mx);
  }
  BlockScale fixed;
  TensorScale tensor;
  if (host_scales(amax, fixed, tensor)) {
    fixed_scale_kernel<<<blocks_for(nb, kThreads), kThreads, 0, st>>>(nb, fixed.encode, fixed.decode, sc.enc, sc.dec);
    check(cudaGetLastError(), "fixed_scale_kernel");
  } else {
    const fast::ScaleCtx ctx(spec, tensor);
    block_scale_kernel<<<blocks_for(nb, kThreads), kThreads, 0, st>>>(sc.amax, nb, ctx, sc.enc, sc.dec);
    check(cudaGetLastError(), "block_scale_kernel");
  }
  const fast::MiniFloatParams p(spec.element);
  const uint32_t ovf = fast::minifloat_overflow_bits(p, spec.saturate);
  const int64_t n = g.rows * g.cols;
  if (spec.rounding == Rounding::kStochastic)
    quantize_kernel<true><<<blocks_for(n, kThreads), kThreads, 0, st>>>(in, out, g, sc.enc, sc.dec, p, ovf,
                                                                          p.has_inf, key);
  else
    quantize_kernel<false><<<blocks_for(n, kThreads), kThreads, 0, st>>>(in, out, g, sc.enc, sc.dec, p, ovf,
                                                                           p.has_inf, key);
  check(cudaGetLastError(), "quantize_kernel");
  // Without the caller's scratch and stream: done when this returns (the
  // scratch is freed by DeviceBuffer's cudaFree, which waits for the device).
  if (!launch.scratch || !launch.stream) check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

}  // namespace

namespace {
// in (host, n floats) -> the device, `run` on it in place, back to out (host).
template <typename Run>
void round_trip(const float* in, float* out, int64_t n, Run&& run) {
  if (!in || !out) throw std::invalid_argument("fake_quantize (CUDA): null data pointer");
  DeviceBuffer<float> x(static_cast<size_t>(n));
  check(cudaMemcpy(x.p, in, size_t(n) * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
  run(x.p);
  check(cudaMemcpy(out, x.p, size_t(n) * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
}
}  // namespace

size_t fake_quantize_scratch_bytes(int64_t rows, int64_t cols, const QuantSpec& spec) {
  if (rows <= 0 || cols <= 0) return 0;
  return Scratch::bytes(grid_of(rows, cols, spec));
}

void fake_quantize_device(const float* in, float* out, int64_t rows, int64_t cols, const QuantSpec& spec,
                          const RoundingKey& key, const DeviceLaunch& launch) {
  check_stateless(rows, cols, spec, key);
  if (rows * cols == 0) return;
  const bool two_level = spec.rule == ScaleRule::kTwoLevel;
  run(in, out, grid_of(rows, cols, spec), spec, key, launch, two_level,
      [&](float amax, BlockScale&, TensorScale& tensor) {
        // two_level: the tensor amax, then the CPU's own tensor-scale function
        if (two_level) tensor = two_level_tensor_scale(amax, spec);
        return false;
      });
}

void fake_quantize_device(const float* in, float* out, int64_t rows, int64_t cols, const RoundingKey& key,
                          DelayedScaling& state, const DeviceLaunch& launch) {
  const QuantSpec& spec = state.spec();
  check_args(rows, cols, spec, key);
  if (rows * cols == 0) {  // as the CPU: an empty tensor records amax 0
    state.record(0.0f);
    return;
  }
  float recorded = 0.0f;
  run(in, out, grid_of(rows, cols, spec), spec, key, launch, /*need_tensor_amax=*/true,
      [&](float amax, BlockScale& fixed, TensorScale&) {
        fixed = detail::delayed_call_scale(state, amax);
        recorded = amax;
        return true;
      });
  state.record(recorded);
}

void fake_quantize_host(const float* in, float* out, int64_t rows, int64_t cols, const QuantSpec& spec,
                        const RoundingKey& key) {
  check_stateless(rows, cols, spec, key);
  if (rows * cols == 0) return;
  round_trip(in, out, rows * cols, [&](float* x) { fake_quantize_device(x, x, rows, cols, spec, key); });
}

void fake_quantize_host(const float* in, float* out, int64_t rows, int64_t cols, const RoundingKey& key,
                        DelayedScaling& state) {
  check_args(rows, cols, state.spec(), key);
  if (rows * cols == 0) {
    state.record(0.0f);
    return;
  }
  round_trip(in, out, rows * cols, [&](float* x) { fake_quantize_device(x, x, rows, cols, key, state); });
}

}  // namespace snip::formats::cuda
