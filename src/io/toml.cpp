// TOML text from outside snip (see toml.h).
#include "snip/io/toml.h"

#include <cmath>
#include <string>
#include <vector>

#include <toml++/toml.h>

#include "snip/core/error.h"

namespace snip::io {

void check_toml_depth(const std::string& text, const std::string& what) {
  struct Open {
    bool inline_table;  // else an array
    size_t depth;       // depth of the values inside
    bool in_key;        // inline table: reading a key (after '{' or ',')
    size_t key_parts;   // inline table: parts of the key being read
  };
  std::vector<Open> open;
  size_t line = 1, header_depth = 0, key_parts = 1;
  bool line_start = true, in_key = true, in_header = false;
  auto check = [&](size_t depth) {
    if (depth > kMaxTomlDepth)
      fail(what, ":", line, ": expected tables, dotted keys, arrays and inline tables nested at most ", kMaxTomlDepth,
           " deep, got more");
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n') {
      ++line;
      if (open.empty()) line_start = in_key = true, key_parts = 1, in_header = false;
      continue;
    }
    if (c == '#') {  // comment to the end of the line
      while (i + 1 < text.size() && text[i + 1] != '\n') ++i;
      continue;
    }
    if (c == '"' || c == '\'') {  // strings: basic (escapes) or literal, one- or multi-line
      const bool multi = text.compare(i, 3, std::string(3, c)) == 0;
      i += multi ? 3 : 1;
      for (; i < text.size(); ++i) {
        if (text[i] == '\n') ++line;
        if (c == '"' && text[i] == '\\') {
          ++i;
          if (i < text.size() && text[i] == '\n') ++line;
        } else if (text[i] == c && (!multi || text.compare(i, 3, std::string(3, c)) == 0)) {
          if (multi) {  // a closing """ may follow up to two quotes of the content
            i += 2;
            for (int extra = 0; extra < 2 && i + 1 < text.size() && text[i + 1] == c; ++extra) ++i;
          }
          break;
        }
      }
      line_start = false;
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\r') continue;
    const size_t base = open.empty() ? header_depth : open.back().depth;
    if (open.empty() && line_start && c == '[') {  // a table header: [a.b] or [[a.b]]
      in_header = true;
      header_depth = 1;
      line_start = false;
      continue;
    }
    line_start = false;
    if (in_header) {
      if (c == '.') check(++header_depth);
      else if (c == '[') check(++header_depth);  // [[array of tables]]
      continue;
    }
    if (!open.empty() && open.back().inline_table && open.back().in_key) {
      if (c == '.') check(base + ++open.back().key_parts);
      else if (c == '=') open.back().in_key = false;
      else if (c == '}') open.pop_back();
      continue;
    }
    if (open.empty() && in_key) {
      if (c == '.') check(base + ++key_parts);
      else if (c == '=') in_key = false;
      continue;
    }
    // A value: arrays and inline tables open here.
    const size_t here = open.empty() ? base + key_parts
                        : open.back().inline_table ? base + open.back().key_parts
                                                   : base;
    if (c == '[' || c == '{') {
      check(here + 1);
      open.push_back(Open{c == '{', here + 1, c == '{', 1});
    } else if ((c == ']' || c == '}') && !open.empty()) {
      open.pop_back();
    } else if (c == ',' && !open.empty() && open.back().inline_table) {
      open.back().in_key = true;
      open.back().key_parts = 1;
    }
  }
}

namespace {

using json = nlohmann::json;

// toml++'s tree -> JSON, iteratively over an explicit stack (the depth is
// bounded by check_toml_depth, but recursion is not needed either).
json node_to_json(const toml::node& root, const std::string& source) {
  struct Item {
    const toml::node* node;
    json* out;
    std::string path;
  };
  json result;
  std::vector<Item> todo{{&root, &result, ""}};
  while (!todo.empty()) {
    const Item it = todo.back();
    todo.pop_back();
    const std::string where = it.path.empty() ? std::string("(top level)") : it.path;
    if (const toml::table* t = it.node->as_table()) {
      *it.out = json::object();
      for (auto&& [k, v] : *t) {
        const std::string key(k.str());
        json& slot = (*it.out)[key];
        todo.push_back({&v, &slot, it.path.empty() ? key : it.path + "." + key});
      }
    } else if (const toml::array* a = it.node->as_array()) {
      *it.out = json::array();
      for (size_t i = 0; i < a->size(); ++i) it.out->push_back(nullptr);
      for (size_t i = 0; i < a->size(); ++i)
        todo.push_back({a->get(i), &(*it.out)[i], where + "[" + std::to_string(i) + "]"});
    } else if (auto s = it.node->value_exact<std::string>()) {
      *it.out = *s;
    } else if (auto b = it.node->value_exact<bool>()) {
      *it.out = *b;
    } else if (auto i = it.node->value_exact<int64_t>()) {
      *it.out = *i;
    } else if (auto d = it.node->value_exact<double>()) {
      if (!std::isfinite(*d))
        fail(source, ": ", where, ": expected a finite number, got ", std::isnan(*d) ? "nan" : (*d > 0 ? "inf" : "-inf"));
      *it.out = *d;
    } else {
      fail(source, ": ", where, ": expected a string, number, boolean, table or array, got a date/time");
    }
  }
  return result;
}

}  // namespace

json parse_toml_as_json(const std::string& text, const std::string& source) {
  check_toml_depth(text, source);
  toml::table tbl;
  try {
    tbl = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    fail(source, ":", e.source().begin.line, ":", e.source().begin.column, ": TOML syntax error: ",
         std::string(e.description()));
  }
  return node_to_json(tbl, source);
}

}  // namespace snip::io
