// src/cli/commands.h: each subcommand group registers itself on the CLI11 app
// from its own file (cmd_<name>.cpp), so modules add commands without touching
// main.cpp's logic. A callback reports a user error by throwing
// snip::UserError; main() turns it into one line and exit status 2.
#pragma once

#include <CLI/CLI.hpp>

namespace snip::cli {

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
