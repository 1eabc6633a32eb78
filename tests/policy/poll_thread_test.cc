#include "policy/poll_thread.h"

#include <atomic>
#include <functional>

#include <gtest/gtest.h>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/testing/fake_clock.h"

namespace lede::policy {
namespace {

// Polls `done` on the real clock for up to 10 s (how long the thread takes
// to get there, not what it decides).
bool Eventually(const std::function<bool()>& done) {
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (absl::Now() < until) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return done();
}

TEST(PollThreadTest, PollsOncePerIntervalOfTheClock) {
  testing::FakeClock clock;
  PollThread poll(&clock);
  std::atomic<int> polls{0};
  poll.Start([&] {
    do {
      ++polls;
    } while (poll.SleepUnlessStopped(absl::Seconds(5)));
  });
  ASSERT_TRUE(Eventually([&] { return clock.n_waiting() == 1; }));
  EXPECT_EQ(polls.load(), 1);  // the first poll right away, then a wait
  const int64_t short_wakeups = clock.n_short_wakeups();
  clock.Advance(absl::Seconds(4));
  ASSERT_TRUE(Eventually([&] { return clock.n_short_wakeups() > short_wakeups; }));
  EXPECT_EQ(polls.load(), 1);  // short of the interval: no poll
  clock.Advance(absl::Seconds(1));
  ASSERT_TRUE(Eventually([&] { return polls.load() == 2; }));
  poll.Stop();
  EXPECT_TRUE(poll.stopping());
  EXPECT_EQ(polls.load(), 2);
}

TEST(PollThreadTest, StopWakesTheSleepWithoutWaitingForTheInterval) {
  testing::FakeClock clock;
  PollThread poll(&clock);
  std::atomic<bool> slept_through{false};
  poll.Start([&] { slept_through = poll.SleepUnlessStopped(absl::Hours(1)); });
  ASSERT_TRUE(Eventually([&] { return clock.n_waiting() == 1; }));
  poll.Stop();  // the fake time never moves: only the stop can end the sleep
  EXPECT_FALSE(slept_through.load());
  EXPECT_FALSE(poll.SleepUnlessStopped(absl::Hours(1)));  // once stopped, returns at once
}

TEST(PollThreadTest, StopInterruptsWhatTheBodyBlocksIn) {
  PollThread poll;
  absl::Mutex mu;
  bool cancelled = false;
  std::atomic<bool> blocking{false};
  poll.Start([&] {
    absl::MutexLock lock(&mu);
    if (poll.stopping()) return;
    blocking = true;
    mu.Await(absl::Condition(&cancelled));  // e.g. a stream read until cancelled
  });
  ASSERT_TRUE(Eventually([&] { return blocking.load(); }));
  int interrupts = 0;
  poll.Stop([&] {
    ++interrupts;
    absl::MutexLock lock(&mu);
    cancelled = true;
  });
  EXPECT_EQ(interrupts, 1);
  poll.Stop([&] { ++interrupts; });  // no thread: a no-op, no interrupt
  EXPECT_EQ(interrupts, 1);
}

TEST(PollThreadTest, StartIsIdempotentAndRestartsAfterStop) {
  PollThread poll;
  std::atomic<int> runs{0};
  auto body = [&] {
    ++runs;
    while (poll.SleepUnlessStopped(absl::Hours(1))) {
    }
  };
  poll.Start(body);
  poll.Start(body);  // already running: no second thread
  ASSERT_TRUE(Eventually([&] { return runs.load() == 1; }));
  poll.Stop();
  EXPECT_EQ(runs.load(), 1);
  poll.Start(body);
  EXPECT_FALSE(poll.stopping());
  ASSERT_TRUE(Eventually([&] { return runs.load() == 2; }));
  // The destructor stops it.
}

}  // namespace
}  // namespace lede::policy
