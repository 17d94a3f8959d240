// cmd_report.cpp: `snip report`, the run report (snip/report/report.h).
//
//   snip report RUN [--reference OTHER] [--out FILE]
//
// Writes RUN/report.html (or FILE) atomically, one self-contained HTML page:
// loss curves (OTHER overlaid dashed), FP4 share, precision map, quantization
// error heat map, the latest plan and stats step. Prints the path written.
// A missing run directory or an unparsable plan/stats/summary file ends as a
// snip::UserError (one line, exit status 2).
#include <iostream>
#include <memory>
#include <string>

#include "commands.h"
#include "snip/report/report.h"

namespace snip::cli {

namespace {
struct ReportArgs {
  std::string run, reference, out;
};
}  // namespace

void add_report_commands(CLI::App& app) {
  auto a = std::make_shared<ReportArgs>();
  CLI::App* sub = app.add_subcommand(
      "report", "Write a run's HTML report (loss curves, precision map, error heat map, latest plan): RUN/report.html");
  sub->add_option("run", a->run, "Run directory (runs/NAME)")->required();
  sub->add_option("--reference", a->reference, "Another run directory to overlay on the loss charts (dashed)");
  sub->add_option("--out", a->out, "Output file (default RUN/report.html)");
  sub->callback([a] {
    const std::string path = report::write_report(a->run, a->reference, a->out);
    std::cout << path << "\n";
  });
}

}  // namespace snip::cli
