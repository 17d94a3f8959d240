// cmd_report.cpp: `snip report`, the run report (snip/report/report.h).
//
//   snip report RUN [--reference OTHER [--force]] [--out FILE]
//
// Writes RUN/report.html (or FILE) atomically, one self-contained HTML page:
// loss curves (OTHER overlaid dashed), FP4 share, precision map, quantization
// error heat map, the latest plan and stats step. Prints the path written.
// With --reference, each way the two runs differ (data folder, tokenizer,
// validation data, model, steps, tokens per step: snip/report/compare.h) is
// one line "snip: note: ..." on stderr and a row of the report's header. A
// reference whose losses are incomparable (another tokenizer, vocabulary or
// validation set) is refused unless --force.
// A missing run directory, an incomparable reference, or an unparsable
// plan/stats/summary file ends as a snip::UserError (one line, exit status
// 2, no file written).
#include <iostream>
#include <memory>
#include <string>

#include "commands.h"
#include "snip/report/report.h"
#include "snip/core/error.h"

namespace snip::cli {

namespace {
struct ReportArgs {
  std::string run, reference, out;
  bool force = false;
};
}  // namespace

void add_report_commands(CLI::App& app) {
  auto a = std::make_shared<ReportArgs>();
  CLI::App* sub = app.add_subcommand(
      "report", "Write a run's HTML report (loss curves, precision map, error heat map, latest plan): RUN/report.html");
  sub->add_option("run", a->run, "Run directory (runs/NAME)")->required();
  sub->add_option("--reference", a->reference,
                  "Another run directory to overlay on the loss charts (dashed); how the runs differ is printed "
                  "and shown, and one with another tokenizer, vocabulary or validation set is refused");
  sub->add_flag("--force", a->force,
                "With --reference: overlay it even when the losses are incomparable (the report says so)");
  sub->add_option("--out", a->out, "Output file (default RUN/report.html)");
  sub->callback([a] {
    if (a->force && a->reference.empty()) fail("snip report: --force only applies with --reference OTHER");
    if (!a->reference.empty()) {
      const std::string rn = report::run_display_name(a->run), fn = report::run_display_name(a->reference);
      for (const report::RunDifference& d : report::check_reference(a->run, a->reference, a->force))
        std::cerr << "snip: " << (d.incomparable ? "warning: --force: " : "note: ") << d.line(rn, fn) << "\n";
    }
    const std::string path = report::write_report(a->run, a->reference, a->out, a->force);
    std::cout << path << "\n";
  });
}

}  // namespace snip::cli
