// The `snip` command line: subcommands register from cmd_<name>.cpp files.
// A UserError becomes one line `snip: error: <message>` and exit status 2.
#include <spdlog/spdlog.h>

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <filesystem>
#include <cstdlib>
#include <iostream>
#include <vector>

#include "commands.h"
#include "snip/core/platform.h"
#include "snip/util/error.h"


int main(int argc, char** argv) {
  snip::tune_openblas_or_reexec(argv);  // before anything runs a GEMM
  CLI::App app{"snip: train Llama-family models with adaptive layer-wise FP4/FP8 mixed precision", "snip"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "snip 0.1.0");
  app.get_formatter()->column_width(40);
  spdlog::set_pattern("[%H:%M:%S] %v");
  snip::cli::add_train_commands(app);
  // `snip data ...` runs the snip-data program next to this one (SentencePiece
  // and LibTorch cannot share a process; see src/data/CMakeLists.txt).
  if (argc >= 2 && std::string(argv[1]) == "data") {
    const auto self = std::filesystem::read_symlink("/proc/self/exe");
    const std::string prog = (self.parent_path() / "snip-data").string();
    std::vector<char*> args{const_cast<char*>(prog.c_str())};
    for (int i = 1; i <= argc; ++i) args.push_back(argv[i]);  // includes argv[argc] == nullptr
    execv(prog.c_str(), args.data());
    std::cerr << "snip: error: cannot run " << prog << ": " << std::strerror(errno) << "\n";
    return 2;
  }
  app.add_subcommand("data", "prepare corpora into token shards (`snip data prepare --help`)");
#ifdef SNIP_HAVE_FORMATS_CMD
  snip::cli::add_format_commands(app);
#endif
#ifdef SNIP_HAVE_PLAN_CMD
  snip::cli::add_plan_commands(app);
#endif
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const snip::UserError& e) {
    std::cerr << "snip: error: " << e.what() << "\n";
    return 2;
  } catch (const c10::Error& e) {
    std::cerr << "snip: error: " << e.what_without_backtrace() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "snip: internal error: " << e.what() << "\n";
    return 3;
  }
  return 0;
}
