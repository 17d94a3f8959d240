// Recipe files (precision.recipe_file): parsing, validation field by field,
// registration, and the run folder's copy (see recipes/recipe_file.h).
#include "snip/recipes/recipe_file.h"

#include <filesystem>
#include <map>

#include "snip/io/atomic_file.h"
#include "snip/io/json.h"
#include "snip/io/toml.h"
#include "snip/core/error.h"

namespace snip::recipes {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kRecipeKeys =
    "description, error_feedback, compensation_freq, all, activations, weights, gradients, operands";

// The role an operand belongs to (recipe_file.h).
const char* role_of(Operand op) {
  switch (op) {
    case Operand::kFpropX:
    case Operand::kWgradX: return "activations";
    case Operand::kFpropW:
    case Operand::kDgradW: return "weights";
    case Operand::kDgradDY:
    case Operand::kWgradDY: return "gradients";
  }
  return "?";
}

bool valid_name(const std::string& n) {
  if (n.empty() || n.size() > 64 || !std::isalpha(static_cast<unsigned char>(n[0]))) return false;
  for (char c : n)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

// `e` is one recipe's table; `where` = "<file>: recipe 'name'".
Recipe parse_one(const std::string& name, const json& e, const std::string& where) {
  if (!valid_name(name))
    fail(where, ": name: expected a letter, then letters, digits or '_' (at most 64; it is used in "
                "precision.policy = uniform-<name> and comma-separated lists)");
  if (is_builtin_recipe(name))
    fail(where, ": name: the name of a built-in recipe (`snip formats --recipes`); choose another name");
  if (name == "none" || name == "fp32")  // words the options already give a meaning (no quantization)
    fail(where, ": name: '", name, "' means no quantization in precision.recipe and policy names; choose another "
         "name");
  if (!e.is_object()) fail(where, ": expected a table of fields (", kRecipeKeys, "), got ", e.type_name());
  Recipe r;
  r.name = name;
  int64_t freq = 0;  // compensation_freq; 0 = not given
  std::map<std::string, json> layer;  // "all", the roles: their QuantSpec JSON
  json per_op = json::object();
  for (auto it = e.begin(); it != e.end(); ++it) {
    const std::string& key = it.key();
    const json& v = *it;
    if (key == "description") {
      if (!v.is_string()) fail(where, ": description: expected a string, got ", v.dump());
      r.description = v.get<std::string>();
      check_recipe_description(r.description, where);
    } else if (key == "error_feedback") {
      if (!v.is_boolean()) fail(where, ": error_feedback: expected true or false, got ", v.dump());
      r.error_feedback = v.get<bool>();
    } else if (key == "compensation_freq") {
      if (!v.is_number_integer() || (v.is_number_unsigned() ? v.get<uint64_t>() < 1 || v.get<uint64_t>() > (1u << 30)
                                                             : v.get<int64_t>() < 1 || v.get<int64_t>() > (1 << 30)))
        fail(where, ": compensation_freq: expected an integer number of steps in [1, 2^30], got ", v.dump());
      freq = v.get<int64_t>();
    } else if (key == "all" || key == "activations" || key == "weights" || key == "gradients") {
      if (!v.is_object()) fail(where, ": ", key, ": expected a table of QuantSpec fields, got ", v.dump());
      layer[key] = v;
    } else if (key == "operands") {
      if (!v.is_object()) fail(where, ": operands: expected a table keyed by operand, got ", v.dump());
      for (auto o = v.begin(); o != v.end(); ++o) {
        parse_operand(o.key(), where + ": operands");
        if (!o->is_object())
          fail(where, ": operands.", o.key(), ": expected a table of QuantSpec fields, got ", o->dump());
      }
      per_op = v;
    } else {
      fail(where, ": ", key, ": unknown key (expected ", kRecipeKeys, ")");
    }
  }
  if (r.description.empty()) r.description = "from a recipe file";
  // compensation_freq -> scale_refresh_interval of a delayed spec, once.
  auto with_freq = [&](json m, const std::string& src) {
    const auto rule = m.find("rule");
    if (freq > 0 && rule != m.end() && rule->is_string() && rule->get<std::string>() == "delayed") {
      if (m.contains("scale_refresh_interval"))
        fail(where, ": compensation_freq: given together with ", src,
             ".scale_refresh_interval (the same setting); give one of them");
      m["scale_refresh_interval"] = freq;
    }
    return m;
  };
  const json all = layer.count("all") ? layer["all"] : json::object();
  // Each role alone on top of `all` first, so its errors name the role.
  for (const char* role : {"activations", "weights", "gradients"})
    if (layer.count(role)) {
      json m = all;
      m.update(layer[role]);
      formats::quant_spec_from_json(with_freq(m, role), where + ": " + role);
    }
  bool delayed = false;
  for (int i = 0; i < kNumOperands; ++i) {
    const Operand op = Operand(i);
    const char* role = role_of(op);
    const char* opname = operand_name(op);
    json m = all;
    std::string src = "all";
    if (layer.count(role)) m.update(layer[role]), src = role;
    if (per_op.contains(opname)) m.update(per_op[opname]), src = std::string("operands.") + opname;
    if (src == "all" && !layer.count("all"))
      fail(where, ": ", role, ": missing (operand ", opname, " has no spec: give activations, weights and "
           "gradients, an 'all' table, or operands.\"", opname, "\")");
    r.operands[size_t(i)] = formats::quant_spec_from_json(with_freq(m, src), where + ": " + src);
    delayed = delayed || r.operands[size_t(i)].rule == formats::ScaleRule::kDelayed;
  }
  if (freq > 0 && !delayed)
    fail(where, ": compensation_freq: expected a recipe with delayed scaling (rule = \"delayed\") on some "
         "operand, got none: it is how often, in steps, the delayed scale is recomputed from the amax history; "
         "the other rules take every scale from the call's own data");
  try {
    validate_recipe(r);  // the Hadamard pairs across a GEMM's operands
  } catch (const UserError& err) {
    fail(where.substr(0, where.find(": recipe '")), ": ", err.what());
  }
  return r;
}

}  // namespace

json RecipeFile::resolved() const {
  json arr = json::array();
  for (const Recipe& r : recipes) arr.push_back(to_json(r));
  return {{"recipe_file", path}, {"recipes", std::move(arr)}};
}

RecipeFile parse_recipe_file_text(const std::string& text, const std::string& format, const std::string& where) {
  json j;
  // The project's guarded readers: bounded nesting, each key once, finite
  // numbers, one-line errors (io/json.h, io/toml.h).
  if (format == "toml") {
    j = io::parse_toml_as_json(text, where);
  } else if (format == "json") {
    j = io::parse_json(text, where);
  } else {
    fail(where, ": expected a .toml or .json recipe file, got format '", format, "'");
  }
  if (!j.is_object()) fail(where, ": expected a table with 'recipes', got ", j.type_name());
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key() != "recipes") fail(where, ": ", it.key(), ": unknown key (expected recipes)");
  const auto rs = j.find("recipes");
  if (rs == j.end() || !rs->is_object() || rs->empty())
    fail(where, ": recipes: expected at least one recipe ([recipes.NAME] in TOML, {\"recipes\": {\"NAME\": "
                "{...}}} in JSON)");
  RecipeFile f;
  f.path = where;
  for (auto it = rs->begin(); it != rs->end(); ++it)  // nlohmann's objects iterate sorted by key
    f.recipes.push_back(parse_one(it.key(), *it, str_cat(where, ": recipe '", it.key(), "'")));
  return f;
}

