// Resume is bit for bit under every registered recipe and every policy:
// everything that decides a step's numerics is in the checkpoint (weights,
// AdamW state, loader position, controller and plan state, delayed scaling's
// amax histories; stochastic rounding is keyed by (seed, step, layer, operand)
// and keeps no state). Each case trains the micro model once straight and once
// killed after step 3 and resumed from the step-2 checkpoint; losses, gradient
// norms, validation losses and the final weights must be equal. Evaluation runs
// after every step and must not feed the amax histories: the training losses
// must equal those of a run that never evaluates.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "micro.h"
#include "snip/config/config.h"
#include "snip/io/atomic_file.h"
#include "snip/recipes/recipe.h"
#include "snip/train/trainer.h"

using namespace snip;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using test::fresh_dir;
using test::read_metrics;

// Straight vs killed-after-3-and-resumed, and evaluation-free; `c` has
// max_steps etc. set by the caller.
void expect_exact_resume(Config c, const std::string& tag) {
  if (!fs::exists(test::kKjv512 + "/train.bin")) GTEST_SKIP() << "no prepared KJV data";
  c.set("train.checkpoint_interval", int64_t{2}, "test");
  c.set("train.keep_checkpoints", int64_t{0}, "test");
  c.set("train.eval_interval", int64_t{1}, "test");
  c.set("train.eval_batches", int64_t{2}, "test");
  TrainOptions o;
  o.quiet = true;
  o.run_dir = fresh_dir(tag + "-straight");
  train(c, o);
  const auto straight = read_metrics(o.run_dir);

  TrainOptions r = o;
  r.run_dir = fresh_dir(tag + "-resumed");
  r.stop_after = 3;
  train(c, r);
  r.stop_after = 0;
  r.resume = true;
  train(c, r);
  const auto resumed = read_metrics(r.run_dir);

  Config no_eval = c;
  no_eval.set("train.eval_interval", int64_t{1000}, "test");
  TrainOptions n = o;
  n.run_dir = fresh_dir(tag + "-noeval");
  train(no_eval, n);
  const auto quiet = read_metrics(n.run_dir);

  ASSERT_EQ(resumed.size(), straight.size());
  ASSERT_EQ(quiet.size(), straight.size());
  for (size_t i = 0; i < straight.size(); ++i) {
    SCOPED_TRACE("step " + std::to_string(i + 1));
    EXPECT_EQ(resumed[i]["loss"].get<double>(), straight[i]["loss"].get<double>());
    EXPECT_EQ(resumed[i]["grad_norm"].get<double>(), straight[i]["grad_norm"].get<double>());
    EXPECT_EQ(resumed[i]["val_loss"].get<double>(), straight[i]["val_loss"].get<double>());
    EXPECT_EQ(resumed[i].value("precision", json()), straight[i].value("precision", json()));
    EXPECT_EQ(quiet[i]["loss"].get<double>(), straight[i]["loss"].get<double>()) << "evaluation changed training";
  }
  const std::string last = "/checkpoints/step-" + std::to_string(straight.size()) + "/model.safetensors";
  EXPECT_TRUE(io::read_file(o.run_dir + last) == io::read_file(r.run_dir + last)) << "final weights differ";
  for (const auto& d : {o.run_dir, r.run_dir, n.run_dir}) fs::remove_all(d);
}

class ResumeEveryRecipe : public ::testing::TestWithParam<std::string> {};

TEST_P(ResumeEveryRecipe, IsBitForBit) {
  Config c = test::micro_config();
  c.set("train.max_steps", int64_t{5}, "test");
  c.set("precision.recipe", GetParam(), "test");
  expect_exact_resume(c, "recipe-" + GetParam());
}

