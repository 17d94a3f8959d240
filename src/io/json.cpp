// JSON files and the strict parser (see json.h).
#include "snip/io/json.h"

#include <cmath>
#include <utility>
#include <vector>

#include "snip/io/atomic_file.h"
#include "snip/core/error.h"

namespace snip::io {
namespace {

using json = nlohmann::json;

/// One line of at most `max` characters: control characters become spaces.
std::string one_line(std::string s, size_t max) {
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  if (s.size() > max) s = s.substr(0, max - 3) + "...";
  return s;
}

/// nlohmann's SAX interface, building the same DOM as json::parse (the
/// containers' own stack, no recursion) while it checks what json::parse
/// does not: nesting depth, duplicate keys, numbers past a double's range.
/// Every check knows where it is, so messages name the JSON path.
class StrictDom {
 public:
  StrictDom(const std::string& source, const std::string& what) : source_(source), what_(what) {}

  json take() { return std::move(root_); }

  bool null() { return add(nullptr); }
  bool boolean(bool v) { return add(v); }
  bool number_integer(json::number_integer_t v) { return add(v); }
  bool number_unsigned(json::number_unsigned_t v) { return add(v); }
  bool number_float(json::number_float_t v, const json::string_t&) { return add(v); }
  bool string(json::string_t& v) { return add(std::move(v)); }
  bool binary(json::binary_t& v) { return add(std::move(v)); }

  bool start_object(std::size_t) { return open(json::value_t::object); }
  bool start_array(std::size_t) { return open(json::value_t::array); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }

  bool key(json::string_t& k) {
    Frame& f = stack_.back();
    if (f.node->contains(k))
      fail(source_, ": ", where(stack_.size() - 1, false), ": expected each key once, got \"", one_line(k, 60),
           "\" twice");
    f.key = k;
    f.slot = &(*f.node)[k];
    return true;
  }

  bool parse_error(std::size_t, const std::string& token, const json::exception& e) {
    // 406: a number literal beyond a double's range ("1e309"): the lexer's
    // strtod overflowed. The value it belongs to is the pending one.
    if (e.id == 406)
      fail(source_, ": ", where(stack_.size(), true), ": expected a number a double can hold (|x| <= 1.8e308), got ",
           one_line(token, 40));
    fail(source_, ": expected valid ", what_, "JSON, got a syntax error: ", one_line(e.what(), 240));
  }

 private:
  struct Frame {
    json* node;              // the open array or object
    std::string key;         // object: key of the value being read
    json* slot = nullptr;    // object: where that value goes
  };

  /// Places a value where the parser is: the root, the end of the open
  /// array, or the open object's current key.
  template <typename V>
  json* place(V&& v) {
    if (stack_.empty()) {
      root_ = json(std::forward<V>(v));
      return &root_;
    }
    Frame& f = stack_.back();
    if (f.node->is_array()) {
      auto& a = f.node->get_ref<json::array_t&>();
      a.emplace_back(std::forward<V>(v));
      return &a.back();
    }
    *f.slot = json(std::forward<V>(v));
    return f.slot;
  }

  template <typename V>
  bool add(V&& v) {
    place(std::forward<V>(v));
    return true;
  }

  bool open(json::value_t t) {
    if (stack_.size() >= kMaxJsonDepth)
      fail(source_, ": ", where(stack_.size(), true), ": expected at most ", kMaxJsonDepth,
           " nested arrays/objects, got more");
    stack_.push_back(Frame{place(t), {}, nullptr});
    return true;
  }

  bool close() {
    stack_.pop_back();
    return true;
  }

  /// The JSON path through the first `levels` open containers: each
  /// contributes the selector of its child. `pending`: the last one's child
  /// is not placed yet (an array's next index is its size).
  std::string where(size_t levels, bool pending) const {
    std::string p;
    for (size_t d = 0; d < levels; ++d) {
      const Frame& f = stack_[d];
      if (f.node->is_array()) {
        const size_t n = f.node->size();
        const bool last = d + 1 == levels;
        p += "[" + std::to_string(last && pending ? n : n - 1) + "]";
      } else {
        p += (p.empty() ? "" : ".") + one_line(f.key, 60);
      }
    }
    return p.empty() ? "(top level)" : p;
  }

  const std::string& source_;
  std::string what_;
  json root_;
  std::vector<Frame> stack_;
};

json parse_strict(std::string_view text, const std::string& source, const std::string& what) {
  StrictDom dom(source, what.empty() ? "" : what + " ");
  // strict: nothing but whitespace after the value; no comments.
  json::sax_parse(text.begin(), text.end(), &dom, json::input_format_t::json, /*strict=*/true);
  return dom.take();
}

}  // namespace

json parse_json(std::string_view text, const std::string& source) { return parse_strict(text, source, ""); }

std::string json_excerpt(const json& v, size_t max) {
  // Invalid UTF-8 cannot come from parse_json; replace it anyway.
  return one_line(v.dump(-1, ' ', false, json::error_handler_t::replace), max);
}

void save_json_atomic(const json& j, const std::string& path) {
  write_file_atomic(path, j.dump(2) + "\n");
}

json read_json_file(const std::string& path, const std::string& what) {
  return parse_strict(read_file(path), path, what);
}

}  // namespace snip::io
