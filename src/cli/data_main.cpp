// `snip-data`: the data commands in a process without LibTorch (see
// src/data/CMakeLists.txt). `snip data ARGS` runs `snip-data data ARGS`.
#include <spdlog/spdlog.h>

#include <iostream>

#include "commands.h"
#include "snip/util/error.h"

int main(int argc, char** argv) {
  CLI::App app{"snip data: prepare corpora into token shards", "snip"};
  app.require_subcommand(1);
  app.get_formatter()->column_width(40);
  spdlog::set_pattern("[%H:%M:%S] %v");
  snip::cli::add_data_commands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const snip::UserError& e) {
    std::cerr << "snip: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "snip: internal error: " << e.what() << "\n";
    return 3;
  }
  return 0;
}
