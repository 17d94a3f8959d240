// SNIP-LoRA (model/lora.h): the adapter's gradients against finite
// differences, B = 0 equals the base, merge equals the adapted model, packed
// base weights equal the fake-quantized operands bit for bit, the PEFT files,
// and the stats step on a frozen base (LD alone).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "micro.h"
#include "snip/config/llama_config.h"
#include "snip/io/atomic_file.h"
#include "snip/io/json.h"
#include "snip/io/safetensors.h"
#include "snip/method/stats.h"
#include "snip/model/lora.h"
#include "snip/model/matmul.h"
#include "snip/model/quantizers.h"
#include "snip/core/error.h"

using namespace snip;
using torch::Tensor;
namespace fs = std::filesystem;

namespace {

LlamaConfig tiny_cfg() { return test::two_block_llama(); }

LoraConfig lora_cfg(int64_t r = 4, double alpha = 8) {
  LoraConfig l;
  l.rank = r;
  l.alpha = alpha;
  l.target = {"*_proj"};
  return l;
}

// B random (the adapters then change the output).
void randomise_b(LlamaForCausalLM& m, double std) {
  torch::NoGradGuard ng;
  for (auto l : m->linear_layers())
    if (l->lora_rank > 0) l->lora_B.copy_(torch::randn_like(l->lora_B) * std);
}

}  // namespace

TEST(Lora, AdapterGradientsMatchFiniteDifferences) {
  // One layer in float64: y = x·Wᵀ + s·x·Aᵀ·Bᵀ, L = <y, R>. Central
  // differences (h = 1e-6) of L in a few entries of A, B and x against
  // autograd; float64 leaves ~1e-8 relative error.
  torch::manual_seed(1);
  QuantLinear lin(12, 8, 0.3);
  lin->name = "l";
  lin->add_lora(torch::randn({3, 12}) * 0.2, torch::randn({8, 3}) * 0.2, 0.5, 0.0);
  lin->to(torch::kDouble);
  lin->weight.set_requires_grad(false);
  const Tensor x = torch::randn({5, 12}, torch::kDouble).requires_grad_(true);
  const Tensor R = torch::randn({5, 8}, torch::kDouble);
  auto loss = [&] { return (lin(x) * R).sum(); };
  loss().backward();
  // Hand-derived too: dL/dB = s·Rᵀ·(x·Aᵀ), dL/dA = s·Bᵀ·Rᵀ·x.
  const double s = 0.5;
  EXPECT_TRUE(torch::allclose(lin->lora_B.grad(), s * torch::mm(R.t(), torch::mm(x, lin->lora_A.t())), 1e-12, 1e-12));
  EXPECT_TRUE(torch::allclose(lin->lora_A.grad(), s * torch::mm(torch::mm(lin->lora_B.t(), R.t()), x), 1e-12, 1e-12));
  EXPECT_FALSE(lin->weight.grad().defined());  // the base does not train
  const double h = 1e-6;
  for (Tensor* p : {&lin->lora_A, &lin->lora_B, const_cast<Tensor*>(&x)}) {
    const Tensor g = p->grad().clone();
    for (int64_t k : {0, 7, 13}) {
      if (k >= p->numel()) continue;
      torch::NoGradGuard ng;
      double* v = p->data_ptr<double>() + k;
      const double v0 = *v;
      *v = v0 + h;
      const double lp = loss().item<double>();
      *v = v0 - h;
      const double lm = loss().item<double>();
      *v = v0;
      EXPECT_NEAR((lp - lm) / (2 * h), g.flatten()[k].item<double>(), 1e-7) << "entry " << k;
    }
  }
}

