// The GEMM-time calibration (method/gemm_calibrate.h) on this machine's CPU.
//
// Timing tests on shared CPUs need loose, stated tolerances:
//  * BF16 seconds per FLOP of two shapes 8x apart in FLOPs agree within a
//    factor of 4 (GEMM throughput depends on shape; a factor-of-4 band still
//    catches a table whose times do not grow with the work, or are swapped
//    between shapes or GEMMs);
//  * the table's fprop + dgrad + wgrad of a layer predicts the measured
//    forward + backward of the trainer's own QuantLinear module (autograd,
//    median of 5) within a factor of 2 (the module also pays autograd and
//    its BF16 path reuses the forward's operand casts; 2 cores shared with
//    other processes).
// Both quantitative checks need a quiet machine: under load (other builds
// on the same 2 cores) single timings swing 10x and more. They run only with
// SNIP_TIMING_TESTS=1 (ctest label "timing": `ctest -L timing` on an idle
// machine); without it the structural checks run and the quantitative ones
// skip with that reason.
//
// The in-step calibration and its GemmTimer (model/gemm_timer.h) are checked
// against a known cost instead: a quantizer that sleeps kSleep per operand
// makes every GEMM take at least 2 x kSleep (two operands), a bound that
// holds on any machine; and against invariants (every entry the run needs,
// the run's precisions, gradients and RNG untouched).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <set>
#include <thread>
#include <vector>

#include "micro.h"
#include "snip/core/error.h"
#include "snip/method/gemm_calibrate.h"
#include "snip/model/gemm_timer.h"
#include "snip/model/linear.h"
#include "snip/model/llama.h"
#include "snip/model/quantizers.h"

using namespace snip;

namespace {

constexpr int64_t kT = 512;

bool timing_enabled() {
  const char* e = std::getenv("SNIP_TIMING_TESTS");
  return e && std::string(e) == "1";
}

plan::GemmTimes calibrate(const std::vector<plan::TimedLayer>& layers) {
  CalibrateOptions o;
  o.options = {"bf16", "fp8", "fp4"};
  o.gemm_dtype = at::kBFloat16;
  o.tokens = kT;
  o.repeats = 5;
  o.max_seconds = 30;
  return calibrate_gemm_times(layers, recipes::RecipeSet(), o);
}

}  // namespace

TEST(GemmCalibrate, TableIsValid) {
  // Two distinct shapes (a repeated shape is timed once), small for speed.
  const std::vector<plan::TimedLayer> layers = {{"a", 64, 64}, {"b", 128, 256}, {"c", 64, 64}};
  const plan::GemmTimes t = calibrate(layers);
  ASSERT_EQ(t.entries.size(), 2u * 3u * 3u);
  EXPECT_EQ(t.device, "cpu");
  EXPECT_EQ(t.gemm_dtype, "bf16");
  for (const auto& e : t.entries) {
    EXPECT_GT(e.seconds, 0.0);
    EXPECT_EQ(e.repeats, 5);
  }
  // The file round trip is exact.
  const plan::GemmTimes back = plan::parse_gemm_times(plan::to_json(t), "x");
  ASSERT_EQ(back.entries.size(), t.entries.size());
  for (size_t i = 0; i < t.entries.size(); ++i) EXPECT_EQ(back.entries[i].seconds, t.entries[i].seconds);
}

// Shapes 8x apart in FLOPs (2·T·in·out): 256x256 and 512x1024.
TEST(GemmCalibrate, Bf16ScalesWithFlops) {
  if (!timing_enabled()) GTEST_SKIP() << "timing checks need SNIP_TIMING_TESTS=1 on an idle machine (label timing)";
  const plan::GemmTimes t = calibrate({{"a", 256, 256}, {"b", 512, 1024}});
  for (Gemm g : kAllGemms) {
    const auto sa = plan::linear_gemm_shapes(kT, 256, 256)[int(g)], sb = plan::linear_gemm_shapes(kT, 512, 1024)[int(g)];
    const double ta = t.find(g, sa, "bf16")->seconds, tb = t.find(g, sb, "bf16")->seconds;
    const double per_flop_a = ta / (2.0 * sa.m * sa.k * sa.n), per_flop_b = tb / (2.0 * sb.m * sb.k * sb.n);
    const double r = per_flop_a / per_flop_b;
    EXPECT_GT(tb, ta) << gemm_name(g);
    EXPECT_GT(r, 0.25) << gemm_name(g) << " " << ta << " s vs " << tb << " s";
    EXPECT_LT(r, 4.0) << gemm_name(g) << " " << ta << " s vs " << tb << " s";
  }
}

