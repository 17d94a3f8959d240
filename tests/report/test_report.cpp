// tests for snip_report: the SVG charts (svg.h), the metrics reader and the
// run report (report.h), and `snip report` run through the built snip
// program. Expected coordinates are worked out by hand from
// the layout constants documented in svg.h.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "program.h"
#include "snip/data/data_folder.h"
#include "snip/data/shard.h"
#include "snip/io/atomic_file.h"
#include "snip/report/report.h"
#include "snip/report/svg.h"
#include "snip/core/error.h"
#include "snip/core/statistics.h"

namespace fs = std::filesystem;
using namespace snip::report;
using snip::pearson;
using snip::spearman;

namespace {

const double kNaN = std::nan("");

// Occurrences of `needle` in `hay`.
size_t count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + needle.size())) ++n;
  return n;
}

// The <svg ...>...</svg> element with data-chart="id" inside an HTML page ("" if absent).
std::string chart(const std::string& html, const std::string& id) {
  const size_t at = html.find("data-chart=\"" + id + "\"");
  if (at == std::string::npos) return "";
  const size_t start = html.rfind("<svg", at);
  const size_t end = html.find("</svg>", at);
  return html.substr(start, end + 6 - start);
}

// The value of attribute `name` in the first element of `svg` that has class `cls`.
std::string first_attr(const std::string& svg, const std::string& cls, const std::string& name) {
  const size_t at = svg.find("class=\"" + cls + "\"");
  if (at == std::string::npos) return "";
  const size_t end = svg.find('>', at);
  const size_t a = svg.find(" " + name + "=\"", at);
  if (a == std::string::npos || a > end) return "";
  const size_t v = a + name.size() + 3;
  return svg.substr(v, svg.find('"', v) - v);
}

struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/snip_report_test_XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name, const std::string& text) const {
    const fs::path p = path / name;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p.string();
  }
  std::string str() const { return path.string(); }
};

// ---- a synthetic run: 3 layers, 6 steps, decisions at s = 0 (warmup, bf16)
// and s = 2 (plan with stats), evaluations at steps 3 and 6.
const char* kLayers[3] = {"model.layers.1.self_attn.q_proj", "model.layers.0.mlp.down_proj",
                          "model.layers.0.self_attn.q_proj"};

std::string metrics_line(int step, const std::string& extra = "") {
  std::ostringstream os;
  os << "{\"step\":" << step << ",\"loss\":" << 9.0 - 0.5 * step << ",\"lr\":0.001,\"grad_norm\":1.0,"
     << "\"tokens_per_s\":1000,\"elapsed_s\":" << step << ",\"fp4_share\":" << (step >= 3 ? 0.6 : 0.0) << extra << "}\n";
  return os.str();
}

void write_synthetic_run(const TempDir& t, const std::string& run, bool torn_tail = false) {
  std::string m;
  m += metrics_line(1, ",\"plan_step\":0,\"phase\":\"warmup\",\"precision\":{\"" + std::string(kLayers[0]) +
                           "\":\"bf16\",\"" + kLayers[1] + "\":\"bf16\",\"" + kLayers[2] + "\":\"bf16\"}");
  m += metrics_line(2);
  m += metrics_line(3, ",\"plan_step\":2,\"phase\":\"plan\",\"precision\":{\"" + std::string(kLayers[0]) +
                           "\":\"fp4\",\"" + kLayers[1] + "\":\"fp8\",\"" + kLayers[2] + "\":\"fp4\"},\"rel_err_fprop\":{\"" +
                           kLayers[0] + "\":0.12,\"" + kLayers[1] + "\":0.03,\"" + kLayers[2] + "\":0.15},\"val_loss\":7.6,\"val_ppl\":2000");
  m += metrics_line(4);
  m += metrics_line(5);
  m += metrics_line(6, ",\"val_loss\":6.9,\"val_ppl\":990");
  if (torn_tail) m += "{\"step\":7,\"loss\":5.";
  t.file(run + "/metrics.jsonl", m);
  t.file(run + "/plans/step-0.json",
         R"({"step":0,"policy":"snip","phase":"warmup","method":"uniform-bf16","status":"optimal","fp4_share":0.0,
             "objective":0.0,"low_option":"fp4","budget":null,
             "items":[{"name":"model.layers.0.self_attn.q_proj","flops":100,"option":"bf16","q":{}},
                      {"name":"model.layers.0.mlp.down_proj","flops":300,"option":"bf16","q":{}},
                      {"name":"model.layers.1.self_attn.q_proj","flops":100,"option":"bf16","q":{}}]})");
  t.file(run + "/plans/step-2.json",
         R"({"step":2,"policy":"snip","phase":"plan","method":"ilp","status":"optimal","proven_optimal":true,
             "solve_seconds":0.01,"stats_seconds":1.5,"fp4_share":0.4,"objective":0.5,"low_option":"fp4","budget":0.4,
             "option_costs":{"fp4":1,"fp8":2,"bf16":4},
             "items":[{"name":"model.layers.0.self_attn.q_proj","flops":100,"option":"fp4","q":{"fp4":0.2,"fp8":0.05,"bf16":0}},
                      {"name":"model.layers.0.mlp.down_proj","flops":300,"option":"fp8","q":{"fp4":0.9,"fp8":0.1,"bf16":0}},
                      {"name":"model.layers.1.self_attn.q_proj","flops":100,"option":"fp4","q":{"fp4":0.3,"fp8":0.07,"bf16":0}}],
             "q_table":{"model.layers.0.self_attn.q_proj":{"fp4":0.2,"fp8":0.05,"bf16":0}},
             "rel_err_fprop":{"model.layers.0.self_attn.q_proj":{"fp4":0.15,"fp8":0.04,"bf16":0},
                              "model.layers.0.mlp.down_proj":{"fp4":0.14,"fp8":0.03,"bf16":0},
                              "model.layers.1.self_attn.q_proj":{"fp4":0.12,"fp8":0.035,"bf16":0}}})");
  t.file(run + "/stats/step-2.json",
         R"({"step":2,"smoothing":0.1,
             "layers":[{"name":"model.layers.0.self_attn.q_proj","flops":100,"q":{"fp4":0.2,"fp8":0.05,"bf16":0},"rel_err":{"fp4":0.15,"fp8":0.04}},
                       {"name":"model.layers.0.mlp.down_proj","flops":300,"q":{"fp4":0.9,"fp8":0.1,"bf16":0},"rel_err":{"fp4":0.14,"fp8":0.03}},
                       {"name":"model.layers.1.self_attn.q_proj","flops":100,"q":{"fp4":0.3,"fp8":0.07,"bf16":0},"rel_err":{"fp4":0.12,"fp8":0.035}}],
             "details":{"low_option":"fp4","layers":[
               {"name":"model.layers.0.self_attn.q_proj","curvature":1e-8,"options":{"fp4":{"ld":1.5e-5,"wd_own":9e-4,"wd_up":0,"rel_err":{"fprop":0.15,"dgrad":0.16,"wgrad":0.14}}}}]}})");
  t.file(run + "/summary.json",
         R"({"final_train_loss":6.0,"final_val_loss":6.9,"final_val_ppl":990.0,"parameters":5000000,"policy":"snip",
             "seconds":12.5,"steps":6,"tokens":12288,"tokens_per_s":983.0})");
  t.file(run + "/config.toml", "[model]\nhidden_size = 256  # C\nnum_hidden_layers = 2\n[precision]\npolicy = 'snip'\n");
}

}  // namespace

// ---- svg.h ------------------------------------------------------------------

TEST(Svg, XmlEscape) {
  EXPECT_EQ(xml_escape("a<b>&\"c'd"), "a&lt;b&gt;&amp;&quot;c&#39;d");
  EXPECT_EQ(xml_escape("plain"), "plain");
  EXPECT_EQ(xml_escape(""), "");
}

TEST(Svg, LineChartPlotRectByHand) {
  // 760 x 340, a title, one series "a" (one legend row):
  // left 64, right 760-20 = 740, top 10 + 22 + 18 + 6 = 56, bottom 340-48 = 292.
  LineChartOptions o;
  o.title = "t";
  const PlotRect r = line_chart_plot_rect({Series{"a", {1, 2}, {0, 1}}}, o);
  EXPECT_DOUBLE_EQ(r.left, 64);
  EXPECT_DOUBLE_EQ(r.right, 740);
  EXPECT_DOUBLE_EQ(r.top, 56);
  EXPECT_DOUBLE_EQ(r.bottom, 292);
  // No title: top 10 + 18 + 6 = 34.
  o.title.clear();
  EXPECT_DOUBLE_EQ(line_chart_plot_rect({Series{"a", {1, 2}, {0, 1}}}, o).top, 34);
}

