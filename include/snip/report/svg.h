// snip/report/svg.h: static SVG charts (line chart, heat map, scatter plot)
// as pure functions returning one `<svg ...>...</svg>` string. The run report
// (report.h) inlines them into report.html; the same strings saved as .svg
// files are valid standalone images (they carry the xmlns attribute).
//
// No JavaScript, no external fonts, scripts or style sheets: every style is
// an attribute, text uses the system font stack. All text passes through
// xml_escape. Numbers that cannot be plotted (NaN, ±Inf, x <= 0 on a log
// axis) are skipped, never drawn at a made-up position.
//
// Units: every width, height and coordinate is in CSS pixels (px); the SVG
// y axis points down (y = 0 is the top edge).
//
// Machine-readable attributes (the tests and the browser test read these):
//   line chart  <svg class="chart line-chart" data-chart=ID data-series-count=N>
//               one <path class="series" data-series=NAME d="M..."> per series;
//               one <circle class="marker" data-series=NAME data-x=X data-y=Y>
//               per point of a series with markers, and per lone point (a
//               point with no finite neighbour) of any series
//   heat map    <svg class="chart heatmap" data-chart=ID data-rows=R data-cols=C
//               data-kind="categorical"|"continuous">
//               one <rect class="cell" data-row=i data-col=j data-value=V> per
//               cell (i in [0,R), j in [0,C), V the option string or the
//               number, "" for an empty cell)
//   scatter     <svg class="chart scatter" data-chart=ID data-points=N>
//               one <circle class="point" data-label=L data-x=X data-y=Y> per
//               plotted point
//
// Plain C++17, no LibTorch.
#pragma once

#include <cstddef>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace snip::report {

/// `s` with & < > " ' replaced by their XML entities; safe both as element
/// text and inside a double- or single-quoted attribute value.
std::string xml_escape(std::string_view s);

/// Colour of the i-th series when Series::color is empty: the Okabe-Ito
/// colour-blind-safe palette (blue, vermillion, bluish green, reddish purple,
/// orange, sky blue, black, yellow), repeating. "#RRGGBB".
std::string series_color(std::size_t i);

/// Fixed colour of a precision option, the same in every chart and table:
/// "fp4" vermillion #D55E00, "fp8" blue #0072B2, "bf16" and "fp32" (unquantized) light grey #BBBBBB;
/// any other option a colour from the rest of the Okabe-Ito palette chosen by
/// a stable hash of its name. "#RRGGBB".
std::string option_color(const std::string& option);

/// Colour of t ∈ [0,1] on the reversed viridis scale (0 = light yellow,
/// 1 = dark purple; perceptually uniform, colour-blind safe). t is clamped.
std::string scale_color(double t);

/// One line of a line chart.
struct Series {
  std::string name;          ///< legend text and data-series attribute
  std::vector<double> x, y;  ///< points, x[k] with y[k]; same length; x ascending
  std::string color;         ///< "#RRGGBB"; empty = series_color(index in the chart)
  bool dashed = false;       ///< dashed stroke (e.g. the reference run)
  double opacity = 1.0;      ///< stroke opacity in (0,1]; e.g. 0.25 for a faint raw curve
  double stroke_width = 1.8; ///< px
  /// A circle (radius kChartMarkerRadius) on every point, e.g. evaluation
  /// steps: filled for a solid series, hollow (white fill) for a dashed one.
  /// Lone points get one whether or not this is set.
  bool markers = false;
  /// An optional band around the line (e.g. ± one standard deviation over
  /// seeds): y_lo[k] and y_hi[k] at x[k], same length as x, drawn as a
  /// filled polygon (<path class="band">, the series' colour at fill-opacity
  /// 0.15) under every line. Empty = no band; points with a non-finite end
  /// are left out of the band.
  std::vector<double> y_lo, y_hi;

  Series() = default;
  Series(std::string name_, std::vector<double> x_, std::vector<double> y_, std::string color_ = "",
         bool dashed_ = false, double opacity_ = 1.0, double stroke_width_ = 1.8, bool markers_ = false)
      : name(std::move(name_)), x(std::move(x_)), y(std::move(y_)), color(std::move(color_)), dashed(dashed_),
        opacity(opacity_), stroke_width(stroke_width_), markers(markers_) {}
};

/// Options of svg_line_chart. NaN in a range field means "from the data".
struct LineChartOptions {
  std::string id = "chart";  ///< data-chart attribute; also the clip-path id prefix (unique per page)
  std::string title;         ///< above the plot; empty = none
  std::string x_label, y_label;
  int width = 760, height = 340;  ///< px, the whole image
  double x_min = std::numeric_limits<double>::quiet_NaN();
  double x_max = std::numeric_limits<double>::quiet_NaN();
  double y_min = std::numeric_limits<double>::quiet_NaN();
  double y_max = std::numeric_limits<double>::quiet_NaN();
  bool log_x = false;            ///< log10 x axis (x <= 0 points skipped)
  std::size_t max_points = 2000; ///< per series; longer series are downsampled (downsample_minmax)
};

/// Layout constants of the line chart and the scatter plot, px.
inline constexpr double kChartMarginLeft = 64;    ///< room for y tick labels and the y label
inline constexpr double kChartMarginRight = 20;
inline constexpr double kChartMarginBottom = 48;  ///< x tick labels and the x label
inline constexpr double kChartPadTop = 10;
inline constexpr double kChartTitleHeight = 22;   ///< added when the title is not empty
inline constexpr double kChartLegendRowHeight = 18;
inline constexpr double kChartMarkerRadius = 3.5;  ///< point markers (Series::markers, lone points)