TEST(GemmCalibrate, PredictsTheModulesForwardBackward) {
  if (!timing_enabled()) GTEST_SKIP() << "timing checks need SNIP_TIMING_TESTS=1 on an idle machine (label timing)";
  const int64_t in = 512, out = 1024;
  const plan::GemmTimes t = calibrate({{"l", in, out}});
  torch::manual_seed(0);
  QuantLinear l(in, out, 0.05);
  l->name = "l";
  const torch::Tensor x0 = torch::randn({kT, in}), dy = torch::randn({kT, out}) * 1e-3;
  for (const std::string opt : {"bf16", "fp8", "fp4"}) {
    l->precision = LinearPrecision{opt == "bf16" ? nullptr : make_recipe_quantizer(recipes::RecipeSet(), opt),
                                   at::kBFloat16};
    QuantStateFreeze freeze;
    std::vector<double> ts;
    for (int k = 0; k < 6; ++k) {
      const torch::Tensor x = x0.clone().set_requires_grad(true);
      l->zero_grad();
      const auto a = std::chrono::steady_clock::now();
      l->forward(x).backward(dy);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
      if (k > 0) ts.push_back(s);  // the first call warms up
    }
    std::sort(ts.begin(), ts.end());
    const double measured = ts[ts.size() / 2];
    double predicted = 0;
    for (Gemm g : kAllGemms) predicted += t.find(g, plan::linear_gemm_shapes(kT, in, out)[int(g)], opt)->seconds;
    EXPECT_GT(measured / predicted, 0.5) << opt << ": measured " << measured << " s, predicted " << predicted << " s";
    EXPECT_LT(measured / predicted, 2.0) << opt << ": measured " << measured << " s, predicted " << predicted << " s";
    std::printf("[ gemm time ] %s 512x1024, T=512: predicted %.3f ms, measured fwd+bwd %.3f ms (%.2fx)\n", opt.c_str(),
                1e3 * predicted, 1e3 * measured, measured / predicted);
  }
}

namespace {

// A quantizer of known cost: each operand it quantizes takes at least kSleep
// (then passes through unchanged), and it records a per-step error as the
// recipe quantizers do (so a test can see whether one was left behind). With
// `throw_at` >= 0 it throws on its throw_at-th call (counted from 0).
constexpr double kSleep = 0.003;  // s
struct SleepQuantizer : OperandQuantizer {
  explicit SleepQuantizer(int throw_at = -1) : throw_at_(throw_at) {}
  torch::Tensor quantize(const torch::Tensor& t, const QuantKey& key) const override {
    if (throw_at_ >= 0 && calls_++ == throw_at_) throw std::runtime_error("sleep quantizer: injected failure");
    std::this_thread::sleep_for(std::chrono::duration<double>(kSleep));
    if (key.errors && !QuantStateFreeze::active()) key.errors->add(key.operand, formats::ErrorNorms{0.0, 1.0, 1});
    steps_.insert(key.step);
    return t.clone();
  }
  std::string name() const override { return "sleep"; }
  /// The QuantKey::step values it was called with.
  const std::set<int64_t>& steps() const { return steps_; }

 private:
  int throw_at_;
  mutable int calls_ = 0;
  mutable std::set<int64_t> steps_;
};

}  // namespace

