// File: tests/fuzz/testing/fuzz_util.h
//
// Helpers shared by the libFuzzer targets (tests/fuzz/*/*_fuzz.cc): a
// per-process scratch file for parsers that only take a path, and a check
// that aborts (a finding) with a message when an invariant of a parser's
// result breaks. Header-only; no project dependencies.
#ifndef LEDE_TESTS_FUZZ_TESTING_FUZZ_UTIL_H_
#define LEDE_TESTS_FUZZ_TESTING_FUZZ_UTIL_H_

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace lede::fuzz {

// Aborts with `what` when `ok` is false: libFuzzer reports it as a crash and
// saves the input.
inline void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz invariant broken: %s\n", what);
    std::abort();
  }
}

// Writes `data` to this process's scratch file (created once under $TMPDIR
// or /tmp, removed at exit) and returns its path.
inline const std::string& WriteScratch(const uint8_t* data, size_t size, const char* suffix) {
  static std::string path;
  static int fd = -1;
  if (fd < 0) {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/lede_fuzz_XXXXXX" + suffix;
    fd = ::mkstemps(tmpl.data(), static_cast<int>(std::string(suffix).size()));
    Check(fd >= 0, "mkstemps failed");
    path = tmpl;
    std::atexit([] { ::unlink(path.c_str()); });
  }
  Check(::ftruncate(fd, 0) == 0, "ftruncate failed");
  size_t done = 0;
  while (done < size) {
    const ssize_t w = ::pwrite(fd, data + done, size - done, static_cast<off_t>(done));
    Check(w > 0, "pwrite failed");
    done += static_cast<size_t>(w);
  }
  return path;
}

}  // namespace lede::fuzz

#endif  // LEDE_TESTS_FUZZ_TESTING_FUZZ_UTIL_H_
