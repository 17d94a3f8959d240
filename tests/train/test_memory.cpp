// The memory estimate checked before a model is built (snip/train/memory.h).
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <torch/torch.h>

#include "micro.h"
#include "snip/train/memory.h"
#include "snip/train/optimizer.h"
#include "snip/core/error.h"

namespace snip {
namespace {

LlamaConfig small() {
  LlamaConfig c;
  c.vocab_size = 512;
  c.hidden_size = 64;
  c.intermediate_size = 172;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 64;
  c.tie_word_embeddings = false;
  return c;
}

TEST(Memory, TermsByHand) {
  const LlamaConfig c = small();
  // P counted from the model LibTorch builds, not from the formula under test.
  LlamaForCausalLM m(c);
  int64_t P = 0;
  for (const auto& p : m->parameters()) P += p.numel();
  // By hand: embed + lm_head 2·512·64 = 65536; per layer q,o 2·64·64 = 8192,
  // k,v 2·64·32 = 4096, gate/up/down 3·64·172 = 33024, 2 norms 128: 45440;
  // two layers 90880; final norm 64. Total 156480.
  ASSERT_EQ(P, 156480);
  const MemoryEstimate e = training_memory(c, 8, 64);
  EXPECT_EQ(e.weights, 4.0 * P);
  EXPECT_EQ(e.gradients, 4.0 * P);
  EXPECT_EQ(e.adamw, 8.0 * P);
  // 4·B·T·L·(3C + 3F + H·T) = 4·8·64·2·(192 + 516 + 256) = 3948544.
  EXPECT_EQ(e.activations, 3948544.0);
  EXPECT_EQ(e.logits, 8.0 * 8 * 64 * 512);
  EXPECT_EQ(e.total(), 16.0 * P + 3948544.0 + 8.0 * 8 * 64 * 512);
  const MemoryEstimate i = inference_memory(c, 0, 0);
  EXPECT_EQ(i.total(), 4.0 * P);
  // Two ranks on this machine: every term twice, but ZeRO-1 shards AdamW's
  // moments (each rank 8P/2: 8P in all) and ZeRO-2 the gradients too.
  const MemoryEstimate two = training_memory(c, 8, 64, RankLayout{2, 2, 0});
  EXPECT_EQ(two.total(), 2 * e.total());
  const MemoryEstimate z1 = training_memory(c, 8, 64, RankLayout{2, 2, 1});
  EXPECT_EQ(z1.adamw, 8.0 * P);
  EXPECT_EQ(z1.gradients, 2 * 4.0 * P);
  const MemoryEstimate z2 = training_memory(c, 8, 64, RankLayout{2, 2, 2});
  EXPECT_EQ(z2.gradients, 4.0 * P);
  EXPECT_EQ(z2.weights, 2 * 4.0 * P);
  // 4 ranks on 2 machines, 2 here, stage 1: this machine holds half the shards.
  EXPECT_EQ(training_memory(c, 8, 64, RankLayout{4, 2, 1}).adamw, 2 * 8.0 * P / 4);
}

TEST(Memory, NoOverflowForAbsurdShapes) {
  LlamaConfig c = small();
  c.num_hidden_layers = 0x7FFFFFFF;
  c.intermediate_size = 0x7FFFFFFF;
  const double t = training_memory(c, 1 << 20, 1 << 20).total();
  EXPECT_TRUE(std::isfinite(t));
  EXPECT_GT(t, 1e30);
}

TEST(Memory, CheckNamesNeedAndAvailability) {
  const MemoryEstimate e = training_memory(small(), 8, 64);
  EXPECT_NO_THROW(check_memory(e, 0, "x"));  // unknown availability: no check
  EXPECT_NO_THROW(check_memory(e, static_cast<long long>(e.total()), "x"));
  const std::string msg = test::error_of([&] { check_memory(e, 1 << 20, "snip train"); });
  EXPECT_EQ(msg.rfind("snip train: the model and batch need at least ", 0), 0u) << msg;
  EXPECT_NE(msg.find("but 0.000977 GiB of memory are available"), std::string::npos) << msg;
  EXPECT_NE(msg.find("AdamW moments"), std::string::npos) << msg;
}

TEST(Memory, IsALowerBoundOfAMeasuredTrainingStep) {
  // One AdamW step of a model whose estimate is ~100 MiB: the process's peak
  // resident size must be at least the estimate.
  LlamaConfig c = small();
  c.vocab_size = 8192;
  c.hidden_size = 256;
  c.intermediate_size = 688;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 8;
  c.max_position_embeddings = 128;
  const int64_t B = 8, T = 128;
  const double est = training_memory(c, B, T).total();
  ASSERT_GT(est, 50.0 * (1 << 20));
  torch::manual_seed(0);
  LlamaForCausalLM m(c);
  TrainConfig tc;
  auto opt = make_optimizer(m, tc);
  const torch::Tensor ids = torch::randint(0, c.vocab_size, {B, T}, torch::kLong);
  LlamaForCausalLMImpl::loss(m(ids), ids).backward();
  opt->step();
  rusage u{};
  ASSERT_EQ(getrusage(RUSAGE_SELF, &u), 0);
  EXPECT_GE(double(u.ru_maxrss) * 1024.0, est) << "peak RSS below the lower bound";
}

}  // namespace
}  // namespace snip
