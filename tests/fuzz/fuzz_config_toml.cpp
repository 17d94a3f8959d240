// A run configuration (`snip train --config F`) -> Config::load_toml_string
// -> RunConfig::from (ranges, words, options together). A config that
// loads must reload from its resolved to_toml() (what a run saves as
// config.toml) to the same values.
#include "harness.h"
#include "snip/config/config.h"

using namespace snip;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::guarded(data, size, [](std::string_view in) {
    Config c;
    c.load_toml_string(std::string(in), "config.toml");
    Config back;
    back.load_toml_string(c.to_toml(), "resolved config.toml");
    // The doc comment of to_toml(): "loading it back gives an equal Config".
    for (const auto& [key, v] : c.values()) {
      const auto it = back.values().find(key);
      if (it == back.values().end() || format_option_value(it->second) != format_option_value(v))
        fuzz::finding("to_toml round trip changed a value");
    }
    RunConfig::from(c);
  });
  return 0;
}
