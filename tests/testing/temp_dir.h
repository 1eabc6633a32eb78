// File: tests/testing/temp_dir.h
//
// A scoped temporary directory for tests (STYLE.md §2.7: files go under a
// mkdtemp directory):
//   lede::testing::TempDir tmp;
//   ASSERT_FALSE(tmp.path().empty());
//   WriteFile(tmp.path() / "model.bin", ...);
#ifndef LEDE_TESTS_TESTING_TEMP_DIR_H_
#define LEDE_TESTS_TESTING_TEMP_DIR_H_

#include <stdlib.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>

#include "gtest/gtest.h"

namespace lede::testing {

// A fresh directory made with mkdtemp under $TMPDIR (or /tmp when it is unset
// or empty), removed with everything in it on destruction. If mkdtemp fails,
// the constructor records a non-fatal test failure and path() is empty, so a
// test that writes into the directory asserts !path().empty() first.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl =
        (std::filesystem::path(base != nullptr && *base != '\0' ? base : "/tmp") /
         "lede_test_XXXXXX")
            .string();
    if (::mkdtemp(tmpl.data()) != nullptr) {
      path_ = tmpl;
    } else {
      ADD_FAILURE() << "mkdtemp(" << tmpl << ") failed: " << std::strerror(errno);
    }
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // The directory, or empty if it could not be made.
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace lede::testing

#endif  // LEDE_TESTS_TESTING_TEMP_DIR_H_
