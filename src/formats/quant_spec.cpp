// QuantSpec: names, validation, JSON form.
#include <climits>
#include <cstring>
#include <nlohmann/json.hpp>

#include "snip/formats/quant_spec.h"

#include "snip/formats/hadamard.h"
#include "snip/core/error.h"

namespace snip::formats {

const char* scale_rule_name(ScaleRule r) {
  switch (r) {
    case ScaleRule::kNone: return "none";
    case ScaleRule::kCurrent: return "current";
    case ScaleRule::kDelayed: return "delayed";
    case ScaleRule::kMxFloor: return "mx_floor";
    case ScaleRule::kTwoLevel: return "two_level";
  }
  return "?";
}

ScaleRule parse_scale_rule(const std::string& name, const std::string& where) {
  for (ScaleRule r : {ScaleRule::kNone, ScaleRule::kCurrent, ScaleRule::kDelayed,
                      ScaleRule::kMxFloor, ScaleRule::kTwoLevel})
    if (name == scale_rule_name(r)) return r;
  fail(where, ": unknown scale rule '", name,
       "' (expected none, current, delayed, mx_floor or two_level)");
}

const char* rounding_name(Rounding r) { return r == Rounding::kRNE ? "rne" : "stochastic"; }

Rounding parse_rounding(const std::string& name, const std::string& where) {
  if (name == "rne") return Rounding::kRNE;
  if (name == "stochastic" || name == "sr") return Rounding::kStochastic;
  fail(where, ": unknown rounding '", name, "' (expected rne or stochastic)");
}

std::string BlockShape::to_string() const {
  if (rows == 0 && cols == 0) return "tensor";
  if (rows == 1 && cols == 0) return "row";
  return str_cat(rows, "x", cols);
}

BlockShape parse_block_shape(const std::string& text, const std::string& where) {
  if (text == "tensor") return BlockShape::tensor();
  if (text == "row" || text == "channel") return BlockShape::row();
  const size_t x = text.find('x');
  auto parse_dim = [&](const std::string& s) -> int64_t {
    if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos)
      fail(where, ": expected a block shape 'tensor', 'row' or 'RxC' (e.g. 1x32, 128x128), got '",
           text, "'");
    return std::stoll(s);
  };
  if (x == std::string::npos)
    fail(where, ": expected a block shape 'tensor', 'row' or 'RxC' (e.g. 1x32, 128x128), got '",
         text, "'");
  return {parse_dim(text.substr(0, x)), parse_dim(text.substr(x + 1))};
}

bool QuantSpec::is_bf16_passthrough() const {
  return element == kBF16 && rule == ScaleRule::kNone;
}

std::string QuantSpec::describe() const {
  std::string s = str_cat(element.name, " ", block.to_string(), " ", scale_rule_name(rule));
  if (rule != ScaleRule::kNone) s += str_cat("/", scale_format_name(scale_format));
  s += str_cat(" ", rounding_name(rounding));
  if (!saturate) s += " nonsat";
  if (rule == ScaleRule::kDelayed)
    s += str_cat(" hist=", amax_history_len, " every=", scale_refresh_interval);
  if (hadamard_size > 0)
    s += str_cat(" rht", hadamard_size, hadamard_seed == kHadamardTeSigns ? std::string(":te")
                                                                          : str_cat(":seed=", hadamard_seed));
  return s;
}

bool operator==(const QuantSpec& a, const QuantSpec& b) {
  return a.element == b.element && a.rule == b.rule && a.scale_format == b.scale_format &&
         a.block == b.block && a.rounding == b.rounding && a.saturate == b.saturate &&
         a.amax_history_len == b.amax_history_len &&
         a.scale_refresh_interval == b.scale_refresh_interval && a.hadamard_size == b.hadamard_size &&
         (a.hadamard_size == 0 || a.hadamard_seed == b.hadamard_seed);
}

void validate_quant_spec(const QuantSpec& s, const std::string& where) {
  validate_element_format(s.element, where);
  if (s.block.rows < 0 || s.block.cols < 0)
    fail(where, ": block: expected dims >= 0 (0 = whole extent), got ", s.block.to_string());
  const bool per_tensor = s.block == BlockShape::tensor();
  switch (s.rule) {
    case ScaleRule::kNone:
      if (!per_tensor)
        fail(where, ": block: rule none has no scales, expected tensor, got ", s.block.to_string());
      break;
    case ScaleRule::kCurrent:
      if (s.scale_format == ScaleFormat::kE4M3)
        fail(where, ": scale_format: e4m3 scales need rule two_level (NVFP4), got rule current");
      break;
    case ScaleRule::kDelayed:
      if (!per_tensor)
        fail(where, ": block: delayed scaling is per tensor, expected tensor, got ",
             s.block.to_string());
      if (s.scale_format != ScaleFormat::kFP32 && s.scale_format != ScaleFormat::kFP32Pow2)
        fail(where, ": scale_format: delayed scaling expects fp32 or fp32_pow2, got ",
             scale_format_name(s.scale_format));
      if (s.amax_history_len < 1)
        fail(where, ": amax_history_len: expected >= 1, got ", s.amax_history_len);
      if (s.scale_refresh_interval < 1)
        fail(where, ": scale_refresh_interval: expected >= 1, got ", s.scale_refresh_interval);
      break;
    case ScaleRule::kMxFloor:
      if (s.scale_format != ScaleFormat::kE8M0)
        fail(where, ": scale_format: rule mx_floor expects e8m0, got ",
             scale_format_name(s.scale_format));
      break;
    case ScaleRule::kTwoLevel:
      if (s.scale_format != ScaleFormat::kE4M3)
        fail(where, ": scale_format: rule two_level expects e4m3, got ",
             scale_format_name(s.scale_format));
      break;
  }
  if (s.hadamard_size != 0) {
    if (!valid_hadamard_size(s.hadamard_size))
      fail(where, ": hadamard: expected 0 (none), 4, 16, 64 or 256, got ", s.hadamard_size);
    if (s.hadamard_seed < kHadamardTeSigns)
      fail(where, ": hadamard_seed: expected 'te' or an integer >= 0, got ", s.hadamard_seed);
    if (s.hadamard_seed == kHadamardTeSigns && s.hadamard_size != 16)
      fail(where, ": hadamard_seed: 'te' (TransformerEngine's 16 signs) needs hadamard 16, got ",
           s.hadamard_size);
  }
}

