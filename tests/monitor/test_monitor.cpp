// The Prometheus exporter (monitor/exporter.h): the exposition text against
// hand-written expected text (label escaping, NaN / +Inf / -Inf as the text
// format 0.0.4 spells them), the streaks (stats-step GEMM error; per-step
// operand error against its format's threshold) at their boundaries,
// monitor.listen parsing, and the HTTP endpoint on loopback.
#include <gtest/gtest.h>
#include <httplib.h>

#include <cmath>
#include <limits>
#include <set>
#include <sstream>

#include "snip/config/config.h"
#include "snip/monitor/exporter.h"
#include "snip/core/error.h"

using namespace snip;
using namespace snip::monitor;
using json = nlohmann::json;

namespace {

const double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::numeric_limits<double>::quiet_NaN();

RunInfo info() {
  RunInfo i;
  i.tokens_per_step = 32;
  i.rank = 0;
  i.world_size = 1;
  i.policy = "snip";
  i.option_formats["fp4"] = {{"fprop.x", "e2m1"}, {"fprop.w", "e2m1"}, {"dgrad.dy", "e2m1"},
                             {"dgrad.w", "e2m1"},  {"wgrad.dy", "e2m1"}, {"wgrad.x", "e2m1"}};
  // An FP8 option with E5M2 gradients (TransformerEngine's HYBRID format):
  // E4M3 for X and W, E5M2 for dY.
  i.option_formats["fp8"] = {{"fprop.x", "e4m3"}, {"fprop.w", "e4m3"}, {"dgrad.dy", "e5m2"},
                             {"dgrad.w", "e4m3"}, {"wgrad.dy", "e5m2"}, {"wgrad.x", "e4m3"}};
  return i;
}

// The block of family `name` in `text` (HELP, TYPE and its samples).
std::string family(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  std::string out;
  for (std::string line; std::getline(in, line);) {
    const bool comment = line.rfind("# HELP " + name + " ", 0) == 0 || line.rfind("# TYPE " + name + " ", 0) == 0;
    const bool sample = line.rfind(name + " ", 0) == 0 || line.rfind(name + "{", 0) == 0;
    if (comment || sample) out += line + "\n";
  }
  return out;
}

// A metrics.jsonl record as the trainer writes it.
StepRecord rec(const json& j) { return step_record_from_json(j, "test record"); }

}  // namespace

TEST(Monitor, ScalarsAndNonFiniteValuesAsTheTextFormatSpellsThem) {
  Exporter e(info());
  json r = {{"step", 7}, {"loss", kNaN}, {"lr", 0.001}, {"grad_norm", -kInf}, {"tokens_per_s", 64.0},
            {"val_loss", kInf}, {"fp4_share", 0.75}};
  e.update(rec(r));
  const std::string t = e.text();
  EXPECT_EQ(family(t, "snip_loss"),
            "# HELP snip_loss Training loss of the last step (nats per token)\n"
            "# TYPE snip_loss gauge\n"
            "snip_loss NaN\n");
  EXPECT_EQ(family(t, "snip_val_loss"),
            "# HELP snip_val_loss Validation loss of the last evaluation (nats per token)\n"
            "# TYPE snip_val_loss gauge\n"
            "snip_val_loss +Inf\n");
  EXPECT_EQ(family(t, "snip_grad_norm").substr(family(t, "snip_grad_norm").rfind('\n', family(t, "snip_grad_norm").size() - 2) + 1),
            "snip_grad_norm -Inf\n");
  EXPECT_NE(t.find("\nsnip_step 7\n"), std::string::npos);
  // tokens: step x tokens per step (7 x 32); step time: tokens per step / tokens/s (32 / 64).
  EXPECT_EQ(family(t, "snip_tokens_total"),
            "# HELP snip_tokens_total Training tokens processed (all ranks), step x tokens per step\n"
            "# TYPE snip_tokens_total counter\n"
            "snip_tokens_total 224\n");
  EXPECT_NE(t.find("\nsnip_step_seconds 0.5\n"), std::string::npos);
  EXPECT_NE(t.find("\nsnip_fp4_flops_share 0.75\n"), std::string::npos);
  EXPECT_NE(t.find("\nsnip_guard_state 0\n"), std::string::npos);
  // Not measured yet: no sample (no invented 0), no family.
  EXPECT_EQ(family(t, "snip_quant_rel_error"), "");
  EXPECT_EQ(family(t, "snip_checkpoint_age_seconds"), "");
  EXPECT_EQ(family(t, "snip_planner_status"), "");
}

