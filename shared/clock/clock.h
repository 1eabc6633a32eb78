// File: shared/clock/clock.h
//
// Clock: the time source of components whose behaviour depends on time
// (experience shard age, policy reload polling, reconnect backoff), so that
// tests drive time with a FakeClock (tests/testing/fake_clock.h) instead of
// sleeping (STYLE.md §2.7 "Time comes from an injected lede::clock::Clock").
// Production code passes nothing and gets Clock::Real(): absl::Now(),
// absl::SleepFor and absl::Mutex's own timed waits.
//
// Deadlines and timeouts handed to gRPC (ClientContext::set_deadline) stay
// on the real clock: the transport knows no other.
//
// Example:
//   struct Options { Clock* clock = nullptr; };  // nullptr = Clock::Real()
//   Clock& clock = *(o.clock != nullptr ? o.clock : Clock::Real());
//   absl::MutexLock lock(&mu_);
//   clock.AwaitWithTimeout(&mu_, absl::Condition(&stopping_), interval);
//
// Thread-safety: every method may be called from any thread; implementations
// are thread-safe. Ownership: a component borrows its Clock, which must
// outlive it.
#ifndef LEDE_SHARED_CLOCK_CLOCK_H_
#define LEDE_SHARED_CLOCK_CLOCK_H_

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace lede::clock {

class Clock {
 public:
  virtual ~Clock() = default;

  // The current time of this clock.
  virtual absl::Time Now() = 0;

  // Returns after `d` has passed on this clock (at once for d <= 0).
  virtual void SleepFor(absl::Duration d) = 0;

  // absl::Mutex::AwaitWithDeadline with `deadline` on this clock: with `mu`
  // held, blocks (releasing `mu`) until `cond` holds or this clock reaches
  // `deadline`, and returns whether `cond` holds; `mu` is held again on
  // return. `cond` is evaluated with `mu` held, as absl::Condition requires.
  virtual bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond,
                                 absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) = 0;

  // AwaitWithDeadline(mu, cond, Now() + timeout).
  bool AwaitWithTimeout(absl::Mutex* mu, const absl::Condition& cond, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return AwaitWithDeadline(mu, cond, Now() + timeout);
  }

  // The process's real (wall) clock; never null, never destroyed.
  static Clock* Real();
};

}  // namespace lede::clock
#endif  // LEDE_SHARED_CLOCK_CLOCK_H_
