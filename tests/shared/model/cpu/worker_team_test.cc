// cpu::ParallelFor (shared/model/cpu/worker_team.h): every index runs once,
// in the chunks the grain fixes; threads that run chunks at once have
// distinct thread indices; a late worker's share goes to the others; a loop
// whose team is held (another caller, or a chunk of a loop) runs on the
// calling thread.
#include "shared/model/cpu/worker_team.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace lede::model::cpu {
namespace {

TEST(WorkerTeamTest, EveryIndexRunsOnceInItsChunk) {
  for (int threads : {1, 2, 3, 4}) {
    for (int64_t grain : {1, 3, 64}) {
      for (int64_t n : {0, 1, 2, 5, 64, 1001}) {
        std::vector<std::atomic<int>> runs(static_cast<size_t>(n));
        std::vector<std::atomic<int>> thread_of(static_cast<size_t>(n));
        ParallelFor(threads, n, grain, [&](int thread, int64_t begin, int64_t end) {
          // Chunk c is [c grain, min(n, (c + 1) grain)): the same cut whoever runs it.
          EXPECT_EQ(begin % grain, 0);
          EXPECT_EQ(end, std::min(n, begin + grain));
          for (int64_t i = begin; i < end; ++i) {
            runs[i].fetch_add(1);
            thread_of[i].store(thread);
          }
        });
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(runs[i].load(), 1) << "threads " << threads << " grain " << grain << " n " << n << " index " << i;
          ASSERT_GE(thread_of[i].load(), 0);
          ASSERT_LT(thread_of[i].load(), std::max(threads, 1));
        }
      }
    }
  }
}

// More chunks than kMaxChunks coarsen the grain: still every index once, in chunks of equal size but the last.
TEST(WorkerTeamTest, ManyChunksCoarsenTheGrain) {
  const int64_t n = 3 * kMaxChunks + 5;
  std::vector<std::atomic<int>> runs(static_cast<size_t>(n));
  std::atomic<int64_t> chunks{0};
  ParallelFor(2, n, 1, [&](int, int64_t begin, int64_t end) {
    EXPECT_EQ(begin % 4, 0);  // grain ceil(n / kMaxChunks) = 4
    chunks.fetch_add(1);
    for (int64_t i = begin; i < end; ++i) runs[i].fetch_add(1);
  });
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(runs[i].load(), 1) << i;
  EXPECT_LE(chunks.load(), kMaxChunks);
}

TEST(WorkerTeamTest, ThreadsRunChunksAtOnceUnderDistinctIndices) {
  EXPECT_EQ(ParallelForThreads(1), 1);
  ASSERT_EQ(ParallelForThreads(3), 3);  // the team is free: the waits below can end
  // Each chunk waits for the others: only threads that run at once get past, and no index is shared.
  std::atomic<int> arrived{0};
  std::mutex mu;
  std::set<int> indices;
  std::set<std::thread::id> ids;
  ParallelFor(3, 3, 1, [&](int thread, int64_t, int64_t) {
    {
      std::lock_guard<std::mutex> lock(mu);
      indices.insert(thread);
      ids.insert(std::this_thread::get_id());
    }
    arrived.fetch_add(1);
    while (arrived.load() < 3) std::this_thread::yield();
  });
  EXPECT_EQ(arrived.load(), 3);
  EXPECT_EQ(indices.size(), 3u);
  EXPECT_EQ(ids.size(), 3u);
}

// A thread held up in one chunk (a worker still waking, or preempted) does not hold up the loop's other
// chunks: the caller runs them, and the loop ends when the held chunk does.
TEST(WorkerTeamTest, AHeldThreadsShareGoesToTheOthers) {
  ASSERT_EQ(ParallelForThreads(2), 2);
  constexpr int64_t kChunks = 64;
  std::atomic<bool> release{false};
  std::atomic<int> held{-1};
  std::vector<std::atomic<int>> ran_by(kChunks);
  for (auto& r : ran_by) r.store(-1);
  std::atomic<int> others_done{0};
  ParallelFor(2, kChunks, 1, [&](int thread, int64_t begin, int64_t) {
    int expected = -1;
    if (held.compare_exchange_strong(expected, thread)) {
      // The first chunk claimed: wait until every other chunk has run.
      while (others_done.load() < kChunks - 1) std::this_thread::yield();
    } else {
      others_done.fetch_add(1);
    }
    ran_by[begin].store(thread);
  });
  int by_other = 0;
  for (auto& r : ran_by) by_other += r.load() != held.load();
  EXPECT_EQ(by_other, kChunks - 1);  // all but the held chunk ran on the other thread
}

TEST(WorkerTeamTest, ANestedLoopRunsOnTheCallingThread) {
  std::mutex mu;
  std::vector<std::set<std::thread::id>> inner_threads(2);
  std::vector<int> inner_sums(2, 0);
  ParallelFor(2, 2, 1, [&](int, int64_t chunk, int64_t) {
    std::set<std::thread::id> ids;
    int sum = 0;
    ParallelFor(4, 8, 2, [&](int thread, int64_t begin, int64_t end) {
      EXPECT_EQ(thread, 0);
      ids.insert(std::this_thread::get_id());
      for (int64_t i = begin; i < end; ++i) sum += static_cast<int>(i);
    });
    std::lock_guard<std::mutex> lock(mu);
    inner_threads[chunk] = ids;
    inner_sums[chunk] = sum;
  });
  for (int chunk = 0; chunk < 2; ++chunk) {
    EXPECT_EQ(inner_threads[chunk].size(), 1u) << "chunk " << chunk;
    EXPECT_EQ(inner_sums[chunk], 28) << "chunk " << chunk;
  }
}

TEST(WorkerTeamTest, ConcurrentCallersEachGetEveryIndexOnce) {
  constexpr int kCallers = 4, kLoops = 200;
  constexpr int64_t kN = 97;
  std::atomic<int64_t> bad{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int loop = 0; loop < kLoops; ++loop) {
        std::vector<std::atomic<int>> runs(kN);
        ParallelFor(2 + (c + loop) % 3, kN, 1 + loop % 7, [&](int, int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) runs[i].fetch_add(1);
        });
        for (int64_t i = 0; i < kN; ++i) bad += runs[i].load() != 1;
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(bad.load(), 0);
}

}  // namespace
}  // namespace lede::model::cpu