TEST(Svg, LineChartPointsMapToPlotCorners) {
  // x from 1 to 3 spans [64, 740]; y range [0, 1] spans [292, 56] (up).
  // (1, 0) -> bottom-left (64, 292); (2, 0.5) -> (402, 174); (3, 1) -> top-right (740, 56).
  LineChartOptions o;
  o.id = "c1";
  o.title = "t";
  o.y_min = 0;
  o.y_max = 1;
  const std::string svg = svg_line_chart({Series{"a", {1, 2, 3}, {0, 0.5, 1}}}, o);
  EXPECT_EQ(count(svg, "class=\"series\""), 1u);
  EXPECT_NE(svg.find("data-chart=\"c1\""), std::string::npos);
  EXPECT_NE(svg.find("data-series-count=\"1\""), std::string::npos);
  EXPECT_EQ(first_attr(svg, "series", "d"), "M64.00,292.00 L402.00,174.00 L740.00,56.00");
  EXPECT_EQ(first_attr(svg, "series", "data-series"), "a");
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_EQ(svg.substr(svg.size() - 6), "</svg>");
  EXPECT_EQ(svg.find("<script"), std::string::npos);
  EXPECT_EQ(svg.find("http://", 30), std::string::npos);  // only the xmlns
}

TEST(Svg, LineChartBandIsAPolygonUnderTheLine) {
  // Same frame as LineChartPointsMapToPlotCorners: x 1..3 -> 64..740, y 0..1 -> 292..56.
  // Band hi (0.5, 1, 1) -> y 174, 56, 56; lo (0, 0, 0.5) -> 292, 292, 174; out along hi, back along lo.
  LineChartOptions o;
  o.title = "t";
  o.y_min = 0;
  o.y_max = 1;
  Series s{"a", {1, 2, 3}, {0.25, 0.5, 0.75}};
  s.y_lo = {0, 0, 0.5};
  s.y_hi = {0.5, 1, 1};
  const std::string svg = svg_line_chart({s}, o);
  EXPECT_EQ(count(svg, "class=\"band\""), 1u);
  EXPECT_EQ(first_attr(svg, "band", "d"),
            "M64.00,174.00 L402.00,56.00 L740.00,56.00 L740.00,174.00 L402.00,292.00 L64.00,292.00 Z");
  EXPECT_LT(svg.find("class=\"band\""), svg.find("class=\"series\""));  // drawn under the line
  // A band of the wrong length is no band; the automatic y range holds the band.
  s.y_lo = {0};
  EXPECT_EQ(count(svg_line_chart({s}, o), "class=\"band\""), 0u);
  Series w{"w", {1, 2}, {1, 1}};
  w.y_lo = {-3, 0};
  w.y_hi = {2, 9};
  LineChartOptions auto_y;
  const std::string a = svg_line_chart({w}, auto_y);
  EXPECT_NE(a.find(">-4<"), std::string::npos);  // ticks reach below -3 and above 9
  EXPECT_NE(a.find(">10<"), std::string::npos);
}

TEST(Svg, LineChartSeriesCountColoursAndDashes) {
  LineChartOptions o;
  const std::string svg = svg_line_chart({Series{"run", {1, 2}, {3, 4}}, Series{"ref", {1, 2}, {3.5, 4.5}, "", true},
                                          Series{"empty", {}, {}}, Series{"all-nan", {1}, {kNaN}}},
                                         o);
  EXPECT_EQ(count(svg, "class=\"series\""), 2u);  // series without a finite point are left out
  EXPECT_NE(svg.find("data-series-count=\"2\""), std::string::npos);
  EXPECT_NE(svg.find("data-series=\"run\" d=\"M"), std::string::npos);
  EXPECT_NE(svg.find("stroke=\"" + series_color(0) + "\""), std::string::npos);
  EXPECT_NE(svg.find("stroke=\"" + series_color(1) + "\" stroke-width=\"1.80\" stroke-dasharray"), std::string::npos);
}

TEST(Svg, LineChartEscapesText) {
  LineChartOptions o;
  o.title = "loss <&> \"x\"";
  o.x_label = "a'b";
  const std::string svg = svg_line_chart({Series{"n<1>", {1, 2}, {1, 2}}}, o);
  EXPECT_NE(svg.find("loss &lt;&amp;&gt; &quot;x&quot;"), std::string::npos);
  EXPECT_NE(svg.find("data-series=\"n&lt;1&gt;\""), std::string::npos);
  EXPECT_NE(svg.find("a&#39;b"), std::string::npos);
  EXPECT_EQ(svg.find("<1>"), std::string::npos);
  EXPECT_EQ(svg.find("<&>"), std::string::npos);
}

TEST(Svg, LineChartBreaksAtNaNAndDrawsLonePoints) {
  LineChartOptions o;
  o.y_min = 0;
  o.y_max = 4;
  // x 1..4 over [64, 740]: 225.33 px per step. y 0..4 over [292, 34] (no title).
  const std::string svg = svg_line_chart({Series{"a", {1, 2, 3, 4}, {1, kNaN, 2, 3}}}, o);
  EXPECT_EQ(first_attr(svg, "series", "d"), "M64.00,227.50 l0,0 M514.67,163.00 L740.00,98.50");
  // One point: a zero-length segment, drawn as a dot by the round line cap.
  const std::string one = svg_line_chart({Series{"a", {5}, {2}}}, o);
  EXPECT_EQ(count(one, "class=\"series\""), 1u);
  EXPECT_NE(first_attr(one, "series", "d").find(" l0,0"), std::string::npos);
}

TEST(Svg, MarkersOnEveryPointAndOnLonePoints) {
  LineChartOptions o;
  o.y_min = 0;
  o.y_max = 4;
  // x 1..3 over [64, 740] (no title): 338 px per step; y 0..4 over [292, 34].
  // (1, 1) -> (64, 227.5); (2, 2) -> (402, 163); (3, 4) -> (740, 34).
  const std::string svg = svg_line_chart({Series{"val", {1, 2, 3}, {1, 2, 4}, "#0072B2", false, 1.0, 2.0, true}}, o);
  EXPECT_EQ(count(svg, "class=\"marker\""), 3u);
  EXPECT_NE(svg.find("data-x=\"2\" data-y=\"2\" cx=\"402.00\" cy=\"163.00\" r=\"3.50\" fill=\"#0072B2\""),
            std::string::npos);
  EXPECT_NE(svg.find("cx=\"740.00\" cy=\"34.00\""), std::string::npos);
  // The legend shows the marker too (a circle outside the markers group).
  EXPECT_EQ(count(svg, "<circle"), 4u);
  // A dashed series of one point (a reference evaluated once): hollow marker,
  // no matter whether it asked for markers; a series without markers gets none
  // on points that have neighbours.
  const std::string one = svg_line_chart({Series{"run", {1, 2, 3}, {1, 2, 3}}, Series{"ref", {2}, {3}, "#D55E00", true}}, o);
  EXPECT_EQ(count(one, "class=\"marker\""), 1u);
  EXPECT_EQ(first_attr(one, "marker", "data-series"), "ref");
  EXPECT_EQ(first_attr(one, "marker", "cx"), "402.00");
  EXPECT_EQ(first_attr(one, "marker", "cy"), "98.50");
  EXPECT_EQ(first_attr(one, "marker", "fill"), "#FFFFFF");
  EXPECT_EQ(first_attr(one, "marker", "stroke"), "#D55E00");
  // A point between two NaNs is lone too.
  const std::string mid = svg_line_chart({Series{"a", {1, 2, 3}, {kNaN, 2, kNaN}}}, o);
  EXPECT_EQ(count(mid, "class=\"marker\""), 1u);
}

TEST(Svg, LineChartWithoutDataSaysSo) {
  const std::string svg = svg_line_chart({}, LineChartOptions{});
  EXPECT_NE(svg.find("no data"), std::string::npos);
  EXPECT_NE(svg.find("data-series-count=\"0\""), std::string::npos);
}

TEST(Svg, LongSeriesDownsampledKeepingTheEnvelope) {
  std::vector<double> x, y;
  for (int k = 0; k < 100000; ++k) {
    x.push_back(k + 1);
    y.push_back(k == 54321 ? 100.0 : k == 777 ? -50.0 : std::sin(k * 0.01));
  }
  std::vector<double> dx = x, dy = y;
  downsample_minmax(dx, dy, 2000);
  ASSERT_LE(dx.size(), 2000u);
  ASSERT_GE(dx.size(), 1000u);
  EXPECT_EQ(dx.front(), 1);
  EXPECT_EQ(dx.back(), 100000);
  EXPECT_EQ(*std::max_element(dy.begin(), dy.end()), 100.0);
  EXPECT_EQ(*std::min_element(dy.begin(), dy.end()), -50.0);
  EXPECT_TRUE(std::is_sorted(dx.begin(), dx.end()));
  // The chart does it itself: at most 2000 points -> at most 1999 " L".
  const std::string svg = svg_line_chart({Series{"long", x, y}}, LineChartOptions{});
  EXPECT_LE(count(first_attr(svg, "series", "d"), " L"), 1999u);
  // Short input: unchanged.
  std::vector<double> sx{1, 2, 3}, sy{3, kNaN, 1};
  downsample_minmax(sx, sy, 2000);
  EXPECT_EQ(sx, (std::vector<double>{1, 3}));
}

