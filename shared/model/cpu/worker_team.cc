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

inline void Pause() {
#if defined(__x86_64__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

using Fn = absl::FunctionRef<void(int, int64_t, int64_t)>;

void RunPart(const Fn& fn, int part, int parts, int64_t n) {
  const int64_t begin = n * part / parts, end = n * (part + 1) / parts;
  if (end > begin) fn(part, begin, end);
}

// The loop in flight is published as one word, generation << 16 | parts: a
// worker acts on a generation whose parts include it, and the caller waits
// for every such worker before fn_ and n_ change, so a worker reads them
// only while they hold.
class Team {
 public:
  // Runs the loop on the team; false (nothing run) when another loop holds
  // it or the calling thread runs a part of one.
  bool TryRun(int parts, int64_t n, const Fn& fn) {
    if (in_loop_) return false;
    std::unique_lock<std::mutex> run(run_mu_, std::try_to_lock);
    if (!run.owns_lock()) return false;
    while (static_cast<int>(workers_.size()) < parts - 1) {
      const int index = static_cast<int>(workers_.size()) + 1;
      workers_.emplace_back([this, index, seen = generation_] { Work(index, seen); });
      workers_.back().detach();
    }
    fn_ = &fn;
    n_ = n;
    pending_.store(parts - 1);
    ++generation_;
    state_.store(generation_ << 16 | static_cast<uint64_t>(parts));  // seq_cst: ordered against sleepers_
    if (sleepers_.load() > 0) {
      { std::lock_guard<std::mutex> lock(sleep_mu_); }
      wake_.notify_all();
    }
    in_loop_ = true;
    RunPart(fn, 0, parts, n);
    in_loop_ = false;
    while (pending_.load(std::memory_order_acquire) > 0) Pause();
    return true;
  }

 private:
  // seen: the last generation published before this worker started.
  void Work(int index, uint64_t seen) {
    in_loop_ = true;  // a part that calls ParallelFor runs it inline
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
      const int parts = static_cast<int>(state & 0xffff);
      if (index < parts) {
        RunPart(*fn_, index, parts, n_);
        pending_.fetch_sub(1, std::memory_order_release);
      }
    }
  }

  std::mutex run_mu_;  // held by the loop on the team
  std::vector<std::thread> workers_;
  uint64_t generation_ = 0;  // under run_mu_
  const Fn* fn_ = nullptr;   // the loop's; see the class comment
  int64_t n_ = 0;
  std::atomic<uint64_t> state_{0};
  std::atomic<int> pending_{0};  // worker parts of the loop not yet run
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

void ParallelFor(int parts, int64_t n, Fn fn) {
  parts = std::clamp(parts, 1, 0xffff);  // 16 bits of Team's state word
  if (parts > 1 && n > 1 && TheTeam().TryRun(parts, n, fn)) return;
  for (int p = 0; p < parts; ++p) RunPart(fn, p, parts, n);
}

int ParallelForThreads(int parts) {
  std::mutex mu;
  std::set<std::thread::id> ids;
  ParallelFor(parts, parts, [&](int, int64_t, int64_t) {
    std::lock_guard<std::mutex> lock(mu);
    ids.insert(std::this_thread::get_id());
  });
  return std::max<int>(1, static_cast<int>(ids.size()));
}

}  // namespace lede::model::cpu
