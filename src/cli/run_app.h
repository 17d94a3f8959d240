// src/cli/run_app.h: what `snip` and `snip-data` share around CLI11.
#pragma once

#include <CLI/CLI.hpp>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <cctype>
#include <csignal>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <string_view>
#include <string>

#include "commands.h"
#include "snip/core/error.h"
#include "snip/core/strings.h"

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

/// Index in argv of the command's name: the first word after the log level
/// options every command takes (-q, --quiet, --log-level LEVEL,
/// --log-level=LEVEL); argc when there is none.
inline int command_word_index(int argc, char** argv) {
  int i = 1;
  while (i < argc) {
    const std::string a = argv[i];
    if (a == "-q" || a == "--quiet" || a.rfind("--log-level=", 0) == 0) ++i;
    else if (a == "--log-level") i += 2;
    else break;
  }
  return i;
}

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
  // Log lines go to stderr with the progress lines, samples and errors;
  // stdout keeps what a command produces (summaries, tables, JSON).
  spdlog::set_default_logger(
      std::make_shared<spdlog::logger>("snip", std::make_shared<spdlog::sinks::stderr_sink_mt>()));
  auto f = std::make_unique<spdlog::pattern_formatter>();
  f->add_flag<LevelTag>('*').set_pattern("[%H:%M:%S] %*%v");
  spdlog::set_formatter(std::move(f));
  // SNIP_LOG_LEVEL first (what torchrun and Slurm pass to every rank); then
  // -q; then --log-level, so an explicit level wins, the last one given.
  auto set_level = [](const std::string& given, const std::string& what) {
    std::string v = given;
    for (char& c : v) c = char(std::tolower(static_cast<unsigned char>(c)));
    static const std::map<std::string, spdlog::level::level_enum> kLevels{
        {"debug", spdlog::level::debug}, {"info", spdlog::level::info}, {"warning", spdlog::level::warn},
        {"warn", spdlog::level::warn}, {"error", spdlog::level::err}};
    const auto it = kLevels.find(v);
    if (it == kLevels.end()) fail(what, ": expected debug, info, warning or error, got '", given, "'");
    spdlog::set_level(it->second);
  };
  if (const char* env = std::getenv("SNIP_LOG_LEVEL"); env && *env) {
    try {
      set_level(env, "SNIP_LOG_LEVEL (environment)");
    } catch (const UserError& e) {
      std::cerr << "snip: error: " << e.what() << "\n";
      std::exit(2);
    }
  }
  app.add_flag_callback("-q,--quiet", [] { spdlog::set_level(spdlog::level::warn); },
                        "the same as --log-level warning: warnings, errors and the final summary only");
  app.add_option_function<std::string>(
         "--log-level", [set_level](const std::string& v) { set_level(v, "--log-level"); },
         "debug, info (default), warning or error: the least severe log lines printed; at warning or error "
         "also no progress lines, plan tables or samples (default: the environment variable SNIP_LOG_LEVEL, "
         "else info; an explicit level wins over -q)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
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
  // Each command's --help names the options every command takes.
  std::function<void(CLI::App&)> note_globals = [&](CLI::App& a) {
    for (CLI::App* sub : a.get_subcommands([](CLI::App*) { return true; })) {
      const std::string f = sub->get_footer();
      sub->footer(f + (f.empty() ? "" : "\n\n") +
                  "Every command also takes --log-level debug|info|warning|error (or SNIP_LOG_LEVEL) and -q/--quiet "
                  "(= --log-level warning), before or after its name.");
      note_globals(*sub);
    }
  };
  note_globals(app);
  // `snip trian`: CLI11 would say "A subcommand is required"; name the word.
  const int word = command_word_index(argc, argv);
  const std::string first = word < argc ? argv[word] : "";
  if (!first.empty() && first[0] != '-' &&
      app.get_subcommands([&](CLI::App* s) { return s->get_name() == first; }).empty()) {
    std::string names, closest;
    size_t best = SIZE_MAX;
    for (const CLI::App* s : app.get_subcommands([](CLI::App*) { return true; })) {
      names += (names.empty() ? "" : ", ") + s->get_name();
      if (const size_t d = edit_distance(first, s->get_name()); d < best) best = d, closest = s->get_name();
    }
    std::cerr << "snip: error: unknown command '" << first << "'"
              << (best <= 2 ? " (did you mean '" + closest + "'?)" : std::string()) << " (commands: " << names
              << "; see --help)\n";
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version are "errors" with exit code 0: CLI11 prints them.
    if (e.get_exit_code() == 0) return app.exit(e);
    // CLI11's "Could not convert: --budget = abc" (a number option given
    // something else) in the words of the other checks.
    std::string msg = e.what();
    const std::string conv = "Could not convert: ";
    if (const size_t eq = msg.find(" = "); msg.rfind(conv, 0) == 0 && eq != std::string::npos)
      msg = msg.substr(conv.size(), eq - conv.size()) + ": expected a number, got '" + msg.substr(eq + 3) + "'";
    std::cerr << "snip: error: " << msg << " (see --help)\n";
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