TEST(Svg, CategoricalHeatmapCellsAndColours) {
  const std::vector<std::string> rows{"a", "b"}, cols{"0", "10", "20"};
  const std::vector<std::vector<std::string>> cells{{"fp4", "fp8", "bf16"}, {"", "fp4", "fp8"}};
  HeatmapOptions o;
  o.id = "pm";
  const std::string svg = svg_heatmap(rows, cols, cells, o);
  EXPECT_NE(svg.find("data-chart=\"pm\""), std::string::npos);
  EXPECT_NE(svg.find("data-kind=\"categorical\" data-rows=\"2\" data-cols=\"3\""), std::string::npos);
  EXPECT_EQ(count(svg, "class=\"cell\""), 6u);
  auto cell = [&](int i, int j) {
    const std::string key = "data-row=\"" + std::to_string(i) + "\" data-col=\"" + std::to_string(j) + "\"";
    const size_t at = svg.find(key);
    return at == std::string::npos ? std::string() : svg.substr(at, svg.find('>', at) - at);
  };
  EXPECT_NE(cell(0, 0).find("data-value=\"fp4\""), std::string::npos);
  EXPECT_NE(cell(0, 0).find("fill=\"#D55E00\""), std::string::npos);
  EXPECT_NE(cell(0, 1).find("fill=\"#0072B2\""), std::string::npos);
  EXPECT_NE(cell(0, 2).find("fill=\"#BBBBBB\""), std::string::npos);
  EXPECT_NE(cell(1, 0).find("data-value=\"\""), std::string::npos);
  EXPECT_NE(cell(1, 0).find("fill=\"#F0F0F0\""), std::string::npos);
  // Legend: fp4, fp8, bf16 in that order, then "none" for the empty cell.
  const size_t l4 = svg.find("legend-item\" data-value=\"fp4\""), l8 = svg.find("legend-item\" data-value=\"fp8\""),
               lb = svg.find("legend-item\" data-value=\"bf16\""), ln = svg.find("legend-item\" data-value=\"none\"");
  ASSERT_NE(ln, std::string::npos);
  EXPECT_LT(l4, l8);
  EXPECT_LT(l8, lb);
  EXPECT_LT(lb, ln);
  // Wrong shape: an error, not a silent chart.
  EXPECT_THROW(svg_heatmap(rows, cols, {{"fp4"}}, o), std::invalid_argument);
}

TEST(Svg, ManyRowsShrinkCells) {
  std::vector<std::string> rows;
  for (int i = 0; i < 154; ++i) rows.push_back("model.layers." + std::to_string(i / 7) + ".x");
  const std::vector<std::vector<std::string>> cells(154, std::vector<std::string>{"fp4", "fp8"});
  const std::string svg = svg_heatmap(rows, {"1", "2"}, cells, HeatmapOptions{});
  EXPECT_EQ(count(svg, "class=\"cell\""), 308u);
  // auto cell height: clamp(720/154, 4, 16) = 4.68 px; row labels thinned to every 3rd (ceil(11/4.68)).
  EXPECT_NE(svg.find("height=\"4.68\""), std::string::npos);
  const size_t labels = svg.find("class=\"row-labels\"");
  EXPECT_EQ(count(svg.substr(labels, svg.find("</g>", labels) - labels), "<text"), 52u);  // rows 0, 3, ..., 153
}

TEST(Svg, ContinuousHeatmapScale) {
  // Log scale over [0.01, 1]: 0.01 -> t = 0 (lightest), 1 -> t = 1 (darkest), 0.1 -> t = 0.5.
  const std::vector<std::vector<double>> cells{{0.01, 0.1}, {1.0, kNaN}};
  HeatmapOptions o;
  o.id = "em";
  o.value_label = "rel <err>";
  const std::string svg = svg_heatmap({"r0", "r1"}, {"5", "9"}, cells, o);
  EXPECT_NE(svg.find("data-kind=\"continuous\" data-rows=\"2\" data-cols=\"2\""), std::string::npos);
  EXPECT_EQ(count(svg, "class=\"cell\""), 4u);
  EXPECT_NE(svg.find("data-row=\"0\" data-col=\"0\" data-value=\"0.01\" x"), std::string::npos);
  EXPECT_NE(svg.find("data-value=\"0.01\""), std::string::npos);
  const auto fill_of = [&](const std::string& v) {
    const size_t at = svg.find("data-value=\"" + v + "\"");
    const size_t f = svg.find("fill=\"", at);
    return svg.substr(f + 6, 7);
  };
  EXPECT_EQ(fill_of("0.01"), scale_color(0));
  EXPECT_EQ(fill_of("1"), scale_color(1));
  EXPECT_EQ(fill_of("0.1"), scale_color(0.5));
  EXPECT_EQ(fill_of(""), "#F0F0F0");
  EXPECT_EQ(scale_color(0), "#FDE725");  // viridis reversed: low = light yellow
  EXPECT_EQ(scale_color(1), "#440154");  // high = dark purple
  EXPECT_NE(svg.find("rel &lt;err&gt; (log scale)"), std::string::npos);
}

TEST(Svg, OptionColoursAreFixedAndDistinct) {
  EXPECT_EQ(option_color("fp4"), "#D55E00");
  EXPECT_EQ(option_color("fp8"), "#0072B2");
  EXPECT_EQ(option_color("bf16"), "#BBBBBB");
  EXPECT_EQ(option_color("mxfp6"), option_color("mxfp6"));
  EXPECT_NE(option_color("mxfp6"), option_color("fp4"));
}

TEST(Svg, ScatterPointsAndSubtitle) {
  ScatterOptions o;
  o.id = "sc";
  o.subtitle = "Pearson r = 0.9, Spearman ρ = 0.8";
  o.log_x = true;
  const std::string svg =
      svg_scatter({{0.1, 1, "a<b", ""}, {1, 2, "c", ""}, {-1, 3, "skipped on log x", ""}, {kNaN, 1, "nan", ""}}, o);
  EXPECT_NE(svg.find("data-points=\"2\""), std::string::npos);
  EXPECT_EQ(count(svg, "class=\"point\""), 2u);
  EXPECT_NE(svg.find("data-label=\"a&lt;b\""), std::string::npos);
  EXPECT_NE(svg.find("Spearman ρ = 0.8"), std::string::npos);
  EXPECT_NE(svg_scatter({}, o).find("no data"), std::string::npos);
}

// ---- report.h helpers -------------------------------------------------------------

TEST(Report, ModelOrder) {
  std::vector<std::string> n{"model.layers.10.self_attn.q_proj", "lm_head", "model.layers.2.mlp.down_proj",
                             "model.layers.2.mlp.up_proj:wgrad", "model.layers.2.mlp.up_proj:fprop",
                             "model.layers.2.self_attn.o_proj", "model.layers.2.mlp.gate_proj",
                             "model.layers.2.self_attn.k_proj", "model.layers.2.mlp.up_proj:dgrad"};
  sort_model_order(n);
  EXPECT_EQ(n, (std::vector<std::string>{"model.layers.2.self_attn.k_proj", "model.layers.2.self_attn.o_proj",
                                         "model.layers.2.mlp.gate_proj", "model.layers.2.mlp.up_proj:fprop",
                                         "model.layers.2.mlp.up_proj:dgrad", "model.layers.2.mlp.up_proj:wgrad",
                                         "model.layers.2.mlp.down_proj", "model.layers.10.self_attn.q_proj",
                                         "lm_head"}));
}

TEST(Report, EmaSmooth) {
  // span 3: alpha = 0.5. m1 = 0.5*0 = 0 -> 0/0.5 = 0; m2 = 0.5*0 + 0.5*2 = 1 -> 1/0.75 = 4/3.
  const std::vector<double> e = ema_smooth({0, 2, kNaN}, 3);
  EXPECT_DOUBLE_EQ(e[0], 0);
  EXPECT_DOUBLE_EQ(e[1], 4.0 / 3.0);
  EXPECT_TRUE(std::isnan(e[2]));
  for (double v : ema_smooth({5, 5, 5, 5}, 10)) EXPECT_DOUBLE_EQ(v, 5);
  EXPECT_EQ(ema_smooth({1, 2}, 1), (std::vector<double>{1, 2}));
}

TEST(Report, Correlations) {
  EXPECT_NEAR(pearson({1, 2, 3}, {2, 4, 6}), 1.0, 1e-12);
  EXPECT_NEAR(pearson({1, 2, 3}, {3, 2, 1}), -1.0, 1e-12);
  // Monotone but not linear: Spearman 1, Pearson below 1.
  EXPECT_NEAR(spearman({1, 2, 3, 4}, {1, 10, 100, 1000}), 1.0, 1e-12);
  EXPECT_LT(pearson({1, 2, 3, 4}, {1, 10, 100, 1000}), 0.99);
  // Ties get their mean rank: ranks (1.5, 1.5, 3) vs (1, 2, 3) -> r = 0.8660.
  EXPECT_NEAR(spearman({1, 1, 2}, {1, 2, 3}), std::sqrt(3.0) / 2, 1e-12);
  EXPECT_TRUE(std::isnan(pearson({1}, {1})));
  EXPECT_TRUE(std::isnan(pearson({1, 1}, {1, 2})));
}

