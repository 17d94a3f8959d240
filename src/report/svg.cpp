// svg.cpp: the static SVG charts of snip/report/svg.h.
//
// Everything is written as text with a fixed number format ("%.2f" for
// coordinates), so the same input always gives the same bytes (the tests
// compare coordinates as strings).
#include "snip/report/svg.h"
#include "snip/core/hash.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

namespace snip::report {

namespace {

constexpr const char* kFontStack =
    "system-ui, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif";
constexpr double kCharWidth12 = 6.6;  // mean advance of a 12 px sans-serif character, px
constexpr const char* kAxisColor = "#444444";
constexpr const char* kGridColor = "#E6E6E6";
constexpr const char* kTextColor = "#222222";
constexpr const char* kMutedColor = "#666666";
constexpr const char* kEmptyCellColor = "#F0F0F0";

std::string f2(double v) {  // a coordinate
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  if (std::string(buf) == "-0.00") return "0.00";
  return buf;
}

std::string g6(double v) {  // a data value
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

// An id usable in url(#...): letters, digits, '-' and '_' only.
std::string safe_id(const std::string& s) {
  std::string out;
  for (char c : s) out += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') ? c : '_';
  return out.empty() ? "chart" : out;
}

// The tick step for about `target` ticks over `range`: 1, 2 or 5 × 10^k.
double nice_step(double range, int target = 5) {
  if (!(range > 0) || !std::isfinite(range)) return 1.0;
  const double raw = range / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  const double m = norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10;
  return m * mag;
}

// A tick label: SI suffix from 1e4, else as many decimals as the step needs.
std::string tick_label(double v, double step) {
  char buf[48];
  const double a = std::fabs(v);
  if (a >= 1e4) {
    const char* suffix = a >= 1e9 ? "G" : a >= 1e6 ? "M" : "k";
    const double div = a >= 1e9 ? 1e9 : a >= 1e6 ? 1e6 : 1e3;
    std::snprintf(buf, sizeof buf, "%.3g%s", v / div, suffix);
    return buf;
  }
  if (a > 0 && (a < 1e-3 || step < 1e-4)) {
    std::snprintf(buf, sizeof buf, "%.2g", v);
    return buf;
  }
  int decimals = step >= 1 ? 0 : int(std::ceil(-std::log10(step) - 1e-9));
  decimals = std::clamp(decimals, 0, 6);
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  std::string s = buf;
  if (s.find_first_not_of("-0.") == std::string::npos && s[0] == '-') s = s.substr(1);  // "-0.0"
  return s;
}

// One axis: the data interval [lo, hi] (linear or log10) mapped to pixels
// [p0, p1] (p0 < p1 for x, p0 > p1 for y).
struct Axis {
  double lo = 0, hi = 1;
  bool log = false;
  double p0 = 0, p1 = 1;

  double t(double v) const {
    if (log) return (std::log10(v) - std::log10(lo)) / (std::log10(hi) - std::log10(lo));
    return (v - lo) / (hi - lo);
  }
  double map(double v) const { return p0 + t(v) * (p1 - p0); }
  bool plottable(double v) const { return std::isfinite(v) && (!log || v > 0); }

  // Tick values inside [lo, hi].
  std::vector<double> ticks() const {
    std::vector<double> out;
    if (log) {
      const int a = int(std::ceil(std::log10(lo) - 1e-9)), b = int(std::floor(std::log10(hi) + 1e-9));
      for (int k = a; k <= b; ++k) out.push_back(std::pow(10.0, k));
      if (out.size() < 3) {  // a narrow range: add 2·10^k and 5·10^k
        std::vector<double> more;
        for (int k = a - 1; k <= b; ++k)
          for (double m : {1.0, 2.0, 5.0}) {
            const double v = m * std::pow(10.0, k);
            if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)) more.push_back(v);
          }
        out = more;
      }
      return out;
    }
    const double step = nice_step(hi - lo);
    const int64_t a = int64_t(std::ceil(lo / step - 1e-9)), b = int64_t(std::floor(hi / step + 1e-9));
    for (int64_t k = a; k <= b && out.size() < 100; ++k) out.push_back(double(k) * step);
    return out;
  }
  std::string label(double v) const {
    if (log) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%g", v);
      return buf;
    }
    return tick_label(v, nice_step(hi - lo));
  }
};

// [lo, hi] for data values in [mn, mx]; `widen` rounds outwards to ticks.
void auto_range(double mn, double mx, bool log, bool widen, double& lo, double& hi) {
  if (log) {
    if (!(mn > 0)) mn = mx > 0 ? mx / 10 : 1;
    if (!(mx > 0)) mx = mn * 10;
    if (widen) {  // out to the nearest 1, 2 or 5 x 10^k
      const double dlo = std::pow(10.0, std::floor(std::log10(mn) + 1e-9));
      lo = mn >= 5 * dlo * (1 - 1e-9) ? 5 * dlo : mn >= 2 * dlo * (1 - 1e-9) ? 2 * dlo : dlo;
      const double dhi = std::pow(10.0, std::floor(std::log10(mx) + 1e-9));
      hi = mx <= dhi * (1 + 1e-9) ? dhi : mx <= 2 * dhi * (1 + 1e-9) ? 2 * dhi : mx <= 5 * dhi * (1 + 1e-9) ? 5 * dhi : 10 * dhi;
    } else {
      lo = mn;
      hi = mx;
    }
    if (!(hi > lo)) {
      lo = lo / std::sqrt(10.0);
      hi = hi * std::sqrt(10.0);
    }
    return;
  }
  if (mn == mx) {
    const double pad = mn == 0 ? 0.5 : std::fabs(mn) * 0.05;
    mn -= pad;
    mx += pad;
    if (!widen) {
      lo = mn;
      hi = mx;
      return;
    }
  }
  lo = mn;
  hi = mx;
  if (widen) {
    const double step = nice_step(mx - mn);
    lo = std::floor(mn / step + 1e-9) * step;
    hi = std::ceil(mx / step - 1e-9) * step;
    if (!(hi > lo)) hi = lo + step;
  }
}

