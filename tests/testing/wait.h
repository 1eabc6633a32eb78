// File: tests/testing/wait.h
//
// WaitUntil: the one polling loop of the tests, for conditions that another
// thread or process makes true eventually (a server logs its port, a writer
// thread publishes a shard). The bound is a safety net for a broken build,
// never part of what a test checks: a test asserts the condition, and time
// it depends on comes from a FakeClock (tests/testing/fake_clock.h).
//
//   ASSERT_TRUE(lede::testing::WaitUntil([&] { return logger.counters().shards_written == 1; }));
//
// Header-only. Thread-safety: `done` runs on the calling thread only.
#ifndef LEDE_TESTS_TESTING_WAIT_H_
#define LEDE_TESTS_TESTING_WAIT_H_

#include <chrono>
#include <thread>

namespace lede::testing {

// Generous: a condition that holds at all holds within well under a second
// on an idle machine; 2-core CI under load is much slower.
inline constexpr std::chrono::milliseconds kWaitBound{20000};

// Calls `done` until it returns true or `bound` has passed, sleeping `poll`
// between calls; returns the last result (a last call after the bound, so a
// condition that became true just then still counts).
template <typename Predicate>
bool WaitUntil(Predicate&& done, std::chrono::milliseconds bound = kWaitBound,
               std::chrono::milliseconds poll = std::chrono::milliseconds(2)) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(poll);
  }
  return done();
}

}  // namespace lede::testing

#endif  // LEDE_TESTS_TESTING_WAIT_H_
