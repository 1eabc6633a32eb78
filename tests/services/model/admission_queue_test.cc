// Tests of services/model/admission_queue.h: the verifier's FIFO queue of
// sessions waiting for a KV slot. Slots are a counter under an absl::Mutex;
// waiters are real threads; deadlines and queue times are on a FakeClock.
// No timing is asserted: every wait is on a condition (WaitUntil) with a
// generous safety bound.
#include "services/model/admission_queue.h"

#include <atomic>
#include <functional>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/wait.h"

namespace lede::model_service {
namespace {

using ::lede::testing::FakeClock;
using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using ::lede::testing::WaitUntil;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// n_free slots behind a mutex, and the queue that hands them out.
class Slots {
 public:
  Slots(int n_free, AdmissionOptions options) : free_(n_free), queue_(options) {}

  Status Acquire(absl::Time deadline, const std::function<bool()>& cancelled = [] { return false; },
                 absl::Duration* queued = nullptr) {
    absl::MutexLock lock(&mu_);
    auto try_admit = [&] {
      if (free_ == 0) return false;
      --free_;
      return true;
    };
    return queue_.Admit(&mu_, try_admit, deadline, cancelled, queued);
  }
  void Release() {
    {
      absl::MutexLock lock(&mu_);
      ++free_;
    }
    queue_.SlotFreed();
  }
  int64_t n_waiting() {
    absl::MutexLock lock(&mu_);
    return queue_.n_waiting();
  }
  int free() {
    absl::MutexLock lock(&mu_);
    return free_;
  }