double text_width(const std::string& s, double font_px) { return double(s.size()) * kCharWidth12 * font_px / 12.0; }

// Opens the root <svg> element and leaves its start tag open for the caller's
// data-* attributes.
void svg_open(std::ostringstream& os, const std::string& cls, const std::string& id, double w, double h,
                     const std::string& title) {
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart " << cls << "\" data-chart=\"" << xml_escape(id)
     << "\" width=\"" << f2(w) << "\" height=\"" << f2(h) << "\" viewBox=\"0 0 " << f2(w) << " " << f2(h)
     << "\" font-family=\"" << kFontStack << "\" font-size=\"12\" fill=\"" << kTextColor << "\" role=\"img\""
     << (title.empty() ? "" : " aria-label=\"" + xml_escape(title) + "\"");
}

// Grid lines, tick labels, the two axis lines and axis labels of a plot area.
void draw_axes(std::ostringstream& os, const PlotRect& r, const Axis& ax, const Axis& ay, const std::string& x_label,
               const std::string& y_label) {
  os << "<g class=\"grid\" stroke=\"" << kGridColor << "\" stroke-width=\"1\">";
  const std::vector<double> xt = ax.ticks(), yt = ay.ticks();
  for (double v : yt) os << "<line x1=\"" << f2(r.left) << "\" x2=\"" << f2(r.right) << "\" y1=\"" << f2(ay.map(v)) << "\" y2=\"" << f2(ay.map(v)) << "\"/>";
  for (double v : xt) os << "<line x1=\"" << f2(ax.map(v)) << "\" x2=\"" << f2(ax.map(v)) << "\" y1=\"" << f2(r.top) << "\" y2=\"" << f2(r.bottom) << "\"/>";
  os << "</g>";
  os << "<g class=\"ticks\" font-size=\"11\" fill=\"" << kMutedColor << "\">";
  for (double v : yt)
    os << "<text x=\"" << f2(r.left - 6) << "\" y=\"" << f2(ay.map(v) + 4) << "\" text-anchor=\"end\">"
       << xml_escape(ay.label(v)) << "</text>";
  // x labels: thin out so they do not overlap (about 7 px per character + gap)
  double last_end = -1e300;
  for (double v : xt) {
    const std::string s = ax.label(v);
    const double x = ax.map(v), w = text_width(s, 11);
    if (x - w / 2 < last_end + 8) continue;
    last_end = x + w / 2;
    os << "<text x=\"" << f2(x) << "\" y=\"" << f2(r.bottom + 16) << "\" text-anchor=\"middle\">" << xml_escape(s) << "</text>";
  }
  os << "</g>";
  os << "<path class=\"axis\" d=\"M" << f2(r.left) << "," << f2(r.top) << " L" << f2(r.left) << "," << f2(r.bottom)
     << " L" << f2(r.right) << "," << f2(r.bottom) << "\" fill=\"none\" stroke=\"" << kAxisColor << "\" stroke-width=\"1\"/>";
  if (!x_label.empty())
    os << "<text class=\"x-label\" x=\"" << f2((r.left + r.right) / 2) << "\" y=\"" << f2(r.bottom + 38)
       << "\" text-anchor=\"middle\">" << xml_escape(x_label) << "</text>";
  if (!y_label.empty()) {
    const double cx = 16, cy = (r.top + r.bottom) / 2;
    os << "<text class=\"y-label\" x=\"" << f2(cx) << "\" y=\"" << f2(cy) << "\" text-anchor=\"middle\" transform=\"rotate(-90 "
       << f2(cx) << " " << f2(cy) << ")\">" << xml_escape(y_label) << "</text>";
  }
}

void draw_title(std::ostringstream& os, const std::string& title, double x) {
  if (!title.empty())
    os << "<text class=\"title\" x=\"" << f2(x) << "\" y=\"" << f2(kChartPadTop + 15)
       << "\" font-size=\"14\" font-weight=\"600\">" << xml_escape(title) << "</text>";
}

void draw_no_data(std::ostringstream& os, const PlotRect& r) {
  os << "<text class=\"no-data\" x=\"" << f2((r.left + r.right) / 2) << "\" y=\"" << f2((r.top + r.bottom) / 2)
     << "\" text-anchor=\"middle\" fill=\"" << kMutedColor << "\">no data</text>";
}

// Legend entry widths and row assignment for the line chart.
double legend_entry_width(const std::string& name) { return 26 + kCharWidth12 * double(name.size()) + 14; }

