// File: tests/testing/shared_dir.h
//
// Where the team handbook data lives for tests: $LEDE_SHARED_DIR if set,
// else ../shared relative to the repository root (ctest runs tests with the
// repository root as working directory; CI lays ../shared beside the clone).
#ifndef LEDE_TESTS_TESTING_SHARED_DIR_H_
#define LEDE_TESTS_TESTING_SHARED_DIR_H_

#include <cstdlib>
#include <string>

namespace lede::testing {

inline std::string SharedDir() {
  if (const char* env = std::getenv("LEDE_SHARED_DIR")) return env;
  return "../shared";
}

inline std::string Stories260KDir() { return SharedDir() + "/models/stories260K"; }
inline std::string BabyLlamaDir() { return SharedDir() + "/models/babyllama-tok105"; }

}  // namespace lede::testing

#endif  // LEDE_TESTS_TESTING_SHARED_DIR_H_
