// Module gradients against central finite differences in float64, and the
// quantized linear layer's explicit GEMMs against autograd's own linear.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "snip/model/llama.h"

using namespace snip;

namespace {

LlamaConfig tiny_cfg() {
  LlamaConfig c;
  c.vocab_size = 11;
  c.hidden_size = 8;
  c.intermediate_size = 12;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 16;
  c.init_std = 0.3;  // large enough that every path matters
  return c;
}

// Checks d f / d p along a random direction for every parameter of `params`,
// via central differences: |fd - analytic| <= tol * max(1, |analytic|).
// f must be deterministic; float64 keeps the truncation error ~h² ≈ 1e-12.
void check_grads(const std::function<torch::Tensor()>& f, const std::vector<torch::Tensor>& params,
                 double tol = 1e-7) {
  for (auto& p : params) p.mutable_grad() = torch::Tensor();
  f().backward();
  const double h = 1e-6;
  for (const auto& p : params) {
    ASSERT_TRUE(p.grad().defined());
    torch::Tensor dir = torch::randn_like(p);
    const double analytic = (p.grad() * dir).sum().item<double>();
    torch::NoGradGuard ng;
    p.add_(dir * h);
    const double fp = f().item<double>();
    p.add_(dir * (-2 * h));
    const double fm = f().item<double>();
    p.add_(dir * h);
    const double fd = (fp - fm) / (2 * h);
    EXPECT_NEAR(fd, analytic, tol * std::max(1.0, std::abs(analytic)));
  }
}

}  // namespace

TEST(QuantLinear, MatchesTorchLinearAndItsGradients) {
  torch::manual_seed(0);
  QuantLinear l(7, 5, 0.5);
  l->to(torch::kDouble);
  torch::Tensor x = torch::randn({3, 4, 7}, torch::kDouble).requires_grad_(true);
  torch::Tensor y = l(x);
  ASSERT_EQ(y.sizes(), (std::vector<int64_t>{3, 4, 5}));
  torch::Tensor g = torch::randn_like(y);
  y.backward(g);
  // Reference: autograd through torch::nn::functional::linear.
  torch::Tensor x2 = x.detach().clone().requires_grad_(true);
  torch::Tensor w2 = l->weight.detach().clone().requires_grad_(true);
  torch::Tensor y2 = torch::nn::functional::linear(x2, w2);
  y2.backward(g);
  EXPECT_TRUE(torch::allclose(y, y2, 0, 1e-14));
  EXPECT_TRUE(torch::allclose(x.grad(), x2.grad(), 0, 1e-14));
  EXPECT_TRUE(torch::allclose(l->weight.grad(), w2.grad(), 0, 1e-14));
}

TEST(QuantLinear, Bf16GemmRoundsOperands) {
  torch::manual_seed(1);
  QuantLinear l(64, 32, 1.0);
  l->precision.gemm_dtype = at::kBFloat16;
  torch::Tensor x = torch::randn({16, 64});
  torch::Tensor y = l(x);
  torch::Tensor ref = torch::mm(x.to(at::kBFloat16).to(at::kFloat), l->weight.detach().to(at::kBFloat16).to(at::kFloat).t());
  // BF16 output rounding: relative error <= 2^-8 per element (plus accumulation order).
  EXPECT_EQ(y.scalar_type(), at::kFloat);
  EXPECT_LT(((y - ref).abs() / (ref.abs() + 1e-3)).max().item<double>(), 1.0 / 128);
  EXPECT_GT((y - torch::mm(x, l->weight.detach().t())).abs().max().item<double>(), 0.0);
}

TEST(Modules, RMSNormGradientsMatchFiniteDifferences) {
  torch::manual_seed(2);
  RMSNorm n(6, 1e-5);
  n->to(torch::kDouble);
  { torch::NoGradGuard ng; n->weight.normal_(1.0, 0.3); }
  torch::Tensor x = torch::randn({2, 3, 6}, torch::kDouble).requires_grad_(true);
  torch::Tensor g = torch::randn({2, 3, 6}, torch::kDouble);
  check_grads([&] { return (n(x) * g).sum(); }, {x, n->weight});
}

TEST(Modules, RMSNormMatchesHandComputedValue) {
  RMSNorm n(2, 0.0);
  n->to(torch::kDouble);
  torch::Tensor x = torch::tensor({3.0, 4.0}, torch::kDouble);
  // rms = sqrt((9+16)/2) = sqrt(12.5)
  torch::Tensor y = n(x);
  EXPECT_NEAR(y[0].item<double>(), 3.0 / std::sqrt(12.5), 1e-15);
  EXPECT_NEAR(y[1].item<double>(), 4.0 / std::sqrt(12.5), 1e-15);
}