TEST(Report, SeedStatistics) {
  // Hand-derived: {1, 2, 3, 6}: mean 3, squares 4+1+0+9 = 14, sd = sqrt(14/3).
  const snip::SampleSummary s = snip::summarize({1, 2, kNaN, 3, 6});
  EXPECT_EQ(s.n, 4u);
  EXPECT_DOUBLE_EQ(s.mean, 3.0);
  EXPECT_NEAR(s.sd, std::sqrt(14.0 / 3.0), 1e-15);
  EXPECT_NEAR(s.se(), std::sqrt(14.0 / 3.0) / 2, 1e-15);
  EXPECT_TRUE(std::isnan(snip::summarize({5}).sd));
  EXPECT_TRUE(std::isnan(snip::summarize({}).mean));
  // Median: the middle value, or the mean of the two middle ones; input order irrelevant.
  EXPECT_EQ(snip::median({3, 1, 2}), 2.0);
  EXPECT_EQ(snip::median({4, 1, 3, 2}), 2.5);
  EXPECT_EQ(snip::median({7}), 7.0);
  EXPECT_TRUE(std::isnan(snip::median({})));
  // Student t quantiles from the published tables (e.g. NIST/SEMATECH e-Handbook 1.3.6.7.2).
  EXPECT_NEAR(snip::t_quantile(0.975, 1), 12.706, 5e-4);
  EXPECT_NEAR(snip::t_quantile(0.975, 2), 4.303, 5e-4);
  EXPECT_NEAR(snip::t_quantile(0.975, 4), 2.776, 5e-4);
  EXPECT_NEAR(snip::t_quantile(0.975, 30), 2.042, 5e-4);
  EXPECT_NEAR(snip::t_quantile(0.95, 10), 1.812, 5e-4);
  EXPECT_NEAR(snip::t_quantile(0.025, 2), -4.303, 5e-4);
  EXPECT_TRUE(std::isnan(snip::t_quantile(1.0, 3)));
  EXPECT_TRUE(std::isnan(snip::t_quantile(0.5, 0)));
  // {1, 2, 3}: mean 2, sd 1, half-width t(0.975, 2) / sqrt(3) = 4.302653 / 1.732051 = 2.484138.
  const snip::MeanInterval m = snip::t_interval({1, 2, 3});
  EXPECT_NEAR(m.lo, 2 - 2.484138, 1e-6);
  EXPECT_NEAR(m.hi, 2 + 2.484138, 1e-6);
  EXPECT_EQ(m.sign(), 0);
  EXPECT_EQ(snip::t_interval({-5, -6, -5.5}).sign(), -1);  // half-width 1.24 < 5.5
  EXPECT_EQ(snip::t_interval({5, 6, 5.5}).sign(), 1);
  EXPECT_EQ(snip::t_interval({5}).sign(), 0);  // n < 2: no interval, no verdict
  EXPECT_TRUE(std::isnan(snip::t_interval({5}).lo));
}

TEST(Report, BootstrapIntervalOfACorrelation) {
  // A perfect linear relation stays perfect in every resample that has two
  // distinct x (the others give NaN and are dropped): [1, 1].
  const std::vector<double> x{1, 2, 3, 4, 5, 6, 7, 8}, y{3, 5, 7, 9, 11, 13, 15, 17};
  const snip::BootstrapInterval b = snip::bootstrap_interval(x, y, pearson, 500);
  EXPECT_DOUBLE_EQ(b.value, 1.0);
  EXPECT_NEAR(b.lo, 1.0, 1e-12);
  EXPECT_NEAR(b.hi, 1.0, 1e-12);
  EXPECT_GT(b.resamples, 490);
  // Noisy data: the interval is ordered, holds the point estimate here, and
  // is reproducible for a seed; another seed moves it a little.
  const std::vector<double> n{2, 1, 4, 3, 6, 8, 5, 7};
  const snip::BootstrapInterval c = snip::bootstrap_interval(x, n, spearman, 2000, 0.95, 7);
  EXPECT_LE(c.lo, c.value);
  EXPECT_GE(c.hi, c.value);
  EXPECT_LT(c.lo, c.hi);
  EXPECT_LE(c.hi, 1.0);
  const snip::BootstrapInterval d = snip::bootstrap_interval(x, n, spearman, 2000, 0.95, 7);
  EXPECT_EQ(c.lo, d.lo);
  EXPECT_EQ(c.hi, d.hi);
  EXPECT_TRUE(std::isnan(snip::bootstrap_interval({1, 2}, {1, 2}, pearson).value));  // fewer than 3 pairs
}

TEST(Report, ReadMetricsToleratesTornLineAndResumedTail) {
  TempDir t;
  const std::string p = t.file("m.jsonl",
                               "{\"step\":1,\"loss\":3.0,\"fp4_share\":0}\n"
                               "\n"
                               "{\"step\":2,\"loss\":2.5,\"val_loss\":2.7,\"val_ppl\":14.9}\n"
                               "{\"step\":3,\"loss\":2.0}\n"
                               "{\"step\":2,\"loss\":2.4,\"precision\":{\"a\":\"fp4\"},\"plan_step\":1,\"phase\":\"plan\","
                               "\"rel_err_fprop\":{\"a\":0.1}}\n"  // resumed from step 1: replaces 2 and 3
                               "[1,2]\n"
                               "{\"step\":3,\"loss\":1e99999}\n"  // past double's range (found by fuzz_metrics)
                               "{\"step\":3,\"loss\":1.");
  const RunCurves c = read_metrics(p);
  EXPECT_EQ(c.step, (std::vector<double>{1, 2}));
  EXPECT_EQ(c.loss, (std::vector<double>{3.0, 2.4}));
  EXPECT_TRUE(c.val_step.empty());  // the evaluation at the replaced step 2 is gone
  EXPECT_EQ(c.fp4_share[0], 0);
  EXPECT_TRUE(std::isnan(c.fp4_share[1]));
  ASSERT_EQ(c.decisions.size(), 1u);
  EXPECT_EQ(c.decisions[0].step, 2);
  EXPECT_EQ(c.decisions[0].plan_step, 1);
  EXPECT_EQ(c.decisions[0].phase, "plan");
  EXPECT_EQ(c.decisions[0].precision.at("a"), "fp4");
  EXPECT_DOUBLE_EQ(c.decisions[0].rel_err_fprop.at("a"), 0.1);
  EXPECT_EQ(c.skipped_lines, 3);  // "[1,2]", the overflowing number and the torn last line
  EXPECT_THROW(read_metrics(t.str() + "/nope.jsonl"), snip::UserError);
}

// ---- the report ----------------------------------------------------------------

// With train.gemm_dtype = fp32 the unquantized option (the recipe "bf16" in
// plans) ran FP32 GEMMs; the precision map says fp32, in the unquantized grey,
// and the error map's caption says so too.
TEST(Report, UnquantizedCellsOfAnFp32RunSayFp32) {
  TempDir t;
  write_synthetic_run(t, "run", /*torn_tail=*/false);
  t.file("run/config.toml", "[train]\ngemm_dtype = 'fp32'\n[precision]\npolicy = 'snip'\n");
  const std::string html = report_html(t.str() + "/run");
  const std::string pm = chart(html, "precision-map");
  EXPECT_NE(pm.find("data-row=\"2\" data-col=\"0\" data-value=\"fp32\""), std::string::npos);
  EXPECT_EQ(pm.find("data-value=\"bf16\""), std::string::npos);
  EXPECT_NE(pm.find("legend-item\" data-value=\"fp32\""), std::string::npos);
  EXPECT_EQ(option_color("fp32"), option_color("bf16"));
  EXPECT_NE(html.find("A layer left unquantized (fp32 GEMMs) has error 0"), std::string::npos);
}

