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
// Mixture-of-experts scale (10^4 and 10^5 items; planner.h "Methods"):
//
//   MoE block: 4 attention projections (hidden 7168, q/o 7168x7168, k/v
//              7168x1024) + 256 experts x {gate, up, down} (7168 <-> 2048),
//              DeepSeek-V3-like: 772 linear layers per block. Each expert's
//              tokens per step are the mean routed share (8 of 256 experts)
//              times a lognormal(0, 0.3) imbalance, so expert FLOPs differ;
//              Q(fp4) ~ type sensitivity x token share x lognormal(0, 0.5).
//   13 blocks = 10,036 layers; 130 blocks = 100,360 layers;
//   44 blocks per GEMM = 101,904 GEMMs; 13 blocks per GEMM = 30,108 GEMMs.
//
// The baselines measured in the same run: the whole-model CBC path
// (PlanMethod::milp) at sizes it finishes, and a plain sort of the same
// items by efficiency (the floor any greedy pays).
//
// Run: build-*/bench/bench_planner   (docs/planner.md has the numbers).
// Cost table for `snip plan` timings (per-GEMM form, serves --per-gemm too):
//   build/bench/bench_planner --moe-costs=FILE --moe-blocks=130
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "snip/plan/cost_table.h"
#include "snip/plan/planner.h"

using namespace snip::plan;

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

// DeepSeek-V3-like MoE blocks (see the header comment), per layer or per
// GEMM; options fp4, fp8 (and bf16 with Q = 0 when `bf16`).
CostTable moe_table(int n_blocks, uint64_t seed) {
  const int64_t hidden = 7168, expert_inter = 2048, kv = 1024, experts = 256, top_k = 8;
  const double tokens = 4096.0 * 16;  // tokens per step
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> noise(0.0, 0.5), small(0.0, 0.3), imbalance(0.0, 0.3);
  const double gemm_factor[3] = {1.0, 0.6, 0.4};
  CostTable t;
  t.source = "moe";
  auto add = [&](const std::string& name, int64_t in, int64_t out, double tok, double sens) {
    LayerCost l;
    l.name = name;
    l.has_gemms = true;
    const double share = tok / tokens;
    for (int g = 0; g < 3; ++g) {
      GemmCost& c = l.gemms[g];
      c.flops = 2.0 * tok * static_cast<double>(in) * static_cast<double>(out);
      c.q["fp4"] = 1e-3 * sens * share * gemm_factor[g] * noise(rng);
      c.q["fp8"] = c.q["fp4"] * 0.03 * small(rng);
      c.q["bf16"] = 0.0;
    }
    t.layers.push_back(std::move(l));
  };
  for (int b = 0; b < n_blocks; ++b) {
    const std::string blk = "model.layers." + std::to_string(b);
    const double edge = (b < 2 || b >= n_blocks - 2) ? 2.0 : 1.0;
    add(blk + ".self_attn.q_proj", hidden, hidden, tokens, 0.6 * edge);
    add(blk + ".self_attn.k_proj", hidden, kv, tokens, 0.6 * edge);
    add(blk + ".self_attn.v_proj", hidden, kv, tokens, 2.0 * edge);
    add(blk + ".self_attn.o_proj", hidden, hidden, tokens, 1.0 * edge);
    for (int e = 0; e < experts; ++e) {
      const double tok = tokens * top_k / experts * imbalance(rng);
      const std::string ex = blk + ".mlp.experts." + std::to_string(e);
      add(ex + ".gate_proj", hidden, expert_inter, tok, 0.8 * edge);
      add(ex + ".up_proj", hidden, expert_inter, tok, 0.8 * edge);
      add(ex + ".down_proj", expert_inter, hidden, tok, 3.0 * edge);
    }
  }
  return t;
}

PlanProblem moe_problem(int n_blocks, Granularity g, bool bf16) {
  PlanProblem p = make_problem(moe_table(n_blocks, 7 + n_blocks), g);
  if (!bf16)
    for (PlanItem& it : p.items) it.q.erase("bf16");
  return p;
}

int g_verbosity = 0;  // SNIP_BENCH_VERBOSE=1: the planner's summary lines