TEST(Modules, AttentionAndMlpGradientsMatchFiniteDifferences) {
  torch::manual_seed(3);
  LlamaConfig c = tiny_cfg();
  Attention att(c);
  MLP mlp(c);
  att->to(torch::kDouble);
  mlp->to(torch::kDouble);
  auto [cos, sin] = rope_tables(5, c.head_dim(), c.rope_theta, torch::kDouble);
  torch::Tensor x = torch::randn({2, 5, c.hidden_size}, torch::kDouble).requires_grad_(true);
  torch::Tensor g = torch::randn({2, 5, c.hidden_size}, torch::kDouble);
  std::vector<torch::Tensor> ap{x};
  for (auto& p : att->parameters()) ap.push_back(p);
  check_grads([&] { return (att(x, cos, sin) * g).sum(); }, ap);
  std::vector<torch::Tensor> mp{x};
  for (auto& p : mlp->parameters()) mp.push_back(p);
  check_grads([&] { return (mlp(x) * g).sum(); }, mp);
}

// Both attention paths (explicit products; fused SDPA, train.attention):
// changing the last token leaves every earlier output as it was (the
// explicit path bit for bit, SDPA's kernel to 1e-14).
TEST(Modules, AttentionIsCausal) {
  for (bool sdpa : {false, true}) {
    SCOPED_TRACE(sdpa ? "sdpa" : "explicit");
    torch::manual_seed(4);
    LlamaConfig c = tiny_cfg();
    Attention att(c);
    att->to(torch::kDouble);
    att->sdpa = sdpa;
    auto [cos, sin] = rope_tables(6, c.head_dim(), c.rope_theta, torch::kDouble);
    torch::Tensor x = torch::randn({1, 6, c.hidden_size}, torch::kDouble);
    torch::Tensor y = att(x, cos, sin);
    torch::Tensor x2 = x.clone();
    x2.index_put_({0, 5}, torch::randn({c.hidden_size}, torch::kDouble));  // change the last token only
    torch::Tensor y2 = att(x2, cos, sin);
    EXPECT_TRUE(sdpa ? torch::allclose(y.narrow(1, 0, 5), y2.narrow(1, 0, 5), 0, 1e-14)
                     : torch::equal(y.narrow(1, 0, 5), y2.narrow(1, 0, 5)));
    EXPECT_FALSE(torch::allclose(y.narrow(1, 5, 1), y2.narrow(1, 5, 1), 0, 1e-6));
  }
}

TEST(Model, LossGradientsMatchFiniteDifferences) {
  torch::manual_seed(5);
  for (bool tied : {true, false}) {
    LlamaConfig c = tiny_cfg();
    c.tie_word_embeddings = tied;
    LlamaForCausalLM m(c);
    m->to(torch::kDouble);
    torch::Tensor ids = torch::randint(0, c.vocab_size, {2, 5}, torch::kLong);
    torch::Tensor tgt = torch::randint(0, c.vocab_size, {2, 5}, torch::kLong);
    check_grads([&] { return LlamaForCausalLMImpl::loss(m(ids), tgt); }, m->parameters());
  }
}

TEST(Model, HuggingFaceParameterNamesAndCounts) {
  LlamaConfig c = tiny_cfg();
  c.tie_word_embeddings = false;
  LlamaForCausalLM m(c);
  std::vector<std::string> names;
  int64_t count = 0;
  for (auto& [n, t] : m->hf_parameters()) names.push_back(n), count += t.numel();
  EXPECT_EQ(names.front(), "model.embed_tokens.weight");
  EXPECT_NE(std::find(names.begin(), names.end(), "model.layers.1.self_attn.k_proj.weight"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "model.layers.0.post_attention_layernorm.weight"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "model.norm.weight"), names.end());
  EXPECT_EQ(names.back(), "lm_head.weight");
  // By hand: V*C*2 + L*(C*C*2 + C*(NKV*HD)*2 + 3*C*F + 2*C) + C
  //        = 11*8*2 + 2*(128 + 8*4*2 + 3*8*12 + 16) + 8 = 176 + 2*496 + 8 = 1176
  EXPECT_EQ(count, 1176);
  EXPECT_EQ(c.num_parameters(), 1176);
  auto lin = m->linear_layers();
  ASSERT_EQ(lin.size(), 14u);
  EXPECT_EQ(lin[7]->name, "model.layers.1.self_attn.q_proj");
  EXPECT_EQ(lin[13]->layer_index, 13);
}

// ------------------------------------------------ fused attention (SDPA) --
// train.attention = sdpa runs at::scaled_dot_product_attention (GQA through
// enable_gqa) instead of the explicit products. In float64 both are the same
// function up to rounding (~1e-16 relative): any difference in mask, scale
// or which KV head serves which query head shows up as O(1).

