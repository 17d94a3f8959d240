// src/run/json_fields.h: strict readers of the typed files of a run
// (trainer_state.json, metrics.jsonl): the field's path in the message
// ("data.vocab_size"), the kind of value expected and what the file holds,
// in one UserError line "<what>: <field>: expected ..., got ...".
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

#include "snip/core/error.h"

namespace snip::run_fields {

using json = nlohmann::json;

[[noreturn]] inline void bad(const std::string& what, const std::string& field, const char* expected, const json& got) {
  std::string shown = got.dump();
  if (shown.size() > 40) shown = shown.substr(0, 40) + "...";
  fail(what, ": ", field, ": expected ", expected, ", got ", shown);
}

inline const json& need(const json& obj, const std::string& prefix, const char* key, const std::string& what) {
  if (!obj.contains(key)) fail(what, ": ", prefix, key, ": missing");
  return obj.at(key);
}

// An integer in [lo, hi] (a JSON integer; 2.0 or 2.5 are refused).
inline int64_t int_in(const json& v, const std::string& what, const std::string& field, int64_t lo, int64_t hi,
               const char* expected) {
  if (!v.is_number_integer()) bad(what, field, expected, v);
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
    bad(what, field, expected, v);
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) bad(what, field, expected, v);
  return x;
}

inline uint64_t unsigned_of(const json& v, const std::string& what, const std::string& field) {
  if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0))
    bad(what, field, "an integer >= 0", v);
  return v.get<uint64_t>();
}

// A finite number >= 0.
inline double nonneg(const json& v, const std::string& what, const std::string& field) {
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0)
    bad(what, field, "a finite number >= 0", v);
  return v.get<double>();
}

inline std::string text(const json& v, const std::string& what, const std::string& field) {
  if (!v.is_string()) bad(what, field, "a string", v);
  return v.get<std::string>();
}

}  // namespace snip::run_fields
