// Error feedback on the weight operand (Recipe::error_feedback; METHOD.md
// section 7; docs/formats.md "Error feedback"): the quantizer's output
// against a hand-written reference loop of the recurrence
//   v_t = W_t + r_t,  out_t = Q(v_t),  r_{t+1} = v_t - Q_fprop.w(v_t),  r_0 = 0,
// the running-mean property for a constant W (also with a Hadamard transform
// on the weights, where Q returns the rotated operand), once per step under
// repeated calls, QuantStateFreeze, and a bit-exact state round trip.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "snip/formats/fake_quant.h"
#include "snip/formats/hadamard.h"
#include "snip/model/linear.h"
#include "snip/model/quantizers.h"
#include "snip/recipes/recipe.h"
#include "snip/core/error.h"

using namespace snip;

namespace {

// The recipes of these tests: the built-ins and the test recipes below.
recipes::RecipeSet& test_recipes() {
  static recipes::RecipeSet set;
  return set;
}

// A test recipe: fp4's specs (NVFP4 two-level E2M1, 1x16) with W in `wblock`
// blocks, and error feedback, added to test_recipes().
std::string ef_recipe(const std::string& name, formats::BlockShape wblock) {
  recipes::Recipe r = test_recipes().find("fp4");
  r.name = name;
  r.description = "test: fp4 with error feedback";
  r.error_feedback = true;
  r[Operand::kFpropW].block = wblock;
  r[Operand::kDgradW].block = wblock;
  test_recipes().add(r, /*replace=*/true);
  return name;
}

// The scalar reference fake quantization of t [rows, K] by operand op's spec.
torch::Tensor ref_q(const std::string& recipe, Operand op, const torch::Tensor& t, int64_t step, int64_t layer) {
  const recipes::Recipe r = test_recipes().find(recipe);
  const torch::Tensor in = t.to(torch::kFloat).contiguous();
  torch::Tensor out = torch::empty_like(in);
  formats::RoundingKey rk{0, uint64_t(step), uint64_t(layer), uint32_t(op)};
  formats::fake_quantize_reference(in.data_ptr<float>(), out.data_ptr<float>(), in.size(0), in.size(1),
                                   r.operands[size_t(op)], rk);
  return out;
}

QuantKey key(int64_t step, Operand op, int64_t layer = 0) {
  QuantKey k;
  k.step = step;
  k.layer = layer;
  k.operand = op;
  return k;
}

}  // namespace

TEST(ErrorFeedback, RecurrenceEqualsAHandWrittenReferenceLoop) {
  // W [OUT=8, IN=48] changing every step (as training changes it), 1x16 tiles
  // along IN for fprop.w and along OUT for dgrad.w: the two quantizations of
  // W differ, the residual is measured against fprop.w's.
  const std::string name = ef_recipe("ef_test_tile", formats::BlockShape::tile(16));
  const auto q = make_recipe_quantizer(test_recipes(), name);
  torch::manual_seed(3);
  const torch::Tensor w0 = torch::randn({8, 48}), dw = torch::randn({8, 48}) * 0.01;
  torch::Tensor r = torch::zeros({8, 48});  // r_0
  for (int64_t t = 0; t < 5; ++t) {
    SCOPED_TRACE(t);
    const torch::Tensor w = w0 + dw * double(t);  // W_t
    const torch::Tensor v = w + r;               // W_t + r_t
    const torch::Tensor want_f = ref_q(name, Operand::kFpropW, v, t, 0);
    const torch::Tensor want_d = ref_q(name, Operand::kDgradW, v.t(), t, 0);  // Q_dgrad((W_t + r_t)ᵀ)
    EXPECT_TRUE(torch::equal(q->quantize(w, key(t, Operand::kFpropW)), want_f));
    EXPECT_TRUE(torch::equal(q->quantize(w.t().contiguous(), key(t, Operand::kDgradW)), want_d));
    EXPECT_FALSE(torch::equal(want_f, ref_q(name, Operand::kFpropW, w, t, 0)) && t > 0)
        << "the residual changes nothing: the test cannot tell error feedback from plain quantization";
    r = v - want_f;  // r_{t+1}
  }
  // Other operands are quantized as plain fp4 (no residual).
  const torch::Tensor x = torch::randn({16, 48});
  EXPECT_TRUE(torch::equal(q->quantize(x, key(0, Operand::kFpropX)), ref_q(name, Operand::kFpropX, x, 0, 0)));
}

