// fake_quantize on the GPU (formats/fake_quant_cuda.h) against the CPU's
// fast path, bit for bit: every recipe operand the CUDA kernels cover on
// awkward data with special values, every code of E4M3, E5M2 and E2M1 and
// the midpoints between neighbours (ties). Without a CUDA device those
// tests skip, saying why; what the kernels refuse is checked everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "snip/formats/fake_quant.h"
#include "snip/formats/fake_quant_cuda.h"
#include "snip/recipes/recipe.h"
#include "test_util.h"

using namespace snip;
using namespace snip::formats;

namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// The first index where the GPU's bits differ from the CPU's, or -1.
int64_t first_difference(const std::vector<float>& x, int64_t rows, int64_t cols, const QuantSpec& spec,
                         const RoundingKey& key = {}) {
  std::vector<float> cpu(x.size()), gpu(x.size());
  fake_quantize(x.data(), cpu.data(), rows, cols, spec, key);
  cuda::fake_quantize_host(x.data(), gpu.data(), rows, cols, spec, key);
  for (size_t i = 0; i < x.size(); ++i)
    if (bits(cpu[i]) != bits(gpu[i])) return int64_t(i);
  return -1;
}

// Without a device the GPU cases skip, saying why; with SNIP_REQUIRE_CUDA=1
// (a lent GPU machine's check) a missing device, or a driver too old for
// the CUDA 13 runtime, fails instead.
#define REQUIRE_GPU()                                                                   \
  do {                                                                                  \
    std::string why;                                                                    \
    if (cuda::device_count(&why) == 0) {                                                \
      const char* req = std::getenv("SNIP_REQUIRE_CUDA");                               \
      if (req && std::string(req) == "1") FAIL() << why << " (SNIP_REQUIRE_CUDA=1)";    \
      GTEST_SKIP() << why;                                                              \
    }                                                                                   \
  } while (0)

}  // namespace

TEST(CudaFakeQuant, BitExactWithTheCpuForEveryCoveredRecipeOperand) {
  REQUIRE_GPU();
  const recipes::RecipeSet set;
  int covered = 0;
  uint32_t seed = 1;
  for (const std::string& name : set.names())
    for (int op = 0; op < kNumOperands; ++op) {
      const QuantSpec& spec = set.find(name)[Operand(op)];
      if (!cuda::supported(spec) || spec.rule == ScaleRule::kDelayed) continue;  // delayed: its own test below
      ++covered;
      for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{256, 512}, {130, 129}, {3, 17}, {1, 1}}) {
        // Clean data (every block and tensor scale finite: two-level's
        // host/device split is exercised), then with special values in the
        // last row only (NaN and Inf blocks; under a per-tensor or two-level
        // scale the whole tensor is NaN, on both sides).
        auto x = snip::formats::testing::awkward_data(rows, cols, seed++);
        const std::string what = name + " " + operand_name(Operand(op)) + " [" + std::to_string(rows) + ", " +
                                 std::to_string(cols) + "]";
        // Stochastic rounding (fp4/nvfp4's dY): the CPU's Philox words.
        const RoundingKey key{0x0123456789ABCDEFull, seed, 3, uint32_t(op)};
        EXPECT_EQ(first_difference(x, rows, cols, spec, key), -1) << what;
        if (rows * cols > 8) {
          const size_t last = size_t((rows - 1) * cols);
          x[last] = NAN;
          x[last + 2] = INFINITY;
          x[size_t(rows * cols - 1)] = -3e38f;
          EXPECT_EQ(first_difference(x, rows, cols, spec), -1) << what << " with NaN/Inf";
        }
        // FP32 subnormals alone: no flush to zero on the device.
        std::vector<float> sub(size_t(rows * cols));
        for (size_t i = 0; i < sub.size(); ++i) sub[i] = std::ldexp(float(int(i % 97) - 48), -140);
        EXPECT_EQ(first_difference(sub, rows, cols, spec), -1) << what << " subnormals";
      }
    }
  EXPECT_GE(covered, 8);  // fp8, mxfp8, mxfp4, nvfp4's RNE operands, ...
}

