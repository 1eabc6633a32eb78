// File: tests/testing/fake_clock.h
//
// FakeClock: a lede::clock::Clock (shared/clock/clock.h) whose time moves only when
// a test says so, so that tests of time-dependent behaviour (shard age,
// reload polling, backoff) decide their outcome by the time they set, never
// by how long a sleep happened to last.
//
//   lede::testing::FakeClock clock;          // starts at 2026-01-02 03:04:05 UTC
//   options.clock = &clock;
//   ... start the component ...
//   ASSERT_TRUE(WaitUntil([&] { return clock.n_waiting() == 1; }));  // it waits on the clock
//   clock.Advance(absl::Seconds(60));        // its deadline passes: it wakes
//
// To check that an Advance() short of a deadline changes nothing, wait for
// n_short_wakeups() to grow (the waiter has seen the new time) first.
//
// AwaitWithDeadline() returns as soon as `cond` holds (absl::Mutex evaluates
// it whenever `mu` is released, as with the real clock) or the fake time
// reaches the deadline; to notice an Advance() it re-checks every
// millisecond of real time, which only sets how soon it notices, not what it
// decides. SleepFor(d) advances the fake time by d and returns at once (a
// sleeping component is simulated, not waited for).
//
// Header-only; links lede::clock. Thread-safety: thread-safe.
#ifndef LEDE_TESTS_TESTING_FAKE_CLOCK_H_
#define LEDE_TESTS_TESTING_FAKE_CLOCK_H_

#include <cstdint>

#include "absl/synchronization/mutex.h"
#include "absl/time/civil_time.h"
#include "absl/time/time.h"
#include "shared/clock/clock.h"

namespace lede::testing {

class FakeClock final : public clock::Clock {
 public:
  // The default start is a fixed UTC time, so time-derived names (dates in
  // keys) are known to the test.
  explicit FakeClock(absl::Time start = absl::FromCivil(absl::CivilSecond(2026, 1, 2, 3, 4, 5),
                                                        absl::UTCTimeZone()))
      : now_(start) {}

  absl::Time Now() override {
    absl::MutexLock lock(&mu_);
    return now_;
  }

  // Moves the time forward by `d` (>= 0) and returns.
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    if (d > absl::ZeroDuration()) now_ += d;
  }

  void SleepFor(absl::Duration d) override {
    absl::MutexLock lock(&mu_);
    ++n_sleeps_;
    if (d > absl::ZeroDuration()) now_ += d;
  }

  bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond, absl::Time deadline) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (cond.Eval()) return true;
    if (Now() >= deadline) return false;
    {
      absl::MutexLock lock(&mu_);
      ++n_waits_;
      ++n_waiting_;
    }
    bool result = false;
    absl::Time seen = Now();
    while (true) {
      if (mu->AwaitWithTimeout(cond, absl::Milliseconds(1))) {
        result = true;
        break;
      }
      const absl::Time now = Now();
      if (now >= deadline) break;
      if (now != seen) {
        absl::MutexLock lock(&mu_);
        ++n_short_wakeups_;
      }
      seen = now;
    }
    absl::MutexLock lock(&mu_);
    --n_waiting_;
    return result;
  }

  // Callers blocked in AwaitWithDeadline() right now.
  int n_waiting() {
    absl::MutexLock lock(&mu_);
    return n_waiting_;
  }
  // AwaitWithDeadline() calls that blocked (did not return at once), ever.
  int64_t n_waits() {
    absl::MutexLock lock(&mu_);
    return n_waits_;
  }
  // Times a blocked AwaitWithDeadline() saw the time move but stay short of
  // its deadline (and went on waiting), ever: after an Advance() that should
  // not end a wait, wait for this to grow before checking that nothing
  // happened.
  int64_t n_short_wakeups() {
    absl::MutexLock lock(&mu_);
    return n_short_wakeups_;
  }
  // SleepFor() calls, ever.
  int64_t n_sleeps() {
    absl::MutexLock lock(&mu_);
    return n_sleeps_;
  }

 private:
  absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  int n_waiting_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t n_waits_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t n_sleeps_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t n_short_wakeups_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace lede::testing

#endif  // LEDE_TESTS_TESTING_FAKE_CLOCK_H_
