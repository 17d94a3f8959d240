// Training throughput of the tiny config (configs/tiny.toml shapes) in FP32 and
// BF16 GEMMs, with the BF16 and FP32 GEMM throughput of the same machine,
// measured in the same run, as the reference for model FLOPs utilisation.
//
//   build/bench/bench_train --benchmark_min_time=5
//
// Counters: tokens_per_s (training tokens per second), model_flops_per_s
// (LlamaConfig::train_flops_per_token x tokens/s) for the step benchmarks;
// flops_per_s for the GEMM references.
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include "snip/model/llama.h"
#include "snip/model/matmul.h"
#include "snip/hw/platform.h"
#include "snip/model/quantizers.h"
#include "tiny_model.h"

namespace {

snip::LlamaConfig tiny() { return snip::bench::tiny_model(); }

constexpr int64_t kB = 16, kT = 128;

void BM_TrainStep(benchmark::State& state) {
  const bool bf16 = state.range(0) == 1;
  torch::manual_seed(0);
  snip::LlamaConfig c = tiny();
  snip::LlamaForCausalLM m(c);
  const at::ScalarType g = bf16 ? at::kBFloat16 : at::ScalarType::Undefined;
  m->set_precision(snip::LinearPrecision{nullptr, g});
  m->set_non_linear_gemm_dtype(g);
  torch::optim::AdamW opt(m->parameters(), torch::optim::AdamWOptions(1e-3));
  torch::Tensor ids = torch::randint(0, c.vocab_size, {kB, kT}, torch::kLong);
  torch::Tensor tg = torch::randint(0, c.vocab_size, {kB, kT}, torch::kLong);
  for (auto _ : state) {
    opt.zero_grad();
    torch::Tensor loss = snip::LlamaForCausalLMImpl::loss(m(ids), tg);
    loss.backward();
    opt.step();
    benchmark::DoNotOptimize(loss.item<float>());
  }
  const double tokens = double(state.iterations()) * kB * kT;
  state.counters["tokens_per_s"] = benchmark::Counter(tokens, benchmark::Counter::kIsRate);
  state.counters["model_flops_per_s"] =
      benchmark::Counter(tokens * c.train_flops_per_token(kT), benchmark::Counter::kIsRate);
  state.SetLabel(bf16 ? "bf16 GEMMs" : "fp32 GEMMs");
}
BENCHMARK(BM_TrainStep)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

// The reference: one GEMM of the model's typical shape, [B*T, C] x [C, F].
// Arg 0: 0 = FP32 (torch::mm), 1 = BF16 operands through LibTorch's own
// torch::mm, 2 = snip's BF16 GEMM (snip::matmul_in: LibTorch's where it
// accumulates in FP32, else the FP32 emulation; model/matmul.h).
void BM_Gemm(benchmark::State& state) {
  const int64_t M = kB * kT, K = state.range(1), N = state.range(2);
  const torch::Tensor a32 = torch::randn({M, K}), b32 = torch::randn({N, K});
  if (state.range(0) == 2) {
    for (auto _ : state) benchmark::DoNotOptimize(snip::matmul_in(a32, b32.t(), at::kBFloat16));
  } else {
    const auto dt = state.range(0) == 1 ? at::kBFloat16 : at::kFloat;
    const torch::Tensor a = a32.to(dt), b = b32.to(dt);
    for (auto _ : state) benchmark::DoNotOptimize(torch::mm(a, b.t()));
  }
  state.counters["flops_per_s"] =
      benchmark::Counter(double(state.iterations()) * 2.0 * M * K * N, benchmark::Counter::kIsRate);
  state.SetLabel(state.range(0) == 0   ? "fp32"
                 : state.range(0) == 1 ? "bf16 torch::mm"
                                       : (snip::native_bf16_gemm() ? "bf16 snip (native)" : "bf16 snip (emulated)"));
}
BENCHMARK(BM_Gemm)->ArgsProduct({{0, 1, 2}, {256}, {688, 8192}})->Unit(benchmark::kMillisecond)->UseRealTime();

// One linear layer, fwd + bwd, [B*T, 688] -> [B*T, 256] (the tiny model's
// down_proj), T_tok = 2048 tokens: LibTorch's own linear with BF16 operands
// (the baseline), then snip's QuantLinear with no quantizer (the identity
// hook must cost nothing measurable), then QuantLinear under recipes.
// Arg: 0 = torch linear, 1 = QuantLinear identity, 2.. = recipes below.
const char* kLinearRecipes[] = {"torch", "identity", "bf16", "fp8", "fp4", "nvfp4", "mxfp4", "mxfp8"};

void BM_Linear(benchmark::State& state) {
  const int which = int(state.range(0));
  const int64_t M = kB * kT, IN = 688, OUT = 256;
  torch::manual_seed(0);
  snip::QuantLinear l(IN, OUT, 0.02);
  l->precision.gemm_dtype = at::kBFloat16;
  if (which >= 2) l->precision.quantizer = snip::make_recipe_quantizer(snip::recipes::RecipeSet(), kLinearRecipes[which]);
  torch::Tensor x = torch::randn({M, IN}).requires_grad_(true);
  torch::Tensor dy = torch::randn({M, OUT});
  for (auto _ : state) {
    torch::Tensor y;
    if (which == 0) {  // autograd's linear on BF16 copies, cast back: what QuantLinear does without a hook
      y = torch::nn::functional::linear(x.to(at::kBFloat16), l->weight.to(at::kBFloat16)).to(at::kFloat);
    } else {
      y = l(x);
    }
    y.backward(dy);
    benchmark::DoNotOptimize(x.grad().data_ptr());
    x.mutable_grad().reset();
    l->weight.mutable_grad().reset();
  }
  state.counters["tokens_per_s"] = benchmark::Counter(double(state.iterations()) * M, benchmark::Counter::kIsRate);
  state.SetLabel(kLinearRecipes[which]);
}
BENCHMARK(BM_Linear)->DenseRange(0, 7)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  snip::tune_runtime_or_reexec(argv);  // the same runtime settings as `snip train`
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
