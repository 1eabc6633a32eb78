// Tests of services/model/admission_queue.h: the verifier's FIFO queue of
// sessions waiting for a KV slot. Slots are a counter under a plain mutex;
// waiters are real threads. No timing is asserted: every wait is on a
// condition (WaitUntil) with a generous safety bound.
#include "services/model/admission_queue.h"

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"

namespace lede::model_service {
namespace {

using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// n_free slots behind a mutex, and the queue that hands them out.
class Slots {
 public:
  Slots(int n_free, AdmissionOptions options) : free_(n_free), queue_(options) {}

  Status Acquire(absl::Time deadline, const std::function<bool()>& cancelled = [] { return false; },
                 absl::Duration* queued = nullptr) {
    std::unique_lock<std::mutex> lock(mu_);
    auto try_admit = [&] {
      if (free_ == 0) return false;
      --free_;
      return true;
    };
    return queue_.Admit(lock, try_admit, deadline, cancelled, queued);
  }
  void Release() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++free_;
    }
    queue_.SlotFreed();
  }
  int64_t n_waiting() {
    std::lock_guard<std::mutex> lock(mu_);
    return queue_.n_waiting();
  }
  int free() {
    std::lock_guard<std::mutex> lock(mu_);
    return free_;
  }

 private:
  std::mutex mu_;
  int free_;
  AdmissionQueue queue_;
};

// Polls `done` until it holds (a safety bound of 20 s, never a timing check).
bool WaitUntil(const std::function<bool()>& done) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!done()) {
    if (std::chrono::steady_clock::now() > give_up) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

AdmissionOptions Options(int64_t max_waiting) {
  AdmissionOptions o;
  o.max_waiting = max_waiting;
  o.poll_interval = absl::Milliseconds(5);
  return o;
}

TEST(AdmissionQueueTest, FreeSlotIsTakenAtOnceWithoutQueueing) {
  Slots slots(1, Options(4));
  absl::Duration queued = absl::Seconds(1);
  EXPECT_THAT(slots.Acquire(absl::InfiniteFuture(), [] { return false; }, &queued), IsOk());
  EXPECT_EQ(queued, absl::ZeroDuration());
  EXPECT_EQ(slots.free(), 0);
  EXPECT_EQ(slots.n_waiting(), 0);
}

// max_waiting 0 is the behaviour before the queue: refuse when full.
TEST(AdmissionQueueTest, NoQueueRefusesWhenFull) {
  Slots slots(0, Options(0));
  EXPECT_THAT(slots.Acquire(absl::InfiniteFuture()),
              StatusIs(StatusCode::kResourceExhausted, HasSubstr("--max-waiting 0")));
  EXPECT_EQ(slots.n_waiting(), 0);
}

// Waiters are admitted in arrival order as slots free one by one.
TEST(AdmissionQueueTest, AdmitsInArrivalOrder) {
  Slots slots(0, Options(8));
  std::mutex order_mu;
  std::vector<int> order;
  std::vector<std::thread> waiters;
  for (int i = 0; i < 4; ++i) {
    waiters.emplace_back([&, i] {
      ASSERT_THAT(slots.Acquire(absl::InfiniteFuture()), IsOk());
      std::lock_guard<std::mutex> lock(order_mu);
      order.push_back(i);
    });
    // Each one queued before the next arrives.
    ASSERT_TRUE(WaitUntil([&] { return slots.n_waiting() == i + 1; }));
  }
  for (int i = 0; i < 4; ++i) {
    slots.Release();
    ASSERT_TRUE(WaitUntil([&] {
      std::lock_guard<std::mutex> lock(order_mu);
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
  Slots slots(0, Options(8));
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

TEST(AdmissionQueueTest, DeadlineEndsTheWait) {
  Slots slots(0, Options(8));
  EXPECT_THAT(slots.Acquire(absl::Now() + absl::Milliseconds(30)),
              StatusIs(StatusCode::kDeadlineExceeded, HasSubstr("waiting for a KV slot")));
  EXPECT_EQ(slots.n_waiting(), 0);
}

// A cancelled head leaves the queue and the next waiter gets the slot.
TEST(AdmissionQueueTest, CancelledWaiterLeavesAndDoesNotBlockTheNext) {
  Slots slots(0, Options(8));
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
  Slots slots(0, Options(2));
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