TEST(ErrorFeedback, DgradFirstInAStepStillMeasuresAgainstFprop) {
  // The residual advances at a step's first weight call, whichever operand it
  // is; r is always v - Q_fprop.w(v).
  const std::string name = ef_recipe("ef_test_tile", formats::BlockShape::tile(16));
  const auto a = make_recipe_quantizer(test_recipes(), name), b = make_recipe_quantizer(test_recipes(), name);
  torch::manual_seed(5);
  const torch::Tensor w = torch::randn({16, 32});
  for (int64_t t = 0; t < 3; ++t) {
    a->quantize(w, key(t, Operand::kFpropW));
    b->quantize(w.t().contiguous(), key(t, Operand::kDgradW));  // dgrad first
    EXPECT_TRUE(torch::equal(a->quantize(w.t().contiguous(), key(t, Operand::kDgradW)),
                             b->quantize(w.t().contiguous(), key(t, Operand::kDgradW))));
    EXPECT_TRUE(torch::equal(a->quantize(w, key(t, Operand::kFpropW)), b->quantize(w, key(t, Operand::kFpropW))));
  }
  EXPECT_EQ(a->state(), b->state());
}

TEST(ErrorFeedback, RunningMeanOfAConstantWeightConvergesToIt) {
  // sum_{t<K} Q(W + r_t) = K·W + r_0 - r_K, so |mean - W| <= max|r| / K: the
  // quantized weights average to W. Plain quantization's mean is Q(W), off by
  // the quantization error at every K.
  const std::string name = ef_recipe("ef_test_row", formats::BlockShape::row());
  const auto q = make_recipe_quantizer(test_recipes(), name);
  torch::manual_seed(11);
  const torch::Tensor w = torch::randn({4, 64});
  const int64_t K = 256;
  torch::Tensor sum = torch::zeros({4, 64}, torch::kDouble);
  torch::Tensor r = torch::zeros({4, 64});
  double max_r = 0;
  for (int64_t t = 0; t < K; ++t) {
    const torch::Tensor out = q->quantize(w, key(t, Operand::kFpropW));
    sum += out.to(torch::kDouble);
    r = (w + r) - out;  // mirrors the recurrence to know max|r|
    max_r = std::max(max_r, r.abs().max().item<double>());
  }
  const torch::Tensor mean = sum / double(K);
  const double dev = (mean - w.to(torch::kDouble)).abs().max().item<double>();
  // FP32 rounding of W + r and of v - Q(v) adds at most a few ulps of |W| per step.
  const double slack = 4 * 1.2e-7 * w.abs().max().item<double>();
  EXPECT_LE(dev, max_r / double(K) + slack) << "max|r| " << max_r;
  const double plain = (ref_q(name, Operand::kFpropW, w, 0, 0) - w).abs().max().item<double>();
  EXPECT_GT(plain, 10 * (max_r / double(K) + slack)) << "plain quantization would satisfy the bound too";
  std::printf("K = %lld: max|mean - W| = %.3g with error feedback (bound max|r|/K = %.3g), %.3g without\n",
              static_cast<long long>(K), dev, max_r / double(K), plain);
}