// A forward-only final phase (precision.final_phase_gemms = fprop) decides
// per GEMM after per-layer plans: the map has one set of rows per layer, its
// three GEMMs, and a per-layer decision fills all three (168 rows became 126
// on the study model, 3 x 42).
TEST(Report, PerLayerDecisionsFillTheGemmRowsOfAPerGemmFinalPhase) {
  TempDir t;
  write_synthetic_run(t, "run", /*torn_tail=*/false);
  t.file("run/plans/step-5.json",
         R"({"step":5,"policy":"snip","phase":"final","final_phase_gemms":"fprop","method":"uniform-fp8",
             "status":"optimal","fp4_share":0.3,"objective":0.0,"low_option":"fp4","budget":null,
             "items":[{"name":"model.layers.0.self_attn.q_proj:fprop","flops":100,"option":"fp8","q":{}},
                      {"name":"model.layers.0.self_attn.q_proj:dgrad","flops":100,"option":"fp4","q":{}},
                      {"name":"model.layers.0.self_attn.q_proj:wgrad","flops":100,"option":"fp4","q":{}},
                      {"name":"model.layers.0.mlp.down_proj:fprop","flops":300,"option":"fp8","q":{}},
                      {"name":"model.layers.0.mlp.down_proj:dgrad","flops":300,"option":"fp8","q":{}},
                      {"name":"model.layers.0.mlp.down_proj:wgrad","flops":300,"option":"fp8","q":{}},
                      {"name":"model.layers.1.self_attn.q_proj:fprop","flops":100,"option":"fp8","q":{}},
                      {"name":"model.layers.1.self_attn.q_proj:dgrad","flops":100,"option":"fp4","q":{}},
                      {"name":"model.layers.1.self_attn.q_proj:wgrad","flops":100,"option":"fp4","q":{}}]})");
  const std::string pm = chart(report_html(t.str() + "/run"), "precision-map");
  EXPECT_NE(pm.find("data-rows=\"9\" data-cols=\"3\""), std::string::npos) << pm.substr(0, 600);
  EXPECT_EQ(count(pm, "class=\"cell\""), 27u);
  // Rows in model order: layers.0.q_proj:{fprop,dgrad,wgrad}, layers.0.down_proj:..., layers.1.q_proj:...
  // At s = 2 (per layer) layer 0's q_proj was fp4: all three of its GEMM rows say so.
  for (int row : {0, 1, 2})
    EXPECT_NE(pm.find("data-row=\"" + std::to_string(row) + "\" data-col=\"1\" data-value=\"fp4\""), std::string::npos)
        << row;
  // At s = 5 its fprop went fp8, dgrad and wgrad stayed fp4.
  EXPECT_NE(pm.find("data-row=\"0\" data-col=\"2\" data-value=\"fp8\""), std::string::npos);
  EXPECT_NE(pm.find("data-row=\"1\" data-col=\"2\" data-value=\"fp4\""), std::string::npos);
  EXPECT_NE(pm.find(">layers.0.self_attn.q_proj:wgrad<"), std::string::npos);
  EXPECT_EQ(pm.find(">layers.0.self_attn.q_proj<"), std::string::npos);  // no per-layer row left
}

TEST(Report, SyntheticRunHasEveryChart) {
  TempDir t;
  write_synthetic_run(t, "run", /*torn_tail=*/true);
  const std::string run = t.str() + "/run";
  const std::string out = write_report(run);
  EXPECT_EQ(out, run + "/report.html");
  std::ifstream in(out);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string html = ss.str();
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("<title>snip report: run</title>"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);
  EXPECT_EQ(html.find("https://"), std::string::npos);

  // Loss: 6 steps, too few for an EMA: the raw curve only; validation: 1 series.
  EXPECT_NE(chart(html, "loss").find("data-series-count=\"1\""), std::string::npos);
  EXPECT_NE(chart(html, "val-loss").find("data-series-count=\"1\""), std::string::npos);
  EXPECT_NE(chart(html, "fp4-share").find("data-series-count=\"1\""), std::string::npos);
  // Precision map: 3 layers x 2 decisions (s = 0, 2), model order, colours.
  const std::string pm = chart(html, "precision-map");
  EXPECT_NE(pm.find("data-rows=\"3\" data-cols=\"2\""), std::string::npos);
  EXPECT_EQ(count(pm, "class=\"cell\""), 6u);
  // rows: layers.0.q_proj, layers.0.down_proj, layers.1.q_proj; at s = 2: fp4, fp8, fp4
  EXPECT_NE(pm.find("data-row=\"0\" data-col=\"1\" data-value=\"fp4\""), std::string::npos);
  EXPECT_NE(pm.find("data-row=\"1\" data-col=\"1\" data-value=\"fp8\""), std::string::npos);
  EXPECT_NE(pm.find("data-row=\"2\" data-col=\"0\" data-value=\"bf16\""), std::string::npos);
  EXPECT_LT(pm.find(">layers.0.self_attn.q_proj<"), pm.find(">layers.0.mlp.down_proj<"));
  // Error map: same grid; the warmup column is empty, s = 2 holds the metrics' chosen errors.
  const std::string em = chart(html, "error-map");
  EXPECT_NE(em.find("data-rows=\"3\" data-cols=\"2\""), std::string::npos);
  EXPECT_EQ(count(em, "class=\"cell\""), 6u);
  EXPECT_NE(em.find("data-row=\"0\" data-col=\"0\" data-value=\"\""), std::string::npos);
  EXPECT_NE(em.find("data-row=\"1\" data-col=\"1\" data-value=\"0.03\""), std::string::npos);
  EXPECT_NE(em.find("data-row=\"2\" data-col=\"1\" data-value=\"0.12\""), std::string::npos);
  // Latest plan table and stats.
  EXPECT_NE(html.find("<table class=\"plan\" data-rows=\"3\">"), std::string::npos);
  EXPECT_NE(html.find("<th>Q(fp4)</th><th>Q(fp8)</th><th>Q(bf16)</th>"), std::string::npos);
  EXPECT_NE(html.find("CBC optimal (proven optimal)"), std::string::npos);
  EXPECT_NE(html.find("FLOPs share ≥ 0.4"), std::string::npos);
  EXPECT_NE(html.find("<table class=\"stats\" data-rows=\"3\">"), std::string::npos);
  EXPECT_NE(chart(html, "stats-scatter").find("data-points=\"3\""), std::string::npos);
  // Header numbers from summary.json; the torn metrics line is reported.
  EXPECT_NE(html.find("6.9000"), std::string::npos);
  EXPECT_NE(html.find("1 unparsable line(s)"), std::string::npos);
}

TEST(Report, ReferenceRunOverlaid) {
  TempDir t;
  write_synthetic_run(t, "run");
  write_synthetic_run(t, "ref");
  t.file("ref/plans/step-9.json", "{ torn");  // a reference contributes curves only: its plans are not read
  const std::string html = report_html(t.str() + "/run", t.str() + "/ref");
  // Both runs have 6 steps: raw curves only (no EMA below span 2).
  EXPECT_NE(chart(html, "loss").find("data-series-count=\"2\""), std::string::npos);
  EXPECT_NE(chart(html, "loss").find("data-series=\"ref train loss\""), std::string::npos);
  EXPECT_NE(chart(html, "val-loss").find("data-series-count=\"2\""), std::string::npos);
  EXPECT_NE(html.find("+0.0000 vs reference"), std::string::npos);
  EXPECT_THROW(report_html(t.str() + "/run", t.str() + "/nope"), snip::UserError);
}

TEST(Report, Bf16RunHasNoPrecisionCharts) {
  TempDir t;
  t.file("b/metrics.jsonl", metrics_line(1));  // one step, no evaluation
  t.file("b/config.toml", "[precision]\npolicy = 'bf16'  # no quantization\n");
  const std::string html = report_html(t.str() + "/b");
  // "bf16" is the unquantized policy's old name: the report calls it none.
  EXPECT_NE(html.find("no precision decisions (policy none)"), std::string::npos);
  EXPECT_EQ(chart(html, "precision-map"), "");
  EXPECT_EQ(chart(html, "error-map"), "");
  // With its GEMM dtype, wherever the policy is named (an FP32 baseline was
  // labelled bf16).
  t.file("c/metrics.jsonl", metrics_line(1));
  t.file("c/config.toml", "[train]\ngemm_dtype = 'fp32'\n[precision]\npolicy = 'none'\n");
  const std::string c = report_html(t.str() + "/c");
  EXPECT_NE(c.find("policy <b>none (fp32 GEMMs)</b>"), std::string::npos);
  EXPECT_NE(c.find("no precision decisions (policy none (fp32 GEMMs))"), std::string::npos);
  EXPECT_EQ(c.find("bf16"), std::string::npos);
  EXPECT_NE(html.find("no validation loss recorded"), std::string::npos);
  EXPECT_NE(html.find("unfinished"), std::string::npos);
  // One step: the raw loss alone (no EMA), a single dot.
  EXPECT_NE(chart(html, "loss").find("data-series-count=\"1\""), std::string::npos);
  EXPECT_NE(first_attr(chart(html, "loss"), "series", "d").find("l0,0"), std::string::npos);
}

