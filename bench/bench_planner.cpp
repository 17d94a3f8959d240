// bench_planner: ILP solve time on real model shapes (METHOD.md section 4
// targets: a 22-block model per layer "well under a second"; 80 blocks per
// GEMM with 3 options too).
//
//   TinyLlama-1.1B: 22 blocks, hidden 2048, MLP 5632, 32 heads, 4 KV heads
//                   -> 154 linear layers.
//   Llama-2-70B:    80 blocks, hidden 8192, MLP 28672, 64 heads, 8 KV heads
//                   -> 560 linear layers, 1680 GEMMs.
//
// Quality losses are random but shaped like real ones: Q(fp4) is lognormal
// around a per-type sensitivity (down_proj and v_proj most sensitive), raised
// in the first and last two blocks, with per-GEMM factors (fprop > dgrad >
// wgrad); Q(fp8) ~ 3% of Q(fp4); Q(bf16) = 0. Fixed seed.
//
// Run: build-*/bench/bench_planner   (docs/planner.md has the numbers).
#include <benchmark/benchmark.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "snip/policy/cost_table.h"
#include "snip/policy/planner.h"

using namespace snip::policy;

namespace {

double type_sensitivity(const std::string& name) {
  struct T {
    const char* suffix;
    double s;
  };
  static const T table[] = {{"q_proj", 0.6}, {"k_proj", 0.6},    {"v_proj", 2.0},
                            {"o_proj", 1.0}, {"gate_proj", 0.8}, {"up_proj", 0.8},
                            {"down_proj", 3.0}};
  for (const T& t : table)
    if (name.size() >= std::string(t.suffix).size() &&
        name.compare(name.size() - std::string(t.suffix).size(), std::string::npos, t.suffix) == 0)
      return t.s;
  return 1.0;
}

PlanProblem llama_problem(int n_blocks, int64_t hidden, int64_t inter, int heads, int kv,
                          Granularity g, bool bf16, uint64_t seed) {
  const int64_t tokens = 4096 * 8;  // tokens per step
  const auto layers = llama_linear_layers(n_blocks, hidden, inter, heads, kv, tokens);
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> noise(0.0, 0.5), small(0.0, 0.3);
  const double gemm_factor[3] = {1.0, 0.6, 0.4};
  PlanProblem p;
  p.granularity = g;
  for (const LinearLayerShape& l : layers) {
    const int b = block_index(l.name);
    const double edge = (b < 2 || b >= n_blocks - 2) ? 2.0 : 1.0;
    const double base = 1e-3 * type_sensitivity(l.name) * edge;
    auto item_q = [&](double factor) {
      std::map<std::string, double> q;
      q["fp4"] = base * factor * noise(rng);
      q["fp8"] = q["fp4"] * 0.03 * small(rng);
      if (bf16) q["bf16"] = 0.0;
      return q;
    };
    if (g == Granularity::layer) {
      PlanItem it;
      it.name = it.layer = l.name;
      it.flops = 3 * l.gemm_flops;
      it.q = item_q(2.0);
      p.items.push_back(it);
    } else {
      for (int k = 0; k < 3; ++k) {
        PlanItem it;
        it.layer = l.name;
        it.gemm = snip::gemm_name(snip::Gemm(k));
        it.name = l.name + ":" + it.gemm;
        it.flops = l.gemm_flops;
        it.q = item_q(gemm_factor[k]);
        p.items.push_back(it);
      }
    }
  }
  return p;
}

PlanProblem tinyllama(Granularity g, bool bf16) {
  return llama_problem(22, 2048, 5632, 32, 4, g, bf16, 1);
}
PlanProblem llama70b(Granularity g, bool bf16) {
  return llama_problem(80, 8192, 28672, 64, 8, g, bf16, 2);
}

void run(benchmark::State& state, const PlanProblem& p, const PlanOptions& o) {
  double optimal = 1, seconds = 0, share = 0;
  for (auto _ : state) {
    const PlanResult r = plan(p, o);
    benchmark::DoNotOptimize(r.objective);
    optimal = std::min(optimal, r.proven_optimal ? 1.0 : 0.0);
    seconds = r.solve_seconds;
    share = r.fp4_share;
  }
  state.counters["items"] = static_cast<double>(p.items.size());
  state.counters["proven_optimal"] = optimal;
  state.counters["fp4_share"] = share;
  state.counters["last_s"] = seconds;
}

// Arg: budget in percent.
void BM_TinyLlama_PerLayer_2opt(benchmark::State& state) {
  static const PlanProblem p = tinyllama(Granularity::layer, false);
  PlanOptions o;
  o.budget = Budget::share(state.range(0) / 100.0);
  run(state, p, o);
}
BENCHMARK(BM_TinyLlama_PerLayer_2opt)->Arg(50)->Arg(75)->Arg(90)->Unit(benchmark::kMillisecond);

void BM_TinyLlama_PerLayer_4stages(benchmark::State& state) {
  static const PlanProblem p = [] {
    PlanProblem q = tinyllama(Granularity::layer, false);
    assign_stages(q, 4);
    return q;
  }();
  PlanOptions o;
  o.budget = Budget::share(0.75);
  o.per_stage_budget = true;
  o.stage_boundary_option = "fp8";
  run(state, p, o);
}
BENCHMARK(BM_TinyLlama_PerLayer_4stages)->Unit(benchmark::kMillisecond);

void BM_TinyLlama_Sweep21(benchmark::State& state) {
  static const PlanProblem p = tinyllama(Granularity::layer, false);
  PlanOptions o;
  size_t points = 0;
  for (auto _ : state) {
    const auto front = sweep(p, o, budget_steps(20));
    points = front.size();
    benchmark::DoNotOptimize(points);
  }
  state.counters["points"] = static_cast<double>(points);
}
BENCHMARK(BM_TinyLlama_Sweep21)->Unit(benchmark::kMillisecond);

// 1680 GEMMs x 3 options under an FP4 share budget (Arg: percent).
void BM_Llama70B_PerGemm_3opt_Share(benchmark::State& state) {
  static const PlanProblem p = llama70b(Granularity::gemm, true);
  PlanOptions o;
  o.budget = Budget::share(state.range(0) / 100.0);
  run(state, p, o);
}
BENCHMARK(BM_Llama70B_PerGemm_3opt_Share)->Arg(50)->Arg(75)->Arg(90)->Unit(benchmark::kMillisecond);

// 1680 GEMMs x 3 options under a cost budget (Arg: cost per FLOP x 100):
// a genuine multiple-choice knapsack, all three options in play.
void BM_Llama70B_PerGemm_3opt_Cost(benchmark::State& state) {
  static const PlanProblem p = llama70b(Granularity::gemm, true);
  PlanOptions o;
  o.budget = Budget::cost(state.range(0) / 100.0);
  run(state, p, o);
}
BENCHMARK(BM_Llama70B_PerGemm_3opt_Cost)->Arg(150)->Arg(250)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