 private:
  absl::Mutex mu_;
  int free_ ABSL_GUARDED_BY(mu_);
  AdmissionQueue queue_;
};

AdmissionOptions Options(int64_t max_waiting, FakeClock* clock) {
  AdmissionOptions o;
  o.max_waiting = max_waiting;
  o.poll_interval = absl::Milliseconds(5);
  o.clock = clock;
  return o;
}

TEST(AdmissionQueueTest, FreeSlotIsTakenAtOnceWithoutQueueing) {
  FakeClock clock;
  Slots slots(1, Options(4, &clock));
  absl::Duration queued = absl::Seconds(1);
  EXPECT_THAT(slots.Acquire(absl::InfiniteFuture(), [] { return false; }, &queued), IsOk());
  EXPECT_EQ(queued, absl::ZeroDuration());
  EXPECT_EQ(slots.free(), 0);
  EXPECT_EQ(slots.n_waiting(), 0);
}

// max_waiting 0 is the behaviour before the queue: refuse when full.
TEST(AdmissionQueueTest, NoQueueRefusesWhenFull) {
  FakeClock clock;
  Slots slots(0, Options(0, &clock));
  EXPECT_THAT(slots.Acquire(absl::InfiniteFuture()),
              StatusIs(StatusCode::kResourceExhausted, HasSubstr("--max-waiting 0")));
  EXPECT_EQ(slots.n_waiting(), 0);
}

// Waiters are admitted in arrival order as slots free one by one.
TEST(AdmissionQueueTest, AdmitsInArrivalOrder) {
  FakeClock clock;
  Slots slots(0, Options(8, &clock));
  absl::Mutex order_mu;
  std::vector<int> order;
  std::vector<std::thread> waiters;
  for (int i = 0; i < 4; ++i) {
    waiters.emplace_back([&, i] {
      ASSERT_THAT(slots.Acquire(absl::InfiniteFuture()), IsOk());
      absl::MutexLock lock(&order_mu);
      order.push_back(i);
    });
    // Each one queued before the next arrives.
    ASSERT_TRUE(WaitUntil([&] { return slots.n_waiting() == i + 1; }));
  }
  for (int i = 0; i < 4; ++i) {
    slots.Release();
    ASSERT_TRUE(WaitUntil([&] {
      absl::MutexLock lock(&order_mu);
      return static_cast<int>(order.size()) == i + 1;
    }));
  }
  for (std::thread& t : waiters) t.join();
  EXPECT_THAT(order, ElementsAre(0, 1, 2, 3));
  EXPECT_EQ(slots.n_waiting(), 0);
  EXPECT_EQ(slots.free(), 0);
}

// A late arrival does not overtake the queue even when a slot is free at
// the moment it arrives (the head is about to take it).
TEST(AdmissionQueueTest, ArrivalDoesNotOvertakeWaiters) {
  FakeClock clock;
  Slots slots(0, Options(8, &clock));
  std::atomic<bool> first_done{false};
  std::thread first([&] {
    ASSERT_THAT(slots.Acquire(absl::InfiniteFuture()), IsOk());
    first_done = true;
  });
  ASSERT_TRUE(WaitUntil([&] { return slots.n_waiting() == 1; }));
  // The late caller's deadline is already past: if it could overtake, it
  // would take the slot instead of failing.
  slots.Release();
  Status late = slots.Acquire(absl::InfinitePast());
  first.join();
  EXPECT_TRUE(first_done);
  EXPECT_THAT(late, StatusIs(StatusCode::kDeadlineExceeded));
  EXPECT_EQ(slots.free(), 0);
}

// The deadline is on the queue's clock: the wait ends when that clock
// reaches it, after exactly the time that passed on it.
TEST(AdmissionQueueTest, DeadlineOnTheClockEndsTheWait) {
  FakeClock clock;
  Slots slots(0, Options(8, &clock));
  Status status;
  std::thread waiter([&] { status = slots.Acquire(clock.Now() + absl::Seconds(30)); });
  EXPECT_TRUE(WaitUntil([&] { return slots.n_waiting() == 1; }));  // not ASSERT: the waiter is joined
  clock.Advance(absl::Seconds(30));
  waiter.join();
  EXPECT_THAT(status, StatusIs(StatusCode::kDeadlineExceeded, HasSubstr("after 30s waiting for a KV slot")));
  EXPECT_EQ(slots.n_waiting(), 0);
}

// The queue time reported is the time the request waited on the clock.
TEST(AdmissionQueueTest, QueueTimeIsTheTimeWaitedOnTheClock) {
  FakeClock clock;
  Slots slots(0, Options(8, &clock));
  absl::Duration queued = absl::ZeroDuration();
  Status status;
  std::thread waiter([&] { status = slots.Acquire(absl::InfiniteFuture(), [] { return false; }, &queued); });
  EXPECT_TRUE(WaitUntil([&] { return slots.n_waiting() == 1; }));  // not ASSERT: the waiter is joined
  clock.Advance(absl::Seconds(7));
  slots.Release();
  waiter.join();
  EXPECT_THAT(status, IsOk());
  EXPECT_EQ(queued, absl::Seconds(7));
}

// A cancelled head leaves the queue and the next waiter gets the slot.
TEST(AdmissionQueueTest, CancelledWaiterLeavesAndDoesNotBlockTheNext) {
  FakeClock clock;
  Slots slots(0, Options(8, &clock));
  std::atomic<bool> cancel{false};
  Status first_status, second_status;
  std::thread first([&] { first_status = slots.Acquire(absl::InfiniteFuture(), [&] { return cancel.load(); }); });
  ASSERT_TRUE(WaitUntil([&] { return slots.n_waiting() == 1; }));
  std::thread second([&] { second_status = slots.Acquire(absl::InfiniteFuture()); });
  ASSERT_TRUE(WaitUntil([&] { return slots.n_waiting() == 2; }));
  cancel = true;
  first.join();
  EXPECT_THAT(first_status, StatusIs(StatusCode::kCancelled));
  EXPECT_EQ(slots.n_waiting(), 1);
  slots.Release();
  second.join();
  EXPECT_THAT(second_status, IsOk());
  EXPECT_EQ(slots.n_waiting(), 0);
  EXPECT_EQ(slots.free(), 0);
}

// The bound counts waiters only; the one past it is refused at once and
// the queued ones are unaffected.
TEST(AdmissionQueueTest, FullQueueRefusesTheNextArrival) {
  FakeClock clock;
  Slots slots(0, Options(2, &clock));
  std::vector<Status> statuses(2);
  std::vector<std::thread> waiters;
  for (int i = 0; i < 2; ++i) {
    waiters.emplace_back([&, i] { statuses[i] = slots.Acquire(absl::InfiniteFuture()); });
    ASSERT_TRUE(WaitUntil([&] { return slots.n_waiting() == i + 1; }));
  }
  EXPECT_THAT(slots.Acquire(absl::InfiniteFuture()),
              StatusIs(StatusCode::kResourceExhausted, HasSubstr("2 requests are already waiting")));
  slots.Release();
  slots.Release();
  for (std::thread& t : waiters) t.join();
  EXPECT_THAT(statuses[0], IsOk());
  EXPECT_THAT(statuses[1], IsOk());
}

}  // namespace
}  // namespace lede::model_service
