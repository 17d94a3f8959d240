// The `snip` command line: subcommands register from cmd_<name>.cpp files.
// A UserError becomes one line `snip: error: <message>` and exit status 2
// (run_app.h).
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <vector>

#include "commands.h"
#include "run_app.h"
#include "snip/hw/platform.h"

int main(int argc, char** argv) {
  // `snip data ...` (also after log level options: `snip -q data prepare`)
  // runs the snip-data program next to this one (SentencePiece and LibTorch
  // cannot share a process; see src/data/CMakeLists.txt).
  if (const int w = snip::cli::command_word_index(argc, argv); w < argc && std::string(argv[w]) == "data") {
    const auto self = std::filesystem::read_symlink("/proc/self/exe");
    const std::string prog = (self.parent_path() / "snip-data").string();
    std::vector<char*> args{const_cast<char*>(prog.c_str())};
    for (int i = 1; i <= argc; ++i) args.push_back(argv[i]);  // includes argv[argc] == nullptr
    execv(prog.c_str(), args.data());
    std::cerr << "snip: error: cannot run " << prog << ": " << std::strerror(errno) << "\n";
    return 2;
  }
  snip::tune_runtime_or_reexec(argv);  // before anything runs a GEMM
  snip::cli::set_program_args(argc, argv);
  CLI::App app{"snip: train Llama-family models with adaptive layer-wise FP4/FP8 mixed precision", "snip"};
  snip::cli::configure_app(app);
  app.set_version_flag("--version", "snip 0.1.0");
  snip::cli::add_train_commands(app);
  app.add_subcommand("data", "prepare corpora into token shards (`snip data prepare --help`)");
  snip::cli::add_format_commands(app);
  snip::cli::add_plan_commands(app);
  snip::cli::add_report_commands(app);
  snip::cli::add_experiment_commands(app);
  snip::cli::add_sample_commands(app);
  snip::cli::add_doctor_commands(app);
  return snip::cli::run_app(app, argc, argv);
}