int legend_rows(const std::vector<std::string>& names, double avail) {
  if (names.empty()) return 0;
  int rows = 1;
  double x = 0;
  for (const auto& n : names) {
    const double w = legend_entry_width(n);
    if (x > 0 && x + w > avail) {
      ++rows;
      x = 0;
    }
    x += w;
  }
  return rows;
}

bool has_plottable(const Series& s, bool log_x) {
  const size_t n = std::min(s.x.size(), s.y.size());
  for (size_t k = 0; k < n; ++k)
    if (std::isfinite(s.x[k]) && std::isfinite(s.y[k]) && (!log_x || s.x[k] > 0)) return true;
  return false;
}

// The viridis colour map at 10 evenly spaced points (matplotlib's _viridis_data).
constexpr unsigned kViridis[10] = {0x440154, 0x482878, 0x3E4A89, 0x31688E, 0x26828E,
                                   0x1F9E89, 0x35B779, 0x6DCD59, 0xB4DE2C, 0xFDE725};

std::string hex(unsigned rgb) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "#%06X", rgb & 0xFFFFFFu);
  return buf;
}

// Category order of a legend: fp4, fp8, bf16 first, then sorted.
int category_rank(const std::string& c) { return c == "fp4" ? 0 : c == "fp8" ? 1 : c == "bf16" || c == "fp32" ? 2 : 3; }

// The shared part of both heat maps: layout, labels, cells. color(i, j) and
// value(i, j) give a cell's fill and data-value ("" = empty).
struct HeatmapLayout {
  double label_w, cell_w, cell_h, top, grid_w, grid_h, width, height;
  int row_every, col_every;
};

HeatmapLayout heatmap_layout(const std::vector<std::string>& rows, const std::vector<std::string>& cols,
                             const HeatmapOptions& o, double legend_w) {
  HeatmapLayout L{};
  const size_t R = rows.size(), C = cols.size();
  L.cell_h = o.cell_height > 0 ? o.cell_height : std::clamp(720.0 / double(std::max<size_t>(R, 1)), 4.0, 16.0);
  size_t maxlen = 0;
  for (const auto& r : rows) maxlen = std::max(maxlen, r.size());
  const double row_font = L.cell_h >= 10 ? 11 : 10;
  L.label_w = std::min(320.0, text_width(std::string(maxlen, 'x'), row_font) + 12);
  const double plot_w = std::max(40.0, double(o.width) - L.label_w - 16);
  L.cell_w = std::min(o.max_cell_width, plot_w / double(std::max<size_t>(C, 1)));
  L.grid_w = L.cell_w * double(C);
  L.grid_h = L.cell_h * double(R);
  L.top = kChartPadTop + (o.title.empty() ? 0 : kChartTitleHeight) + 26;
  L.width = std::max({L.label_w + L.grid_w + 16, legend_w + 16, text_width(o.title, 14) + 16, 240.0});
  L.height = L.top + L.grid_h + 44;
  L.row_every = std::max(1, int(std::ceil(11.0 / L.cell_h)));
  L.col_every = std::max(1, int(std::ceil(34.0 / std::max(L.cell_w, 1e-9))));
  return L;
}

template <typename CellFn>
void draw_heatmap_body(std::ostringstream& os, const std::vector<std::string>& rows,
                       const std::vector<std::string>& cols, const HeatmapOptions& o, const HeatmapLayout& L,
                       CellFn cell) {
  const size_t R = rows.size(), C = cols.size();
  const double row_font = L.cell_h >= 10 ? 11 : 10;
  const bool gaps = L.cell_h >= 6 && L.cell_w >= 6;
  os << "<g class=\"cells\" shape-rendering=\"crispEdges\"" << (gaps ? " stroke=\"#FFFFFF\" stroke-width=\"0.5\"" : "") << ">";
  for (size_t i = 0; i < R; ++i)
    for (size_t j = 0; j < C; ++j) {
      std::string fill, value;
      cell(i, j, fill, value);
      os << "<rect class=\"cell\" data-row=\"" << i << "\" data-col=\"" << j << "\" data-value=\"" << xml_escape(value)
         << "\" x=\"" << f2(L.label_w + L.cell_w * double(j)) << "\" y=\"" << f2(L.top + L.cell_h * double(i))
         << "\" width=\"" << f2(L.cell_w) << "\" height=\"" << f2(L.cell_h) << "\" fill=\"" << fill << "\"><title>"
         << xml_escape(rows[i] + " @ " + cols[j] + ": " + (value.empty() ? "none" : value)) << "</title></rect>";
    }
  os << "</g>";
  os << "<g class=\"row-labels\" font-size=\"" << row_font << "\" fill=\"" << kTextColor << "\">";
  for (size_t i = 0; i < R; i += size_t(L.row_every))
    os << "<text x=\"" << f2(L.label_w - 6) << "\" y=\"" << f2(L.top + L.cell_h * (double(i) + 0.5) + row_font * 0.35)
       << "\" text-anchor=\"end\">" << xml_escape(rows[i]) << "</text>";
  os << "</g>";
  const double gb = L.top + L.grid_h;
  os << "<g class=\"col-labels\" font-size=\"11\" fill=\"" << kMutedColor << "\">";
  for (size_t j = 0; j < C; j += size_t(L.col_every))
    os << "<text x=\"" << f2(L.label_w + L.cell_w * (double(j) + 0.5)) << "\" y=\"" << f2(gb + 14)
       << "\" text-anchor=\"middle\">" << xml_escape(cols[j]) << "</text>";
  os << "</g>";
  os << "<rect class=\"frame\" x=\"" << f2(L.label_w) << "\" y=\"" << f2(L.top) << "\" width=\"" << f2(L.grid_w)
     << "\" height=\"" << f2(L.grid_h) << "\" fill=\"none\" stroke=\"" << kAxisColor << "\" stroke-width=\"1\"/>";
  if (!o.x_label.empty())
    os << "<text class=\"x-label\" x=\"" << f2(L.label_w + L.grid_w / 2) << "\" y=\"" << f2(gb + 34)
       << "\" text-anchor=\"middle\">" << xml_escape(o.x_label) << "</text>";
}