TEST(Sdpa, EqualsTheExplicitAttentionInFloat64WithGqa) {
  torch::manual_seed(5);
  LlamaConfig c = tiny_cfg();  // 4 query heads over 2 KV heads
  ASSERT_EQ(c.num_attention_heads / c.num_key_value_heads, 2);
  Attention att(c);
  att->to(torch::kDouble);
  auto [cos, sin] = rope_tables(7, c.head_dim(), c.rope_theta, torch::kDouble);
  torch::Tensor x = torch::randn({3, 7, c.hidden_size}, torch::kDouble).requires_grad_(true);
  torch::Tensor g = torch::randn({3, 7, c.hidden_size}, torch::kDouble);
  auto run = [&](bool sdpa) {
    att->sdpa = sdpa;
    att->zero_grad();
    x.mutable_grad() = torch::Tensor();
    torch::Tensor y = att(x, cos, sin);
    (y * g).sum().backward();
    std::vector<torch::Tensor> out{y.detach(), x.grad().clone()};
    for (auto& p : att->parameters()) out.push_back(p.grad().clone());
    return out;
  };
  const auto ref = run(false), got = run(true);
  ASSERT_EQ(ref.size(), got.size());
  for (size_t i = 0; i < ref.size(); ++i)
    EXPECT_TRUE(torch::allclose(got[i], ref[i], 1e-12, 1e-12)) << "tensor " << i << " (0 = output, 1 = dx)";
}

TEST(Sdpa, HasFiniteDifferenceGradients) {
  torch::manual_seed(6);
  LlamaConfig c = tiny_cfg();
  Attention att(c);
  att->to(torch::kDouble);
  att->sdpa = true;
  auto [cos, sin] = rope_tables(6, c.head_dim(), c.rope_theta, torch::kDouble);
  torch::Tensor x = torch::randn({1, 6, c.hidden_size}, torch::kDouble);
  torch::Tensor xg = x.clone().requires_grad_(true);
  torch::Tensor g = torch::randn_like(x);
  std::vector<torch::Tensor> ap{xg};
  for (auto& p : att->parameters()) ap.push_back(p);
  check_grads([&] { return (att(xg, cos, sin) * g).sum(); }, ap);
}

TEST(Sdpa, Bf16ProductsStayWithinBf16RoundingOfTheExplicitPath) {
  // The BF16 baseline's setting: FP32 activations, QKᵀ and AV in BF16. Both
  // paths round Q, K, V to BF16 (8 significant bits, unit roundoff 2^-8);
  // they differ in where the scores and probabilities are rounded, so the
  // outputs agree to a few BF16 ulps, not bits: bound 2^-6 relative (Frobenius).
  torch::manual_seed(7);
  LlamaConfig c = tiny_cfg();
  Attention att(c);
  att->bmm_dtype = at::kBFloat16;
  auto [cos, sin] = rope_tables(9, c.head_dim(), c.rope_theta, torch::kFloat);
  torch::Tensor x = torch::randn({2, 9, c.hidden_size});
  torch::NoGradGuard ng;
  att->sdpa = false;
  const torch::Tensor ref = att(x, cos, sin);
  att->sdpa = true;
  const torch::Tensor got = att(x, cos, sin);
  EXPECT_EQ(got.scalar_type(), torch::kFloat);
  const double rel = ((got - ref).norm() / ref.norm()).item<double>();
  EXPECT_LT(rel, 1.0 / 64) << "relative Frobenius difference " << rel;
  EXPECT_GT(rel, 0.0) << "BF16 operands should leave some rounding difference";
}

TEST(Sdpa, TrainAttentionResolvesPerDevice) {
  EXPECT_FALSE(resolve_attention_sdpa("auto", torch::Device(torch::kCPU)));
  EXPECT_TRUE(resolve_attention_sdpa("auto", torch::Device(torch::kCUDA, 0)));
  EXPECT_TRUE(resolve_attention_sdpa("sdpa", torch::Device(torch::kCPU)));
  EXPECT_FALSE(resolve_attention_sdpa("math", torch::Device(torch::kCUDA, 0)));
  // FP32 or emulated-BF16 products: auto keeps the explicit path (the fused
  // kernels take half types; the emulation is the explicit path's).
  EXPECT_FALSE(resolve_attention_sdpa("auto", torch::Device(torch::kCUDA, 0), /*native_bf16=*/false));
  EXPECT_TRUE(resolve_attention_sdpa("sdpa", torch::Device(torch::kCUDA, 0), /*native_bf16=*/false));
  try {
    resolve_attention_sdpa("flash", torch::Device(torch::kCPU));
    FAIL() << "expected a UserError";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("train.attention"), std::string::npos) << e.what();
  }
  LlamaConfig c = tiny_cfg();
  LlamaForCausalLM m(c);
  EXPECT_FALSE(m->attention_sdpa());
  m->set_attention_sdpa(true);
  EXPECT_TRUE(m->attention_sdpa());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    EXPECT_TRUE(m->model->layers->ptr(i)->as<DecoderLayer>()->self_attn->sdpa);
}