TEST(Lora, ZeroBGivesTheBaseExactlyAndInitFollowsPeft) {
  torch::manual_seed(2);
  LlamaForCausalLM m(tiny_cfg());
  const Tensor ids = torch::randint(0, 64, {2, 8}, torch::kLong);
  const Tensor before = m(ids).detach();
  const auto names = attach_lora(m, lora_cfg(), 7);
  EXPECT_EQ(names.size(), 14u);  // 7 *_proj per block, 2 blocks
  EXPECT_TRUE(torch::equal(m(ids).detach(), before));  // B = 0: bit for bit
  for (auto l : m->linear_layers()) {
    EXPECT_EQ(l->lora_B.count_nonzero().item<int64_t>(), 0);
    // kaiming_uniform_(a = sqrt(5)): U(-1/sqrt(IN), 1/sqrt(IN)).
    const double bound = 1.0 / std::sqrt(double(l->in_features));
    EXPECT_LE(l->lora_A.abs().max().item<double>(), bound);
    EXPECT_GT(l->lora_A.abs().max().item<double>(), 0.8 * bound);
  }
  // Only the adapters train; the optimizer would hold 2 x 14 tensors.
  const auto train = freeze_base(m, lora_cfg());
  EXPECT_EQ(train.size(), 28u);
  int64_t trainable = 0;
  for (auto& p : m->parameters()) trainable += p.requires_grad() ? p.numel() : 0;
  // r x (IN + OUT) per layer: q (32+32), k,v (32+16 each), o (32+32), gate/up (32+48 each), down (48+32).
  EXPECT_EQ(trainable, 2 * 4 * (64 + 48 + 48 + 64 + 80 + 80 + 80));
  // A glob that matches nothing is an error naming it.
  LlamaForCausalLM m2(tiny_cfg());
  LoraConfig bad = lora_cfg();
  bad.target = {"*.q_proj", "*.nothing"};
  try {
    attach_lora(m2, bad, 7);
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("'*.nothing' matches no linear layer"), std::string::npos) << e.what();
  }
}

TEST(Lora, MergedModelEqualsTheAdaptedModel) {
  // W + s·B·A in FP32 against base(x) + s·(x·Aᵀ)·Bᵀ: the same function in
  // another summation order; logits agree to 1e-5 (absolute, logits ~1).
  torch::manual_seed(3);
  LlamaForCausalLM m(tiny_cfg());
  attach_lora(m, lora_cfg(4, 2.0), 11);
  randomise_b(m, 0.1);
  const Tensor ids = torch::randint(0, 64, {2, 8}, torch::kLong);
  const Tensor adapted = m(ids).detach();
  const Tensor base_w = m->linear_layers()[0]->weight.detach().clone();
  merge_lora(m);
  EXPECT_EQ(m->linear_layers()[0]->lora_rank, 0);
  EXPECT_EQ(m->named_parameters().size(), m->hf_parameters().size());  // no adapter left
  EXPECT_FALSE(torch::equal(m->linear_layers()[0]->weight, base_w));
  const Tensor merged = m(ids).detach();
  EXPECT_LT((merged - adapted).abs().max().item<double>(), 1e-5);
}

TEST(Lora, PackedBaseDequantizesToTheFakeQuantizedOperandsExactly) {
  // W [OUT, IN] = [64, 128]: awkward values, both GEMM dtypes, fp4 (NVFP4
  // 1x16 blocks: fprop and dgrad blocks differ), fp8 (128x128 blocks) and
  // nvfp4 (16x16 weight blocks): one copy serves both.
  torch::manual_seed(4);
  const Tensor w = torch::randn({64, 128}) * 0.05 + torch::rand({64, 128}) * 1e-3;
  QuantKey key{9, 3, 5, Operand::kFpropW};
  for (const at::ScalarType dt : {at::ScalarType::Undefined, at::kBFloat16}) {
    for (const std::string recipe : {"fp4", "fp8", "nvfp4"}) {
      const auto q = make_recipe_quantizer(recipes::RecipeSet(), recipe);
      const auto f = freeze_weight(w, LinearPrecision{q, dt}, key);
      ASSERT_TRUE(f) << recipe;
      QuantKey kf = key, kd = key;
      kf.operand = Operand::kFpropW;
      kd.operand = Operand::kDgradW;
      EXPECT_TRUE(torch::equal(f->operand(Operand::kFpropW), q->quantize_for_gemm(w, kf, dt))) << recipe;
      EXPECT_TRUE(torch::equal(f->operand(Operand::kDgradW), q->quantize_for_gemm(w.t().contiguous(), kd, dt)))
          << recipe;
      // Bytes, hand-counted: fp4 = two copies of (64·128/2 codes + 64·8 FP32 block scales) (fprop)
      // and (128·64/2 + 128·4 x 4) (dgrad); fp8 = 64·128 codes + one 128x128 block scale, once.
      if (recipe == "fp4") {
        EXPECT_FALSE(f->dgrad_is_fprop_t);
        EXPECT_EQ(f->bytes(), (4096 + 512 * 4) + (4096 + 512 * 4));
      } else if (recipe == "fp8") {
        EXPECT_TRUE(f->dgrad_is_fprop_t);
        EXPECT_EQ(f->bytes(), 8192 + 4);
      } else {  // nvfp4: 16x16 weight blocks, the same values both ways: one copy, 4 x 8 block scales
        EXPECT_TRUE(f->dgrad_is_fprop_t);
        EXPECT_EQ(f->bytes(), 4096 + 4 * 8 * 4);
      }
    }
    // No quantizer: the BF16 cast (2 bytes a weight), or nothing to gain in FP32.
    const auto b = freeze_weight(w, LinearPrecision{nullptr, dt}, key);
    if (dt == at::kBFloat16) {
      ASSERT_TRUE(b);
      EXPECT_TRUE(torch::equal(b->operand(Operand::kFpropW), gemm_operand(w, dt)));
      EXPECT_TRUE(torch::equal(b->operand(Operand::kDgradW), gemm_operand(w.t().contiguous(), dt)));
      EXPECT_EQ(b->bytes(), 64 * 128 * 2);
    } else {
      EXPECT_FALSE(b);
    }
  }
}

