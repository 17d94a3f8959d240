// dist/pipeline.h without other processes: the rank layout, the split of
// blocks into stages (against an exhaustive search), the schedules (a
// simulation of S stages exchanging messages: every schedule completes, the
// activations held), the cost factors, the FP8 boundary codec (SQNR and
// bytes), and LlamaForCausalLMImpl::forward_stage chained over stages ==
// forward() bit for bit. The multi-process runs are tests/cli/test_pipeline.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "snip/dist/pipeline.h"
#include "snip/model/llama.h"
#include "snip/core/error.h"

namespace snip::dist {
namespace {

TEST(PipelineLayout, RanksAndStages) {
  PipelineLayout l;
  l.stages = 2;
  l.replicas = 2;
  l.bounds = {0, 3, 5};
  // Megatron-LM's order: r = s·D + d.
  EXPECT_EQ(l.rank_of(1, 0), 2);
  EXPECT_EQ(l.stage_of(3), 1);
  EXPECT_EQ(l.replica_of(3), 1);
  EXPECT_EQ(l.pipeline_ranks(1), (std::vector<int>{1, 3}));
  EXPECT_EQ(l.replica_ranks(1), (std::vector<int>{2, 3}));
  EXPECT_EQ(l.stage_of_param("model.embed_tokens.weight"), 0);
  EXPECT_EQ(l.stage_of_param("model.layers.2.mlp.down_proj.weight"), 0);
  EXPECT_EQ(l.stage_of_param("model.layers.3.input_layernorm.weight"), 1);
  EXPECT_EQ(l.stage_of_param("model.norm.weight"), 1);
  EXPECT_EQ(l.stage_of_param("lm_head.weight"), 1);
  EXPECT_THROW(l.stage_of_param("model.layers.7.mlp.up_proj.weight"), UserError);
  EXPECT_THROW(l.stage_of_param("something.else"), UserError);
  EXPECT_EQ(l.describe(), "0-2 | 3-4");
  EXPECT_EQ(block_of("model.layers.12.mlp.up_proj"), 12);
  EXPECT_EQ(block_of("model.layers.x.mlp"), -1);
  EXPECT_EQ(block_of("model.norm.weight"), -1);
}

// The smallest largest stage cost over every contiguous split (exhaustive).
double brute_best(const std::vector<double>& c, int S, double fe, double le) {
  const int L = int(c.size());
  double best = std::numeric_limits<double>::infinity();
  std::vector<int64_t> b{0};
  std::function<void(int)> rec = [&](int a) {
    if (int(b.size()) == S) {
      b.push_back(L);
      const auto costs = stage_costs(b, c, fe, le);
      best = std::min(best, *std::max_element(costs.begin(), costs.end()));
      b.pop_back();
      return;
    }
    for (int e = a + 1; e <= L - (S - int(b.size())); ++e) {
      b.push_back(e);
      rec(e);
      b.pop_back();
    }
  };
  rec(0);
  return best;
}

TEST(PipelineSplit, HandDerived) {
  // Equal blocks, no extras: the even split, extra blocks first.
  EXPECT_EQ(balanced_split({1, 1, 1, 1, 1}, 2), (std::vector<int64_t>{0, 3, 5}));
  // A head of 1.5 blocks on the last stage: [3 | 1 + 1.5] = max 3 beats [2 | 2 + 1.5].
  EXPECT_EQ(balanced_split({1, 1, 1, 1}, 2, 0.0, 1.5), (std::vector<int64_t>{0, 3, 4}));
  // One heavy block alone.
  EXPECT_EQ(balanced_split({4, 1, 1, 1, 1}, 2), (std::vector<int64_t>{0, 1, 5}));
  EXPECT_EQ(balanced_split({1, 2, 3}, 3), (std::vector<int64_t>{0, 1, 2, 3}));
  const std::vector<double> costs = stage_costs({0, 1, 5}, {4, 1, 1, 1, 1}, 0.5, 0.25);
  EXPECT_EQ(costs, (std::vector<double>{4.5, 4.25}));
  EXPECT_DOUBLE_EQ(imbalance({3, 1}), 1.5);
  EXPECT_DOUBLE_EQ(imbalance({0, 0}), 1.0);
}

TEST(PipelineSplit, OptimalAgainstExhaustiveSearch) {
  std::mt19937 gen(7);
  std::uniform_real_distribution<double> u(0.1, 3.0);
  for (int trial = 0; trial < 200; ++trial) {
    const int L = 2 + int(gen() % 7), S = 1 + int(gen() % std::min(L, 4));
    std::vector<double> c(static_cast<size_t>(L), 0.0);
    for (double& x : c) x = u(gen);
    const double fe = trial % 3 == 0 ? u(gen) : 0.0, le = trial % 2 == 0 ? u(gen) : 0.0;
    const std::vector<int64_t> b = balanced_split(c, S, fe, le);
    ASSERT_EQ(b.size(), size_t(S) + 1);
    ASSERT_EQ(b.front(), 0);
    ASSERT_EQ(b.back(), L);
    for (int s = 0; s < S; ++s) ASSERT_LT(b[size_t(s)], b[size_t(s) + 1]) << "empty stage";
    const auto costs = stage_costs(b, c, fe, le);
    EXPECT_NEAR(*std::max_element(costs.begin(), costs.end()), brute_best(c, S, fe, le), 1e-9) << "trial " << trial;
  }
}

TEST(PipelineSplit, ConfiguredSplits) {
  const std::vector<double> c(5, 1.0);
  EXPECT_EQ(stage_bounds("even", 5, 2, c, 0, 0), (std::vector<int64_t>{0, 3, 5}));
  EXPECT_EQ(stage_bounds("even", 7, 3, std::vector<double>(7, 1.0), 0, 0), (std::vector<int64_t>{0, 3, 5, 7}));
  EXPECT_EQ(stage_bounds("1,4", 5, 2, c, 0, 0), (std::vector<int64_t>{0, 1, 5}));
  // [4 | 1 + 2] and [3 | 2 + 2] both have a largest stage of 4: the earlier stage takes the block.
  EXPECT_EQ(stage_bounds("balanced", 5, 2, c, 0, 2.0), (std::vector<int64_t>{0, 4, 5}));
  EXPECT_EQ(stage_bounds("balanced", 5, 2, c, 0, 3.0), (std::vector<int64_t>{0, 4, 5}));
  EXPECT_THROW(stage_bounds("3,3", 5, 2, c, 0, 0), UserError);
  EXPECT_THROW(stage_bounds("5", 5, 2, c, 0, 0), UserError);
  EXPECT_THROW(stage_bounds("0,5", 5, 2, c, 0, 0), UserError);
  EXPECT_THROW(stage_bounds("x,y", 5, 2, c, 0, 0), UserError);
  EXPECT_THROW(stage_bounds("even", 5, 6, c, 0, 0), UserError);
}

// Runs the S stages' schedules against each other: F(m) on stage s needs
// F(m) done on s-1, B(m) on s needs B(m) done on s+1 (and F(m) on s). Returns
// false on a deadlock; `held` = the most forwards awaiting their backward on each stage.
bool simulate(PipelineSchedule sched, int S, int M, std::vector<int>& held) {
  std::vector<std::vector<std::pair<bool, int>>> ops;
  for (int s = 0; s < S; ++s) ops.push_back(schedule_ops(sched, S, s, M));
  std::vector<size_t> pc(size_t(S), 0);
  std::vector<std::vector<char>> fdone(size_t(S), std::vector<char>(size_t(M), 0)), bdone = fdone;
  held.assign(size_t(S), 0);
  std::vector<int> live(size_t(S), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < S; ++s) {
      if (pc[size_t(s)] == ops[size_t(s)].size()) continue;
      const auto [fwd, m] = ops[size_t(s)][pc[size_t(s)]];
      const bool ready = fwd ? (s == 0 || fdone[size_t(s) - 1][size_t(m)])
                             : (fdone[size_t(s)][size_t(m)] && (s == S - 1 || bdone[size_t(s) + 1][size_t(m)]));
      if (!ready) continue;
      (fwd ? fdone : bdone)[size_t(s)][size_t(m)] = 1;
      live[size_t(s)] += fwd ? 1 : -1;
      held[size_t(s)] = std::max(held[size_t(s)], live[size_t(s)]);
      ++pc[size_t(s)];
      progress = true;
    }
  }
  for (int s = 0; s < S; ++s)
    if (pc[size_t(s)] != ops[size_t(s)].size()) return false;
  return true;
}

TEST(PipelineSchedule, OneFOneBOrder) {
  using Ops = std::vector<std::pair<bool, int>>;
  // PipeDream-Flush (Narayanan et al. 2021, section 2.2.1): S-s-1 warm-up
  // forwards, then one forward and one backward, then the remaining backwards.
  EXPECT_EQ(schedule_ops(PipelineSchedule::k1F1B, 4, 0, 4),
            (Ops{{true, 0}, {true, 1}, {true, 2}, {true, 3}, {false, 0}, {false, 1}, {false, 2}, {false, 3}}));
  EXPECT_EQ(schedule_ops(PipelineSchedule::k1F1B, 4, 1, 4),
            (Ops{{true, 0}, {true, 1}, {true, 2}, {false, 0}, {true, 3}, {false, 1}, {false, 2}, {false, 3}}));
  EXPECT_EQ(schedule_ops(PipelineSchedule::k1F1B, 4, 3, 4),
            (Ops{{true, 0}, {false, 0}, {true, 1}, {false, 1}, {true, 2}, {false, 2}, {true, 3}, {false, 3}}));
  EXPECT_EQ(schedule_ops(PipelineSchedule::kGpipe, 2, 1, 2), (Ops{{true, 0}, {true, 1}, {false, 0}, {false, 1}}));
}

TEST(PipelineSchedule, EveryScheduleCompletesAndBoundsActivations) {
  for (const PipelineSchedule sched : {PipelineSchedule::kGpipe, PipelineSchedule::k1F1B})
    for (int S = 1; S <= 6; ++S)
      for (int M = 1; M <= 9; ++M) {
        for (int s = 0; s < S; ++s) {
          const auto ops = schedule_ops(sched, S, s, M);
          ASSERT_EQ(ops.size(), size_t(2 * M));
          int f = 0, b = 0;  // forwards and backwards each in micro-batch order
          for (const auto& [fwd, m] : ops) ASSERT_EQ(m, fwd ? f++ : b++);
        }
        std::vector<int> held;
        ASSERT_TRUE(simulate(sched, S, M, held)) << to_string(sched) << " S=" << S << " M=" << M << " deadlocks";
        for (int s = 0; s < S; ++s)
          EXPECT_EQ(held[size_t(s)], sched == PipelineSchedule::kGpipe ? M : std::min(M, S - s)) << to_string(sched) << " S=" << S << " M=" << M;
      }
  EXPECT_DOUBLE_EQ(ideal_bubble(4, 8), 3.0 / 11.0);
  EXPECT_DOUBLE_EQ(ideal_bubble(1, 8), 0.0);
}

TEST(PipelineCost, Factors) {
  const auto f = stage_cost_factors(recipes::RecipeSet(), "bits", {"fp4", "fp8", "bf16", "mxfp4", "nvfp4"});
  EXPECT_EQ(f.at("fp4"), 0.25);
  EXPECT_EQ(f.at("fp8"), 0.5);
  EXPECT_EQ(f.at("bf16"), 1.0);
  EXPECT_EQ(f.at("mxfp4"), 0.25);
  const auto g = stage_cost_factors(recipes::RecipeSet(), "fp4=0.4,fp8=0.7", {"fp4", "fp8", "bf16"});
  EXPECT_EQ(g.at("fp4"), 0.4);
  EXPECT_EQ(g.at("fp8"), 0.7);
  EXPECT_EQ(g.at("bf16"), 1.0);
  for (const char* bad : {"fp4", "fp4=0", "fp4=-1", "=1", "fp4=x", "fp4=1,fp8"})
    EXPECT_THROW(stage_cost_factors(recipes::RecipeSet(), bad, {"fp4"}), UserError) << bad;
}

TEST(PipelinePartition, OwnersOffsetsAndTiedOnce) {
  const torch::Tensor a = torch::zeros({3, 2}), b = torch::zeros({5}), c = torch::zeros({4});
  const ZeroPartition p = owner_partition({"a", "b", "a_again", "c"}, {a, b, a, c}, {0, 1, 1, 1}, 2);
  ASSERT_EQ(p.params.size(), 3u);  // the tied tensor once, under its first name
  EXPECT_EQ(p.names, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(p.owner, (std::vector<int>{0, 1, 1}));
  EXPECT_EQ(p.offset, (std::vector<int64_t>{0, 0, 5}));
  EXPECT_EQ(p.elements, (std::vector<int64_t>{6, 9}));
}

double sqnr_db(const torch::Tensor& x, const torch::Tensor& q) {
  return 10.0 * std::log10(x.pow(2).sum().item<double>() / (x - q).pow(2).sum().item<double>());
}

TEST(PipelineBoundary, Fp8CodecSqnrAndBytes) {
  torch::manual_seed(3);
  const torch::Tensor x = torch::randn({2, 16, 32});
  torch::Tensor e4 = x.clone(), e5 = x.clone();
  EXPECT_EQ(boundary_quantize(e4, false), 2 * 16 * 32 + 4);
  EXPECT_EQ(boundary_quantize(e5, true), 2 * 16 * 32 + 4);
  // RNE with 3 (2) mantissa bits: relative error <= 2^-4 (2^-3) for normal
  // values; for Gaussian data about 31 dB (25 dB); the amax maps to 448 x scale.
  EXPECT_GT(sqnr_db(x, e4), 28.0);
  EXPECT_GT(sqnr_db(x, e5), 22.0);
  EXPECT_LT(sqnr_db(x, e5), sqnr_db(x, e4));
  EXPECT_NEAR(e4.abs().max().item<float>(), x.abs().max().item<float>(), 1e-6 * x.abs().max().item<float>());
  // On the wire: one byte per element + the FP32 scale; decoded bit for bit
  // as boundary_quantize leaves the sender's tensor.
  for (bool e5m2 : {false, true}) {
    const torch::Tensor bytes = boundary_encode(x, e5m2);
    EXPECT_EQ(bytes.numel(), x.numel() + 4);
    EXPECT_EQ(bytes.scalar_type(), torch::kUInt8);
    torch::Tensor back = torch::empty_like(x);
    boundary_decode(bytes, e5m2, back);
    EXPECT_EQ(std::memcmp(back.data_ptr(), (e5m2 ? e5 : e4).data_ptr(), size_t(x.numel()) * 4), 0) << e5m2;
    EXPECT_THROW(boundary_decode(bytes.narrow(0, 0, 10), e5m2, back), UserError);
  }
  // Hand-derived: amax 448 gives decode scale 1, so 1.0, -2.5 and 448 are
  // their own E4M3 codes: 0x38 (0 0111 000), 0xC2 (1 1000 010), 0x7E.
  const torch::Tensor h = torch::tensor({1.0f, -2.5f, 448.0f});
  const torch::Tensor hb = boundary_encode(h, false);
  const uint8_t* hp = hb.data_ptr<uint8_t>();
  EXPECT_EQ(hp[0], 0x38);
  EXPECT_EQ(hp[1], 0xC2);
  EXPECT_EQ(hp[2], 0x7E);
  float scale;
  std::memcpy(&scale, hp + 3, 4);
  EXPECT_EQ(scale, 1.0f);
  torch::Tensor again = e4.clone();
  boundary_quantize(again, false);
  EXPECT_TRUE(torch::equal(again, e4)) << "quantizing the decoded values again changes nothing";
}

TEST(PipelineModel, ForwardStagesEqualForwardBitForBit) {
  for (bool tied : {false, true}) {
    LlamaConfig c;
    c.vocab_size = 64;
    c.hidden_size = 32;
    c.intermediate_size = 64;
    c.num_hidden_layers = 3;
    c.num_attention_heads = 2;
    c.num_key_value_heads = 1;
    c.max_position_embeddings = 16;
    c.tie_word_embeddings = tied;
    torch::manual_seed(1);
    LlamaForCausalLM m(c);
    const torch::Tensor ids = torch::randint(0, 64, {2, 8}, torch::kLong);
    torch::NoGradGuard ng;
    const torch::Tensor ref = m(ids);
    const torch::Tensor h0 = m->forward_stage(ids, 0, 1, true, false);
    const torch::Tensor h1 = m->forward_stage(h0, 1, 2, false, false);
    const torch::Tensor out = m->forward_stage(h1, 2, 3, false, true);
    ASSERT_EQ(out.sizes(), ref.sizes());
    EXPECT_EQ(std::memcmp(out.data_ptr(), ref.data_ptr(), size_t(ref.numel()) * 4), 0) << "tied " << tied;
    EXPECT_THROW(m->forward_stage(ids, 2, 5, true, true), UserError);
  }
}

}  // namespace
}  // namespace snip::dist