nlohmann::json to_json(const QuantSpec& s) {
  nlohmann::json j = {{"element", s.element.name},
                      {"rule", scale_rule_name(s.rule)},
                      {"scale_format", scale_format_name(s.scale_format)},
                      {"block", s.block.to_string()},
                      {"rounding", rounding_name(s.rounding)},
                      {"saturate", s.saturate}};
  if (s.rule == ScaleRule::kDelayed) {
    j["amax_history_len"] = s.amax_history_len;
    j["scale_refresh_interval"] = s.scale_refresh_interval;
  }
  if (s.hadamard_size > 0) {
    j["hadamard"] = s.hadamard_size;
    j["hadamard_seed"] = s.hadamard_seed == kHadamardTeSigns ? nlohmann::json("te") : nlohmann::json(s.hadamard_seed);
  }
  return j;
}

QuantSpec quant_spec_from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) fail(where, ": expected an object, got ", j.type_name());
  QuantSpec s;
  auto get_string = [&](const char* key) -> std::string {
    const auto& v = j.at(key);
    if (!v.is_string())
      fail(where, ".", key, ": expected a string, got ", v.type_name(), " ", v.dump());
    return v.get<std::string>();
  };
  auto get_int = [&](const char* key) -> int {
    const auto& v = j.at(key);
    if (!v.is_number_integer())
      fail(where, ".", key, ": expected an integer, got ", v.type_name(), " ", v.dump());
    // get<int>() would wrap 2^32 + 5 to 5 silently.
    if (v.is_number_unsigned() ? v.get<uint64_t>() > uint64_t(INT_MAX)
                               : v.get<int64_t>() < INT_MIN || v.get<int64_t>() > INT_MAX)
      fail(where, ".", key, ": expected an integer of 32 bits, got ", v.dump());
    return v.get<int>();
  };
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    const std::string w = where + "." + key;
    if (key == "element") {
      const std::string name = get_string("element");  // its own error names the key once
      try {
        s.element = find_element_format(name);
      } catch (const UserError& e) {
        fail(w, ": ", e.what());
      }
    } else if (key == "rule") {
      s.rule = parse_scale_rule(get_string("rule"), w);
    } else if (key == "scale_format") {
      s.scale_format = parse_scale_format(get_string("scale_format"), w);
    } else if (key == "block") {
      s.block = parse_block_shape(get_string("block"), w);
    } else if (key == "rounding") {
      s.rounding = parse_rounding(get_string("rounding"), w);
    } else if (key == "saturate") {
      if (!it->is_boolean()) fail(w, ": expected true or false, got ", it->dump());
      s.saturate = it->get<bool>();
    } else if (key == "amax_history_len") {
      s.amax_history_len = get_int("amax_history_len");
    } else if (key == "scale_refresh_interval") {
      s.scale_refresh_interval = get_int("scale_refresh_interval");
    } else if (key == "hadamard") {
      const auto& v = *it;
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 256)
        fail(w, ": expected 0 (none), 4, 16, 64 or 256, got ", v.dump());
      s.hadamard_size = int(v.get<int64_t>());
    } else if (key == "hadamard_seed") {
      if (it->is_string() && it->get<std::string>() == "te") {
        s.hadamard_seed = kHadamardTeSigns;
      } else if (it->is_number_integer() && it->get<int64_t>() >= 0) {
        s.hadamard_seed = it->get<int64_t>();
      } else {
        fail(w, ": expected \"te\" or an integer >= 0, got ", it->dump());
      }
    } else {
      fail(w, ": unknown key (expected element, rule, scale_format, block, rounding, "
              "saturate, amax_history_len, scale_refresh_interval, hadamard, hadamard_seed)");
    }
  }
  // The seed's default, TE's signs, exists only for size 16: other sizes
  // name their seed; a seed without a transform is a mistake.
  if (j.contains("hadamard_seed") && s.hadamard_size == 0)
    fail(where, ".hadamard_seed: given without a Hadamard transform (set hadamard to 4, 16, 64 or 256)");
  if (valid_hadamard_size(s.hadamard_size) && s.hadamard_size != 16 && !j.contains("hadamard_seed"))
    fail(where, ".hadamard_seed: hadamard ", s.hadamard_size, " needs a seed (an integer >= 0; \"te\" is for 16 only)");
  validate_quant_spec(s, where);
  return s;
}

}  // namespace snip::formats
