// src/cli/run_app.h: what `snip` and `snip-data` share around CLI11.
#pragma once

#include <CLI/CLI.hpp>
#include <spdlog/pattern_formatter.h>
#include <spdlog/spdlog.h>

#include <csignal>
#include <ctime>
#include <iostream>
#include <map>
#include <memory>
#include <string_view>
#include <string>

#include "commands.h"
#include "snip/util/error.h"

namespace snip::cli {

/// "warning: " / "error: " before a log line of that level, nothing before
/// an info line (the %* flag of the log pattern).
class LevelTag : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& m, const std::tm&, spdlog::memory_buf_t& dest) override {
    const std::string_view t = m.level == spdlog::level::warn ? "warning: " : m.level >= spdlog::level::err ? "error: " : "";
    dest.append(t.data(), t.data() + t.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<LevelTag>(); }
};

/// Common look: option column width, log line pattern ("[12:00:00] model:
/// ...", "[12:00:00] warning: ..."), and the log level options every
/// subcommand takes (before or after its name: `snip --quiet train` and
/// `snip train --quiet`):
///   --log-level LEVEL  debug, info (default), warning or error; also the
///                      environment variable SNIP_LOG_LEVEL (so torchrun and
///                      Slurm jobs can set it for every rank). Lines below
///                      LEVEL are not printed; at warning and above also no
///                      progress lines, plan tables or samples.
///   -q, --quiet        the same as --log-level warning.
/// Errors and the end-of-run summary (stdout) are always printed.
inline void configure_app(CLI::App& app) {
  app.require_subcommand(1);
  app.fallthrough();  // the options below also after the subcommand's name
  app.get_formatter()->column_width(40);
  auto f = std::make_unique<spdlog::pattern_formatter>();
  f->add_flag<LevelTag>('*').set_pattern("[%H:%M:%S] %*%v");
  spdlog::set_formatter(std::move(f));
  static const std::map<std::string, spdlog::level::level_enum> kLevels{
      {"debug", spdlog::level::debug}, {"info", spdlog::level::info}, {"warning", spdlog::level::warn},
      {"warn", spdlog::level::warn}, {"error", spdlog::level::err}};
  app.add_option_function<std::string>(
         "--log-level",
         [](const std::string& v) {
           const auto it = kLevels.find(v);
           if (it == kLevels.end())
             fail("--log-level: expected debug, info, warning or error, got '", v, "'");
           spdlog::set_level(it->second);
         },
         "debug, info (default), warning or error: the least severe log lines printed; at warning or error "
         "also no progress lines, plan tables or samples")
      ->envname("SNIP_LOG_LEVEL");
  app.add_flag_callback("-q,--quiet", [] { spdlog::set_level(spdlog::level::warn); },
                        "the same as --log-level warning: warnings, errors and the final summary only");
}

/// Parses argv and runs the chosen subcommand. Exit status: 0 on success
/// and for --help/--version; 2 with one line `snip: error: <message>` for a
/// usage error (unknown option, missing or invalid value) and
/// `snip: error: <message>` for a UserError; 3 with `snip: internal error:
/// <first line>` for any other exception (LibTorch's c10::Error carries a
/// backtrace after its first line).
inline int run_app(CLI::App& app, int argc, char** argv) {
  // A file-size limit (ulimit -f) must end a write with EFBIG, which every
  // writer turns into one clear line, not kill the process mid-file.
  std::signal(SIGXFSZ, SIG_IGN);
  refuse_empty_numbers(app);
  // `snip trian`: CLI11 would say "A subcommand is required"; name the word.
  const std::string first = argc >= 2 ? argv[1] : "";
  if (!first.empty() && first[0] != '-' &&
      app.get_subcommands([&](CLI::App* s) { return s->get_name() == first; }).empty()) {
    std::string names;
    for (const CLI::App* s : app.get_subcommands([](CLI::App*) { return true; }))
      names += (names.empty() ? "" : ", ") + s->get_name();
    std::cerr << "snip: error: unknown command '" << first << "' (commands: " << names << "; see --help)\n";
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version are "errors" with exit code 0: CLI11 prints them.
    if (e.get_exit_code() == 0) return app.exit(e);
    std::cerr << "snip: error: " << e.what() << " (see --help)\n";
    return 2;
  } catch (const UserError& e) {
    std::cerr << "snip: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    const std::string what = e.what();
    std::cerr << "snip: internal error: " << what.substr(0, what.find('\n')) << "\n";
    return 3;
  }
  return 0;
}

}  // namespace snip::cli
