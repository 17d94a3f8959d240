// `snip-data`: the data commands in a process without LibTorch (see
// src/data/CMakeLists.txt). `snip data ARGS` runs `snip-data data ARGS`.
#include "commands.h"
#include "run_app.h"
#include "snip/io/signal_cleanup.h"

int main(int argc, char** argv) {
  // Before any thread starts: SIGINT/SIGTERM remove `data prepare`'s staging
  // folder, then end the process by that signal (status 128 + signal).
  snip::io::install_signal_cleanup();
  CLI::App app{"snip data: prepare corpora into token shards", "snip"};
  snip::cli::configure_app(app);
  snip::cli::add_data_commands(app);
  return snip::cli::run_app(app, argc, argv);
}