TEST(GemmTimer, TimesEachGemmOfAStep) {
  torch::manual_seed(0);
  QuantLinear trained(16, 8, 0.1), frozen(16, 8, 0.1);
  for (QuantLinear* l : {&trained, &frozen}) (*l)->precision = LinearPrecision{std::make_shared<SleepQuantizer>(), at::ScalarType::Undefined};
  frozen->weight.set_requires_grad(false);  // no wgrad (a frozen base's)
  const torch::Tensor x = torch::randn({4, 16}).set_requires_grad(true);
  {
    // Without a timer nothing is recorded anywhere.
    EXPECT_EQ(GemmTimer::active(), nullptr);
    (trained(x) + frozen(x)).sum().backward();
  }
  GemmTimer timer(false);
  EXPECT_EQ(GemmTimer::active(), &timer);
  EXPECT_THROW(GemmTimer second(false), std::logic_error);
  EXPECT_TRUE(timer.take().empty());
  (trained(x) + frozen(x)).sum().backward();
  auto t = timer.take();
  ASSERT_EQ(t.size(), 2u);
  for (Gemm g : kAllGemms) EXPECT_GE(t[trained.get()][size_t(g)], 2 * kSleep) << gemm_name(g);
  EXPECT_GE(t[frozen.get()][size_t(Gemm::kFprop)], 2 * kSleep);
  EXPECT_GE(t[frozen.get()][size_t(Gemm::kDgrad)], 2 * kSleep);
  EXPECT_EQ(t[frozen.get()][size_t(Gemm::kWgrad)], 0.0);
  EXPECT_TRUE(timer.take().empty());  // take() starts afresh
}

TEST(GemmCalibrate, InStepTimesEveryGemmOfTheModelsSteps) {
  torch::manual_seed(7);
  LlamaForCausalLM model(test::two_block_llama());
  const std::vector<QuantLinear> layers = model->linear_layers();
  // The run's own precision (a quantizer object of its own) must come back.
  const auto run_q = std::make_shared<SleepQuantizer>();
  model->set_precision(LinearPrecision{run_q, at::kBFloat16});
  CalibrateOptions o;
  o.options = {"bf16", "slow"};
  o.gemm_dtype = at::kBFloat16;
  o.warmup = 1;
  o.repeats = 3;
  std::shared_ptr<SleepQuantizer> slow;
  o.quantizer_for = [&slow](const std::string& name) {
    EXPECT_EQ(name, "slow");
    return slow = std::make_shared<SleepQuantizer>();
  };
  for (QuantLinear l : layers) l->key_base.step = 41;
  std::vector<std::string> lines;
  o.progress = [&lines](const std::string& l) { lines.push_back(l); };
  torch::manual_seed(99);
  const torch::Tensor want = torch::rand({4});
  torch::manual_seed(99);
  const plan::GemmTimes t = calibrate_gemm_times_in_step(InStepModel{model, 2, 8, 5}, recipes::RecipeSet(), o);
  EXPECT_TRUE(torch::equal(torch::rand({4}), want)) << "the calibration drew from the run's RNG";
  // q/o 32->32, k/v 32->16, gate/up 32->48, down 48->32: 4 distinct shapes x 2 options x 3 GEMMs.
  std::set<std::pair<int64_t, int64_t>> shapes;
  for (const QuantLinear& l : layers) shapes.insert({l->in_features, l->out_features});
  ASSERT_EQ(shapes.size(), 4u);
  ASSERT_EQ(t.entries.size(), 4u * 2u * 3u);
  EXPECT_EQ(t.device, "cpu");
  EXPECT_EQ(t.gemm_dtype, "bf16");
  EXPECT_NE(t.machine.find("in training steps (in_step)"), std::string::npos) << t.machine;
  for (const QuantLinear& l : layers)
    for (Gemm g : kAllGemms)
      for (const std::string opt : {"bf16", "slow"}) {
        const plan::GemmTimeEntry* e = t.find(g, plan::linear_gemm_shapes(16, l->in_features, l->out_features)[int(g)], opt);
        ASSERT_NE(e, nullptr) << l->name << " " << gemm_name(g) << " " << opt;
        EXPECT_EQ(e->repeats, 3);
        EXPECT_GT(e->seconds, 0.0);
        // Two sleeping operands per GEMM in every timed step.
        if (opt == "slow") {
          EXPECT_GE(e->seconds, 2 * kSleep) << l->name << " " << gemm_name(g);
        }
      }
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[1].find("option slow (2/2): 1 + 3 training steps of 2 x 8 tokens"), std::string::npos) << lines[1];
  // The run's precisions are back, no gradient was written, and the
  // calibration's quantization errors were discarded.
  for (const QuantLinear& l : layers) {
    EXPECT_EQ(l->precision.quantizer, run_q) << l->name;
    EXPECT_EQ(l->precision.gemm_dtype, at::kBFloat16);
    EXPECT_EQ(l->key_base.step, 41) << l->name;
    for (const formats::ErrorNorms& n : l->operand_errors->take()) EXPECT_EQ(n.calls, 0) << l->name;
  }
  // Each of the option's 1 + 3 passes ran under a step number of its own,
  // above every optimizer step, counting down from 2^32 - 1 over both
  // options' 8 passes (the run's own step 41 untouched).
  ASSERT_TRUE(slow);
  EXPECT_EQ(slow->steps(), (std::set<int64_t>{(int64_t(1) << 32) - 8, (int64_t(1) << 32) - 7,
                                              (int64_t(1) << 32) - 6, (int64_t(1) << 32) - 5}));
  for (const torch::Tensor& p : model->parameters()) EXPECT_FALSE(p.grad().defined());
  // Every item of a plan of this model finds its seconds.
  std::vector<plan::TimedLayer> timed;
  plan::PlanProblem prob;
  for (const QuantLinear& l : layers) {
    timed.push_back({l->name, l->in_features, l->out_features});
    plan::PlanItem it;
    it.name = it.layer = l->name;
    prob.items.push_back(it);
  }
  EXPECT_NO_THROW(plan::apply_gemm_times(prob, t, timed, 16, 1.0, {"bf16", "slow"}));
  EXPECT_GE(prob.items[0].seconds.at("slow"), 6 * kSleep);
}