void check_cells_shape(size_t R, size_t C, size_t rows_got, const std::vector<size_t>& widths) {
  if (rows_got != R) throw std::invalid_argument("svg_heatmap: cells has " + std::to_string(rows_got) + " rows, expected " + std::to_string(R));
  for (size_t i = 0; i < widths.size(); ++i)
    if (widths[i] != C)
      throw std::invalid_argument("svg_heatmap: cells row " + std::to_string(i) + " has " + std::to_string(widths[i]) +
                                  " columns, expected " + std::to_string(C));
}

}  // namespace

std::string xml_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string series_color(std::size_t i) {
  static const char* const kPalette[8] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7",
                                          "#E69F00", "#56B4E9", "#000000", "#F0E442"};
  return kPalette[i % 8];
}

std::string option_color(const std::string& option) {
  if (option == "fp4") return "#D55E00";
  if (option == "fp8") return "#0072B2";
  if (option == "bf16" || option == "fp32") return "#BBBBBB";  // unquantized
  static const char* const kRest[6] = {"#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#F0E442", "#000000"};
  return kRest[fnv1a32(option) % 6];  // stable across runs and platforms
}

std::string scale_color(double t) {
  if (!std::isfinite(t)) t = 0;
  const double u = (1.0 - std::clamp(t, 0.0, 1.0)) * 9.0;  // reversed: t = 1 is dark
  const int k = std::min(8, int(u));
  const double f = u - k;
  auto ch = [&](int shift) {
    const double a = (kViridis[k] >> shift) & 0xFF, b = (kViridis[k + 1] >> shift) & 0xFF;
    return unsigned(std::lround(a + (b - a) * f));
  };
  return hex((ch(16) << 16) | (ch(8) << 8) | ch(0));
}

void downsample_minmax(std::vector<double>& x, std::vector<double>& y, std::size_t max_points) {
  const size_t n0 = std::min(x.size(), y.size());
  std::vector<double> fx, fy;
  fx.reserve(n0);
  fy.reserve(n0);
  for (size_t k = 0; k < n0; ++k)
    if (std::isfinite(y[k]) && std::isfinite(x[k])) {
      fx.push_back(x[k]);
      fy.push_back(y[k]);
    }
  max_points = std::max<size_t>(max_points, 4);
  const size_t n = fx.size();
  if (n <= max_points) {
    x = std::move(fx);
    y = std::move(fy);
    return;
  }
  const size_t buckets = (max_points - 2) / 2, inner = n - 2;
  std::vector<double> ox{fx[0]}, oy{fy[0]};
  for (size_t b = 0; b < buckets; ++b) {
    const size_t a = 1 + inner * b / buckets, e = 1 + inner * (b + 1) / buckets;  // [a, e)
    if (a >= e) continue;
    size_t lo = a, hi = a;
    for (size_t k = a; k < e; ++k) {
      if (fy[k] < fy[lo]) lo = k;
      if (fy[k] > fy[hi]) hi = k;
    }
    const size_t first = std::min(lo, hi), second = std::max(lo, hi);
    ox.push_back(fx[first]);
    oy.push_back(fy[first]);
    if (second != first) {
      ox.push_back(fx[second]);
      oy.push_back(fy[second]);
    }
  }
  ox.push_back(fx[n - 1]);
  oy.push_back(fy[n - 1]);
  x = std::move(ox);
  y = std::move(oy);
}

PlotRect line_chart_plot_rect(const std::vector<Series>& series, const LineChartOptions& o) {
  PlotRect r;
  r.left = kChartMarginLeft;
  r.right = double(o.width) - kChartMarginRight;
  r.bottom = double(o.height) - kChartMarginBottom;
  std::vector<std::string> names;
  for (const Series& s : series)
    if (has_plottable(s, o.log_x)) names.push_back(s.name);
  const int rows = legend_rows(names, r.right - r.left);
  r.top = kChartPadTop + (o.title.empty() ? 0 : kChartTitleHeight) + rows * kChartLegendRowHeight + (rows ? 6 : 0);
  if (r.bottom < r.top + 20) r.bottom = r.top + 20;  // a tiny image still gets a plot area
  return r;
}

