// formats/fake_quant_cuda.h in a build without nvcc (-DSNIP_CUDA=OFF, the
// fuzz build): no device, every call says so.
#include "snip/formats/fake_quant_cuda.h"

#include <stdexcept>

namespace snip::formats::cuda {

namespace {
constexpr const char* kWhy = "no CUDA device: snip was built without its CUDA kernels (nvcc not found, or -DSNIP_CUDA=OFF)";
}  // namespace

int device_count(std::string* why) {
  if (why) *why = kWhy;
  return 0;
}

bool memory_info(int, size_t*, size_t*, std::string* why) {
  if (why) *why = kWhy;
  return false;
}

bool supported(const QuantSpec&, std::string* why) {
  if (why) *why = kWhy;
  return false;
}

size_t fake_quantize_scratch_bytes(int64_t, int64_t, const QuantSpec&) { return 0; }

void fake_quantize_device(const float*, float*, int64_t, int64_t, const QuantSpec&, const RoundingKey&,
                          const DeviceLaunch&) {
  throw std::runtime_error(kWhy);
}

void fake_quantize_device(const float*, float*, int64_t, int64_t, const RoundingKey&, DelayedScaling&,
                          const DeviceLaunch&) {
  throw std::runtime_error(kWhy);
}

void fake_quantize_host(const float*, float*, int64_t rows, int64_t cols, const QuantSpec&, const RoundingKey&) {
  if (rows > 0 && cols > 0) throw std::runtime_error(kWhy);
}

void fake_quantize_host(const float*, float*, int64_t rows, int64_t cols, const RoundingKey&, DelayedScaling&) {
  if (rows > 0 && cols > 0) throw std::runtime_error(kWhy);
}

}  // namespace snip::formats::cuda
