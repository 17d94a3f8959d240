// src/cli/commands.h: each subcommand group registers itself on the CLI11 app
// from its own file (cmd_<name>.cpp), so modules add commands without touching
// main.cpp's logic. A callback reports a user error by throwing
// snip::UserError; main() turns it into one line and exit status 2.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

namespace snip::cli {

/// CLI11 reads an empty string as the value type's default, so `--budget ''`
/// would be --budget 0. Every numeric option of `app` and of its subcommands
/// refuses it ("--budget: expected a number, got ''"). run_app() applies it
/// to the whole app; a command group may apply it to its own subcommand.
inline void refuse_empty_numbers(CLI::App& app) {
  for (CLI::Option* o : app.get_options()) {
    const std::string t = o->get_type_name();
    if (t.find("FLOAT") != std::string::npos || t.find("INT") != std::string::npos || t == "NUMBER")
      o->check(CLI::Validator(
          [](std::string& s) { return s.empty() ? std::string("expected a number, got ''") : std::string(); }, "",
          "non-empty number"));
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) refuse_empty_numbers(*sub);
}

void add_train_commands(CLI::App& app);    // train, eval       (cmd_train.cpp)
void add_data_commands(CLI::App& app);     // data prepare      (cmd_data.cpp)
void add_token_commands(CLI::App* data);   // data encode/decode (cmd_tokens.cpp, snip-data only)
void add_sample_commands(CLI::App& app);   // sample            (cmd_sample.cpp)
void add_format_commands(CLI::App& app);   // formats, quantize (cmd_formats.cpp)
void add_plan_commands(CLI::App& app);     // plan              (cmd_plan.cpp)
void add_report_commands(CLI::App& app);   // report            (cmd_report.cpp)
void add_experiment_commands(CLI::App& app);  // experiment, correlate (cmd_experiment.cpp)
void add_doctor_commands(CLI::App& app);   // doctor            (cmd_doctor.cpp)

}  // namespace snip::cli