TEST(Report, PerGemmKeysAndRunWithoutMetrics) {
  TempDir t;
  t.file("g/metrics.jsonl",
         "{\"step\":1,\"loss\":3,\"precision\":{\"model.layers.0.mlp.up_proj:wgrad\":\"fp8\","
         "\"model.layers.0.mlp.up_proj:fprop\":\"fp4\",\"model.layers.0.mlp.up_proj:dgrad\":\"fp8\"},\"plan_step\":0}\n");
  const std::string pm = chart(report_html(t.str() + "/g"), "precision-map");
  EXPECT_NE(pm.find("data-rows=\"3\" data-cols=\"1\""), std::string::npos);
  EXPECT_LT(pm.find(">layers.0.mlp.up_proj:fprop<"), pm.find(">layers.0.mlp.up_proj:dgrad<"));
  EXPECT_LT(pm.find(">layers.0.mlp.up_proj:dgrad<"), pm.find(">layers.0.mlp.up_proj:wgrad<"));
  // A run that has started (config.toml written) but logged no step yet.
  t.file("fresh/config.toml", "[precision]\npolicy = \"snip\"\n");
  EXPECT_NE(report_html(t.str() + "/fresh").find("no metrics.jsonl"), std::string::npos);
  // A folder that is no run at all, and a file, are errors.
  fs::create_directories(t.path / "empty");
  EXPECT_THROW(report_html(t.str() + "/empty"), snip::UserError);
  t.file("afile", "x");
  try {
    report_html(t.str() + "/afile");
    ADD_FAILURE() << "no error for a file";
  } catch (const snip::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("is not a folder"), std::string::npos) << e.what();
  }
}

namespace {

// The text of the last cell of the table row whose name cell is `name`.
std::string last_cell(const std::string& html, const std::string& name) {
  const size_t at = html.find("<td class=\"name\">" + name + "</td>");
  if (at == std::string::npos) return "(no row " + name + ")";
  const size_t end = html.find("</tr>", at);
  const size_t open = html.rfind("<td>", end);
  return html.substr(open + 4, html.find("</td>", open) - open - 4);
}

// `n` metrics records, loss 5 at every step (no decisions).
std::string flat_metrics(int n) {
  std::string m;
  for (int s = 1; s <= n; ++s) m += "{\"step\":" + std::to_string(s) + ",\"loss\":5}\n";
  return m;
}

}  // namespace

// The EMA span is steps/60 (20 for 1200 steps). Below span 2 (fewer than 120
// steps) an "EMA (span 1 steps)" is the raw curve under another name (span 1:
// alpha = 1) or nearly so; the chart then shows only the raw loss, drawn as
// the main line, and says nothing about a moving average.
TEST(Report, ShortRunShowsTheRawLossWithoutAnEma) {
  TempDir t;
  write_synthetic_run(t, "run");  // 6 steps
  std::string html = report_html(t.str() + "/run");
  std::string loss = chart(html, "loss");
  EXPECT_NE(loss.find("data-series-count=\"1\""), std::string::npos);
  EXPECT_NE(loss.find("data-series=\"train loss\""), std::string::npos);
  EXPECT_EQ(first_attr(loss, "series", "stroke-opacity"), "");  // full opacity, not the faint raw line
  EXPECT_EQ(html.find("EMA"), std::string::npos);
  EXPECT_EQ(html.find("exponential moving average"), std::string::npos);
  EXPECT_NE(html.find("Training loss at every step (6 steps: too few for a moving average)."), std::string::npos);
  // 119 steps: span 119/60 = 1.98 < 2, still raw only.
  t.file("r119/metrics.jsonl", flat_metrics(119));
  EXPECT_NE(chart(report_html(t.str() + "/r119"), "loss").find("data-series-count=\"1\""), std::string::npos);
  // 120 steps: span 2 (alpha 2/3): raw + EMA, captioned with the span.
  t.file("r120/metrics.jsonl", flat_metrics(120));
  html = report_html(t.str() + "/r120");
  loss = chart(html, "loss");
  EXPECT_NE(loss.find("data-series-count=\"2\""), std::string::npos);
  EXPECT_NE(loss.find("data-series=\"train loss (EMA)\""), std::string::npos);
  EXPECT_NE(html.find("exponential moving average (span 2 steps)"), std::string::npos);
  // A long reference beside a short run: each curve by its own length.
  html = report_html(t.str() + "/run", t.str() + "/r120");
  loss = chart(html, "loss");
  EXPECT_NE(loss.find("data-series-count=\"2\""), std::string::npos);
  EXPECT_NE(loss.find("data-series=\"train loss\""), std::string::npos);
  EXPECT_NE(loss.find("data-series=\"r120 train loss (EMA)\""), std::string::npos);
}

// The plan table has a Q column per option the plan could choose: the plan
// file's "options" (plan_to_json), else the run's precision.options. The
// q_table also carries the reference bf16 (Q = 0) even when bf16 was not an
// allowed option; a Q(bf16) column of zeros then suggests a free choice the
// planner never had.
TEST(Report, PlanTableHasQColumnsOnlyForThePlansOptions) {
  TempDir t;
  write_synthetic_run(t, "run");
  const std::string plan = t.str() + "/run/plans/step-2.json";
  std::ifstream in(plan);
  nlohmann::json pj = nlohmann::json::parse(in);
  pj["q_table"] = {{"model.layers.0.self_attn.q_proj", {{"fp4", 0.2}, {"fp8", 0.05}, {"bf16", 0}}},
                   {"model.layers.0.mlp.down_proj", {{"fp4", 0.9}, {"fp8", 0.1}, {"bf16", 0}}},
                   {"model.layers.1.self_attn.q_proj", {{"fp4", 0.3}, {"fp8", 0.07}, {"bf16", 0}}}};
  for (auto& it : pj["items"]) it["q"] = it["q"][it["option"].get<std::string>()];  // as plan_to_json writes
  pj["options"] = {"fp4", "fp8"};
  t.file("run/plans/step-2.json", pj.dump());
  std::string html = report_html(t.str() + "/run");
  EXPECT_NE(html.find("<th>Q(fp4)</th><th>Q(fp8)</th><th>rel. err fprop</th>"), std::string::npos);
  EXPECT_EQ(html.find("Q(bf16)"), std::string::npos);
  // Without "options" in the plan (older plan files): precision.options of
  // config.toml decides.
  pj.erase("options");
  t.file("run/plans/step-2.json", pj.dump());
  t.file("run/config.toml", "[precision]\npolicy = 'snip'\noptions = \"fp4,fp8\"  # list\n");
  html = report_html(t.str() + "/run");
  EXPECT_NE(html.find("<th>Q(fp4)</th><th>Q(fp8)</th><th>rel. err fprop</th>"), std::string::npos);
  EXPECT_EQ(html.find("Q(bf16)"), std::string::npos);
  // bf16 allowed: its column is back.
  t.file("run/config.toml", "[precision]\npolicy = 'snip'\noptions = \"fp4,fp8,bf16\"\n");
  EXPECT_NE(report_html(t.str() + "/run").find("<th>Q(fp4)</th><th>Q(fp8)</th><th>Q(bf16)</th>"), std::string::npos);
}

// Per-GEMM plans: each GEMM row shows the relative error of its own GEMM at
// its option, from the stats step of the plan (stats/step-s.json,
// "measured" -> details.layers[].options[opt].rel_err.{fprop,dgrad,wgrad}),
// never the layer's fprop error repeated; "-" when unknown.
TEST(Report, PerGemmPlanRowsShowTheirOwnGemmsError) {
  TempDir t;
  const std::string L = "model.layers.0.mlp.up_proj";
  t.file("g/metrics.jsonl", "{\"step\":1,\"loss\":3}\n{\"step\":2,\"loss\":3}\n{\"step\":3,\"loss\":3}\n");
  nlohmann::json pj = {
      {"step", 2}, {"policy", "snip"}, {"phase", "plan"}, {"method", "ilp"}, {"status", "optimal"},
      {"granularity", "gemm"}, {"low_option", "fp4"}, {"budget", 0.5}, {"fp4_share", 0.5}, {"objective", 0.3},
      {"options", {"fp4", "fp8"}},
      {"items", {{{"name", L + ":fprop"}, {"flops", 100}, {"option", "fp4"}, {"q", 0.1}},
                 {{"name", L + ":dgrad"}, {"flops", 100}, {"option", "fp8"}, {"q", 0.01}},
                 {{"name", L + ":wgrad"}, {"flops", 100}, {"option", "fp4"}, {"q", 0.2}}}},
      {"rel_err_fprop", {{L, {{"fp4", 0.11}, {"fp8", 0.021}, {"bf16", 0}}}}}};
  t.file("g/plans/step-2.json", pj.dump());
  std::string html = report_html(t.str() + "/g");
  // No stats file: only the fprop row's error is known (from the plan).
  EXPECT_EQ(last_cell(html, L + ":fprop"), "0.11");
  EXPECT_EQ(last_cell(html, L + ":dgrad"), "-");
  EXPECT_EQ(last_cell(html, L + ":wgrad"), "-");
  nlohmann::json opt4 = {{"rel_err", {{"fprop", 0.11}, {"dgrad", 0.17}, {"wgrad", 0.13}}}};
  nlohmann::json opt8 = {{"rel_err", {{"fprop", 0.021}, {"dgrad", 0.034}, {"wgrad", 0.027}}}};
  nlohmann::json details = {{"low_option", "fp4"}, {"reference", "bf16"}, {"options", {"fp4", "fp8"}},
                            {"layers", {{{"name", L}, {"options", {{"fp4", opt4}, {"fp8", opt8}}}}}}};
  // The smoothed top level differs from "measured": the table shows what was
  // measured at the decision, like the fprop column of the plan.
  nlohmann::json smoothed = details;
  smoothed["layers"][0]["options"]["fp8"]["rel_err"]["dgrad"] = 0.5;
  t.file("g/stats/step-2.json",
         nlohmann::json({{"step", 2}, {"layers", nlohmann::json::array()}, {"details", smoothed},
                         {"measured", {{"step", 2}, {"details", details}}}})
             .dump());
  html = report_html(t.str() + "/g");
  EXPECT_EQ(last_cell(html, L + ":fprop"), "0.11");
  EXPECT_EQ(last_cell(html, L + ":dgrad"), "0.034");
  EXPECT_EQ(last_cell(html, L + ":wgrad"), "0.13");
  EXPECT_NE(html.find("<th>rel. err (own GEMM)</th>"), std::string::npos);
  // The reference option has error 0, as in the plan's rel_err_fprop.
  pj["items"][1]["option"] = "bf16";
  t.file("g/plans/step-2.json", pj.dump());
  EXPECT_EQ(last_cell(report_html(t.str() + "/g"), L + ":dgrad"), "0");
}