TEST(ErrorFeedback, ResidualAdvancesOncePerStepUnderRepeatedCalls) {
  // grad_accum micro-batches and dgrad quantize W several times in a step:
  // each call of step t uses W_t + r_t and returns the same tensor, and the
  // residual advances once.
  const std::string name = ef_recipe("ef_test_tile", formats::BlockShape::tile(16));
  const auto once = make_recipe_quantizer(test_recipes(), name), many = make_recipe_quantizer(test_recipes(), name);
  torch::manual_seed(7);
  const torch::Tensor w0 = torch::randn({8, 32}), dw = torch::randn({8, 32}) * 0.02;
  for (int64_t t = 0; t < 4; ++t) {
    const torch::Tensor w = w0 + dw * double(t);
    const torch::Tensor f = once->quantize(w, key(t, Operand::kFpropW));
    const torch::Tensor d = once->quantize(w.t().contiguous(), key(t, Operand::kDgradW));
    for (int i = 0; i < 3; ++i) {  // three micro-batches: fprop, then dgrad, each
      EXPECT_TRUE(torch::equal(many->quantize(w, key(t, Operand::kFpropW)), f)) << t << " " << i;
      EXPECT_TRUE(torch::equal(many->quantize(w.t().contiguous(), key(t, Operand::kDgradW)), d)) << t << " " << i;
    }
  }
  EXPECT_EQ(once->state(), many->state());
}

TEST(ErrorFeedback, FreezeNeitherUpdatesNorDiffersFromTheNextStep) {
  // Evaluation and sampling (QuantStateFreeze) quantize W as the next training
  // step would (W + r_{t+1}) and change nothing.
  const std::string name = ef_recipe("ef_test_tile", formats::BlockShape::tile(16));
  const auto a = make_recipe_quantizer(test_recipes(), name), b = make_recipe_quantizer(test_recipes(), name);
  torch::manual_seed(8);
  const torch::Tensor w = torch::randn({8, 32}), w2 = torch::randn({8, 32});
  for (const auto& q : {a, b}) q->quantize(w, key(0, Operand::kFpropW));
  const nlohmann::json before = a->state();
  torch::Tensor frozen;
  {
    QuantStateFreeze f;
    frozen = a->quantize(w2, key(0, Operand::kFpropW));
    for (int64_t s : {0, 1, 5}) {
      a->quantize(w2, key(s, Operand::kFpropW));
      a->quantize(w2.t().contiguous(), key(s, Operand::kDgradW));
    }
  }
  EXPECT_EQ(a->state(), before);
  // The next training step sees the same residual the frozen call added.
  EXPECT_TRUE(torch::equal(b->quantize(w2, key(1, Operand::kFpropW)), frozen));
  EXPECT_TRUE(torch::equal(a->quantize(w2, key(1, Operand::kFpropW)), frozen));
  EXPECT_EQ(a->state(), b->state());
}

TEST(ErrorFeedback, StateRoundTripIsBitExact) {
  // The residual (as large as W) travels as base64 of its FP32 bytes; a
  // restored quantizer continues exactly as the original.
  const std::string name = ef_recipe("ef_test_tile", formats::BlockShape::tile(16));
  const auto a = make_recipe_quantizer(test_recipes(), name), b = make_recipe_quantizer(test_recipes(), name);
  EXPECT_TRUE(a->state().is_null());
  torch::manual_seed(12);
  std::vector<torch::Tensor> ws;
  for (int i = 0; i < 6; ++i) ws.push_back(torch::randn({24, 48}) * (i + 1));
  for (int64_t t = 0; t < 3; ++t)
    for (int64_t layer = 0; layer < 2; ++layer) a->quantize(ws[size_t(t * 2 + layer)], key(t, Operand::kFpropW, layer));
  const nlohmann::json st = a->state();
  ASSERT_TRUE(st.contains("residuals"));
  ASSERT_EQ(st["residuals"].size(), 2u);
  EXPECT_EQ(st["residuals"][0]["shape"], nlohmann::json({24, 48}));
  EXPECT_EQ(st["residuals"][0]["f32_base64"].get<std::string>().size(), size_t(24 * 48 * 4 + 2) / 3 * 4);
  b->restore_state(nlohmann::json::parse(st.dump()), "test", 2);  // through text, as in a checkpoint
  EXPECT_EQ(b->state(), st);
  for (int64_t t = 3; t < 6; ++t)
    for (int64_t layer = 0; layer < 2; ++layer) {
      const torch::Tensor& w = ws[size_t((t + layer) % 6)];
      EXPECT_TRUE(torch::equal(a->quantize(w, key(t, Operand::kFpropW, layer)),
                               b->quantize(w, key(t, Operand::kFpropW, layer))));
      EXPECT_TRUE(torch::equal(a->quantize(w.t().contiguous(), key(t, Operand::kDgradW, layer)),
                               b->quantize(w.t().contiguous(), key(t, Operand::kDgradW, layer))));
    }
  EXPECT_EQ(a->state(), b->state());
  // Bad state: a layer outside the model, truncated bytes, another recipe.
  nlohmann::json bad = st;
  bad["residuals"][0]["layer"] = 2;
  EXPECT_THROW(b->restore_state(bad, "test", 2), UserError);
  bad = st;
  bad["residuals"][0]["f32_base64"] = "AAAA";
  EXPECT_THROW(b->restore_state(bad, "test", 2), UserError);
  EXPECT_THROW(make_recipe_quantizer(test_recipes(), "fp4")->restore_state(st, "test", 2), UserError);
  // A residual of another shape than the layer's weight is refused at use.
  EXPECT_THROW(b->quantize(torch::randn({8, 16}), key(9, Operand::kFpropW, 0)), UserError);
}