/// The plot area of a chart, px: data x range [x_min, x_max] maps to
/// [left, right], y range [y_min, y_max] to [bottom, top].
struct PlotRect {
  double left = 0, top = 0, right = 0, bottom = 0;
};

/// Where svg_line_chart puts the plot area:
///   left   = kChartMarginLeft,  right = width − kChartMarginRight,
///   top    = kChartPadTop + (title ? kChartTitleHeight : 0)
///            + legend_rows · kChartLegendRowHeight + (legend_rows ? 6 : 0),
///   bottom = height − kChartMarginBottom,
/// where legend_rows is the number of rows the legend (one entry per series,
/// 26 px + 6.6 px per character + 14 px gap, wrapped at the plot width) needs;
/// 0 for a chart without series. E.g. one series "a", title set, 760 × 340:
/// left 64, right 740, top 10 + 22 + 18 + 6 = 56, bottom 292.
PlotRect line_chart_plot_rect(const std::vector<Series>& series, const LineChartOptions& o);

/// A line chart: axes with "nice" ticks (1, 2, 5 × 10^k; powers of ten on a
/// log axis), light grid lines, tick labels (SI suffix k/M/G from 1e4), axis
/// labels, a legend, and one <path class="series"> per series (clipped to the
/// plot area). The x range is [min x, max x] of all series (or x_min/x_max);
/// the automatic y range is the data range widened to the nearest ticks.
/// Non-finite y values break the line; a lone point (no finite neighbour,
/// e.g. a series of one point) gets a marker circle, so it stays visible
/// whatever the stroke (a zero-length dashed path may draw nothing), and so
/// does every point of a series with Series::markers (its legend entry shows
/// the marker too). A series longer than o.max_points is downsampled. No series, or no finite
/// point at all, gives a chart with the text "no data".
std::string svg_line_chart(const std::vector<Series>& series, const LineChartOptions& o);

/// Keeps at most max_points points of (x, y) (max_points >= 4), preserving
/// the envelope: the first and last points, and per bucket of consecutive
/// points the minimum and the maximum of y (in x order). Non-finite y are
/// dropped first. Shorter inputs are returned unchanged (minus non-finite y).
void downsample_minmax(std::vector<double>& x, std::vector<double>& y, std::size_t max_points);

/// Options of svg_heatmap.
struct HeatmapOptions {
  std::string id = "heatmap";  ///< data-chart attribute
  std::string title;           ///< empty = none
  std::string x_label = "step";
  int width = 900;             ///< px; the image is narrower when cells reach max_cell_width
  double cell_height = 0;      ///< px per row; 0 = auto: clamp(720 / rows, 4, 16)
  double max_cell_width = 64;  ///< px
  // Continuous variant only:
  std::string value_label;     ///< legend caption, e.g. "relative error (fprop)"
  bool log_scale = true;       ///< log10 colour scale (values <= 0 get the lowest colour)
  double v_min = std::numeric_limits<double>::quiet_NaN();  ///< NaN = smallest finite (>0 on a log scale)
  double v_max = std::numeric_limits<double>::quiet_NaN();  ///< NaN = largest finite
};

/// Categorical heat map: rows × cols cells (row labels on the left, column
/// labels below), cells[i][j] the category of row i at column j (e.g. the
/// precision option), coloured with option_color; "" = empty cell (light
/// grey, data-value=""). A legend lists the categories present: fp4, fp8,
/// bf16 first, the others sorted. cells must be rows.size() × cols.size()
/// (std::invalid_argument otherwise). Each cell has a <title> tooltip
/// "ROW @ COL: VALUE". Row labels are thinned out (every k-th) when rows are
/// shorter than 11 px, column labels when columns are narrower than 34 px.
std::string svg_heatmap(const std::vector<std::string>& rows, const std::vector<std::string>& cols,
                        const std::vector<std::vector<std::string>>& cells, const HeatmapOptions& o);

/// Continuous heat map: as above with cells[i][j] a number (NaN = empty
/// cell), coloured with scale_color over [v_min, v_max] (log10 when
/// o.log_scale and v_max > 0), and a colour bar legend with its end values.
/// data-value is the number printed with %.6g.
std::string svg_heatmap(const std::vector<std::string>& rows, const std::vector<std::string>& cols,
                        const std::vector<std::vector<double>>& cells, const HeatmapOptions& o);

/// One point of a scatter plot.
struct ScatterPoint {
  double x = 0, y = 0;
  std::string label;  ///< drawn beside the point when ScatterOptions::show_labels; tooltip
  std::string color;  ///< empty = series_color(0)
};

/// Options of svg_scatter.
struct ScatterOptions {
  std::string id = "scatter";  ///< data-chart attribute
  std::string title;
  std::string subtitle;        ///< a second title line, e.g. "Pearson r = 0.91, Spearman ρ = 0.88"
  std::string x_label, y_label;  ///< e.g. "predicted", "measured"
  int width = 560, height = 440;  ///< px
  bool log_x = false, log_y = false;  ///< log10 axes (points with a coordinate <= 0 skipped)
  bool show_labels = false;    ///< print each label beside its point
  bool diagonal = false;       ///< dashed y = x line (for predicted vs measured in the same unit)
};

/// A scatter plot: one <circle class="point"> per finite point, axes as in
/// svg_line_chart (ranges from the data, widened to ticks), optional labels
/// and diagonal. No plottable point gives a chart with the text "no data".
/// Plot area: as line_chart_plot_rect with the legend replaced by the
/// subtitle row (kChartLegendRowHeight + 6 when the subtitle is not empty).
std::string svg_scatter(const std::vector<ScatterPoint>& points, const ScatterOptions& o);

}  // namespace snip::report
