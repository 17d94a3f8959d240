// dist/zero.h without other processes: the ownership partition (every
// parameter exactly once, balanced, deterministic), the ZeRO gradient norm
// against LibTorch's clip_grad_norm_ (bit for bit), and the optimizer shards
// (write, re-read by name on another partition). The 2-rank runs are
// tests/cli/test_zero.py.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "snip/dist/zero.h"
#include "snip/io/atomic_file.h"
#include "snip/model/llama.h"
#include "snip/run/checkpoint_files.h"
#include "snip/core/error.h"

namespace snip::dist {
namespace {

namespace fs = std::filesystem;

bool bitwise_equal(const torch::Tensor& a, const torch::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
         std::memcmp(a.contiguous().data_ptr(), b.contiguous().data_ptr(), size_t(a.numel()) * a.element_size()) == 0;
}

LlamaConfig micro() {
  LlamaConfig c;
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.max_position_embeddings = 32;
  return c;
}

void named(LlamaForCausalLM& m, std::vector<std::string>& names, std::vector<torch::Tensor>& params) {
  for (const auto& np : m->named_parameters()) names.push_back(np.key()), params.push_back(np.value());
}

TEST(DistZero, PartitionOwnsEveryParameterOnceBalancedAndDeterministic) {
  torch::manual_seed(0);
  LlamaForCausalLM m(micro());
  std::vector<std::string> names;
  std::vector<torch::Tensor> params;
  named(m, names, params);
  int64_t total = 0, largest = 0;
  for (const auto& p : params) total += p.numel(), largest = std::max<int64_t>(largest, p.numel());
  for (int R : {1, 2, 3, 4, 7}) {
    const ZeroPartition a = zero_partition(names, params, R), b = zero_partition(names, params, R);
    ASSERT_EQ(a.params.size(), params.size());
    EXPECT_EQ(a.owner, b.owner) << "R=" << R;  // deterministic
    EXPECT_EQ(a.offset, b.offset);
    // Every parameter exactly once: the owned lists partition the parameters.
    std::multiset<const void*> seen;
    int64_t sum = 0;
    for (int r = 0; r < R; ++r) {
      int64_t n = 0;
      for (const auto& p : a.owned(r)) seen.insert(p.unsafeGetTensorImpl()), n += p.numel();
      EXPECT_EQ(n, a.elements[size_t(r)]);
      sum += n;
    }
    EXPECT_EQ(sum, total);
    for (const auto& p : params) EXPECT_EQ(seen.count(p.unsafeGetTensorImpl()), 1u);
    // Greedy largest-first: max - min <= the largest parameter.
    const auto [mn, mx] = std::minmax_element(a.elements.begin(), a.elements.end());
    EXPECT_LE(*mx - *mn, largest) << "R=" << R;
    // Offsets: the owner's parameters in model order, back to back.
    for (int r = 0; r < R; ++r) {
      int64_t at = 0;
      for (size_t i = 0; i < params.size(); ++i)
        if (a.owner[i] == r) {
          EXPECT_EQ(a.offset[i], at) << names[i];
          at += params[i].numel();
        }
    }
  }
  // A tensor listed twice (a tied weight) is owned once, under its first name.
  std::vector<std::string> n2{"a", "b", "a_again"};
  std::vector<torch::Tensor> p2{params[0], params[1], params[0]};
  const ZeroPartition t = zero_partition(n2, p2, 2);
  EXPECT_EQ(t.names, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(t.owner, (std::vector<int>{0, 1}));
  EXPECT_THROW(zero_partition(names, params, 0), std::invalid_argument);
}

// One rank owns everything: zero_clip_grad_norm must return clip_grad_norm_'s
// norm and leave the gradients with its bits, clipping or not.
TEST(DistZero, GradNormEqualsClipGradNormBitForBit) {
  torch::manual_seed(1);
  LlamaForCausalLM m(micro());
  std::vector<std::string> names;
  std::vector<torch::Tensor> params;
  named(m, names, params);
  const ZeroPartition part = zero_partition(names, params, 1);
  for (double clip : {1e-3, 1.0, std::numeric_limits<double>::infinity()}) {
    std::vector<torch::Tensor> g;
    for (const auto& p : params) g.push_back(torch::randn_like(p) * 0.1);
    for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = g[i].clone();
    const double want = torch::nn::utils::clip_grad_norm_(params, clip);
    std::vector<torch::Tensor> want_g;
    for (const auto& p : params) want_g.push_back(p.grad().clone());
    for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = g[i].clone();
    const double got = zero_clip_grad_norm(nullptr, part, clip);
    EXPECT_EQ(std::memcmp(&got, &want, sizeof got), 0) << got << " vs " << want << " clip " << clip;
    for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(bitwise_equal(params[i].grad(), want_g[i])) << names[i];
  }
}

// Shards written under a 3-rank partition are read back by name under a
// 2-rank one and a 1-rank one: every parameter's m, v and step bit for bit.
TEST(DistZero, ShardsReshardByName) {
  torch::manual_seed(2);
  LlamaForCausalLM m(micro());
  std::vector<std::string> names;
  std::vector<torch::Tensor> params;
  named(m, names, params);
  const ZeroPartition p3 = zero_partition(names, params, 3);
  std::vector<AdamEntry> want;
  const fs::path dir = fs::temp_directory_path() / ("snip-zero-test-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  nlohmann::json crc;
  std::vector<std::unique_ptr<torch::optim::AdamW>> opts;
  for (size_t i = 0; i < params.size(); ++i)
    want.push_back({torch::randn_like(params[i]), torch::rand_like(params[i]), int64_t(i % 5 + 1)});
  for (int r = 0; r < 3; ++r) {
    opts.push_back(std::make_unique<torch::optim::AdamW>(p3.owned(r)));
    for (size_t i = 0; i < params.size(); ++i)
      if (p3.owner[i] == r) set_adam_entry(*opts.back(), params[i], want[i]);
    const std::string bytes = optimizer_shard_bytes(*opts.back(), p3, r);
    io::write_file_atomic((dir / optimizer_shard_name(r)).string(), bytes);
    crc[optimizer_shard_name(r)] = crc32_of(bytes);
  }
  io::write_file_atomic((dir / "optimizer_index.json").string(), optimizer_index(p3, 1).dump(2));
  for (int R : {2, 1}) {
    const ZeroPartition pr = zero_partition(names, params, R);
    for (int r = 0; r < R; ++r) {
      torch::optim::AdamW opt(pr.owned(r));
      load_optimizer_shards(dir.string(), crc, opt, pr, 10);
      for (size_t i = 0; i < params.size(); ++i) {
        AdamEntry e;
        const bool has = get_adam_entry(opt, params[i], e);
        EXPECT_EQ(has, pr.owner[i] == r) << names[i];
        if (!has) continue;
        EXPECT_TRUE(bitwise_equal(e.exp_avg, want[i].exp_avg)) << names[i];
        EXPECT_TRUE(bitwise_equal(e.exp_avg_sq, want[i].exp_avg_sq)) << names[i];
        EXPECT_EQ(e.step, want[i].step);
      }
    }
  }
  // A step past the checkpoint's is corrupt; a damaged shard is named.
  {
    torch::optim::AdamW opt(params);
    try {
      load_optimizer_shards(dir.string(), crc, opt, zero_partition(names, params, 1), 2);
      ADD_FAILURE() << "expected a UserError";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("outside [1, 2]"), std::string::npos) << e.what();
    }
    io::write_file_atomic((dir / optimizer_shard_name(1)).string(), "garbage");
    try {
      load_optimizer_shards(dir.string(), crc, opt, zero_partition(names, params, 1), 10);
      ADD_FAILURE() << "expected a UserError";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(optimizer_shard_name(1) + ": checksum mismatch"), std::string::npos)
          << e.what();
    }
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace snip::dist