TEST(Report, Errors) {
  TempDir t;
  try {
    write_report(t.str() + "/missing");
    FAIL() << "expected UserError";
  } catch (const snip::UserError& e) {
    EXPECT_EQ(std::string(e.what()), "snip report: " + t.str() + "/missing does not exist");
  }
  write_synthetic_run(t, "run");
  const std::string bad = t.file("run/plans/step-4.json", "{\"step\": 4, \"items\": [");
  try {
    report_html(t.str() + "/run");
    FAIL() << "expected UserError";
  } catch (const snip::UserError& e) {
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
  }
  t.file("run/plans/step-4.json", "{\"step\": 4, \"items\": [{\"name\": 3}]}");
  EXPECT_THROW(report_html(t.str() + "/run"), snip::UserError);
  fs::remove(t.path / "run/plans/step-4.json");
  t.file("run/stats/step-9.json", "not json");
  EXPECT_THROW(report_html(t.str() + "/run"), snip::UserError);
  // Nothing was written by the failed calls.
  EXPECT_FALSE(fs::exists(t.path / "run/report.html"));
}

// ---- comparing with a reference (compare.h) ------------------------------------

namespace {
const std::string kShaA(64, 'a'), kShaB(64, 'b'), kShaV(64, 'c'), kShaW(64, 'd');

// A checkpoint record of the data run `run` trained on (trainer_state.json "data").
void write_data_record(const TempDir& t, const std::string& run, const std::string& tok, int vocab,
                       const std::string& val, const std::string& dir = "/data/x") {
  nlohmann::json st = {{"step", 6}, {"data", {{"dir", dir}, {"tokenizer_sha256", tok}, {"vocab_size", vocab}}}};
  if (!val.empty()) st["data"]["val_sha256"] = val;
  t.file(run + "/checkpoints/step-6/trainer_state.json", st.dump());
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
}  // namespace

TEST(Compare, RecordsAndDifferences) {
  TempDir t;
  write_synthetic_run(t, "a");
  write_synthetic_run(t, "b");
  // No checkpoint, no data folder: nothing known about data; same config and steps: no difference.
  RunRecord ra = read_run_record(t.str() + "/a");
  EXPECT_EQ(ra.name, "a");
  EXPECT_EQ(ra.tokenizer_sha256, "");
  EXPECT_EQ(ra.vocab_size, -1);
  EXPECT_EQ(ra.steps, 6);  // summary.json
  EXPECT_EQ(ra.model, "C=256, 2 layers, ?/? heads, SwiGLU ?");  // what config.toml leaves out
  EXPECT_TRUE(compare_runs(ra, read_run_record(t.str() + "/b")).empty());

  // One side records its data, the other does not: stated as unknown, never incomparable.
  write_data_record(t, "a", kShaA, 512, kShaV);
  ra = read_run_record(t.str() + "/a");
  EXPECT_EQ(ra.tokenizer_sha256, kShaA);
  EXPECT_EQ(ra.vocab_size, 512);
  EXPECT_EQ(ra.val_sha256, kShaV);
  EXPECT_EQ(ra.data_dir, "/data/x");
  auto d = compare_runs(ra, read_run_record(t.str() + "/b"));
  ASSERT_EQ(d.size(), 4u);  // tokenizer, vocabulary, validation data, data folder
  EXPECT_EQ(d[3].line("a", "b"), "data folder: /data/x (a) vs unknown (b)");
  EXPECT_EQ(d[0].line("a", "b"), "tokenizer: SHA-256 aaaaaaaaaaaa... (a) vs unknown (b)");
  EXPECT_EQ(d[1].line("a", "b"), "vocabulary: 512 (a) vs unknown (b)");
  EXPECT_FALSE(incomparable(d));

  // Same tokenizer and validation set in another folder; other model, steps, batch: stated, comparable.
  write_data_record(t, "b", kShaA, 512, kShaV, "/data/y");
  t.file("b/config.toml", "[model]\nhidden_size = 64\nnum_hidden_layers = 2\n[train]\nbatch_size = 4\nseq_len = 8\n"
                          "grad_accum = 2\nmax_steps = 10\neval_batches = 0\n");
  fs::remove(t.path / "b/summary.json");  // unfinished: steps from metrics.jsonl
  d = compare_runs(ra, read_run_record(t.str() + "/b"));
  EXPECT_FALSE(incomparable(d));
  std::vector<std::string> what;
  for (const auto& x : d) what.push_back(x.what);
  EXPECT_EQ(what, (std::vector<std::string>{"data folder", "model", "steps", "tokens per step", "evaluation"}));
  EXPECT_EQ(d[2].line("a", "b"), "steps: 6 (a) vs 6 of 10 (b)");
  EXPECT_EQ(d[3].line("a", "b"), "tokens per step: unknown (a) vs 64 (4 x 8 x 2) (b)");
  EXPECT_EQ(d[4].reference, "all of val.bin");
  // Every data-parallel replica trains its own micro-batches: 2 ranks double
  // the tokens of a step (the ranks a fresh user's 2-rank run had, unnoted).
  RunRecord two = read_run_record(t.str() + "/b");
  two.replicas = 2;
  RunRecord one = two;
  one.replicas = 1;
  d = compare_runs(one, two);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].line("a", "b"), "tokens per step: 64 (4 x 8 x 2) (a) vs 128 (4 x 8 x 2 x 2 ranks) (b)");

  // Another tokenizer and vocabulary: incomparable; another validation set alone too.
  write_data_record(t, "b", kShaB, 300, kShaV);
  d = compare_runs(ra, read_run_record(t.str() + "/b"));
  EXPECT_TRUE(incomparable(d));
  EXPECT_TRUE(d[0].incomparable && d[0].what == "tokenizer");
  EXPECT_TRUE(d[1].incomparable && d[1].what == "vocabulary");
  write_data_record(t, "b", kShaA, 512, kShaW);
  d = compare_runs(ra, read_run_record(t.str() + "/b"));
  ASSERT_FALSE(d.empty());
  EXPECT_EQ(d[0].what, "validation data");
  EXPECT_TRUE(d[0].incomparable);
}

