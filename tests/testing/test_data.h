// File: tests/testing/test_data.h
//
// Where the repository's test data (testdata/: the small real models, corpus
// slices and prompt sets; provenance in testdata/SOURCES.md) lives for tests.
// ctest runs tests with the repository root as working directory; a test
// binary run by hand from a folder below the root (a build folder, say) or
// from anywhere else finds it too, through its own path.
#ifndef LEDE_TESTS_TESTING_TEST_DATA_H_
#define LEDE_TESTS_TESTING_TEST_DATA_H_

#include <filesystem>
#include <string>
#include <system_error>

namespace lede::testing {

// The repository root: the first folder holding testdata/SHA256SUMS, looked
// for from the working directory upward, then from the test binary's folder
// upward; "." when neither finds one (paths then fail to open, naming it).
inline std::string RepoRoot() {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (fs::path dir : {fs::current_path(ec), fs::read_symlink("/proc/self/exe", ec).parent_path()}) {
    for (; !dir.empty(); dir = dir.parent_path()) {
      if (fs::is_regular_file(dir / "testdata" / "SHA256SUMS", ec)) return dir.lexically_normal().string();
      if (dir == dir.root_path()) break;
    }
  }
  return ".";
}

// RepoRoot()/testdata.
inline std::string TestDataDir() { return RepoRoot() + "/testdata"; }

inline std::string Stories260KDir() { return TestDataDir() + "/models/stories260K"; }
inline std::string BabyLlamaDir() { return TestDataDir() + "/models/babyllama-tok105"; }

}  // namespace lede::testing

#endif  // LEDE_TESTS_TESTING_TEST_DATA_H_