RecipeFile load_recipe_file(const std::string& path) {
  const std::string ext = fs::path(path).extension().string();
  if (ext != ".toml" && ext != ".json")
    fail("precision.recipe_file: expected a .toml or .json file, got '", path, "'");
  if (!fs::is_regular_file(path)) fail("precision.recipe_file: ", path, " does not exist or is not a file");
  std::string text;
  try {
    text = io::read_file(path);
  } catch (const std::exception& e) {
    fail("precision.recipe_file: ", e.what());
  }
  return parse_recipe_file_text(text, ext.substr(1), path);
}

RecipeSet recipe_set(const RecipeFile& file) {
  RecipeSet set;
  for (const Recipe& r : file.recipes) set.add(r);  // built-in names refused by the parser
  return set;
}

RecipeSet load_recipe_set(const std::string& path) { return path.empty() ? RecipeSet() : recipe_set(load_recipe_file(path)); }

std::vector<Recipe> load_recipe_copy(const std::string& path) {
  const json j = io::parse_json(io::read_file(path), path);
  if (!j.is_object() || !j.contains("recipes") || !j["recipes"].is_array())
    fail(path, ": recipes: expected a list of recipes");
  std::vector<Recipe> rs;
  for (size_t i = 0; i < j["recipes"].size(); ++i) {
    Recipe r = recipe_from_json(j["recipes"][i], str_cat(path, ": recipes[", i, "]"));
    if (is_builtin_recipe(r.name)) fail(path, ": recipe '", r.name, "': name: the name of a built-in recipe");
    validate_recipe(r);
    rs.push_back(std::move(r));
  }
  return rs;
}

std::string record_run_recipes(const std::string& run_dir, const RecipeFile& file, bool resume) {
  const fs::path copy = fs::path(run_dir) / "recipes.json";
  std::string warning;
  if (resume && fs::is_regular_file(copy)) {
    json before;
    try {
      before = json::parse(io::read_file(copy.string()));
    } catch (const std::exception&) {
      before = json::object();  // unreadable: treated as "every recipe changed" below
    }
    std::map<std::string, json> now;
    if (!file.recipes.empty())
      for (const Recipe& r : file.recipes) now[r.name] = to_json(r);
    std::string changed;
    if (before.contains("recipes") && before["recipes"].is_array())
      for (const json& r : before["recipes"]) {
        const std::string name = r.value("name", std::string("?"));
        const auto it = now.find(name);
        // The description changes no number: compared without it.
        auto numbers = [](json j) {
          if (j.is_object()) j.erase("description");
          return j;
        };
        if (it == now.end() || numbers(it->second) != numbers(r)) changed += (changed.empty() ? "" : ", ") + name;
      }
    if (!changed.empty())
      warning = str_cat("--resume: recipe(s) ", changed, " of ", copy.string(), " (what the run trained with) ",
                        file.path.empty() ? std::string("are no longer defined (precision.recipe_file is empty)")
                                          : str_cat("changed or vanished in ", file.path),
                        ": the resumed steps will not be bit-identical to an uninterrupted run");
  }
  if (!file.recipes.empty()) io::write_file_atomic(copy.string(), file.resolved().dump(2) + "\n");
  return warning;
}

}  // namespace snip::recipes
