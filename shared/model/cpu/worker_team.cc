#include "shared/model/cpu/worker_team.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace lede::model::cpu {
namespace {

// How long a worker polls for the next loop before it sleeps: longer than
// the gap between two loops of a step, shorter than the gap between steps
// (a round trip through the coordinator, about 0.3 ms or more).
constexpr auto kSpin = std::chrono::microseconds(100);

// How long ParallelForThreads waits for the workers to join: long enough
// for a worker on a loaded machine (a test suite beside it) to be scheduled.
constexpr auto kJoinWait = std::chrono::seconds(2);

inline void Pause() {
#if defined(__x86_64__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

using Fn = absl::FunctionRef<void(int, int64_t, int64_t)>;

// One loop: [0, n) in chunks of grain.
struct Loop {
  const Fn* fn;
  int64_t n, grain;
  void RunChunk(int thread, int64_t c) const {
    const int64_t begin = c * grain, end = std::min(n, begin + grain);
    (*fn)(thread, begin, end);
  }
};

// The loop in flight is published in two words:
//  - state_ = generation << 16 | threads: what sleeping or polling workers
//    wait on (worker i joins a loop of more than i threads);
//  - claim_ = generation << 32 | chunks << 16 | next: the next chunk to run.
//    A thread claims chunk `next` by a compare-and-swap that keeps the
//    generation; a claim that succeeds holds a chunk of the loop in flight,
//    which cannot end (nor loop_ change) before that chunk is done, so loop_
//    is read only under a successful claim. A worker late for a loop whose
//    chunks are all claimed finds next == chunks or another generation and
//    runs nothing.
class Team {
 public:
  // Runs the loop on the team; false (nothing run) when another loop holds
  // it or the calling thread runs a chunk of one.
  bool TryRun(int threads, const Loop& loop, int64_t chunks) {
    if (in_loop_) return false;
    std::unique_lock<std::mutex> run(run_mu_, std::try_to_lock);
    if (!run.owns_lock()) return false;
    while (static_cast<int>(workers_.size()) < threads - 1) {
      const int index = static_cast<int>(workers_.size()) + 1;
      workers_.emplace_back([this, index, seen = generation_] { Work(index, seen); });
      workers_.back().detach();
    }
    loop_ = loop;
    done_.store(0, std::memory_order_relaxed);
    ++generation_;
    const uint64_t gen = generation_ & 0xffffffffu;
    claim_.store(gen << 32 | static_cast<uint64_t>(chunks) << 16, std::memory_order_release);
    state_.store(generation_ << 16 | static_cast<uint64_t>(threads));  // seq_cst: ordered against sleepers_
    if (sleepers_.load() > 0) {
      { std::lock_guard<std::mutex> lock(sleep_mu_); }
      wake_.notify_all();
    }
    in_loop_ = true;
    RunChunks(0, gen);
    in_loop_ = false;
    while (done_.load(std::memory_order_acquire) < chunks) Pause();
    return true;
  }

 private:
  // Claims and runs chunks of generation `gen` until none is left.
  void RunChunks(int thread, uint64_t gen) {
    uint64_t word = claim_.load(std::memory_order_acquire);
    for (;;) {
      const uint64_t chunks = (word >> 16) & 0xffff, next = word & 0xffff;
      if (word >> 32 != gen || next >= chunks) return;
      if (!claim_.compare_exchange_weak(word, word + 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
        continue;
      }
      loop_.RunChunk(thread, static_cast<int64_t>(next));
      done_.fetch_add(1, std::memory_order_release);
      word = claim_.load(std::memory_order_acquire);
    }
  }

  // seen: the last generation published before this worker started.
  void Work(int index, uint64_t seen) {
    in_loop_ = true;  // a chunk that calls ParallelFor runs it inline
    for (;;) {
      const auto spin_until = std::chrono::steady_clock::now() + kSpin;
      uint64_t state = state_.load(std::memory_order_acquire);
      for (int polls = 1; state >> 16 == seen; ++polls) {
        Pause();
        if (polls % 64 == 0 && std::chrono::steady_clock::now() > spin_until) {
          std::unique_lock<std::mutex> lock(sleep_mu_);
          sleepers_.fetch_add(1);  // seq_cst, before the predicate reads state_
          wake_.wait(lock, [&] { return state_.load() >> 16 != seen; });
          sleepers_.fetch_sub(1);
        }
        state = state_.load(std::memory_order_acquire);
      }
      seen = state >> 16;
      if (index < static_cast<int>(state & 0xffff)) RunChunks(index, seen & 0xffffffffu);
    }
  }

  std::mutex run_mu_;  // held by the loop on the team
  std::vector<std::thread> workers_;
  uint64_t generation_ = 0;  // under run_mu_
  Loop loop_{};              // the loop's; see the class comment
  std::atomic<uint64_t> state_{0};
  std::atomic<uint64_t> claim_{0};
  std::atomic<int64_t> done_{0};  // chunks of the loop run
  std::mutex sleep_mu_;
  std::condition_variable wake_;
  std::atomic<int> sleepers_{0};
  static thread_local bool in_loop_;
};

thread_local bool Team::in_loop_ = false;

Team& TheTeam() {
  static Team* team = new Team;  // never destroyed: its detached workers outlive main's statics
  return *team;
}

}  // namespace

void ParallelFor(int threads, int64_t n, int64_t grain, Fn fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  if ((n + grain - 1) / grain > kMaxChunks) grain = (n + kMaxChunks - 1) / kMaxChunks;
  const int64_t chunks = (n + grain - 1) / grain;
  threads = std::clamp(threads, 1, 0xffff);  // 16 bits of Team's state word
  const Loop loop{&fn, n, grain};
  if (threads > 1 && chunks > 1 && TheTeam().TryRun(threads, loop, chunks)) return;
  for (int64_t c = 0; c < chunks; ++c) loop.RunChunk(0, c);
}

int ParallelForThreads(int threads) {
  std::mutex mu;
  std::set<std::thread::id> ids;
  const auto deadline = std::chrono::steady_clock::now() + kJoinWait;
  const size_t want = static_cast<size_t>(std::max(1, threads));
  ParallelFor(threads, threads, 1, [&](int, int64_t, int64_t) {
    std::unique_lock<std::mutex> lock(mu);
    ids.insert(std::this_thread::get_id());
    while (ids.size() < want && std::chrono::steady_clock::now() < deadline) {
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
    }
  });
  return std::max<int>(1, static_cast<int>(ids.size()));
}

}  // namespace lede::model::cpu