std::string svg_line_chart(const std::vector<Series>& series_in, const LineChartOptions& o) {
  // Series with something to draw, downsampled; colours fixed by input index.
  std::vector<Series> series;
  for (size_t i = 0; i < series_in.size(); ++i) {
    const Series& s = series_in[i];
    if (!has_plottable(s, o.log_x)) continue;
    Series c = s;
    c.x.resize(std::min(s.x.size(), s.y.size()));
    c.y.resize(c.x.size());
    if (c.color.empty()) c.color = series_color(i);
    if (c.y_lo.size() != c.x.size() || c.y_hi.size() != c.x.size()) c.y_lo.clear(), c.y_hi.clear();
    if (c.x.size() > o.max_points) {  // a band is dropped with downsampling (it would not match the points)
      downsample_minmax(c.x, c.y, o.max_points);
      c.y_lo.clear(), c.y_hi.clear();
    }
    series.push_back(std::move(c));
  }
  const PlotRect r = line_chart_plot_rect(series, o);
  std::ostringstream os;
  svg_open(os, "line-chart", o.id, o.width, o.height, o.title);
  os << " data-series-count=\"" << series.size() << "\">";
  os << "<rect class=\"background\" width=\"" << o.width << "\" height=\"" << o.height << "\" fill=\"#FFFFFF\"/>";
  draw_title(os, o.title, r.left);

  // Data ranges.
  double xmn = INFINITY, xmx = -INFINITY, ymn = INFINITY, ymx = -INFINITY;
  for (const Series& s : series)
    for (size_t k = 0; k < s.x.size(); ++k) {
      if (!std::isfinite(s.x[k]) || !std::isfinite(s.y[k]) || (o.log_x && s.x[k] <= 0)) continue;
      xmn = std::min(xmn, s.x[k]);
      xmx = std::max(xmx, s.x[k]);
      ymn = std::min(ymn, s.y[k]);
      ymx = std::max(ymx, s.y[k]);
      if (k < s.y_lo.size() && std::isfinite(s.y_lo[k]) && std::isfinite(s.y_hi[k])) {
        ymn = std::min(ymn, s.y_lo[k]);
        ymx = std::max(ymx, s.y_hi[k]);
      }
    }
  if (series.empty()) {
    Axis ax{0, 1, false, r.left, r.right}, ay{0, 1, false, r.bottom, r.top};
    draw_axes(os, r, ax, ay, o.x_label, o.y_label);
    draw_no_data(os, r);
    os << "</svg>";
    return os.str();
  }
  Axis ax, ay;
  ax.log = o.log_x;
  auto_range(xmn, xmx, o.log_x, false, ax.lo, ax.hi);
  if (std::isfinite(o.x_min)) ax.lo = o.x_min;
  if (std::isfinite(o.x_max)) ax.hi = o.x_max;
  // The y range: explicit ends stay, automatic ends widen to ticks.
  double ylo, yhi;
  const double dmn = std::isfinite(o.y_min) ? std::min(o.y_min, ymn) : ymn;
  const double dmx = std::isfinite(o.y_max) ? std::max(o.y_max, ymx) : ymx;
  auto_range(std::isfinite(o.y_min) ? o.y_min : dmn, std::isfinite(o.y_max) ? o.y_max : dmx, false, true, ylo, yhi);
  ay.lo = std::isfinite(o.y_min) ? o.y_min : ylo;
  ay.hi = std::isfinite(o.y_max) ? o.y_max : yhi;
  if (!(ay.hi > ay.lo)) ay.hi = ay.lo + 1;
  if (!(ax.hi > ax.lo)) ax.hi = ax.lo + (ax.log ? ax.lo * 9 : 1);
  ax.p0 = r.left;
  ax.p1 = r.right;
  ay.p0 = r.bottom;
  ay.p1 = r.top;
  draw_axes(os, r, ax, ay, o.x_label, o.y_label);

  const std::string clip = safe_id(o.id) + "-clip";
  os << "<defs><clipPath id=\"" << clip << "\"><rect x=\"" << f2(r.left - 2) << "\" y=\"" << f2(r.top - 2)
     << "\" width=\"" << f2(r.right - r.left + 4) << "\" height=\"" << f2(r.bottom - r.top + 4) << "\"/></clipPath></defs>";
  os << "<g class=\"series-group\" clip-path=\"url(#" << clip << ")\" fill=\"none\" stroke-linejoin=\"round\" stroke-linecap=\"round\">";
  for (const Series& s : series) {  // bands first, under every line
    if (s.y_lo.empty()) continue;
    std::string up, down;
    for (size_t k = 0; k < s.x.size(); ++k) {
      if (!ax.plottable(s.x[k]) || !std::isfinite(s.y_lo[k]) || !std::isfinite(s.y_hi[k])) continue;
      up += (up.empty() ? "M" : " L") + f2(ax.map(s.x[k])) + "," + f2(ay.map(s.y_hi[k]));
      down = " L" + f2(ax.map(s.x[k])) + "," + f2(ay.map(s.y_lo[k])) + down;
    }
    if (up.empty()) continue;
    os << "<path class=\"band\" data-series=\"" << xml_escape(s.name) << "\" d=\"" << up << down
       << " Z\" fill=\"" << s.color << "\" fill-opacity=\"0.15\" stroke=\"none\"/>";
  }
  std::ostringstream marks;  // drawn over every line
  auto marker = [&](const Series& s, size_t k) {
    marks << "<circle class=\"marker\" data-series=\"" << xml_escape(s.name) << "\" data-x=\"" << g6(s.x[k])
          << "\" data-y=\"" << g6(s.y[k]) << "\" cx=\"" << f2(ax.map(s.x[k])) << "\" cy=\"" << f2(ay.map(s.y[k]))
          << "\" r=\"" << f2(kChartMarkerRadius) << "\" fill=\"" << (s.dashed ? "#FFFFFF" : s.color) << "\" stroke=\""
          << s.color << "\" stroke-width=\"1.50\"/>";
  };
  for (const Series& s : series) {
    std::string d;
    bool pen_down = false, lone = false;
    size_t lone_k = 0;
    for (size_t k = 0; k < s.x.size(); ++k) {
      if (!ax.plottable(s.x[k]) || !std::isfinite(s.y[k])) {
        if (lone) {
          d += " l0,0";  // a lone point: a zero-length segment (a dot by the round cap), and a marker
          if (!s.markers) marker(s, lone_k);
        }
        pen_down = lone = false;
        continue;
      }
      const std::string xy = f2(ax.map(s.x[k])) + "," + f2(ay.map(s.y[k]));
      if (s.markers) marker(s, k);
      if (!pen_down) {
        d += (d.empty() ? "M" : " M") + xy;
        pen_down = lone = true;
        lone_k = k;
      } else {
        d += " L" + xy;
        lone = false;
      }
    }
    if (lone) {
      d += " l0,0";
      if (!s.markers) marker(s, lone_k);
    }
    os << "<path class=\"series\" data-series=\"" << xml_escape(s.name) << "\" d=\"" << d << "\" stroke=\"" << s.color
       << "\" stroke-width=\"" << f2(s.stroke_width) << "\"";
    if (s.opacity < 1.0) os << " stroke-opacity=\"" << f2(s.opacity) << "\"";
    if (s.dashed) os << " stroke-dasharray=\"6 4\"";
    os << "/>";
  }
  os << "</g>";
  if (!marks.str().empty()) {  // clipped one radius wider, so a point on the frame shows whole
    const double m = 2 + kChartMarkerRadius + 1;
    os << "<defs><clipPath id=\"" << clip << "-markers\"><rect x=\"" << f2(r.left - m) << "\" y=\"" << f2(r.top - m)
       << "\" width=\"" << f2(r.right - r.left + 2 * m) << "\" height=\"" << f2(r.bottom - r.top + 2 * m)
       << "\"/></clipPath></defs><g class=\"markers\" clip-path=\"url(#" << clip << "-markers)\">" << marks.str() << "</g>";
  }

  // Legend rows between the title and the plot area (line_chart_plot_rect).
  os << "<g class=\"legend\" font-size=\"12\">";
  double lx = r.left, ly = kChartPadTop + (o.title.empty() ? 0 : kChartTitleHeight) + 12;
  for (const Series& s : series) {
    const double w = legend_entry_width(s.name);
    if (lx > r.left && lx + w > r.right) {
      lx = r.left;
      ly += kChartLegendRowHeight;
    }
    os << "<line x1=\"" << f2(lx) << "\" x2=\"" << f2(lx + 20) << "\" y1=\"" << f2(ly - 4) << "\" y2=\"" << f2(ly - 4)
       << "\" stroke=\"" << s.color << "\" stroke-width=\"" << f2(std::max(2.0, s.stroke_width)) << "\""
       << (s.opacity < 1.0 ? " stroke-opacity=\"" + f2(std::max(0.35, s.opacity)) + "\"" : std::string())
       << (s.dashed ? " stroke-dasharray=\"6 4\"" : "") << "/>";
    if (s.markers)
      os << "<circle cx=\"" << f2(lx + 10) << "\" cy=\"" << f2(ly - 4) << "\" r=\"" << f2(kChartMarkerRadius)
         << "\" fill=\"" << (s.dashed ? "#FFFFFF" : s.color) << "\" stroke=\"" << s.color << "\" stroke-width=\"1.50\"/>";
    os << "<text x=\"" << f2(lx + 26) << "\" y=\"" << f2(ly) << "\">" << xml_escape(s.name) << "</text>";
    lx += w;
  }
  os << "</g></svg>";
  return os.str();
}