TEST(GemmCalibrate, InStepRefusesAnEmptyMicroBatch) {
  torch::manual_seed(7);
  LlamaForCausalLM model(test::two_block_llama());
  CalibrateOptions o;
  o.options = {"bf16"};
  EXPECT_THROW(calibrate_gemm_times_in_step(InStepModel{model, 0, 8, 5}, recipes::RecipeSet(), o), UserError);
}

TEST(GemmCalibrate, InStepRestoresTheRunOnAnException) {
  torch::manual_seed(7);
  LlamaForCausalLM model(test::two_block_llama());
  const auto run_q = std::make_shared<SleepQuantizer>();
  model->set_precision(LinearPrecision{run_q, at::kBFloat16});
  for (QuantLinear l : model->linear_layers()) l->key_base.step = 3;
  CalibrateOptions o;
  o.options = {"bf16", "broken"};
  o.gemm_dtype = at::kBFloat16;
  o.repeats = 2;
  // Fails in the middle of the second option's first pass.
  o.quantizer_for = [](const std::string&) { return std::make_shared<SleepQuantizer>(30); };
  EXPECT_THROW(calibrate_gemm_times_in_step(InStepModel{model, 2, 8, 5}, recipes::RecipeSet(), o), std::exception);
  EXPECT_EQ(GemmTimer::active(), nullptr);
  for (const QuantLinear& l : model->linear_layers()) {
    EXPECT_EQ(l->precision.quantizer, run_q) << l->name;
    EXPECT_EQ(l->key_base.step, 3) << l->name;
    for (const formats::ErrorNorms& n : l->operand_errors->take()) EXPECT_EQ(n.calls, 0) << l->name;
  }
  for (const torch::Tensor& p : model->parameters()) EXPECT_FALSE(p.grad().defined());
}
