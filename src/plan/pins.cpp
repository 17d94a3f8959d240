// pins.cpp: glob matching, pin resolution, block indices and pipeline stages.
#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "snip/plan/planner.h"
#include "snip/core/error.h"

namespace snip::plan {

namespace {

// Matches one bracket expression starting at pattern[p] == '['. On success
// sets `end` to the index just past the closing ']' and `hit` to whether c
// belongs to the set. Returns false if the bracket is not closed (then the
// '[' is an ordinary character, as in fnmatch).
bool match_bracket(const std::string& pat, size_t p, char c, size_t& end, bool& hit) {
  size_t i = p + 1;
  bool negate = false;
  if (i < pat.size() && (pat[i] == '!' || pat[i] == '^')) {
    negate = true;
    ++i;
  }
  bool found = false;
  bool first = true;
  while (i < pat.size() && (first || pat[i] != ']')) {
    first = false;
    char lo = pat[i];
    if (lo == '\\' && i + 1 < pat.size()) lo = pat[++i];
    ++i;
    char hi = lo;
    if (i + 1 < pat.size() && pat[i] == '-' && pat[i + 1] != ']') {
      hi = pat[i + 1];
      if (hi == '\\' && i + 2 < pat.size()) {
        hi = pat[i + 2];
        ++i;
      }
      i += 2;
    }
    const auto uc = static_cast<unsigned char>(c);
    if (static_cast<unsigned char>(lo) <= uc && uc <= static_cast<unsigned char>(hi))
      found = true;
  }
  if (i >= pat.size()) return false;  // no closing ']'
  end = i + 1;
  hit = found != negate;
  return true;
}

// Does the single pattern element at pat[p] match character c? Sets `next`
// to the index of the following element.
bool match_one(const std::string& pat, size_t p, char c, size_t& next) {
  const char pc = pat[p];
  if (pc == '?') {
    next = p + 1;
    return true;
  }
  if (pc == '[') {
    size_t end;
    bool hit;
    if (match_bracket(pat, p, c, end, hit)) {
      next = end;
      return hit;
    }
    next = p + 1;
    return c == '[';
  }
  if (pc == '\\' && p + 1 < pat.size()) {
    next = p + 2;
    return c == pat[p + 1];
  }
  next = p + 1;
  return c == pc;
}

}  // namespace

bool glob_match(const std::string& pat, const std::string& text) {
  // Iterative matcher with one backtrack point (the last '*'): linear in
  // |pat|*|text| in the worst case, no recursion.
  size_t p = 0, t = 0;
  size_t star_p = std::string::npos, star_t = 0;
  while (t < text.size()) {
    if (p < pat.size() && pat[p] == '*') {
      while (p < pat.size() && pat[p] == '*') ++p;
      star_p = p;
      star_t = t;
      continue;
    }
    size_t next;
    if (p < pat.size() && match_one(pat, p, text[t], next)) {
      p = next;
      ++t;
      continue;
    }
    if (star_p == std::string::npos) return false;
    p = star_p;
    t = ++star_t;
  }
  while (p < pat.size() && pat[p] == '*') ++p;
  return p == pat.size();
}

Pin parse_pin(const std::string& spec) {
  const size_t eq = spec.rfind('=');
  if (eq == std::string::npos)
    fail("pin '", spec, "': expected GLOB=OPTION (e.g. '*.down_proj=fp8'), got no '='");
  Pin pin{spec.substr(0, eq), spec.substr(eq + 1)};
  if (pin.pattern.empty())
    fail("pin '", spec, "': expected a glob before '=', got nothing");
  if (pin.option.empty())
    fail("pin '", spec, "': expected an option after '=', got nothing");
  return pin;
}

bool pin_matches(const Pin& pin, const PlanItem& item, Granularity g) {
  const size_t colon = pin.pattern.find(':');
  const std::string layer_pat = pin.pattern.substr(0, colon);
  if (colon != std::string::npos) {
    if (g == Granularity::layer)
      fail("pin '", pin.text(), "': names a GEMM (after ':'), which needs per-GEMM ",
           "planning (snip plan --per-gemm, or precision.granularity = gemm in training); per layer use '", layer_pat, "=", pin.option, "'");
    if (!glob_match(pin.pattern.substr(colon + 1), item.gemm)) return false;
  }
  const std::string& name = item.layer;
  if (glob_match(layer_pat, name)) return true;
  for (size_t i = 0; i < name.size(); ++i)
    if (name[i] == '.' && glob_match(layer_pat, name.substr(i + 1))) return true;
  return false;
}

namespace {

std::string offered_list(const PlanItem& item) {
  std::string s;
  for (const auto& kv : item.q) s += (s.empty() ? "" : ", ") + kv.first;
  return s;
}

}  // namespace

PinResolution resolve_pins(const PlanProblem& problem, const PlanOptions& options) {
  const size_t n = problem.items.size();
  PinResolution r;
  r.option.assign(n, "");
  r.source.assign(n, -1);
  std::vector<bool> used(options.pins.size(), false);
  for (size_t k = 0; k < options.pins.size(); ++k) {
    const Pin& pin = options.pins[k];
    if (pin.pattern.empty() || pin.option.empty())
      fail("pin '", pin.text(), "': expected GLOB=OPTION with both sides non-empty");
  }
  for (size_t i = 0; i < n; ++i) {
    const PlanItem& item = problem.items[i];
    for (size_t k = 0; k < options.pins.size(); ++k) {
      const Pin& pin = options.pins[k];
      if (!pin_matches(pin, item, problem.granularity)) continue;
      used[k] = true;
      if (r.source[i] < 0) {
        r.option[i] = pin.option;
        r.source[i] = static_cast<int>(k);
      } else if (r.option[i] != pin.option) {
        fail("pins '", options.pins[r.source[i]].text(), "' and '", pin.text(),
             "' both match '", item.name, "'; expected at most one option per item");
      }
    }
    if (r.source[i] >= 0 && !item.q.count(r.option[i]))
      fail("pin '", options.pins[r.source[i]].text(), "' selects option '", r.option[i],
           "', which item '", item.name, "' does not offer (it offers ",
           offered_list(item), ")");
  }
  for (size_t k = 0; k < options.pins.size(); ++k)
    if (!used[k])
      fail("pin '", options.pins[k].text(), "' matches no item (items are named like '",
           n ? problem.items[0].name : std::string("?"), "')");

  if (!options.stage_boundary_option.empty()) {
    // First and last layer (by first appearance) of every stage.
    std::map<int, std::pair<std::string, std::string>> ends;
    for (const PlanItem& item : problem.items) {
      if (item.stage < 0)
        fail("stage-boundary pins need a pipeline stage on every item; '", item.name,
             "' has none (give --stages or \"stage\" in the cost table)");
      auto it = ends.find(item.stage);
      if (it == ends.end())
        ends[item.stage] = {item.layer, item.layer};
      else
        it->second.second = item.layer;
    }
    for (size_t i = 0; i < n; ++i) {
      const PlanItem& item = problem.items[i];
      const auto& e = ends[item.stage];
      if (item.layer != e.first && item.layer != e.second) continue;
      if (r.source[i] >= 0) continue;  // a user pin takes precedence
      if (!item.q.count(options.stage_boundary_option))
        fail("stage-boundary pin to '", options.stage_boundary_option, "': item '",
             item.name, "' does not offer it (it offers ", offered_list(item), ")");
      r.option[i] = options.stage_boundary_option;
      r.source[i] = -2;
    }
  }
  return r;
}

int block_index(const std::string& name) {
  // Find a component "layers" followed by ".<digits>".
  size_t pos = 0;
  while ((pos = name.find("layers.", pos)) != std::string::npos) {
    const bool starts_component = pos == 0 || name[pos - 1] == '.';
    size_t d = pos + 7, e = d;
    while (e < name.size() && std::isdigit(static_cast<unsigned char>(name[e]))) ++e;
    if (starts_component && e > d && (e == name.size() || name[e] == '.' || name[e] == ':')) {
      if (e - d > 9) return -1;
      return std::stoi(name.substr(d, e - d));
    }
    pos += 7;
  }
  return -1;
}

void assign_stages(PlanProblem& problem, int n_stages) {
  std::set<int> blocks;
  for (const PlanItem& item : problem.items) {
    const int b = block_index(item.layer);
    if (b >= 0) blocks.insert(b);
  }
  if (n_stages < 1) fail("--stages: expected a positive number of stages, got ", n_stages);
  if (static_cast<size_t>(n_stages) > blocks.size())
    fail("--stages: expected at most ", blocks.size(), " stages (one block each), got ",
         n_stages);
  // Block rank -> stage: the first (n_blocks % n_stages) stages get one more.
  const int nb = static_cast<int>(blocks.size());
  const int base = nb / n_stages, extra = nb % n_stages;
  std::map<int, int> stage_of;
  int rank = 0;
  for (int b : blocks) {
    int s = 0, start = 0;
    while (true) {
      const int len = base + (s < extra ? 1 : 0);
      if (rank < start + len) break;
      start += len;
      ++s;
    }
    stage_of[b] = s;
    ++rank;
  }
  int prev = 0;
  for (PlanItem& item : problem.items) {
    const int b = block_index(item.layer);
    item.stage = b >= 0 ? stage_of[b] : prev;
    prev = item.stage;
  }
}

}  // namespace snip::plan