TEST(Compare, DataFolderFallbackForOlderCheckpoints) {
  // A run without the record (no checkpoint, or one written before snip
  // recorded val_sha256): the data folder of config.toml, as it is now, when
  // it still holds the tokenizer the checkpoint recorded.
  TempDir t;
  const std::string data = t.str() + "/data";
  fs::create_directories(data);
  for (auto [name, n] : {std::pair<const char*, int>{"train.bin", 16}, {"val.bin", 8}}) {
    snip::data::ShardWriter w(data + "/" + name, 512);
    for (int i = 0; i < n; ++i) w.append({i * 31 % 512});
    w.commit();
  }
  const std::string tok_sha = snip::data::sha256_hex("a tokenizer");
  t.file("data/tokenizer.model", "a tokenizer");
  t.file("data/meta.json", nlohmann::json{{"format", "snip-data"}, {"version", 2}, {"vocab_size", 512},
                                          {"shards", {{"train", {{"path", "train.bin"}, {"dtype", "uint16"}}},
                                                      {"val", {{"path", "val.bin"}, {"dtype", "uint16"}}}}},
                                          {"tokens", {{"train", 16}, {"val", 8}}},
                                          {"tokenizer", {{"path", "tokenizer.model"}, {"sha256", tok_sha}}},
                                          {"bos_id", 1}, {"eos_id", 2}}.dump());
  const std::string val_sha = snip::data::sha256_hex(snip::io::read_file(data + "/val.bin"));
  write_synthetic_run(t, "a");
  EXPECT_EQ(read_run_record(t.str() + "/a").val_sha256, "");  // config.toml names no data folder: unknown
  t.file("a/config.toml", "[data]\ndir = '" + data + "'\n");
  RunRecord r = read_run_record(t.str() + "/a");
  EXPECT_EQ(r.tokenizer_sha256, tok_sha);
  EXPECT_EQ(r.vocab_size, 512);
  EXPECT_EQ(r.val_sha256, val_sha);
  EXPECT_EQ(r.data_source, "data folder " + data + " (now)");
  // An older checkpoint: tokenizer recorded, validation set not; the folder still holds that tokenizer.
  nlohmann::json st = {{"step", 6}, {"data", {{"dir", data}, {"tokenizer_sha256", tok_sha}}}};
  t.file("a/checkpoints/step-6/trainer_state.json", st.dump());
  r = read_run_record(t.str() + "/a");
  EXPECT_EQ(r.val_sha256, val_sha);
  EXPECT_EQ(r.data_source, "checkpoint " + t.str() + "/a/checkpoints/step-6, and data folder " + data + " (now)");
  // The folder now holds another tokenizer: it tells nothing about the run.
  st["data"]["tokenizer_sha256"] = kShaA;
  t.file("a/checkpoints/step-6/trainer_state.json", st.dump());
  r = read_run_record(t.str() + "/a");
  EXPECT_EQ(r.tokenizer_sha256, kShaA);
  EXPECT_EQ(r.vocab_size, -1);
  EXPECT_EQ(r.val_sha256, "");
  // An unparsable trainer_state.json is named.
  t.file("a/checkpoints/step-6/trainer_state.json", "{ torn");
  try {
    read_run_record(t.str() + "/a");
    FAIL() << "expected UserError";
  } catch (const snip::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("a/checkpoints/step-6/trainer_state.json"), std::string::npos) << e.what();
  }
}

TEST(Report, IncomparableReferenceIsRefusedUnlessForced) {
  TempDir t;
  write_synthetic_run(t, "run");
  write_synthetic_run(t, "ref");
  write_data_record(t, "run", kShaA, 512, kShaV);
  write_data_record(t, "ref", kShaB, 300, kShaW, "/data/other");
  const std::string run = t.str() + "/run", ref = t.str() + "/ref";
  try {
    write_report(run, ref);
    FAIL() << "expected UserError";
  } catch (const snip::UserError& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("snip report: " + run + " and the reference " + ref + " have incomparable losses (", 0), 0u) << m;
    EXPECT_NE(m.find("tokenizer: SHA-256 aaaaaaaaaaaa... (run) vs SHA-256 bbbbbbbbbbbb... (ref)"), std::string::npos) << m;
    EXPECT_NE(m.find("vocabulary: 512 (run) vs 300 (ref)"), std::string::npos) << m;
    EXPECT_NE(m.find("validation data"), std::string::npos) << m;
    EXPECT_NE(m.find("--force"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos);
  }
  EXPECT_FALSE(fs::exists(t.path / "run/report.html"));
  // --force: written, with the warning and every difference in the header.
  const std::string out = write_report(run, ref, "", /*force=*/true);
  const std::string html = read_text(out);
  EXPECT_NE(html.find("<div class=\"warning\" id=\"incomparable\"><b>The losses are not comparable</b>: tokenizer, "
                      "vocabulary, validation data differ between run and the reference ref"),
            std::string::npos);
  EXPECT_NE(html.find("<table class=\"compare\" id=\"comparison\" data-rows=\"4\">"), std::string::npos);
  EXPECT_NE(html.find("<td class=\"name\">/data/other</td>"), std::string::npos);
  // A comparable reference: no warning, and a line saying what agrees.
  write_data_record(t, "ref", kShaA, 512, kShaV);
  const std::string same = report_html(run, ref);
  EXPECT_EQ(same.find("class=\"warning\""), std::string::npos);
  EXPECT_NE(same.find("same tokenizer, validation data, model, steps and tokens per step"), std::string::npos);
}

TEST(Report, ReferenceEvaluatedOnceIsAMarker) {
  TempDir t;
  write_synthetic_run(t, "run");
  t.file("ref/metrics.jsonl", metrics_line(1) + metrics_line(2, ",\"val_loss\":7.0,\"val_ppl\":1100"));
  const std::string vl = chart(report_html(t.str() + "/run", t.str() + "/ref"), "val-loss");
  EXPECT_NE(vl.find("data-series-count=\"2\""), std::string::npos);
  // The run's two evaluations (steps 3, 6) filled; the reference's one (step 2) hollow.
  EXPECT_EQ(count(vl, "class=\"marker\" data-series=\"val loss\""), 2u);
  EXPECT_EQ(count(vl, "class=\"marker\" data-series=\"ref val loss\""), 1u);
  EXPECT_NE(vl.find("data-series=\"ref val loss\" data-x=\"2\" data-y=\"7\""), std::string::npos);
  const size_t at = vl.find("class=\"marker\" data-series=\"ref val loss\"");
  EXPECT_NE(vl.substr(at, 200).find("fill=\"#FFFFFF\""), std::string::npos);
}

TEST(Report, ResumedRunCardsCoverEverySession) {
  TempDir t;
  write_synthetic_run(t, "run");
  // 6 steps in 2 sessions (resumed at step 2): 12288 tokens in 12.5 s over both.
  t.file("run/summary.json",
         R"({"final_train_loss":6.0,"final_val_loss":6.9,"final_val_ppl":990.0,"policy":"snip","seconds":12.5,
             "steps":6,"tokens":12288,"tokens_per_s":983.04,"elapsed_s":12.5,"tokens_total":12288,"resumed_at":[2],
             "invocation":{"start_step":2,"steps":4,"tokens":8192,"seconds":4.0}})");
  const std::string html = report_html(t.str() + "/run");
  EXPECT_NE(html.find("<div class=\"k\">throughput</div><div class=\"v\">983 tok/s</div><div class=\"d\">over every session"),
            std::string::npos);
  EXPECT_NE(html.find("<div class=\"v\">12.5 s</div><div class=\"d\">2 sessions: resumed at step 2</div>"), std::string::npos);
  // Unfinished: tokens per step from config.toml x steps logged / elapsed_s of the last step
  // (metrics_line: elapsed_s = step): 4 x 8 x 2 x 6 / 6 = 64 tok/s.
  fs::remove(t.path / "run/summary.json");
  t.file("run/config.toml", "[train]\nbatch_size = 4\nseq_len = 8\ngrad_accum = 2\n");
  EXPECT_NE(report_html(t.str() + "/run").find("<div class=\"v\">64 tok/s</div><div class=\"d\">since the first step"),
            std::string::npos);
}

// ---- `snip report` ------------------------------------------------------------

namespace {
using CliResult = snip::test::Ran;
// Runs the built `snip report <args>` (tests/common/program.h).
CliResult run_cli(std::vector<std::string> args) {
  args.insert(args.begin(), "report");
  return snip::test::run_program(SNIP_EXE, args);
}
}  // namespace

TEST(CliReport, WritesAndPrintsThePath) {
  TempDir t;
  write_synthetic_run(t, "run");
  write_synthetic_run(t, "ref");
  const std::string out = t.str() + "/custom.html";
  const CliResult r = run_cli({t.str() + "/run", "--reference", t.str() + "/ref", "--out", out});
  EXPECT_EQ(r.error, "");
  EXPECT_EQ(r.out, out + "\n");
  EXPECT_TRUE(fs::exists(out));
  EXPECT_FALSE(fs::exists(t.path / "run/report.html"));
  const CliResult d = run_cli({t.str() + "/run"});
  EXPECT_EQ(d.out, t.str() + "/run/report.html\n");
  EXPECT_EQ(run_cli({t.str() + "/nope"}).error, "snip report: " + t.str() + "/nope does not exist");
  // An --out in a folder that does not exist: named as such, nothing written.
  EXPECT_EQ(run_cli({t.str() + "/run", "--out", t.str() + "/missing/r.html"}).error,
            "--out " + t.str() + "/missing/r.html is not writable: folder " + t.str() + "/missing does not exist");
}

TEST(CliReport, IncomparableReferenceNeedsForce) {
  TempDir t;
  write_synthetic_run(t, "run");
  write_synthetic_run(t, "ref");
  write_data_record(t, "run", kShaA, 512, kShaV);
  write_data_record(t, "ref", kShaB, 300, kShaV);
  const std::string run = t.str() + "/run", ref = t.str() + "/ref";
  const CliResult r = run_cli({run, "--reference", ref});
  EXPECT_NE(r.error.find("have incomparable losses"), std::string::npos) << r.error;
  EXPECT_EQ(r.out, "");
  EXPECT_FALSE(fs::exists(t.path / "run/report.html"));
  const CliResult f = run_cli({run, "--reference", ref, "--force"});
  EXPECT_EQ(f.error, "");
  EXPECT_EQ(f.out, run + "/report.html\n");
  EXPECT_EQ(run_cli({run, "--force"}).error, "snip report: --force only applies with --reference OTHER");
}
