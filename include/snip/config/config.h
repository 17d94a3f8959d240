// snip/config/config.h: the run configuration, as option records.
//
// Every option is one record (HiGHS options habit): dotted key
// (`section.name`), type, default, unit and meaning, in ONE table
// (config.cpp, option_table()). The same table drives: TOML parsing,
// `--set section.key=value` overrides, `snip train --help`'s option list and
// the resolved `runs/NAME/config.toml`. An unknown key is a UserError naming
// the key and the closest valid one ("did you mean ..."); a wrong type names
// the key, the expected type and the value found.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

namespace snip {

/// One typed option value.
using OptionValue = std::variant<bool, int64_t, double, std::string>;

/// Type of an option; "list" options are comma-separated strings.
enum class OptionType { kBool, kInt, kFloat, kString };

/// The record of one option.
struct OptionSpec {
  std::string key;       ///< dotted, e.g. "train.lr"
  OptionType type;
  OptionValue def;       ///< default value
  std::string unit;      ///< e.g. "steps", "tokens", "fraction", "" if none
  std::string help;      ///< one-line meaning
};

/// All options snip knows, sorted by key.
const std::vector<OptionSpec>& option_table();

/// Renders a value as TOML would write it (strings quoted).
std::string format_option_value(const OptionValue& v);

/// A resolved configuration: every key of option_table() has a value.
class Config {
 public:
  /// Defaults for every option.
  Config();

  /// Reads a TOML file on top of the current values.
  /// Throws UserError "<file>: <key>: ..." for an unknown key, a wrong type or
  /// a TOML syntax error (with line and column).
  void load_toml_file(const std::string& path);

  /// Parses TOML text (for tests); `what` names the source in errors.
  void load_toml_string(const std::string& text, const std::string& what);

  /// Applies one `section.key=value` override (the value is parsed according
  /// to the option's type: true/false, integer, number or string).
  /// Throws UserError "--set <arg>: ..." on a bad key, missing '=' or bad value.
  void set_override(const std::string& assignment);

  /// Sets a key to a typed value; throws UserError on unknown key/wrong type.
  void set(const std::string& key, const OptionValue& v, const std::string& what);

  bool get_bool(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  const std::string& get_string(const std::string& key) const;

  /// Keys explicitly set by a file or an override (not defaults).
  const std::map<std::string, OptionValue>& values() const { return values_; }

  /// The resolved configuration as TOML text, with each option's help and unit
  /// as a comment; loading it back gives an equal Config.
  std::string to_toml() const;

  /// Throws UserError when options are individually valid but inconsistent
  /// (e.g. hidden_size not divisible by num_attention_heads).
  void validate() const;

 private:
  const OptionValue& raw(const std::string& key) const;
  std::map<std::string, OptionValue> values_;
};

/// The option key closest to `key` by edit distance (for "did you mean").
std::string closest_option_key(const std::string& key);

}  // namespace snip
