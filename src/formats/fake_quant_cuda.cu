// fake_quantize on an NVIDIA GPU (snip/formats/fake_quant_cuda.h), with the
// CPU's codec: block scales through fast::scale_lane (the lanes the CPU's
// scales_from_amax runs) and elements through fast::minifloat_element (the
// CPU's span_minifloat body), compiled for the device from fast_math.h.
//
// Three steps, as the CPU's 2-D/two-level path: (1) one thread per scaling
// block takes the max of |x|'s bits over its elements (NaN bits above Inf's:
// NaN-propagating); (2) two_level: the tensor scale from those amaxes, on
// the host (scale.cpp, the CPU's function); one thread per block computes
// its (encode, decode) scale; (3) one thread per element quantizes. Order of
// the max does not matter (max is exact), so the results are the CPU's bit
// for bit; NaN outputs are made the CPU's canonical 0x7FC00000 (the device
// writes 0x7FFFFFFF for an arithmetic NaN). Not tuned for speed yet.
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

namespace snip::formats::cuda {

namespace {

void check(cudaError_t e, const char* call) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA: ") + call + ": " + cudaGetErrorString(e));
}

// A device buffer of n T's, freed on scope exit.
template <typename T>
struct DeviceBuffer {
  T* p = nullptr;
  explicit DeviceBuffer(size_t n) { check(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

struct Grid {
  int64_t rows, cols, br, bc, gr, gc;
};

__global__ void block_amax_kernel(const float* x, Grid g, uint32_t* amax) {
  const int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= g.gr * g.gc) return;
  const int64_t r0 = (b / g.gc) * g.br, c0 = (b % g.gc) * g.bc;
  const int64_t r1 = r0 + g.br < g.rows ? r0 + g.br : g.rows, c1 = c0 + g.bc < g.cols ? c0 + g.bc : g.cols;
  uint32_t m = 0;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; ++c) {
      const uint32_t a = fast::bits_of(x[r * g.cols + c]) & fast::kAbsMask;
      m = a > m ? a : m;
    }
  amax[b] = m;
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

bool supported(const QuantSpec& spec, std::string* why) {
  validate_quant_spec(spec, "fake_quantize (CUDA)");
  auto no = [&](const std::string& w) {
    if (why) *why = "fake_quantize (CUDA): " + w + " is not covered yet (" + spec.describe() + ")";
    return false;
  };
  if (!fast::minifloat_fast_ok(spec.element)) return no(std::string("element format ") + spec.element.name);
  if (spec.rule == ScaleRule::kDelayed) return no("delayed scaling");
  if (spec.hadamard_size != 0) return no("the Hadamard transform");
  return true;
}

void fake_quantize_device(const float* in, float* out, int64_t rows, int64_t cols, const QuantSpec& spec,
                          const RoundingKey& key) {
  std::string why;
  if (!supported(spec, &why)) throw std::invalid_argument(why);
  check_rounding_key(key);
  if (rows < 0 || cols < 0) throw std::invalid_argument("fake_quantize (CUDA): negative size");
  if (rows * cols == 0) return;
  Grid g{rows, cols, std::max<int64_t>(1, spec.block.rows_over(rows)), std::max<int64_t>(1, spec.block.cols_over(cols)), 0,
         0};
  g.gr = (rows + g.br - 1) / g.br;
  g.gc = (cols + g.bc - 1) / g.bc;
  const int64_t nb = g.gr * g.gc;
  constexpr unsigned kThreads = 256;
  DeviceBuffer<uint32_t> amax{static_cast<size_t>(nb)};
  DeviceBuffer<float> enc{static_cast<size_t>(nb)}, dec{static_cast<size_t>(nb)};
  block_amax_kernel<<<blocks_for(nb, kThreads), kThreads>>>(in, g, amax.p);
  check(cudaGetLastError(), "block_amax_kernel");
  TensorScale tensor;
  if (spec.rule == ScaleRule::kTwoLevel) {  // the tensor amax, then the CPU's own tensor-scale function
    std::vector<uint32_t> a(static_cast<size_t>(nb));
    check(cudaMemcpy(a.data(), amax.p, a.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost), "cudaMemcpy");
    uint32_t mx = 0;
    for (uint32_t v : a) mx = std::max(mx, v);
    tensor = two_level_tensor_scale(mx > fast::kInfBits ? fast::float_of(fast::kCanonicalNaN) : fast::float_of(mx),
                                    spec);
  }
  const fast::ScaleCtx ctx(spec, tensor);
  block_scale_kernel<<<blocks_for(nb, kThreads), kThreads>>>(amax.p, nb, ctx, enc.p, dec.p);
  check(cudaGetLastError(), "block_scale_kernel");
  const fast::MiniFloatParams p(spec.element);
  const uint32_t ovf = fast::minifloat_overflow_bits(p, spec.saturate);
  if (spec.rounding == Rounding::kStochastic)
    quantize_kernel<true><<<blocks_for(rows * cols, kThreads), kThreads>>>(in, out, g, enc.p, dec.p, p, ovf,
                                                                           p.has_inf, key);
  else
    quantize_kernel<false><<<blocks_for(rows * cols, kThreads), kThreads>>>(in, out, g, enc.p, dec.p, p, ovf,
                                                                            p.has_inf, key);
  check(cudaGetLastError(), "quantize_kernel");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

void fake_quantize_host(const float* in, float* out, int64_t rows, int64_t cols, const QuantSpec& spec,
                        const RoundingKey& key) {
  std::string why;
  if (!supported(spec, &why)) throw std::invalid_argument(why);
  if (rows < 0 || cols < 0) throw std::invalid_argument("fake_quantize (CUDA): negative size");
  if (rows * cols == 0) return;
  if (!in || !out) throw std::invalid_argument("fake_quantize (CUDA): null data pointer");
  const size_t n = size_t(rows * cols);
  DeviceBuffer<float> x(n);
  check(cudaMemcpy(x.p, in, n * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
  fake_quantize_device(x.p, x.p, rows, cols, spec, key);
  check(cudaMemcpy(out, x.p, n * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
}

}  // namespace snip::formats::cuda