INSTANTIATE_TEST_SUITE_P(Registered, ResumeEveryRecipe, ::testing::ValuesIn(recipes::RecipeSet().names()),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

// Every policy, with the delayed-scaling recipe among its options, in the
// warmup and in the final phase, so its amax histories cross the resume.
class ResumeEveryPolicy : public ::testing::TestWithParam<std::string> {};

TEST_P(ResumeEveryPolicy, IsBitForBit) {
  Config c = test::micro_config();
  c.set("train.max_steps", int64_t{6}, "test");
  c.set("precision.policy", GetParam(), "test");
  c.set("precision.warmup_steps", int64_t{1}, "test");
  c.set("precision.initial_interval", int64_t{2}, "test");
  c.set("precision.final_interval", int64_t{2}, "test");
  c.set("precision.warmup_precision", std::string("fp8_tensor"), "test");
  c.set("precision.final_precision", std::string("fp8_tensor"), "test");
  c.set("precision.final_high_precision_fraction", 0.2, "test");
  expect_exact_resume(c, "policy-" + GetParam());
}

INSTANTIATE_TEST_SUITE_P(All, ResumeEveryPolicy,
                         ::testing::Values("bf16", "uniform-fp8_tensor", "uniform-fp4", "snip", "min-rel-err",
                                           "layer-type", "first-last-fp8", "random"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

// The checkpoint holds the histories: a fp8_tensor run's trainer_state.json
// has one entry per (layer, operand) quantized so far, each with the
// recorded amaxes; a corrupted entry is refused on resume with one line.
TEST(ResumeState, CheckpointCarriesAmaxHistoriesAndRefusesBadOnes) {
  if (!fs::exists(test::kKjv512 + "/train.bin")) GTEST_SKIP() << "no prepared KJV data";
  Config c = test::micro_config();
  c.set("train.max_steps", int64_t{4}, "test");
  c.set("train.checkpoint_interval", int64_t{2}, "test");
  c.set("precision.recipe", std::string("fp8_tensor"), "test");
  TrainOptions o;
  o.quiet = true;
  o.run_dir = fresh_dir("state");
  o.stop_after = 2;
  train(c, o);
  const std::string st_path = o.run_dir + "/checkpoints/step-2/trainer_state.json";
  json st = json::parse(io::read_file(st_path));
  const json& q = st.at("precision").at("quantizers").at("fp8_tensor");
  // 2 layers x 7 linear layers x 6 operands, two steps each.
  ASSERT_EQ(q.at("delayed").size(), 2u * 7u * 6u);
  for (const json& e : q.at("delayed")) {
    EXPECT_EQ(e.at("history").size(), 2u) << e.dump();
    EXPECT_EQ(e.at("calls"), 2);
    EXPECT_EQ(e.at("scale_amax"), json(std::max(e.at("history")[0].get<float>(), e.at("history")[1].get<float>())));
  }
  // Tampered entries (checksums recomputed: only the content is wrong) are
  // refused with one line naming the file and the problem.
  const std::string good = io::read_file(st_path);
  o.stop_after = 0;
  o.resume = true;
  auto refused = [&](const std::function<void(json&)>& edit, const std::string& needle) {
    json bad = json::parse(good);
    edit(bad["precision"]["quantizers"]["fp8_tensor"]);
    io::write_file_atomic(st_path, bad.dump(2));
    write_checkpoint_manifest(fs::path(st_path).parent_path().string());  // past the checksum, to the fields
    const std::string err = test::error_of([&] { train(c, o); });
    EXPECT_NE(err.find(needle), std::string::npos) << err;
    EXPECT_NE(err.find("trainer_state.json"), std::string::npos) << err;
  };
  refused([](json& q) { q["delayed"][0]["history"][0] = -1.0; }, "amax history holds -1");
  refused([](json& q) { q["delayed"][0]["layer"] = 999; }, "layer 999 is not a linear layer of this model (0 .. 13)");
  refused([](json& q) { q["delayed"][0]["calls"] = 2.7; }, "calls: expected an integer, got 2.7");
  refused([](json& q) { q["delayed"][0]["scale_amax"] = -3.0; }, "scale_amax -3 is not a finite value >= 0");
  refused([](json& q) { q["delayed"] = json::object(); }, ".delayed: expected a list, got object");
  refused([](json& q) { q["delayed"].push_back(q["delayed"][0]); }, "appears twice");
  // Restored intact, the run finishes.
  io::write_file_atomic(st_path, good);
  write_checkpoint_manifest(fs::path(st_path).parent_path().string());
  EXPECT_EQ(test::error_of([&] { train(c, o); }), "(no error)");
  fs::remove_all(o.run_dir);
}

// The configuration may drop an option between invocations: its state is
// dropped with a warning (as a changed policy is), not refused.
TEST(ResumeState, StateOfAnOptionNoLongerConfiguredIsDropped) {
  if (!fs::exists(test::kKjv512 + "/train.bin")) GTEST_SKIP() << "no prepared KJV data";
  Config c = test::micro_config();
  c.set("train.max_steps", int64_t{2}, "test");
  c.set("train.checkpoint_interval", int64_t{2}, "test");
  c.set("precision.policy", std::string("uniform-fp8"), "test");
  c.set("precision.warmup_steps", int64_t{1}, "test");
  c.set("precision.final_high_precision_fraction", 0.0, "test");
  c.set("precision.warmup_precision", std::string("fp8_tensor"), "test");
  TrainOptions o;
  o.quiet = true;
  o.run_dir = fresh_dir("dropped");
  train(c, o);
  EXPECT_TRUE(json::parse(io::read_file(o.run_dir + "/checkpoints/step-2/trainer_state.json"))
                  .at("precision").at("quantizers").contains("fp8_tensor"));
  c.set("train.max_steps", int64_t{4}, "test");
  c.set("precision.warmup_precision", std::string("bf16"), "test");
  o.resume = true;
  EXPECT_EQ(test::error_of([&] { train(c, o); }), "(no error)");
  EXPECT_EQ(read_metrics(o.run_dir).size(), 4u);
  fs::remove_all(o.run_dir);
}

}  // namespace

// precision.recipe_file (docs/formats.md "Recipe files"): a recipe with error
// feedback on the weights (its residuals cross the resume in the checkpoint)
// and delayed dY scaling refreshed every 2 steps (compensation_freq), two
// micro-batches per step (the residual advances once per step), evaluation
// after every step (frozen: the residual must not move).
TEST(ResumeState, RecipeFileWithErrorFeedbackIsBitForBit) {
  const std::string dir = fresh_dir("recipe-file");
  fs::create_directories(dir);
  const std::string path = dir + "/recipes.toml";
  std::ofstream(path) << R"(
[recipes.ef_w4a8_test]
error_feedback = true
compensation_freq = 2
activations = { element = "e4m3" }
weights = { element = "e2m1", block = "row" }
gradients = { element = "e5m2", rule = "delayed", amax_history_len = 4 }
)";
  Config c = test::micro_config();
  c.set("train.max_steps", int64_t{5}, "test");
  c.set("train.grad_accum", int64_t{2}, "test");
  c.set("precision.recipe_file", path, "test");
  c.set("precision.recipe", std::string("ef_w4a8_test"), "test");
  expect_exact_resume(c, "recipe-file-ef");
  fs::remove_all(dir);
}
