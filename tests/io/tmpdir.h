// tests/io/tmpdir.h: a fresh temporary directory per test, removed afterwards.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

namespace snip::io::testing {

class TmpDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl =
        (std::filesystem::temp_directory_path() / "snip_io_test_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  /// Path of `name` inside the test directory.
  std::string at(const std::string& name) const { return (dir_ / name).string(); }
  /// Names of the entries of `d` (default: the test directory), sorted.
  std::vector<std::string> entries(std::string d = "") const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(d.empty() ? dir_ : std::filesystem::path(d)))
      out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
  std::filesystem::path dir_;
};

}  // namespace snip::io::testing