std::string svg_heatmap(const std::vector<std::string>& rows, const std::vector<std::string>& cols,
                        const std::vector<std::vector<std::string>>& cells, const HeatmapOptions& o) {
  std::vector<size_t> widths;
  for (const auto& r : cells) widths.push_back(r.size());
  check_cells_shape(rows.size(), cols.size(), cells.size(), widths);
  std::set<std::string> present;
  bool any_empty = false;
  for (const auto& r : cells)
    for (const auto& c : r) {
      if (c.empty())
        any_empty = true;
      else
        present.insert(c);
    }
  std::vector<std::string> cats(present.begin(), present.end());
  std::stable_sort(cats.begin(), cats.end(),
                   [](const std::string& a, const std::string& b) { return category_rank(a) < category_rank(b); });
  double legend_w = 0;
  for (const auto& c : cats) legend_w += 18 + text_width(c, 12) + 16;
  if (any_empty) legend_w += 18 + text_width("none", 12) + 16;
  const HeatmapLayout L = heatmap_layout(rows, cols, o, legend_w);

  std::ostringstream os;
  svg_open(os, "heatmap", o.id, L.width, L.height, o.title);
  os << " data-kind=\"categorical\" data-rows=\"" << rows.size() << "\" data-cols=\"" << cols.size() << "\">";
  os << "<rect class=\"background\" width=\"" << f2(L.width) << "\" height=\"" << f2(L.height) << "\" fill=\"#FFFFFF\"/>";
  draw_title(os, o.title, 8);
  // Legend: a swatch per category.
  os << "<g class=\"legend\" font-size=\"12\">";
  double lx = 8;
  const double ly = kChartPadTop + (o.title.empty() ? 0 : kChartTitleHeight) + 14;
  auto swatch = [&](const std::string& name, const std::string& fill) {
    os << "<g class=\"legend-item\" data-value=\"" << xml_escape(name) << "\"><rect x=\"" << f2(lx) << "\" y=\""
       << f2(ly - 10) << "\" width=\"12\" height=\"12\" rx=\"2\" fill=\"" << fill << "\"/><text x=\"" << f2(lx + 18)
       << "\" y=\"" << f2(ly) << "\">" << xml_escape(name) << "</text></g>";
    lx += 18 + text_width(name, 12) + 16;
  };
  for (const auto& c : cats) swatch(c, option_color(c));
  if (any_empty) swatch("none", kEmptyCellColor);
  os << "</g>";
  draw_heatmap_body(os, rows, cols, o, L, [&](size_t i, size_t j, std::string& fill, std::string& value) {
    value = cells[i][j];
    fill = value.empty() ? kEmptyCellColor : option_color(value);
  });
  os << "</svg>";
  return os.str();
}