void run(benchmark::State& state, const PlanProblem& p, const PlanOptions& o_) {
  PlanOptions o = o_;
  o.verbosity = g_verbosity;
  double optimal = 1, seconds = 0, share = 0, rel_gap = 0, gap = 0;
  std::string algorithm;
  for (auto _ : state) {
    const PlanResult r = solve(p, o);
    benchmark::DoNotOptimize(r.objective);
    optimal = std::min(optimal, r.proven_optimal ? 1.0 : 0.0);
    seconds = r.solve_seconds;
    share = r.fp4_share;
    rel_gap = std::max(rel_gap, r.relative_gap);
    gap = std::max(gap, r.gap);
    algorithm = r.algorithm;
  }
  state.counters["items"] = static_cast<double>(p.items.size());
  state.counters["proven_optimal"] = optimal;
  state.counters["fp4_share"] = share;
  state.counters["last_s"] = seconds;
  state.counters["rel_gap"] = rel_gap;
  state.counters["gap"] = gap;
  state.SetLabel(algorithm);
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

// ---- mixture-of-experts scale --------------------------------------------
// Arg 0: MoE blocks (13: ~10^4 layers, 130: ~10^5 layers; per GEMM 13:
// ~3x10^4, 44: ~10^5 GEMMs). Arg 1 (where present): 0 = auto, 1 = the
// whole-model MILP baseline (PlanMethod::milp), 2 = PlanMethod::mckp.

const PlanProblem& moe(int blocks, Granularity g, bool bf16) {
  static std::map<std::tuple<int, int, bool>, PlanProblem> cache;
  auto key = std::make_tuple(blocks, static_cast<int>(g), bf16);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, moe_problem(blocks, g, bf16)).first;
  return it->second;
}

void BM_MoE_PerLayer_Share(benchmark::State& state) {
  const PlanProblem& p = moe(static_cast<int>(state.range(0)), Granularity::layer, false);
  PlanOptions o;
  o.budget = Budget::share(0.75);
  if (state.range(1) == 1) o.method = PlanMethod::milp;
  if (state.range(1) == 2) o.method = PlanMethod::mckp;
  run(state, p, o);
}
// 4 blocks = 3,088 layers: the baseline's reach (it did not finish 10^4 in 30 s).
BENCHMARK(BM_MoE_PerLayer_Share)
    ->Args({4, 1})->Args({4, 2})->Args({13, 0})->Args({130, 0})
    ->Unit(benchmark::kMillisecond)->Iterations(1);

void BM_MoE_PerLayer_4Stages(benchmark::State& state) {
  static std::map<int, PlanProblem> cache;
  const int blocks = static_cast<int>(state.range(0));
  if (!cache.count(blocks)) {
    PlanProblem q = moe_problem(blocks, Granularity::layer, false);
    assign_stages(q, 4);
    cache[blocks] = std::move(q);
  }
  PlanOptions o;
  o.budget = Budget::share(0.75);
  o.per_stage_budget = true;
  o.stage_boundary_option = "fp8";
  run(state, cache[blocks], o);
}
BENCHMARK(BM_MoE_PerLayer_4Stages)->Arg(13)->Arg(130)->Unit(benchmark::kMillisecond)->Iterations(1);

void BM_MoE_PerGemm_3opt_Share(benchmark::State& state) {
  const PlanProblem& p = moe(static_cast<int>(state.range(0)), Granularity::gemm, true);
  PlanOptions o;
  o.budget = Budget::share(0.75);
  run(state, p, o);
}
BENCHMARK(BM_MoE_PerGemm_3opt_Share)->Arg(4)->Arg(13)->Arg(44)->Unit(benchmark::kMillisecond)->Iterations(1);

// Cost budget 2.5 per FLOP: all three options in play (Arg 1 as above).
void BM_MoE_PerGemm_3opt_Cost(benchmark::State& state) {
  const PlanProblem& p = moe(static_cast<int>(state.range(0)), Granularity::gemm, true);
  PlanOptions o;
  o.budget = Budget::cost(2.5);
  if (state.range(1) == 1) o.method = PlanMethod::milp;
  if (state.range(1) == 2) o.method = PlanMethod::mckp;
  run(state, p, o);
}
BENCHMARK(BM_MoE_PerGemm_3opt_Cost)
    ->Args({1, 1})->Args({1, 2})->Args({13, 0})->Args({44, 0})
    ->Unit(benchmark::kMillisecond)->Iterations(1);

void BM_MoE_PerGemm_3opt_Cost_4Stages(benchmark::State& state) {
  static std::map<int, PlanProblem> cache;
  const int blocks = static_cast<int>(state.range(0));
  if (!cache.count(blocks)) {
    PlanProblem q = moe_problem(blocks, Granularity::gemm, true);
    assign_stages(q, 4);
    cache[blocks] = std::move(q);
  }
  PlanOptions o;
  o.budget = Budget::cost(2.5);
  o.per_stage_budget = true;
  o.stage_boundary_option = "fp8";
  run(state, cache[blocks], o);
}
BENCHMARK(BM_MoE_PerGemm_3opt_Cost_4Stages)->Arg(44)->Unit(benchmark::kMillisecond)->Iterations(1);

