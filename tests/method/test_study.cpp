// The correlation study (study.h) on the micro model: its BF16 baseline arm
// reproduces the run's own continuation bit for bit (same weights, moments,
// data order and LR schedule), quantizing one layer changes the loss, and the
// correlations are those of the reported numbers.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "snip/config/config.h"
#include "snip/app/study.h"
#include "snip/train/trainer.h"
#include "snip/io/atomic_file.h"
#include "snip/report/report.h"
#include "snip/core/error.h"
#include "snip/core/statistics.h"
#include "micro.h"

using namespace snip;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using test::fresh_dir;

#define REQUIRE_DATA() \
  if (!fs::exists(test::kKjv512 + "/train.bin")) GTEST_SKIP() << "no prepared KJV data"

}  // namespace

TEST(CorrelationStudy, BaselineReproducesTheRunAndLayersMove) {
  REQUIRE_DATA();
  Config c = test::micro_config();
  c.set("train.max_steps", int64_t{12}, "test");
  c.set("train.checkpoint_interval", int64_t{8}, "test");
  c.set("train.keep_checkpoints", int64_t{0}, "test");
  c.set("train.eval_batches", int64_t{4}, "test");
  TrainOptions o;
  o.quiet = true;
  o.run_dir = fresh_dir("run");
  const TrainSummary s = train(c, o);  // checkpoints at 8 and 12; val at 12

  CorrelationOptions co;
  co.run_dir = o.run_dir;
  co.step = 8;
  co.steps = 4;  // 8 -> 12: the baseline arm is the run's own last 4 steps
  co.layers = {"layers.0.*", "*.down_proj"};
  co.out_dir = o.run_dir + "/corr";
  co.quiet = true;
  const CorrelationResult r = correlation_study(co);
  EXPECT_EQ(r.base_val_loss, s.final_val_loss);  // bit-exact replay of steps 9..12
  ASSERT_EQ(r.layers.size(), 8u);                // 7 layers of block 0 + block 1's down_proj
  EXPECT_EQ(r.layers.back().name, "model.layers.1.mlp.down_proj");
  std::vector<double> q, dv;
  for (const auto& l : r.layers) {
    SCOPED_TRACE(l.name);
    EXPECT_NE(l.delta_val, 0.0);  // FP4 on one layer changes the trajectory
    EXPECT_EQ(l.delta_val, l.val_loss - r.base_val_loss);
    EXPECT_GT(l.q, 0.0);
    EXPECT_GT(l.rel_err_fprop, 0.01);  // FP4 (E2M1) errors are percent-level
    q.push_back(l.q);
    dv.push_back(l.delta_val);
  }
  EXPECT_DOUBLE_EQ(r.correlations.at("q").at("pearson"), pearson(q, dv));
  // The grid at the run's first-order rule and α = 1 (or 0) is LD (or WD)
  // itself up to a positive scale (normalised over the studied layers instead
  // of all layers), which correlation ignores.
  const std::string fo = c.get_string("precision.first_order");
  EXPECT_NEAR(r.correlations.at("q[" + fo + ",a=1]").at("pearson"), r.correlations.at("ld").at("pearson"), 1e-12);
  EXPECT_NEAR(r.correlations.at("q[" + fo + ",a=0]").at("pearson"), r.correlations.at("wd").at("pearson"), 1e-12);
  // Predictors by hand from the per-layer parts, and a JSON round trip (--replot).
  const std::vector<double> ld_drop = predictor_values(r, "ld[drop]"), ld_abs = predictor_values(r, "ld[abs]");
  for (size_t i = 0; i < r.layers.size(); ++i) {
    EXPECT_EQ(ld_drop[i], std::max(0.0, r.layers[i].ld_curvature));
    EXPECT_EQ(ld_abs[i], std::max(0.0, std::abs(r.layers[i].ld_first_order) + r.layers[i].ld_curvature));
  }
  const CorrelationResult back = correlation_from_json(json::parse(to_json(r).dump()), "round trip");
  EXPECT_EQ(predictor_values(back, "q[signed,a=0.3]"), predictor_values(r, "q[signed,a=0.3]"));
  EXPECT_EQ(back.base_val_loss, r.base_val_loss);
  EXPECT_NE(test::error_of([&] { predictor_values(r, "q[drop]"); }).find("unknown predictor"), std::string::npos);
  const json j = json::parse(io::read_file(co.out_dir + "/correlation.json"));
  EXPECT_EQ(j["layers"].size(), 8u);
  EXPECT_EQ(j["base_val_loss"].get<double>(), s.final_val_loss);
  std::ifstream csv(co.out_dir + "/correlation.csv");
  int lines = 0;
  for (std::string line; std::getline(csv, line);) ++lines;
  EXPECT_EQ(lines, 9);

  // Repeats: repeat 0 is the study above bit for bit; repeat 1 trains on the
  // next 4 steps' data with another SR seed (its own baseline); the layer's
  // change is the mean of the two, its standard error
  // sd/sqrt(2) = |d0 - d1| / 2.
  co.repeats = 2;
  co.out_dir = o.run_dir + "/corr2";
  const CorrelationResult r2 = correlation_study(co);
  ASSERT_EQ(r2.base_val_losses.size(), 2u);
  EXPECT_EQ(r2.base_val_losses[0], r.base_val_loss);
  EXPECT_NE(r2.base_val_losses[1], r.base_val_loss);  // other data
  ASSERT_EQ(r2.layers.size(), r.layers.size());
  std::vector<double> dv2;
  for (size_t i = 0; i < r2.layers.size(); ++i) {
    const auto& l = r2.layers[i];
    SCOPED_TRACE(l.name);
    ASSERT_EQ(l.delta_val_repeats.size(), 2u);
    EXPECT_EQ(l.delta_val_repeats[0], r.layers[i].delta_val);
    EXPECT_DOUBLE_EQ(l.delta_val, (l.delta_val_repeats[0] + l.delta_val_repeats[1]) / 2);
    EXPECT_NEAR(l.delta_val_se, std::abs(l.delta_val_repeats[0] - l.delta_val_repeats[1]) / 2, 1e-15);
    EXPECT_EQ(l.q, r.layers[i].q);  // one prediction
    dv2.push_back(l.delta_val);
  }
  const auto& m = r2.correlations.at("q");
  EXPECT_DOUBLE_EQ(m.at("pearson"), pearson(q, dv2));
  EXPECT_LE(m.at("pearson_lo"), m.at("pearson_hi"));
  EXPECT_LE(m.at("spearman_lo"), m.at("spearman_hi"));
  EXPECT_EQ(r.correlations.at("q").count("pearson_lo"), 0u);  // one repeat: no interval
  const CorrelationResult back2 = correlation_from_json(json::parse(to_json(r2).dump()), "round trip");
  EXPECT_EQ(back2.repeats, 2);
  EXPECT_EQ(back2.layers[0].delta_val_repeats, r2.layers[0].delta_val_repeats);
  EXPECT_EQ(back2.layers[0].delta_val_se, r2.layers[0].delta_val_se);
  co.repeats = 0;
  EXPECT_NE(test::error_of([&] { correlation_study(co); }).find("--repeats: expected >= 1"), std::string::npos);
  co.repeats = 1;

  co.layers = {"*.nothing"};
  EXPECT_NE(test::error_of([&] { correlation_study(co); }).find("--layers: pattern '*.nothing' matches no"),
            std::string::npos);
  co.layers = {};
  co.steps = 0;
  EXPECT_NE(test::error_of([&] { correlation_study(co); }).find("--steps: expected >= 1"), std::string::npos);
  co.steps = 1;
  co.step = 5;
  EXPECT_NE(test::error_of([&] { correlation_study(co); }).find("step-5 does not exist"), std::string::npos);
  co.run_dir = o.run_dir + "/nope";
  EXPECT_NE(test::error_of([&] { correlation_study(co); }).find("does not exist (expected a run"), std::string::npos);
  fs::remove_all(o.run_dir);
}
