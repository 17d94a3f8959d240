// src/app/correlation_view.cpp: the correlation study's scatter chart and
// table (snip/app/study.h present_correlation), for `snip correlate`.
#include <fmt/format.h>

#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include "snip/app/study.h"
#include "snip/io/atomic_file.h"
#include "snip/report/svg.h"
#include "snip/core/statistics.h"

namespace fs = std::filesystem;

namespace snip {

std::string present_correlation(CorrelationResult& r, const std::string& predictor, const std::string& out_dir,
                                bool replotted, std::ostream& out) {
  const std::vector<double> x = predictor_values(r, predictor);  // UserError for an unknown name
  std::vector<double> dv;
  std::vector<report::ScatterPoint> pts;
  for (size_t i = 0; i < r.layers.size(); ++i) {
    std::string shortname = r.layers[i].name;
    if (shortname.rfind("model.layers.", 0) == 0) shortname = shortname.substr(13);
    pts.push_back({x[i], r.layers[i].delta_val, shortname, ""});
    dv.push_back(r.layers[i].delta_val);
  }
  report::ScatterOptions so;
  so.id = "correlation";
  so.title = fmt::format("{} vs measured loss change", predictor);
  so.subtitle = fmt::format("{} layers, {} alone for {} steps from step {}{}: Pearson {:.3f}, Spearman {:.3f}",
                            r.layers.size(), r.option, r.steps, r.step,
                            r.repeats > 1 ? fmt::format(", mean of {} repeats", r.repeats) : std::string(),
                            pearson(x, dv), spearman(x, dv));
  so.x_label = "predicted " + predictor + " (stats step)";
  so.y_label = "measured delta val loss (nats/token)";
  so.show_labels = r.layers.size() <= 40;
  std::string file = predictor == "q" ? "scatter.svg" : "scatter-" + predictor + ".svg";
  for (char& ch : file)
    if (ch == '[' || ch == ']' || ch == ',' || ch == '=') ch = '_';
  io::ensure_writable_dir(out_dir);
  const std::string svg_path = (fs::path(out_dir) / file).string();
  io::write_file_atomic(svg_path, report::svg_scatter(pts, so) + "\n");
  const bool rep = r.repeats > 1;
  out << fmt::format("{:<44} {:>10} {:>10} {:>10} {:>12}{}\n", "layer", "Q", "LD", "WD", "dval",
                           rep ? fmt::format(" {:>10}", "se") : std::string());
  for (const auto& l : r.layers)
    out << fmt::format("{:<44} {:>10.4g} {:>10.4g} {:>10.4g} {:>+12.5f}{}\n", l.name, l.q, l.ld, l.wd,
                             l.delta_val, rep ? fmt::format(" {:>10.5f}", l.delta_val_se) : std::string());
  out << fmt::format("\nbaseline (unquantized) val {:.5f} after {} steps from step {}{}\n", r.base_val_loss,
                           r.steps, r.step, rep ? fmt::format(" (mean of {} repeats)", r.repeats) : std::string());
  if (replotted && rep) add_bootstrap_intervals(r);
  if (!r.correlations.count(predictor))  // --replot: the chosen predictor too
    r.correlations[predictor] = {{"pearson", pearson(x, dv)}, {"spearman", spearman(x, dv)}};
  out << "predictor vs measured dval:      Pearson   Spearman"
            << (rep ? "   (95% bootstrap intervals)" : "") << "\n";
  for (const auto& [k, m] : r.correlations) {
    if (k.find("/train") != std::string::npos) continue;
    std::string ci;
    if (m.count("pearson_lo"))
      ci = fmt::format("   P [{:.2f}, {:.2f}]  S [{:.2f}, {:.2f}]", m.at("pearson_lo"), m.at("pearson_hi"),
                       m.at("spearman_lo"), m.at("spearman_hi"));
    out << fmt::format("  {:<28} {:>9.3f} {:>10.3f}{}\n", k, m.at("pearson"), m.at("spearman"), ci);
  }
  out << fmt::format("\nwritten: {}", svg_path);
  if (!replotted) out << fmt::format(", {}/correlation.json, correlation.csv ({:.0f} s)", out_dir, r.seconds);
  out << "\n";
  return svg_path;
}

}  // namespace snip
