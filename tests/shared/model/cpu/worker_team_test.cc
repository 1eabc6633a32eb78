// cpu::ParallelFor (shared/model/cpu/worker_team.h): every index runs once in
// the ranges the part count fixes, parts run on distinct threads at once,
// and a loop whose team is held (another caller, or a part of a loop) runs
// its parts on the calling thread with the same ranges.
#include "shared/model/cpu/worker_team.h"

#include <atomic>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace lede::model::cpu {
namespace {

TEST(WorkerTeamTest, EveryIndexRunsOnceInTheRangesOfItsPart) {
  for (int parts : {1, 2, 3, 4}) {
    for (int64_t n : {0, 1, 2, 5, 64, 1001}) {
      std::vector<std::atomic<int>> runs(static_cast<size_t>(n));
      std::vector<int> part_of(static_cast<size_t>(n), -1);
      ParallelFor(parts, n, [&](int part, int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          runs[i].fetch_add(1);
          part_of[i] = part;
        }
      });
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(runs[i].load(), 1) << "parts " << parts << " n " << n << " index " << i;
        // Part p holds [n p / parts, n (p + 1) / parts): the same split whoever runs it.
        const int p = std::max(parts, 1);
        ASSERT_LE(n * part_of[i] / p, i);
        ASSERT_LT(i, n * (part_of[i] + 1) / p);
      }
    }
  }
}

TEST(WorkerTeamTest, PartsRunOnDistinctThreadsAtOnce) {
  EXPECT_EQ(ParallelForThreads(1), 1);
  ASSERT_EQ(ParallelForThreads(3), 3);  // the team is free: the waits below can end
  // Each part waits for the others: only threads that run at once get past.
  std::atomic<int> arrived{0};
  ParallelFor(3, 3, [&](int, int64_t, int64_t) {
    arrived.fetch_add(1);
    while (arrived.load() < 3) std::this_thread::yield();
  });
  EXPECT_EQ(arrived.load(), 3);
}

TEST(WorkerTeamTest, ANestedLoopRunsOnTheCallingThread) {
  std::mutex mu;
  std::vector<std::set<std::thread::id>> inner_threads(2);
  std::vector<int> inner_sums(2, 0);
  ParallelFor(2, 2, [&](int part, int64_t, int64_t) {
    std::set<std::thread::id> ids;
    int sum = 0;
    ParallelFor(4, 8, [&](int, int64_t begin, int64_t end) {
      ids.insert(std::this_thread::get_id());
      for (int64_t i = begin; i < end; ++i) sum += static_cast<int>(i);
    });
    std::lock_guard<std::mutex> lock(mu);
    inner_threads[part] = ids;
    inner_sums[part] = sum;
  });
  for (int part = 0; part < 2; ++part) {
    EXPECT_EQ(inner_threads[part].size(), 1u) << "part " << part;
    EXPECT_EQ(inner_sums[part], 28) << "part " << part;
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
        ParallelFor(2 + (c + loop) % 3, kN, [&](int, int64_t begin, int64_t end) {
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
