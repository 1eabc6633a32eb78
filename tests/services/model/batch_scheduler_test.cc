// Tests of services/model/batch_scheduler.h: submitters block until their
// job ran; one batch holds at most max_batch jobs in arrival order; jobs
// that arrive while a batch runs form the next one; every job runs exactly
// once. Real threads; no timing is asserted (every wait is on a condition).
#include "services/model/batch_scheduler.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <tuple>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "tests/testing/wait.h"

namespace lede::model_service {
namespace {

using ::testing::ElementsAre;

struct Job {
  int id = 0;
  int ran = 0;  // times the run function saw it
};

// The batches a run function saw, as job ids (thread-safe).
struct BatchLog {
  absl::Mutex mu;
  std::vector<std::vector<int>> batches ABSL_GUARDED_BY(mu);

  // Counts each job's run and records the batch; true for the first batch.
  bool Record(const std::vector<void*>& jobs) {
    std::vector<int> ids;
    for (void* j : jobs) {
      ++static_cast<Job*>(j)->ran;
      ids.push_back(static_cast<Job*>(j)->id);
    }
    absl::MutexLock lock(&mu);
    batches.push_back(ids);
    return batches.size() == 1;
  }
  size_t size() {
    absl::MutexLock lock(&mu);
    return batches.size();
  }
};

// While the first batch (one job) is held, five more jobs queue; with
// max_batch 3 they run as [1, 2, 3] then [4, 5], in arrival order, and
// each submitter returns once its own job ran.
TEST(BatchSchedulerTest, BatchesHoldAtMostMaxBatchJobsInArrivalOrder) {
  absl::Notification release;
  BatchLog log;
  BatchSchedulerOptions o;
  o.max_batch = 3;
  o.n_workers = 1;
  BatchScheduler scheduler(o, [&](const std::vector<void*>& jobs) {
    if (log.Record(jobs)) release.WaitForNotification();  // batch [0] is held
  });
  std::vector<Job> jobs(6);
  for (int i = 0; i < 6; ++i) jobs[i].id = i;
  std::vector<std::thread> threads;
  threads.emplace_back([&] { EXPECT_TRUE(scheduler.Submit(&jobs[0], 1)); });
  ASSERT_TRUE(lede::testing::WaitUntil([&] { return log.size() == 1; }, std::chrono::seconds(10),
                                       std::chrono::milliseconds(1)));
  // Jobs 1..5 queue one after the other while batch [0] is held.
  for (int i = 1; i < 6; ++i) {
    threads.emplace_back([&, i] {
      EXPECT_TRUE(scheduler.Submit(&jobs[i], 1));
      EXPECT_EQ(jobs[i].ran, 1);
    });
    ASSERT_TRUE(lede::testing::WaitUntil([&] { return scheduler.n_ready() == i; }, std::chrono::seconds(10),
                                         std::chrono::milliseconds(1)));
  }
  release.Notify();
  for (std::thread& t : threads) t.join();
  for (const Job& j : jobs) EXPECT_EQ(j.ran, 1) << j.id;
  absl::MutexLock lock(&log.mu);
  ASSERT_GE(log.batches.size(), 3u);
  EXPECT_THAT(log.batches[0], ElementsAre(0));
  for (const std::vector<int>& b : log.batches) EXPECT_LE(b.size(), 3u);
  // Flattened, the jobs ran in arrival order.
  std::vector<int> order;
  for (const std::vector<int>& b : log.batches) order.insert(order.end(), b.begin(), b.end());
  EXPECT_THAT(order, ElementsAre(0, 1, 2, 3, 4, 5));
}

// Filling, one runner: with three open sessions the first job waits
// (max_wait an hour, far beyond the test) until all three are there, and
// they run as one batch; then, one session closing while two wait starts
// their batch at once (set_n_sessions re-checks the fill).
TEST(BatchSchedulerTest, ABatchWaitsForTheOpenSessionsStillToCome) {
  BatchLog log;
  BatchSchedulerOptions o;
  o.max_batch = 16;
  o.n_workers = 1;
  o.max_wait = absl::Hours(1);
  BatchScheduler scheduler(o, [&](const std::vector<void*>& jobs) { log.Record(jobs); });
  scheduler.set_n_sessions(3);
  std::vector<Job> jobs(5);
  for (int i = 0; i < 5; ++i) jobs[i].id = i;
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] { EXPECT_TRUE(scheduler.Submit(&jobs[i], 1)); });
    // One after the other, each queued before the next comes.
    ASSERT_TRUE(lede::testing::WaitUntil([&] { return scheduler.n_ready() == i + 1 || log.size() > 0; },
                                         std::chrono::seconds(10), std::chrono::milliseconds(1)));
  }
  for (std::thread& t : threads) t.join();
  threads.clear();
  {
    absl::MutexLock lock(&log.mu);
    ASSERT_EQ(log.batches.size(), 1u);
    EXPECT_THAT(log.batches[0], ElementsAre(0, 1, 2));
  }
  // Two of three sessions submit; they wait for the third until it closes.
  for (int i = 3; i < 5; ++i) threads.emplace_back([&, i] { EXPECT_TRUE(scheduler.Submit(&jobs[i], 1)); });
  ASSERT_TRUE(lede::testing::WaitUntil([&] { return scheduler.n_ready() == 2; }, std::chrono::seconds(10),
                                       std::chrono::milliseconds(1)));
  EXPECT_EQ(log.size(), 1u);  // still waiting
  scheduler.set_n_sessions(2);
  for (std::thread& t : threads) t.join();
  absl::MutexLock lock(&log.mu);
  ASSERT_EQ(log.batches.size(), 2u);
  EXPECT_THAT(log.batches[1], ::testing::UnorderedElementsAre(3, 4));
  for (const Job& j : jobs) EXPECT_EQ(j.ran, 1) << j.id;
}