std::string svg_heatmap(const std::vector<std::string>& rows, const std::vector<std::string>& cols,
                        const std::vector<std::vector<double>>& cells, const HeatmapOptions& o) {
  std::vector<size_t> widths;
  for (const auto& r : cells) widths.push_back(r.size());
  check_cells_shape(rows.size(), cols.size(), cells.size(), widths);
  double mn = INFINITY, mx = -INFINITY, mn_pos = INFINITY;
  for (const auto& r : cells)
    for (double v : r)
      if (std::isfinite(v)) {
        mn = std::min(mn, v);
        mx = std::max(mx, v);
        if (v > 0) mn_pos = std::min(mn_pos, v);
      }
  const bool any = std::isfinite(mn);
  double vmax = std::isfinite(o.v_max) ? o.v_max : (any ? mx : 1.0);
  const bool log = o.log_scale && vmax > 0 && (std::isfinite(o.v_min) ? o.v_min > 0 : std::isfinite(mn_pos));
  double vmin = std::isfinite(o.v_min) ? o.v_min : (!any ? 0.0 : log ? mn_pos : mn);
  auto t_of = [&](double v) {
    if (log) {
      if (!(v > 0)) return 0.0;
      if (!(vmax > vmin)) return 0.5;
      return (std::log10(v) - std::log10(vmin)) / (std::log10(vmax) - std::log10(vmin));
    }
    if (!(vmax > vmin)) return 0.5;
    return (v - vmin) / (vmax - vmin);
  };
  const std::string caption = o.value_label + (log ? " (log scale)" : "");
  const double bar_w = 160;
  auto g3 = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g", v);
    return std::string(buf);
  };
  const std::string lo_text = g3(vmin), hi_text = g3(vmax);
  // caption, gap, min, bar, max, gap, "none" swatch
  const double legend_w = text_width(caption, 12) + 12 + text_width(lo_text, 11) + 6 + bar_w + 6 +
                          text_width(hi_text, 11) + 16 + 18 + text_width("none", 12) + 8;
  const HeatmapLayout L = heatmap_layout(rows, cols, o, legend_w);

  std::ostringstream os;
  svg_open(os, "heatmap", o.id, L.width, L.height, o.title);
  os << " data-kind=\"continuous\" data-rows=\"" << rows.size() << "\" data-cols=\"" << cols.size() << "\">";
  os << "<rect class=\"background\" width=\"" << f2(L.width) << "\" height=\"" << f2(L.height) << "\" fill=\"#FFFFFF\"/>";
  draw_title(os, o.title, 8);
  // Legend: caption, min value, a bar of 32 steps, max value, "none" swatch.
  const double ly = kChartPadTop + (o.title.empty() ? 0 : kChartTitleHeight) + 14;
  double lx = 8;
  os << "<g class=\"legend\" font-size=\"12\">";
  if (!caption.empty()) {
    os << "<text x=\"" << f2(lx) << "\" y=\"" << f2(ly) << "\">" << xml_escape(caption) << "</text>";
    lx += text_width(caption, 12) + 12;
  }
  if (any) {
    os << "<text x=\"" << f2(lx) << "\" y=\"" << f2(ly) << "\" font-size=\"11\">" << lo_text << "</text>";
    lx += text_width(lo_text, 11) + 6;
    os << "<g class=\"colorbar\" shape-rendering=\"crispEdges\">";
    for (int k = 0; k < 32; ++k)
      os << "<rect x=\"" << f2(lx + bar_w * k / 32.0) << "\" y=\"" << f2(ly - 10) << "\" width=\"" << f2(bar_w / 32.0 + 0.3)
         << "\" height=\"12\" fill=\"" << scale_color((k + 0.5) / 32.0) << "\"/>";
    os << "</g>";
    lx += bar_w + 6;
    os << "<text x=\"" << f2(lx) << "\" y=\"" << f2(ly) << "\" font-size=\"11\">" << hi_text << "</text>";
    lx += text_width(hi_text, 11) + 16;
  }
  os << "<rect x=\"" << f2(lx) << "\" y=\"" << f2(ly - 10) << "\" width=\"12\" height=\"12\" rx=\"2\" fill=\"" << kEmptyCellColor
     << "\" stroke=\"#CCCCCC\"/><text x=\"" << f2(lx + 18) << "\" y=\"" << f2(ly) << "\">none</text>";
  os << "</g>";
  draw_heatmap_body(os, rows, cols, o, L, [&](size_t i, size_t j, std::string& fill, std::string& value) {
    const double v = cells[i][j];
    if (!std::isfinite(v)) {
      value.clear();
      fill = kEmptyCellColor;
    } else {
      value = g6(v);
      fill = scale_color(t_of(v));
    }
  });
  os << "</svg>";
  return os.str();
}