TEST(Lora, FrozenBaseLayerComputesWhatTheFp32LayerComputes) {
  // A whole forward and backward through a layer whose weight was released
  // (only the packed fp4 form left) equals the layer with its FP32 weight.
  torch::manual_seed(5);
  QuantLinear a(48, 32, 0.2), b(48, 32, 0.2);
  {
    torch::NoGradGuard ng;
    b->weight.copy_(a->weight);
  }
  for (auto* l : {&a, &b}) {
    (*l)->name = "x";
    (*l)->precision = LinearPrecision{make_recipe_quantizer(recipes::RecipeSet(), "fp4"), at::kBFloat16};
    (*l)->weight.set_requires_grad(false);
  }
  b->frozen = freeze_weight(b->weight.detach(), b->precision, QuantKey{0, 0, 0, Operand::kFpropW});
  b->weight.set_(torch::empty({0}));
  const Tensor x = torch::randn({16, 48});
  const Tensor xa = x.clone().requires_grad_(true), xb = x.clone().requires_grad_(true);
  const Tensor ya = a(xa), yb = b(xb);
  EXPECT_TRUE(torch::equal(ya, yb));
  const Tensor g = torch::randn_like(ya);
  ya.backward(g);
  yb.backward(g);
  EXPECT_TRUE(torch::equal(xa.grad(), xb.grad()));
  // A precision it was not packed for, with no way to re-read W: an error, not a silent wrong weight.
  b->precision = LinearPrecision{make_recipe_quantizer(recipes::RecipeSet(), "fp8"), at::kBFloat16};
  EXPECT_THROW(b(x), UserError);
}