// Two runners share the open sessions: with four, each batch waits for its
// half, and the second half runs while the first is still running (both
// cores compute; a batch of all four would leave one idle).
TEST(BatchSchedulerTest, TwoRunnersSplitTheOpenSessionsBetweenThem) {
  BatchLog log;
  absl::Notification release;
  BatchSchedulerOptions o;
  o.max_batch = 16;
  o.n_workers = 2;
  o.max_wait = absl::Hours(1);
  BatchScheduler scheduler(o, [&](const std::vector<void*>& jobs) {
    if (log.Record(jobs)) release.WaitForNotification();  // the first batch runs until the second began
  });
  scheduler.set_n_sessions(4);
  std::vector<Job> jobs(4);
  for (int i = 0; i < 4; ++i) jobs[i].id = i;
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] { EXPECT_TRUE(scheduler.Submit(&jobs[i], 1)); });
    ASSERT_TRUE(lede::testing::WaitUntil(
        [&] {
          absl::MutexLock lock(&log.mu);
          size_t queued = 0;
          for (const auto& b : log.batches) queued += b.size();
          return queued + static_cast<size_t>(scheduler.n_ready()) == static_cast<size_t>(i + 1);
        },
        std::chrono::seconds(10), std::chrono::milliseconds(1)));
  }
  ASSERT_TRUE(lede::testing::WaitUntil([&] { return log.size() == 2; }, std::chrono::seconds(10),
                                       std::chrono::milliseconds(1)));
  release.Notify();
  for (std::thread& t : threads) t.join();
  absl::MutexLock lock(&log.mu);
  ASSERT_EQ(log.batches.size(), 2u);
  // Which runner records first is up to the thread scheduler; the split is not.
  std::vector<std::vector<int>> batches(log.batches.begin(), log.batches.end());
  std::sort(batches.begin(), batches.end());
  EXPECT_THAT(batches[0], ElementsAre(0, 1));
  EXPECT_THAT(batches[1], ElementsAre(2, 3));
}

// With min_split_rows, sessions that bring few rows stay in one batch (a
// step bound by reading the weights shares that read): 4 one-row sessions,
// two runners, 8 rows per split: one batch of all 4.
TEST(BatchSchedulerTest, TwoRunnersKeepFewRowsInOneBatch) {
  BatchLog log;
  BatchSchedulerOptions o;
  o.max_batch = 16;
  o.n_workers = 2;
  o.max_wait = absl::Hours(1);
  o.min_split_rows = 8;
  BatchScheduler scheduler(o, [&](const std::vector<void*>& jobs) { log.Record(jobs); });
  scheduler.set_n_sessions(4);
  std::vector<Job> jobs(4);
  for (int i = 0; i < 4; ++i) jobs[i].id = i;
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] { EXPECT_TRUE(scheduler.Submit(&jobs[i], 1)); });
    ASSERT_TRUE(lede::testing::WaitUntil(
        [&] {
          absl::MutexLock lock(&log.mu);
          size_t queued = 0;
          for (const auto& b : log.batches) queued += b.size();
          return queued + static_cast<size_t>(scheduler.n_ready()) == static_cast<size_t>(i + 1);
        },
        std::chrono::seconds(10), std::chrono::milliseconds(1)));
  }
  for (std::thread& t : threads) t.join();
  absl::MutexLock lock(&log.mu);
  ASSERT_EQ(log.batches.size(), 1u);
  EXPECT_THAT(log.batches[0], ElementsAre(0, 1, 2, 3));
}