TEST(ErrorFeedback, QuantLinearUsesTheResidualInFpropAndDgrad) {
  // Through the layer: Y = X · Q_f(W + r)ᵀ and dX = Q(dY) · Q_d((W + r)ᵀ)ᵀ with
  // the same r in both, at the layer's step; FP32 GEMMs.
  const std::string name = ef_recipe("ef_test_tile", formats::BlockShape::tile(16));
  torch::manual_seed(13);
  QuantLinear l(32, 16, 0.5);
  l->precision = LinearPrecision{make_recipe_quantizer(test_recipes(), name), at::kFloat};
  const auto ref = make_recipe_quantizer(test_recipes(), name);  // the same recurrence by direct calls
  for (int64_t t = 0; t < 3; ++t) {
    l->key_base.step = t;
    const torch::Tensor x = torch::randn({8, 32}).requires_grad_(true), dy = torch::randn({8, 16});
    const torch::Tensor y = l(x);
    y.backward(dy);
    const torch::Tensor wq = ref->quantize(l->weight.detach(), key(t, Operand::kFpropW));
    const torch::Tensor wdq = ref->quantize(l->weight.detach().t().contiguous(), key(t, Operand::kDgradW));
    const torch::Tensor xq = ref->quantize(x.detach(), key(t, Operand::kFpropX));
    const torch::Tensor dyq = ref->quantize(dy, key(t, Operand::kDgradDY));
    EXPECT_TRUE(torch::allclose(y.detach(), torch::mm(xq, wq.t()), 1e-5, 1e-6)) << t;
    EXPECT_TRUE(torch::allclose(x.grad(), torch::mm(dyq, wdq.t()), 1e-5, 1e-6)) << t;
    torch::NoGradGuard ng;
    l->weight.sub_(l->weight.grad() * 0.1);  // an optimizer step
    l->weight.grad().zero_();
  }
}

namespace {

// R = diag(s) · H_n / sqrt(n), H_n the Sylvester Hadamard matrix built here
// by Kronecker products ([[1, 1], [1, -1]] ⊗ ...), s the spec's signs; the
// block-diagonal R of width K (K a multiple of n) as a dense [K, K] matrix.
torch::Tensor rht_matrix(int64_t K, int n, const std::vector<float>& signs) {
  torch::Tensor h = torch::ones({1, 1});
  const torch::Tensor h2 = torch::tensor({{1.0f, 1.0f}, {1.0f, -1.0f}});
  while (h.size(0) < n) h = torch::kron(h, h2);
  const torch::Tensor s = torch::tensor(signs);
  const torch::Tensor block = torch::diag(s).mm(h) / std::sqrt(double(n));
  torch::Tensor R = torch::zeros({K, K});
  for (int64_t b = 0; b < K; b += n) R.slice(0, b, b + n).slice(1, b, b + n).copy_(block);
  return R;
}

}  // namespace

