// Overhead of the stats step (METHOD.md section 3 targets: amortised time
// under 2% of training at the default schedule, extra peak memory under 1% of
// a training step's peak), on the shapes of configs/tiny.toml (B=16, T=128,
// BF16 GEMMs, options fp4 + fp8, one curvature probe), measured in one run:
// the baseline is an ordinary training step of the same model.
//
//   build/bench/bench_stats
//
// Memory: LibTorch's CPU allocator is wrapped by a counting allocator
// (c10::SetCPUAllocator), so peaks are bytes of live tensor storage (weights,
// AdamW state, gradients, activations, temporaries); allocations that oneDNN
// or OpenBLAS make on their own are not seen. A peak is measured from the
// state at a step boundary (weights, moments, gradients of the last step).
//
// Counters: step_ms, stats_ms (wall time, ms), stats_in_steps (stats_ms /
// step_ms), stats_steps (at the default schedule of a 1200-step run),
// amortised_pct (stats_steps·stats_ms / (1200·step_ms), percent),
// peak_step_MB, peak_stats_MB (MiB), extra_peak_pct (percent of the step's
// peak; 0 when the stats step peaks lower).
#include <benchmark/benchmark.h>
#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <chrono>

#include "snip/config/config.h"
#include "snip/method/controller.h"
#include "snip/model/llama.h"
#include "snip/hw/platform.h"
#include "snip/method/stats.h"
#include "tiny_model.h"

namespace {

// Counts live bytes of every CPU tensor allocation and their peak. Memory
// comes from posix_memalign (64-byte alignment, as c10's allocator) with the
// data pointer as the DataPtr context, so raw_allocate() works too.
class CountingAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    void* p = nullptr;
    if (n > 0 && posix_memalign(&p, 64, n) != 0) throw std::bad_alloc();
    {
      std::lock_guard<std::mutex> g(mu_);
      sizes_[p] = n;
      live_ += int64_t(n);
      peak_ = std::max(peak_, live_);
    }
    return c10::DataPtr(p, p, &release, c10::Device(c10::DeviceType::CPU));
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
  int64_t peak() const {
    std::lock_guard<std::mutex> g(mu_);
    return peak_;
  }
  void reset_peak() const {
    std::lock_guard<std::mutex> g(mu_);
    peak_ = live_;
  }
  static CountingAllocator* instance;

 private:
  static void release(void* p) {
    if (!p) return;
    {
      std::lock_guard<std::mutex> g(instance->mu_);
      auto it = instance->sizes_.find(p);
      if (it != instance->sizes_.end()) {
        instance->live_ -= int64_t(it->second);
        instance->sizes_.erase(it);
      }
    }
    std::free(p);
  }
  mutable std::mutex mu_;
  mutable std::unordered_map<void*, size_t> sizes_;
  mutable int64_t live_ = 0, peak_ = 0;
};
CountingAllocator* CountingAllocator::instance = nullptr;

CountingAllocator* counting() {
  static CountingAllocator* a = [] {
    auto* c = new CountingAllocator();
    CountingAllocator::instance = c;
    c10::SetCPUAllocator(c, /*priority=*/100);
    return c;
  }();
  return a;
}

void BM_StatsStepOverhead(benchmark::State& state) {
  CountingAllocator* mem = counting();
  const snip::LlamaConfig c = snip::bench::tiny_model();
  const int64_t B = 16, T = 128;
  torch::manual_seed(0);
  snip::LlamaForCausalLM m(c);
  m->set_precision(snip::LinearPrecision{nullptr, at::kBFloat16});
  m->set_non_linear_gemm_dtype(at::kBFloat16);
  torch::optim::AdamW opt(m->parameters(), torch::optim::AdamWOptions(1e-3));
  const torch::Tensor ids = torch::randint(0, c.vocab_size, {B, T}, torch::kLong);
  const torch::Tensor tg = torch::randint(0, c.vocab_size, {B, T}, torch::kLong);
  auto step = [&] {
    opt.zero_grad();
    torch::Tensor loss = snip::LlamaForCausalLMImpl::loss(m(ids), tg);
    loss.backward();
    opt.step();
    return loss.item<double>();
  };
  step();  // AdamW state exists from here on, as at any stats step after warmup
  snip::StatsOptions so;  // fp4 + fp8, one probe: the controller's defaults
  if (state.range(0) == 1) so.curvature_probes = 0;  // diagnostics: where the extra peak comes from
  if (state.range(0) == 2) so.options = {"fp8"}, so.low_option = "fp8";
  state.SetLabel(state.range(0) == 0 ? "default (fp4+fp8, 1 probe)" : state.range(0) == 1 ? "no curvature probe" : "fp8 only");
  using clock = std::chrono::steady_clock;
  double step_s = 0, stats_s = 0;
  int64_t peak_step = 0, peak_stats = 0;
  int64_t n = 0;
  for (auto _ : state) {
    mem->reset_peak();
    auto t0 = clock::now();
    benchmark::DoNotOptimize(step());
    step_s += std::chrono::duration<double>(clock::now() - t0).count();
    peak_step = std::max(peak_step, mem->peak());
    opt.zero_grad();  // as the trainer does before a step boundary's stats step
    mem->reset_peak();
    t0 = clock::now();
    snip::StatsStep s = snip::run_stats_step(m->linear_layers(), [&] { return snip::LlamaForCausalLMImpl::loss(m(ids), tg); },
                                      opt, so, n);
    stats_s += std::chrono::duration<double>(clock::now() - t0).count();
    peak_stats = std::max(peak_stats, mem->peak());
    benchmark::DoNotOptimize(s.layers.size());
    ++n;
  }
  snip::Config cfg;  // the default schedule of a 1200-step run (configs/tiny.toml)
  cfg.set("train.max_steps", int64_t{1200}, "bench");
  const double stats_steps = double(snip::PrecisionSchedule::from_config(cfg).plan_steps().size());
  const double st = step_s / double(n), ss = stats_s / double(n);
  state.counters["step_ms"] = 1e3 * st;
  state.counters["stats_ms"] = 1e3 * ss;
  state.counters["stats_in_steps"] = ss / st;
  state.counters["stats_steps"] = stats_steps;
  state.counters["amortised_pct"] = 100.0 * stats_steps * ss / (1200.0 * st);
  state.counters["peak_step_MB"] = double(peak_step) / (1 << 20);
  state.counters["peak_stats_MB"] = double(peak_stats) / (1 << 20);
  state.counters["extra_peak_pct"] = 100.0 * std::max<double>(0, double(peak_stats - peak_step)) / double(peak_step);
}
BENCHMARK(BM_StatsStepOverhead)->Arg(0)->Iterations(3)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_StatsStepOverhead)->DenseRange(1, 2)->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  snip::tune_runtime_or_reexec(argv);  // the same runtime settings as `snip train`
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