// A batch holds at most max_batch_tokens rows: while both runners hold a
// batch (the first a 100-row job, larger than the budget: it runs, alone),
// four 30-row jobs (prompts that came together) queue; once released, they
// run at most two per batch (60 of 64 rows), so both runners get some,
// instead of one runner taking all four while the other idles.
TEST(BatchSchedulerTest, ABatchHoldsAtMostMaxBatchTokensRows) {
  BatchLog log;
  absl::Notification release;
  BatchSchedulerOptions o;
  o.max_batch = 16;
  o.n_workers = 2;
  o.min_split_rows = 8;
  o.max_batch_tokens = 64;
  BatchScheduler scheduler(o, [&](const std::vector<void*>& jobs) {
    bool held;
    {
      absl::MutexLock lock(&log.mu);
      held = log.batches.size() < 2;
    }
    log.Record(jobs);
    if (held) release.WaitForNotification();  // the first two batches run until all four queued
  });
  std::vector<Job> jobs(6);
  for (int i = 0; i < 6; ++i) jobs[i].id = i;
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] { EXPECT_TRUE(scheduler.Submit(&jobs[i], i == 0 ? 100 : 30)); });
    ASSERT_TRUE(lede::testing::WaitUntil([&] { return log.size() == static_cast<size_t>(i + 1); },
                                         std::chrono::seconds(10), std::chrono::milliseconds(1)));
  }
  for (int i = 2; i < 6; ++i) {
    threads.emplace_back([&, i] { EXPECT_TRUE(scheduler.Submit(&jobs[i], 30)); });
    ASSERT_TRUE(lede::testing::WaitUntil([&] { return scheduler.n_ready() == i - 1; }, std::chrono::seconds(10),
                                         std::chrono::milliseconds(1)));
  }
  release.Notify();
  for (std::thread& t : threads) t.join();
  for (const Job& j : jobs) EXPECT_EQ(j.ran, 1) << j.id;
  absl::MutexLock lock(&log.mu);
  ASSERT_GE(log.batches.size(), 4u);
  EXPECT_THAT(log.batches[0], ElementsAre(0));
  std::vector<int> queued;
  for (size_t b = 2; b < log.batches.size(); ++b) {
    EXPECT_LE(log.batches[b].size(), 2u) << "batch " << b;
    queued.insert(queued.end(), log.batches[b].begin(), log.batches[b].end());
  }
  EXPECT_THAT(queued, ::testing::UnorderedElementsAre(2, 3, 4, 5));
}

// Many submitters at once, one or two scheduler threads: every job runs
// exactly once, no batch is larger than max_batch, and no batch is empty (a
// submitter whose job another runner took waits for it; it once read the
// front of an empty queue, found its own stale entry there and ran empty
// batches in a loop).
// Parameters: (n_workers, max_batch); max_batch 16 >= the 16 submitters
// empties the queue with every batch, as the service does at its default.
class BatchSchedulerWorkersTest : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(BatchSchedulerWorkersTest, EveryJobRunsOnceUnderConcurrentSubmits) {
  std::atomic<int> largest{0};
  std::atomic<int> empty_batches{0};
  BatchSchedulerOptions o;
  const auto [n_workers, max_batch] = GetParam();
  o.max_batch = max_batch;
  o.n_workers = n_workers;
  BatchScheduler scheduler(o, [&](const std::vector<void*>& jobs) {
    int seen = largest.load();
    while (static_cast<int>(jobs.size()) > seen && !largest.compare_exchange_weak(seen, jobs.size())) {
    }
    if (jobs.empty()) ++empty_batches;
    for (void* j : jobs) ++static_cast<Job*>(j)->ran;  // jobs of concurrent batches are disjoint
    // A batch takes a while (as a forward pass does), so that batches overlap
    // and submitters find their jobs taken by another runner.
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  });
  constexpr int kThreads = 16, kRounds = 1000;
  std::vector<Job> jobs(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      jobs[i].id = i;
      for (int round = 0; round < kRounds; ++round) EXPECT_TRUE(scheduler.Submit(&jobs[i], 2));
    });
  }
  for (std::thread& t : threads) t.join();
  for (const Job& j : jobs) EXPECT_EQ(j.ran, kRounds);
  EXPECT_LE(largest.load(), max_batch);
  EXPECT_GE(largest.load(), 1);
  EXPECT_EQ(empty_batches.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(Workers, BatchSchedulerWorkersTest,
                         ::testing::Combine(::testing::Values(1, 2), ::testing::Values(4, 16)));

}  // namespace
}  // namespace lede::model_service