TEST(ErrorFeedback, HadamardOnTheWeightsKeepsTheResidualInTheWeightDomain) {
  // fprop.w with a 16-point random Hadamard transform R: Q returns Q(v·R),
  // the operand the GEMM reads. The residual must be v - Q(v·R)·Rᵀ (the
  // quantization error of v); v - Q(v·R) mixes the two domains and grows
  // without bound (seen: residuals of 9.4e7 on weights of 0.02). Checked
  // against a hand-written loop with R as a dense matrix, and by the
  // running-mean property: sum_t Q(v_t·R)·Rᵀ = K·W + r_0 - r_K.
  recipes::Recipe r = test_recipes().find("fp4");
  r.name = "ef_test_rht";
  r.description = "test: fp4 with a Hadamard transform and error feedback";
  r.error_feedback = true;
  for (Operand op : {Operand::kFpropX, Operand::kFpropW, Operand::kDgradDY, Operand::kDgradW}) {
    r[op].hadamard_size = 16;
    r[op].hadamard_seed = 7;
  }
  test_recipes().add(r, /*replace=*/true);
  const auto q = make_recipe_quantizer(test_recipes(), r.name);
  torch::manual_seed(21);
  const torch::Tensor w = torch::randn({8, 48}) * 0.02;  // W [OUT, IN], constant
  const torch::Tensor R = rht_matrix(48, 16, formats::hadamard_signs(16, 7));
  ASSERT_TRUE(torch::allclose(R.mm(R.t()), torch::eye(48), 0, 1e-6)) << "R is not orthogonal";
  const int64_t K = 200;
  const double wmax = w.abs().max().item<double>();
  torch::Tensor res = torch::zeros({8, 48});  // r_t, by hand
  torch::Tensor sum = torch::zeros({8, 48}, torch::kDouble);
  double max_r = 0;
  for (int64_t t = 0; t < K; ++t) {
    const torch::Tensor v = w + res;
    const torch::Tensor want = ref_q(r.name, Operand::kFpropW, v, t, 0);  // Q(v·R), rotated
    const torch::Tensor got = q->quantize(w, key(t, Operand::kFpropW));
    ASSERT_TRUE(torch::equal(got, want)) << "step " << t;
    // Q(v·R)·Rᵀ, in W's domain: by the fast inverse transform (bit for bit
    // what the quantizer must do), which is the dense Rᵀ to FP32 rounding.
    torch::Tensor back = want.clone();
    const std::vector<float> signs = formats::hadamard_signs(16, 7);
    formats::hadamard_rows_inverse(back.data_ptr<float>(), 8, 48, 16, signs.data());
    ASSERT_TRUE(torch::allclose(back, want.mm(R.t()), 0, 1e-6 * wmax)) << "step " << t;
    sum += back.to(torch::kDouble);
    res = v - back;  // r_{t+1}
    max_r = std::max(max_r, res.abs().max().item<double>());
  }
  // Bounded: within a few quantization steps of |W| (E2M1's largest gap is
  // 2 of 6, a third of the block amax, and R spreads a block's amax over
  // at most sqrt(16) = 4 times its entries).
  EXPECT_LT(max_r, 4 * wmax) << "the residual grows: it mixes the rotated and the weight domain";
  const double dev = (sum / double(K) - w.to(torch::kDouble)).abs().max().item<double>();
  // FP32 rounding of v = W + r and of v - back: a few ulps of |W| per step.
  EXPECT_LE(dev, max_r / double(K) + 4 * 1.2e-7 * (wmax + max_r)) << "max|r| " << max_r;
  // The quantizer's own residual is the hand-written one (its state is r_K).
  const nlohmann::json st = q->state();
  ASSERT_TRUE(st.contains("residuals"));
  std::printf("Hadamard + error feedback, K = %lld: max|r| = %.3g (|W| <= %.3g), max|mean - W| = %.3g\n",
              static_cast<long long>(K), max_r, wmax, dev);
}