// Delayed scaling (fp8_tensor: E4M3 X/W, E5M2 dY, per-tensor FP32 scales
// from an amax history): a sequence of calls whose magnitudes rise and fall
// (the first call bootstraps from its own amax, later ones use the history;
// a NaN call is skipped by the history), the same bits and the same state as
// the CPU's after every call.
TEST(CudaFakeQuant, DelayedScalingMatchesTheCpuCallForCall) {
  REQUIRE_GPU();
  const recipes::RecipeSet set;
  for (Operand op : {Operand::kFpropX, Operand::kWgradDY}) {
    QuantSpec spec = set.find("fp8_tensor")[op];
    spec.amax_history_len = 4;
    spec.scale_refresh_interval = 2;
    DelayedScaling cpu(spec), gpu(spec);
    uint32_t seed = 11;
    for (int call = 0; call < 9; ++call) {
      const int64_t rows = 64 + call, cols = 96;
      auto x = snip::formats::testing::awkward_data(rows, cols, seed++);
      const float mag = std::ldexp(1.0f, (call % 5) * 3 - 6);
      for (float& v : x)
        if (std::isfinite(v)) v *= mag;
      if (call == 6) x[5] = NAN;
      std::vector<float> a(x.size()), b(x.size());
      fake_quantize(x.data(), a.data(), rows, cols, RoundingKey{}, cpu);
      cuda::fake_quantize_host(x.data(), b.data(), rows, cols, RoundingKey{}, gpu);
      int64_t diff = -1;
      for (size_t i = 0; i < x.size() && diff < 0; ++i)
        if (bits(a[i]) != bits(b[i])) diff = int64_t(i);
      EXPECT_EQ(diff, -1) << operand_name(op) << " call " << call;
      EXPECT_EQ(cpu.history(), gpu.history()) << operand_name(op) << " call " << call;
      EXPECT_EQ(cpu.calls(), gpu.calls());
      EXPECT_EQ(cpu.skipped(), gpu.skipped());
      EXPECT_EQ(cpu.has_scale(), gpu.has_scale());
      if (cpu.has_scale()) {
        EXPECT_EQ(bits(cpu.scale().decode), bits(gpu.scale().decode));
      }
    }
  }
}

TEST(CudaFakeQuant, EveryCodeAndEveryTieOfE4M3E5M2E2M1) {
  REQUIRE_GPU();
  for (const ElementFormat& e : {kE4M3, kE5M2, kE2M1}) {
    QuantSpec s;
    s.element = e;
    s.rule = ScaleRule::kNone;
    std::vector<float> x;
    std::vector<float> values;
    for (uint32_t c = 0; c < e.num_codes(); ++c) {
      const float v = decode(e, c);
      if (std::isfinite(v)) values.push_back(v);
      x.push_back(v);
    }
    std::sort(values.begin(), values.end());
    for (size_t i = 0; i + 1 < values.size(); ++i) x.push_back(0.5f * (values[i] + values[i + 1]));  // ties
    x.push_back(2.0f * values.back());  // overflow: saturates
    EXPECT_EQ(first_difference(x, 1, int64_t(x.size()), s), -1) << e.name;
    s.saturate = false;
    EXPECT_EQ(first_difference(x, 1, int64_t(x.size()), s), -1) << e.name << " (IEEE overflow)";
  }
}

// Everywhere (no device needed): what the kernels do not cover yet is
// refused with a line that names it, before any device is touched.
TEST(CudaFakeQuant, RefusesWhatItDoesNotCoverSayingWhat) {
  const recipes::RecipeSet set;
  std::string why;
  EXPECT_TRUE(cuda::supported(set.find("fp8")[Operand::kFpropX], &why)) << why;
  EXPECT_TRUE(cuda::supported(set.find("nvfp4")[Operand::kFpropW], &why)) << why;
  EXPECT_TRUE(cuda::supported(set.find("fp4")[Operand::kDgradDY], &why)) << why;  // stochastic rounding
  QuantSpec rht = set.find("nvfp4")[Operand::kWgradDY];
  rht.hadamard_size = 16;
  EXPECT_FALSE(cuda::supported(rht, &why));
  EXPECT_NE(why.find("the Hadamard transform"), std::string::npos) << why;
  EXPECT_FALSE(cuda::supported(set.find("bf16")[Operand::kFpropX], &why));
  EXPECT_NE(why.find("element format bf16"), std::string::npos) << why;
  // Delayed scaling: covered through the DelayedScaling overload only.
  EXPECT_TRUE(cuda::supported(set.find("fp8_tensor")[Operand::kFpropX], &why)) << why;
  std::vector<float> x(4, 1.0f), y(4);
  try {
    cuda::fake_quantize_host(x.data(), y.data(), 1, 4, set.find("fp8_tensor")[Operand::kFpropX]);
    ADD_FAILURE() << "a delayed spec was accepted without its state";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("the DelayedScaling overload"), std::string::npos) << e.what();
  }
  try {
    cuda::fake_quantize_host(x.data(), y.data(), 1, 4, rht);
    ADD_FAILURE() << "a Hadamard spec was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind("fake_quantize (CUDA): the Hadamard transform is not covered yet", 0), 0u)
        << e.what();
  }
  // device_count says why there is none (this CPU machine) or counts them.
  std::string none;
  const int n = cuda::device_count(&none);
  if (n == 0) EXPECT_EQ(none.rfind("no CUDA device", 0), 0u) << none;
  else EXPECT_GT(n, 0);
}
