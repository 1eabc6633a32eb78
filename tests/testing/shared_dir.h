// File: tests/testing/shared_dir.h
//
// Where the team handbook data (../shared, with the real models in
// ../shared/models) lives for tests. ctest runs tests with the repository root
// as working directory and CI lays ../shared beside the clone; a test binary
// run by hand from a folder up to three levels below the root (a build
// folder, say) finds it too.
#ifndef LEDE_TESTS_TESTING_SHARED_DIR_H_
#define LEDE_TESTS_TESTING_SHARED_DIR_H_

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace lede::testing {

// $LEDE_SHARED_DIR if set and non-empty; else the first ../shared holding a
// models/ folder, looked for from the working directory and up to three of its
// parents; else "../shared".
inline std::string SharedDir() {
  if (const char* env = std::getenv("LEDE_SHARED_DIR"); env != nullptr && *env != '\0') {
    return env;
  }
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path dir = fs::current_path(ec);
  for (int up = 0; up < 4 && !dir.empty(); ++up, dir = dir.parent_path()) {
    const fs::path candidate = dir / ".." / "shared";
    if (fs::is_directory(candidate / "models", ec)) return candidate.lexically_normal().string();
  }
  return "../shared";
}

inline std::string Stories260KDir() { return SharedDir() + "/models/stories260K"; }
inline std::string BabyLlamaDir() { return SharedDir() + "/models/babyllama-tok105"; }

}  // namespace lede::testing

#endif  // LEDE_TESTS_TESTING_SHARED_DIR_H_