TEST(Monitor, LabelValuesEscapedBackslashQuoteNewline) {
  RunInfo i = info();
  i.policy = "a\\b\"c\nd";  // a\b"c<newline>d
  Exporter e(i);
  EXPECT_EQ(family(e.text(), "snip_info"),
            "# HELP snip_info Always 1; labels: rank, world_size, policy\n"
            "# TYPE snip_info gauge\n"
            "snip_info{policy=\"a\\\\b\\\"c\\nd\",rank=\"0\",world_size=\"1\"} 1\n");
}

TEST(Monitor, PerLayerErrorPrecisionAndPlanner) {
  Exporter e(info());
  e.update(rec({{"step", 3},
            {"precision", {{"l.q", "fp4"}, {"l.k", "fp8"}}},
            {"rel_err_fprop", {{"l.q", 0.125}, {"l.k", 0.0}}},
            {"plan_step", 2},
            {"plan_status", "optimal"},
            {"plan_solve_seconds", 0.25},
            {"stats_seconds", 1.5}}));
  const std::string t = e.text();
  EXPECT_EQ(family(t, "snip_quant_rel_error"),
            "# HELP snip_quant_rel_error Relative error ||Y_q - Y||/||Y|| of a GEMM's output under the layer's "
            "option, at the last stats step (ratio; labels layer, gemm, operand)\n"
            "# TYPE snip_quant_rel_error gauge\n"
            "snip_quant_rel_error{gemm=\"fprop\",layer=\"l.k\",operand=\"both\"} 0\n"
            "snip_quant_rel_error{gemm=\"fprop\",layer=\"l.q\",operand=\"both\"} 0.125\n");
  // Six operands per layer, each with its element bits.
  const std::string bits = family(t, "snip_layer_precision_bits");
  EXPECT_NE(bits.find("snip_layer_precision_bits{gemm=\"fprop\",layer=\"l.q\",operand=\"x\",option=\"fp4\"} 4\n"),
            std::string::npos);
  EXPECT_NE(bits.find("snip_layer_precision_bits{gemm=\"wgrad\",layer=\"l.k\",operand=\"dy\",option=\"fp8\"} 8\n"),
            std::string::npos);
  EXPECT_EQ(std::count(bits.begin(), bits.end(), '\n'), 2 + 12);
  EXPECT_NE(t.find("\nsnip_planner_status{status=\"optimal\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("\nsnip_planner_solve_seconds 0.25\n"), std::string::npos);
  EXPECT_NE(t.find("\nsnip_stats_step_seconds 1.5\n"), std::string::npos);
  EXPECT_NE(t.find("\nsnip_plan_step 2\n"), std::string::npos);
  // per-GEMM granularity: "layer:gemm" items
  e.update(rec({{"step", 4}, {"precision", {{"l.q:fprop", "fp8"}, {"l.q:dgrad", "fp4"}, {"l.q:wgrad", "fp4"}}}}));
  const std::string g = family(e.text(), "snip_layer_precision_bits");
  EXPECT_NE(g.find("{gemm=\"fprop\",layer=\"l.q\",operand=\"w\",option=\"fp8\"} 8\n"), std::string::npos);
  EXPECT_NE(g.find("{gemm=\"dgrad\",layer=\"l.q\",operand=\"w\",option=\"fp4\"} 4\n"), std::string::npos);
  EXPECT_EQ(std::count(g.begin(), g.end(), '\n'), 2 + 6);
}

TEST(Monitor, StatsStepStreakCountsMeasurementsStrictlyAboveTheThreshold) {
  // The stats step's GEMM-output error of a layer with no precision known
  // counts against guard.quant_error_threshold (0.08 by default): exactly
  // the threshold never counts; two above then one below resets; three
  // above reach 3; NaN and Inf count as above.
  Exporter e(info());
  const std::vector<std::vector<double>> seq = {
      {0.08, 0.09, 0.09, 0.1, kNaN}, {0.08, 0.09, 0.09, 0.12, kInf}, {0.08, 0.09, 0.07, 0.09, 0.0}};
  const std::vector<std::vector<int64_t>> want = {{0, 1, 2, 3, 4}, {0, 1, 2, 3, 4}, {0, 1, 0, 1, 0}};
  const char* layers[3] = {"a", "b", "c"};
  for (size_t k = 0; k < 5; ++k) {
    json rel = json::object();
    for (int l = 0; l < 3; ++l) rel[layers[l]] = seq[size_t(l)][k];
    e.update(rec({{"step", k + 1}, {"rel_err_fprop", rel}}));
    for (int l = 0; l < 3; ++l) EXPECT_EQ(e.streak(layers[l]), want[size_t(l)][k]) << layers[l] << " " << k;
  }
  // Exactly the threshold, three times: never a streak.
  Streak s(0.05);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(s.add("x", 0.05), 0);
  EXPECT_EQ(s.add("x", std::nextafter(0.05, 1.0)), 1);
  // Steps between stats steps carry no measurement: the streak stays.
  e.update(rec({{"step", 9}, {"loss", 1.0}}));
  EXPECT_EQ(e.streak("a"), 4);
  EXPECT_NE(e.text().find("snip_quant_rel_error_streak{gemm=\"fprop\",layer=\"a\",operand=\"both\"} 4\n"),
            std::string::npos);
}

// The per-step operand error and its streak against the threshold of the
// operand's own element format, with the guard's defaults (E4M3 0.08, E5M2
// 0.15, E2M1 0.3): the sequences of deploy/prometheus/snip-rules-test.yml.
TEST(Monitor, OperandStreakCountsStepsAboveTheFormatsThreshold) {
  Exporter e(info());
  e.update(rec({{"step", 1}, {"precision", {{"l.q", "fp4"}, {"l.k", "fp8"}}}}));
  struct Seq {
    const char *layer, *op, *gemm, *operand;
    std::vector<double> v;
    std::vector<int64_t> want;
  };
  const std::vector<Seq> seqs = {
      {"l.k", "fprop.x", "fprop", "x", {0.08, 0.08, 0.08, 0.08}, {0, 0, 0, 0}},    // e4m3, exactly 0.08
      {"l.k", "dgrad.dy", "dgrad", "dy", {0.16, 0.17, 0.14, 0.14}, {1, 2, 0, 0}},  // e5m2, a drop
      {"l.q", "fprop.w", "fprop", "w", {0.25, 0.25, 0.25, 0.25}, {0, 0, 0, 0}},    // e2m1 healthy
      {"l.k", "wgrad.x", "wgrad", "x", {0.09, 0.09, 0.1, 0.1}, {1, 2, 3, 4}},      // e4m3 above 0.08
      {"l.q", "wgrad.dy", "wgrad", "dy", {0.31, kNaN, kInf, 0.3}, {1, 2, 3, 0}},   // e2m1; NaN/Inf count
  };
  for (size_t k = 0; k < 4; ++k) {
    json q = json::object();
    for (const Seq& s : seqs) q[s.layer][s.op] = s.v[k];
    e.update(rec({{"step", k + 2}, {"quant_err", q}}));
    for (const Seq& s : seqs) {
      const std::string want = "snip_quant_operand_rel_error_streak{format=\"" +
                               std::string(std::string(s.layer) == "l.q" ? "e2m1" : s.operand == std::string("dy") ? "e5m2" : "e4m3") +
                               "\",gemm=\"" + s.gemm + "\",layer=\"" + s.layer + "\",operand=\"" + s.operand +
                               "\"} " + std::to_string(s.want[k]) + "\n";
      EXPECT_NE(e.text().find(want), std::string::npos) << want << " at step " << k + 2;
    }
  }
  const std::string t = family(e.text(), "snip_quant_operand_rel_error");
  EXPECT_NE(t.find("snip_quant_operand_rel_error{format=\"e5m2\",gemm=\"dgrad\",layer=\"l.k\",operand=\"dy\"} 0.14\n"),
            std::string::npos) << t;
  EXPECT_EQ(std::count(t.begin(), t.end(), '\n'), 2 + 5);
  // A step that quantized nothing of a layer drops its operands (not measured).
  e.update(rec({{"step", 6}, {"quant_err", {{"l.k", {{"fprop.x", 0.01}}}}}}));
  const std::string u = family(e.text(), "snip_quant_operand_rel_error");
  EXPECT_EQ(std::count(u.begin(), u.end(), '\n'), 2 + 1) << u;
}

TEST(Monitor, CheckpointAgeAndMemory) {
  Exporter e(info());
  e.checkpoint_written(5);
  const std::string t = e.text();
  EXPECT_NE(t.find("\nsnip_last_checkpoint_step 5\n"), std::string::npos);
  const std::string age = family(t, "snip_checkpoint_age_seconds");
  const double a = std::stod(age.substr(age.rfind(' ') + 1));
  EXPECT_GE(a, 0.0);
  EXPECT_LT(a, 60.0);
  // RSS <= peak RSS, both positive (read from /proc/self/status at each scrape).
  auto value = [&](const std::string& name) {
    const std::string f = family(t, name);
    return std::stod(f.substr(f.rfind(' ') + 1));
  };
  EXPECT_GT(value("snip_process_resident_memory_bytes"), 0.0);
  EXPECT_LE(value("snip_process_resident_memory_bytes"), value("snip_process_peak_resident_memory_bytes"));
}

TEST(Monitor, ListenOptionParsedAndChecked) {
  Config c;
  MonitorOptions o = monitor_options(RunConfig::from(c).monitor);
  EXPECT_TRUE(o.enabled);
  EXPECT_EQ(o.address(0, 0), "127.0.0.1:9464");
  EXPECT_EQ(o.address(1, 1), "");  // rank0: other ranks serve nothing
  c.set_override("monitor.ranks=all");
  o = monitor_options(RunConfig::from(c).monitor);
  EXPECT_EQ(o.address(3, 1), "127.0.0.1:9465");  // port + local rank
  c.set_override("monitor.listen=");
  EXPECT_FALSE(monitor_options(RunConfig::from(c).monitor).enabled);
  EXPECT_EQ(monitor_options(RunConfig::from(c).monitor).address(0, 0), "");
  for (const char* bad : {"9464", "127.0.0.1:", ":9464", "127.0.0.1:70000", "127.0.0.1:x1", "a b:1"}) {
    c.set("monitor.listen", std::string(bad), "test");
    try {
      monitor_options(RunConfig::from(c).monitor);
      ADD_FAILURE() << bad;
    } catch (const UserError& e) {
      EXPECT_EQ(std::string(e.what()).rfind("monitor.listen: expected HOST:PORT", 0), 0u) << e.what();
    }
  }
  c.set_override("monitor.ranks=some");
  EXPECT_THROW(c.validate(), UserError);
}

TEST(Monitor, ServesMetricsOnLoopbackAndReportsAPortInUse) {
  Exporter e(info());
  std::string why;
  const int port = e.listen("127.0.0.1:0", &why);
  ASSERT_GT(port, 0) << why;
  e.update(rec({{"step", 2}, {"loss", 3.5}}));
  httplib::Client cli("127.0.0.1", port);
  auto res = cli.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(family(res->body, "snip_loss"), family(e.text(), "snip_loss"));
  EXPECT_NE(res->body.find("\nsnip_loss 3.5\n"), std::string::npos);
  // Every family snip lists is one the scrape may carry, and every family
  // in the scrape is listed.
  std::set<std::string> listed;
  for (const MetricInfo& m : metric_table()) listed.insert(m.name);
  std::istringstream in(res->body);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("# TYPE ", 0) == 0) {
      EXPECT_TRUE(listed.count(line.substr(7, line.find(' ', 7) - 7))) << line;
    }
  Exporter second(info());
  std::string busy;
  EXPECT_EQ(second.listen("127.0.0.1:" + std::to_string(port), &busy), -1);
  EXPECT_NE(busy.find("in use"), std::string::npos) << busy;
}