std::string svg_scatter(const std::vector<ScatterPoint>& points, const ScatterOptions& o) {
  std::vector<const ScatterPoint*> pts;
  for (const ScatterPoint& p : points)
    if (std::isfinite(p.x) && std::isfinite(p.y) && (!o.log_x || p.x > 0) && (!o.log_y || p.y > 0)) pts.push_back(&p);
  PlotRect r;
  r.left = kChartMarginLeft;
  r.right = double(o.width) - kChartMarginRight;
  r.bottom = double(o.height) - kChartMarginBottom;
  r.top = kChartPadTop + (o.title.empty() ? 0 : kChartTitleHeight) + (o.subtitle.empty() ? 0 : kChartLegendRowHeight + 6);
  if (r.bottom < r.top + 20) r.bottom = r.top + 20;
  std::ostringstream os;
  svg_open(os, "scatter", o.id, o.width, o.height, o.title);
  os << " data-points=\"" << pts.size() << "\">";
  os << "<rect class=\"background\" width=\"" << o.width << "\" height=\"" << o.height << "\" fill=\"#FFFFFF\"/>";
  draw_title(os, o.title, r.left);
  if (!o.subtitle.empty())
    os << "<text class=\"subtitle\" x=\"" << f2(r.left) << "\" y=\"" << f2(kChartPadTop + (o.title.empty() ? 0 : kChartTitleHeight) + 12)
       << "\" fill=\"" << kMutedColor << "\">" << xml_escape(o.subtitle) << "</text>";
  if (pts.empty()) {
    Axis ax{0, 1, false, r.left, r.right}, ay{0, 1, false, r.bottom, r.top};
    draw_axes(os, r, ax, ay, o.x_label, o.y_label);
    draw_no_data(os, r);
    os << "</svg>";
    return os.str();
  }
  double xmn = INFINITY, xmx = -INFINITY, ymn = INFINITY, ymx = -INFINITY;
  for (const ScatterPoint* p : pts) {
    xmn = std::min(xmn, p->x);
    xmx = std::max(xmx, p->x);
    ymn = std::min(ymn, p->y);
    ymx = std::max(ymx, p->y);
  }
  Axis ax, ay;
  ax.log = o.log_x;
  ay.log = o.log_y;
  auto_range(xmn, xmx, o.log_x, true, ax.lo, ax.hi);
  auto_range(ymn, ymx, o.log_y, true, ay.lo, ay.hi);
  ax.p0 = r.left;
  ax.p1 = r.right;
  ay.p0 = r.bottom;
  ay.p1 = r.top;
  draw_axes(os, r, ax, ay, o.x_label, o.y_label);
  const std::string clip = safe_id(o.id) + "-clip";
  os << "<defs><clipPath id=\"" << clip << "\"><rect x=\"" << f2(r.left) << "\" y=\"" << f2(r.top) << "\" width=\""
     << f2(r.right - r.left) << "\" height=\"" << f2(r.bottom - r.top) << "\"/></clipPath></defs>";
  if (o.diagonal) {
    const double a = std::max(ax.lo, ay.lo), b = std::min(ax.hi, ay.hi);
    if (b > a)
      os << "<path class=\"diagonal\" d=\"M" << f2(ax.map(a)) << "," << f2(ay.map(a)) << " L" << f2(ax.map(b)) << ","
         << f2(ay.map(b)) << "\" stroke=\"#999999\" stroke-dasharray=\"4 4\" fill=\"none\" clip-path=\"url(#" << clip << ")\"/>";
  }
  os << "<g class=\"points\">";
  for (const ScatterPoint* p : pts) {
    const std::string color = p->color.empty() ? series_color(0) : p->color;
    os << "<circle class=\"point\" data-label=\"" << xml_escape(p->label) << "\" data-x=\"" << g6(p->x) << "\" data-y=\""
       << g6(p->y) << "\" cx=\"" << f2(ax.map(p->x)) << "\" cy=\"" << f2(ay.map(p->y)) << "\" r=\"4\" fill=\"" << color
       << "\" fill-opacity=\"0.85\" stroke=\"#FFFFFF\" stroke-width=\"0.8\"><title>"
       << xml_escape((p->label.empty() ? "" : p->label + ": ") + g6(p->x) + ", " + g6(p->y)) << "</title></circle>";
  }
  os << "</g>";
  if (o.show_labels) {
    os << "<g class=\"point-labels\" font-size=\"10\" fill=\"" << kMutedColor << "\">";
    for (const ScatterPoint* p : pts)
      if (!p->label.empty())
        os << "<text x=\"" << f2(ax.map(p->x) + 6) << "\" y=\"" << f2(ay.map(p->y) - 4) << "\">" << xml_escape(p->label) << "</text>";
    os << "</g>";
  }
  os << "</svg>";
  return os.str();
}

}  // namespace snip::report
