// Shared helpers for the snip_data tests: a self-deleting temp folder, file
// writing, and a small synthetic English-like corpus with a tiny alphabet
// (so a ~300-piece BPE vocabulary can be trained in a fraction of a second).
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "snip/core/error.h"

namespace snip::data::testing {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "snip_data_test.XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& rel) const { return (std::filesystem::path(path_) / rel).string(); }

 private:
  std::string path_;
};

inline void write_text(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream f(path, std::ios::binary);
  f << text;
  if (!f) throw std::runtime_error("cannot write " + path);
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

/// `n` documents of a few sentences each, words from a fixed lexicon over
/// [a-z] plus " .,\n" (30 distinct characters). Deterministic in `seed`.
inline std::vector<std::string> synthetic_docs(int n, uint32_t seed = 7) {
  static const char* kWords[] = {"the", "a", "model", "trains", "on", "text", "and", "learns", "to", "predict",
                                 "next", "token", "with", "low", "precision", "layers", "of", "weights", "in",
                                 "blocks", "scale", "error", "loss", "grows", "when", "budget", "is", "tight",
                                 "quantized", "gradient", "small", "large", "every", "step", "data", "loader"};
  std::mt19937 g(seed);
  std::vector<std::string> docs;
  for (int d = 0; d < n; ++d) {
    std::string doc;
    const int sentences = 2 + static_cast<int>(g() % 4);
    for (int s = 0; s < sentences; ++s) {
      const int words = 4 + static_cast<int>(g() % 8);
      for (int w = 0; w < words; ++w) {
        if (w > 0) doc += (g() % 9 == 0) ? ", " : " ";
        doc += kWords[g() % (sizeof kWords / sizeof kWords[0])];
      }
      doc += (s + 1 < sentences && g() % 3 == 0) ? ".\n" : ". ";
    }
    while (!doc.empty() && (doc.back() == ' ' || doc.back() == '\n')) doc.pop_back();
    docs.push_back(doc);
  }
  return docs;
}

/// Writes synthetic_docs(n) as files doc000.txt ... into `dir`.
inline void write_synthetic_folder(const std::string& dir, int n, uint32_t seed = 7) {
  const auto docs = synthetic_docs(n, seed);
  for (int i = 0; i < n; ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "doc%03d.txt", i);
    write_text((std::filesystem::path(dir) / name).string(), docs[static_cast<size_t>(i)] + "\n");
  }
}

/// Runs `fn`, expects snip::UserError, returns its message ("" if none thrown).
template <typename Fn>
std::string user_error_of(Fn&& fn) {
  try {
    fn();
  } catch (const snip::UserError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected snip::UserError";
  return "";
}

}  // namespace snip::data::testing