TEST(Lora, PeftFilesRoundTrip) {
  // PEFT's documented layout (peft.utils.save_and_load): tensors
  // "base_model.model.<module>.lora_A.weight" [r, in_features] and
  // ".lora_B.weight" [out_features, r]; adapter_config.json with peft_type
  // "LORA", task_type, r, lora_alpha, lora_dropout, target_modules, bias.
  torch::manual_seed(6);
  LlamaForCausalLM m(tiny_cfg());
  LoraConfig c = lora_cfg(4, 8);
  c.target = {"*.q_proj", "*.v_proj"};
  c.dropout = 0.05;
  attach_lora(m, c, 1);
  randomise_b(m, 0.1);
  const std::string dir = test::fresh_dir("lora-peft");
  export_peft(m, c, "some/base", dir, false);
  const auto j = io::parse_json(io::read_file(dir + "/adapter_config.json"), "adapter_config.json");
  EXPECT_EQ(j["peft_type"], "LORA");
  EXPECT_EQ(j["task_type"], "CAUSAL_LM");
  EXPECT_EQ(j["r"], 4);
  EXPECT_EQ(j["lora_alpha"], 8.0);
  EXPECT_EQ(j["lora_dropout"], 0.05);
  EXPECT_EQ(j["bias"], "none");
  EXPECT_EQ(j["fan_in_fan_out"], false);
  EXPECT_EQ(j["base_model_name_or_path"], "some/base");
  EXPECT_EQ(j["target_modules"], nlohmann::json({"q_proj", "v_proj"}));
  const io::SafeTensors st = io::read_safetensors(dir + "/adapter_model.safetensors");
  ASSERT_EQ(st.tensors.size(), 8u);  // 2 blocks x 2 layers x (A, B)
  const io::TensorRecord* a = st.find("base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight");
  const io::TensorRecord* bb = st.find("base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight");
  ASSERT_TRUE(a && bb);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{4, 32}));  // [r, IN = C]
  EXPECT_EQ(bb->shape, (std::vector<int64_t>{16, 4}));  // [OUT = NKV·HD = 2·8, r]
  EXPECT_EQ(a->dtype, io::DType::F32);
  // Back in: the config and a fresh model's adapters equal the originals.
  const LoraConfig back = lora_config_from_peft(j, "adapter_config.json");
  EXPECT_EQ(back.rank, 4);
  EXPECT_EQ(back.alpha, 8.0);
  EXPECT_EQ(back.target, (std::vector<std::string>{"q_proj", "v_proj"}));
  LlamaForCausalLM m2(tiny_cfg());
  attach_lora(m2, back, 99);
  load_adapter_tensors(m2, st, "adapter_model.safetensors", false);
  const auto p1 = lora_parameters(m, false), p2 = lora_parameters(m2, false);
  ASSERT_EQ(p1.size(), p2.size());
  for (size_t i = 0; i < p1.size(); ++i) {
    EXPECT_EQ(p1[i].first, p2[i].first);
    EXPECT_TRUE(torch::equal(p1[i].second, p2[i].second)) << p1[i].first;
  }
  // What PEFT would refuse to mean the same thing is refused.
  nlohmann::json bad = j;
  bad["bias"] = "all";
  EXPECT_THROW(lora_config_from_peft(bad, "x"), UserError);
  bad = j;
  bad["peft_type"] = "IA3";
  EXPECT_THROW(lora_config_from_peft(bad, "x"), UserError);
  // A non-empty folder is not overwritten without force.
  EXPECT_THROW(export_peft(m, c, "b", dir, false), UserError);
  fs::remove_all(dir);
}

TEST(Lora, StatsOnAFrozenBaseMeasureLdAloneAndTheSameLd) {
  // The loss divergence does not depend on whether the weights train: the
  // frozen step's LD equals the full step's LD bit for bit; WD is 0 and
  // Q = LD / sum of LD at fp4.
  torch::manual_seed(7);
  LlamaForCausalLM m(tiny_cfg());
  m->to(torch::kDouble);
  const Tensor ids = torch::randint(0, 64, {2, 8}, torch::kLong);
  const Tensor tg = torch::randint(0, 64, {2, 8}, torch::kLong);
  auto loss = [&] { return LlamaForCausalLMImpl::loss(m(ids), tg); };
  torch::optim::AdamW opt(m->parameters(), torch::optim::AdamWOptions(1e-3));
  StatsOptions o;
  o.seed = 3;
  const StatsStep full = run_stats_step(m->linear_layers(), loss, opt, o, 1);
  attach_lora(m, lora_cfg(), 5);
  m->to(torch::kDouble);
  freeze_base(m, lora_cfg());
  torch::optim::AdamW lopt({m->linear_layers()[0]->lora_A}, torch::optim::AdamWOptions(1e-3));  // not read
  o.frozen = true;
  const StatsStep fr = run_stats_step(m->linear_layers(), loss, lopt, o, 1);
  EXPECT_EQ(fr.alpha, 1.0);
  EXPECT_GT(fr.ld_sum_low, 0.0);  // something was measured
  ASSERT_EQ(fr.layers.size(), full.layers.size());
  for (size_t i = 0; i < fr.layers.size(); ++i)
    for (const auto& [opt_name, os] : fr.layers[i].options) {
      EXPECT_EQ(os.ld, full.layers[i].options.at(opt_name).ld) << fr.layers[i].name << " " << opt_name;
      EXPECT_EQ(os.wd_own, 0.0);
      EXPECT_EQ(os.wd_upstream, 0.0);
      EXPECT_DOUBLE_EQ(os.q, os.ld / fr.ld_sum_low);
    }
  for (auto& p : m->linear_layers()) EXPECT_FALSE(p->weight.requires_grad());  // unmarked after the step
}
