// `snip-data`: the data commands in a process without LibTorch (see
// src/data/CMakeLists.txt). `snip data ARGS` runs `snip-data data ARGS`.
#include "commands.h"
#include "run_app.h"

int main(int argc, char** argv) {
  CLI::App app{"snip data: prepare corpora into token shards", "snip"};
  snip::cli::configure_app(app);
  snip::cli::add_data_commands(app);
  return snip::cli::run_app(app, argc, argv);
}
