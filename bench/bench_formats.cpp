// Fake-quantization throughput of snip_formats (bytes of FP32 input per
// second) against a memcpy of the same bytes, in the same run.
//
//   bench_formats --benchmark_filter=. (OMP_NUM_THREADS=2 for the numbers in
//   the report)
//
// Cases, all on a 4096 x 4096 FP32 matrix (64 MiB) unless noted:
//   Memcpy            std::memcpy, one thread (the baseline)
//   MemcpyParallel    the same bytes copied by all OpenMP threads
//   FakeQuant/<recipe>/<rne|sr>   fast path, the recipe's fprop.x spec with
//                     RNE or stochastic rounding (fp8: 1x128 tiles, pow2
//                     scales; nvfp4: 1x16 E4M3 x FP32; mxfp4: 1x32 E8M0)
//   Reference/<recipe>  the reference path on 512 x 4096 (it is ~100x slower)
//   FakeQuant/<recipe>/<rne|sr>/norms  the fast path with the per-step
//                     error norms (formats::ErrorNorms) as its by-product: the
//                     difference to the case without is their cost
#include <benchmark/benchmark.h>
#include <omp.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "snip/formats/fake_quant.h"
#include "snip/recipes/recipe.h"

namespace {

using snip::formats::Rounding;

constexpr int64_t kRows = 4096, kCols = 4096;

const std::vector<float>& input() {
  static const std::vector<float> x = [] {
    std::vector<float> v(size_t(kRows * kCols));
    std::mt19937 gen(1);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (float& f : v) f = nd(gen);
    return v;
  }();
  return x;
}

void BM_Memcpy(benchmark::State& state) {
  const auto& x = input();
  std::vector<float> y(x.size());
  for (auto _ : state) {
    std::memcpy(y.data(), x.data(), x.size() * sizeof(float));
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(x.size() * sizeof(float)));
}
BENCHMARK(BM_Memcpy)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_MemcpyParallel(benchmark::State& state) {
  const auto& x = input();
  std::vector<float> y(x.size());
  for (auto _ : state) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < kRows; ++r)
      std::memcpy(y.data() + r * kCols, x.data() + r * kCols, size_t(kCols) * sizeof(float));
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(x.size() * sizeof(float)));
}
BENCHMARK(BM_MemcpyParallel)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_FakeQuant(benchmark::State& state, const std::string& recipe, Rounding rounding,
                  bool reference, bool norms = false) {
  const auto& x = input();
  const int64_t rows = reference ? 512 : kRows;
  snip::formats::QuantSpec spec =
      snip::recipes::RecipeSet().find(recipe)[snip::Operand::kFpropX];
  spec.rounding = rounding;
  std::vector<float> y(size_t(rows * kCols));
  const snip::formats::RoundingKey key{1, 2, 3, 0};
  snip::formats::ErrorNorms n;
  for (auto _ : state) {
    if (reference) {
      snip::formats::fake_quantize_reference(x.data(), y.data(), rows, kCols, spec, key);
    } else {
      snip::formats::fake_quantize(x.data(), y.data(), rows, kCols, spec, key, nullptr, norms ? &n : nullptr);
    }
    benchmark::DoNotOptimize(n.sum_sq_err);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * rows * kCols * int64_t(sizeof(float)));
  state.counters["threads"] = omp_get_max_threads();
}

BENCHMARK_CAPTURE(BM_FakeQuant, fp8/rne, "fp8", Rounding::kRNE, false)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_FakeQuant, fp8/sr, "fp8", Rounding::kStochastic, false)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_FakeQuant, nvfp4/rne, "nvfp4", Rounding::kRNE, false)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_FakeQuant, nvfp4/sr, "nvfp4", Rounding::kStochastic, false)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_FakeQuant, mxfp4/rne, "mxfp4", Rounding::kRNE, false)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_FakeQuant, mxfp4/sr, "mxfp4", Rounding::kStochastic, false)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_FakeQuant, fp8/rne/norms, "fp8", Rounding::kRNE, false, true)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_FakeQuant, nvfp4/rne/norms, "nvfp4", Rounding::kRNE, false, true)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_FakeQuant, nvfp4/sr/norms, "nvfp4", Rounding::kStochastic, false, true)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_FakeQuant, mxfp4/rne/norms, "mxfp4", Rounding::kRNE, false, true)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_FakeQuant, reference_fp8/rne, "fp8", Rounding::kRNE, true)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_FakeQuant, reference_nvfp4/rne, "nvfp4", Rounding::kRNE, true)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
