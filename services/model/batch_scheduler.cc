#include "services/model/batch_scheduler.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "shared/telemetry/metrics.h"

namespace lede::model_service {

BatchScheduler::BatchScheduler(BatchSchedulerOptions options, RunFn run)
    : options_(std::move(options)), run_(std::move(run)) {}

BatchScheduler::~BatchScheduler() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  auto idle = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return n_running_ == 0 && ready_.empty(); };
  mu_.Await(absl::Condition(&idle));
}

int64_t BatchScheduler::n_ready() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(ready_.size());
}

void BatchScheduler::set_n_sessions(int64_t n) {
  absl::MutexLock lock(&mu_);
  n_sessions_ = std::max<int64_t>(0, n);
}

int64_t BatchScheduler::ShareLocked() const {
  const int64_t max_batch = std::max<int64_t>(1, options_.max_batch);
  if (n_sessions_ <= 0) return max_batch;  // sessions unknown: as many as wait
  int64_t free_places = std::max(1, std::max(1, options_.n_workers) - n_running_);
  const int64_t to_come = std::max(n_sessions_ - n_taken_, static_cast<int64_t>(ready_.size()));
  if (options_.min_split_rows > 0 && free_places > 1) {
    const double rows = static_cast<double>(to_come) * recent_rows_;
    free_places = std::clamp<int64_t>(static_cast<int64_t>(rows / static_cast<double>(options_.min_split_rows)),
                                      1, free_places);
  }
  return std::max<int64_t>(1, std::min(max_batch, (to_come + free_places - 1) / free_places));
}

bool BatchScheduler::Submit(void* job, int64_t n_rows) {
  Entry entry{job, n_rows, false, absl::Now()};
  const int n_runners = std::max(1, options_.n_workers);
  absl::MutexLock lock(&mu_);
  if (stopping_) return false;
  // A job of min_split_rows or more (a prefill chunk) is a step's worth of
  // rows on its own and says nothing of the rows of the sessions' rounds.
  if (n_rows < options_.min_split_rows) {
    recent_rows_ = (recent_rows_ * 15 + static_cast<double>(std::max<int64_t>(1, n_rows))) / 16;
  }
  ready_.push_back(&entry);
  ready_rows_ += n_rows;
  // Done, or a runner's place is free and this job is the oldest waiting:
  // this thread runs the next batch (the oldest jobs, its own first). Only
  // the oldest submitter wakes for a free place, not every waiter. A job
  // that another runner took is no longer in ready_ and waits for done
  // (front() of an empty deque is undefined: it once returned this entry's
  // stale slot and the thread ran empty batches in a loop).
  // With min_split_rows, a second batch starts beside a running one only
  // with that many rows waiting: fewer wait for the running batch to end
  // and join the next one (two batches of 10 and 6 one-row sessions would
  // read the weights twice per round, and stay apart from then on).
  auto wake = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return entry.done || (n_running_ < n_runners && !ready_.empty() && ready_.front() == &entry &&
                          (options_.min_split_rows <= 0 || n_running_ == 0 ||
                           ready_rows_ >= options_.min_split_rows));
  };
  // The oldest, with a free place, waits for the batch to fill: only this
  // thread starts batches meanwhile, so its place and its job stay its own.
  auto filled = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return stopping_ || n_sessions_ <= 0 || static_cast<int64_t>(ready_.size()) >= ShareLocked();
  };
  while (true) {
    mu_.Await(absl::Condition(&wake));
    if (entry.done) return true;
    const absl::Duration max_wait = std::max(options_.max_wait, recent_run_ * options_.wait_fraction);
    if (max_wait > absl::ZeroDuration()) {
      // From when this job may start (its arrival, or the end of the batch
      // it waited for): the sessions of a batch that just ended come back
      // now, and a batch started without them splits the sessions into
      // two groups that alternate from then on.
      mu_.AwaitWithDeadline(absl::Condition(&filled), std::max(entry.arrival, absl::Now()) + max_wait);
    }
    const int64_t take = ShareLocked();  // <= max_batch
    const int64_t row_budget = options_.max_batch_tokens > 0 ? options_.max_batch_tokens
                                                             : std::numeric_limits<int64_t>::max();
    std::vector<Entry*> batch;
    std::vector<void*> jobs;
    int64_t rows = 0;
    // Its first job whatever its size (a long chunk still runs), then while
    // the rows stay within the token budget.
    while (!ready_.empty() && static_cast<int64_t>(batch.size()) < take &&
           (batch.empty() || rows + ready_.front()->n_rows <= row_budget)) {
      batch.push_back(ready_.front());
      jobs.push_back(ready_.front()->job);
      rows += ready_.front()->n_rows;
      ready_rows_ -= ready_.front()->n_rows;
      ready_.pop_front();
    }
    ++n_running_;
    n_taken_ += static_cast<int64_t>(batch.size());
    mu_.Unlock();
    if (options_.batch_size) options_.batch_size->Observe(static_cast<double>(batch.size()));
    if (options_.batch_rows) options_.batch_rows->Observe(static_cast<double>(rows));
    const absl::Time start = absl::Now();
    run_(jobs);
    const absl::Duration ran = absl::Now() - start;
    mu_.Lock();
    recent_run_ = recent_run_ == absl::ZeroDuration() ? ran : (recent_run_ * 3 + ran) / 4;
    --n_running_;
    n_taken_ -= static_cast<int64_t>(batch.size());
    for (Entry* e : batch) e->done = true;  // their submitters wake when mu_ is released
  }
}

}  // namespace lede::model_service