// The floor: sorting the same items by efficiency (ΔQ / FLOPs), nothing else.
void BM_MoE_SortBaseline(benchmark::State& state) {
  const PlanProblem& p = moe(static_cast<int>(state.range(0)), Granularity::layer, false);
  std::vector<std::pair<double, int>> eff(p.items.size());
  for (auto _ : state) {
    for (size_t i = 0; i < p.items.size(); ++i)
      eff[i] = {(p.items[i].q.at("fp4") - p.items[i].q.at("fp8")) / p.items[i].flops,
                static_cast<int>(i)};
    std::sort(eff.begin(), eff.end());
    benchmark::DoNotOptimize(eff.data());
  }
  state.counters["items"] = static_cast<double>(p.items.size());
}
BENCHMARK(BM_MoE_SortBaseline)->Arg(13)->Arg(130)->Unit(benchmark::kMillisecond);

// ---- sweeps ---------------------------------------------------------------
// Arg: budget steps (--steps). Points: the Pareto points kept.
void sweep_bench(benchmark::State& state, const PlanProblem& p) {
  PlanOptions o;
  size_t points = 0;
  double proven = 1, rel_gap = 0;
  for (auto _ : state) {
    const auto front = sweep(p, o, budget_steps(static_cast<int>(state.range(0))));
    points = front.size();
    for (const ParetoPoint& pt : front) {
      proven = std::min(proven, pt.plan.proven_optimal ? 1.0 : 0.0);
      rel_gap = std::max(rel_gap, pt.plan.relative_gap);
    }
    benchmark::DoNotOptimize(points);
  }
  state.counters["items"] = static_cast<double>(p.items.size());
  state.counters["points"] = static_cast<double>(points);
  state.counters["proven_optimal"] = proven;
  state.counters["rel_gap"] = rel_gap;
}

void BM_Sweep_TinyLlama(benchmark::State& state) {
  static const PlanProblem p = tinyllama(Granularity::layer, false);
  sweep_bench(state, p);
}
BENCHMARK(BM_Sweep_TinyLlama)->Arg(20)->Arg(10000)->Unit(benchmark::kMillisecond)->Iterations(1);

void BM_Sweep_Llama70B_PerLayer(benchmark::State& state) {
  static const PlanProblem p = llama70b(Granularity::layer, false);
  sweep_bench(state, p);
}
BENCHMARK(BM_Sweep_Llama70B_PerLayer)->Arg(20)->Arg(10000)->Unit(benchmark::kMillisecond)->Iterations(1);

void BM_Sweep_Llama70B_PerGemm(benchmark::State& state) {
  static const PlanProblem p = llama70b(Granularity::gemm, false);
  sweep_bench(state, p);
}
BENCHMARK(BM_Sweep_Llama70B_PerGemm)->Arg(10000)->Unit(benchmark::kMillisecond)->Iterations(1);

void BM_Sweep_MoE_PerLayer(benchmark::State& state) {
  sweep_bench(state, moe(13, Granularity::layer, false));
}
BENCHMARK(BM_Sweep_MoE_PerLayer)->Arg(100)->Unit(benchmark::kMillisecond)->Iterations(1);

// The previous sweep: one whole-model MILP per budget, nothing shared.
void BM_Sweep_TinyLlama_OnePlanPerBudget(benchmark::State& state) {
  static const PlanProblem p = tinyllama(Granularity::layer, false);
  PlanOptions o;
  o.method = PlanMethod::milp;
  for (auto _ : state)
    for (double b : budget_steps(static_cast<int>(state.range(0)))) {
      o.budget = Budget::share(b);
      benchmark::DoNotOptimize(solve(p, o).objective);
    }
}
BENCHMARK(BM_Sweep_TinyLlama_OnePlanPerBudget)->Arg(20)->Arg(1000)->Unit(benchmark::kMillisecond)->Iterations(1);

}  // namespace

// --moe-costs=FILE [--moe-blocks=N]: write the MoE cost table (per-GEMM
// form) instead of benchmarking.
int main(int argc, char** argv) {
  if (const char* v = std::getenv("SNIP_BENCH_VERBOSE")) g_verbosity = std::atoi(v);
  std::string out;
  int blocks = 130;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--moe-costs=", 12) == 0) out = argv[i] + 12;
    if (std::strncmp(argv[i], "--moe-blocks=", 13) == 0) blocks = std::atoi(argv[i] + 13);
  }
  if (!out.empty()) {
    std::ofstream(out) << to_json(moe_table(blocks, 7 + blocks)).dump() << "\n";
    std::printf("%s: %d MoE blocks, %d layers\n", out.c_str(), blocks, blocks * 772);
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
