#include "services/model/batch_scheduler.h"

#include <algorithm>
#include <utility>

#include "shared/telemetry/metrics.h"

namespace lede::model_service {

BatchScheduler::BatchScheduler(BatchSchedulerOptions options, RunFn run)
    : options_(std::move(options)), run_(std::move(run)) {
  thread_ = std::thread([this] { Loop(); });
}

BatchScheduler::~BatchScheduler() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

bool BatchScheduler::Submit(void* job, int64_t n_rows) {
  Entry entry{job, n_rows, false};
  absl::MutexLock lock(&mu_);
  if (stopping_) return false;
  ready_.push_back(&entry);
  mu_.Await(absl::Condition(&entry.done));
  return true;
}

int64_t BatchScheduler::n_ready() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(ready_.size());
}

void BatchScheduler::Loop() {
  const int64_t max_batch = std::max<int64_t>(1, options_.max_batch);
  std::vector<Entry*> batch;
  std::vector<void*> jobs;
  absl::MutexLock lock(&mu_);
  while (true) {
    auto has_work = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stopping_ || !ready_.empty(); };
    mu_.Await(absl::Condition(&has_work));
    if (ready_.empty() && stopping_) return;
    batch.clear();
    jobs.clear();
    int64_t rows = 0;
    while (!ready_.empty() && static_cast<int64_t>(batch.size()) < max_batch) {
      batch.push_back(ready_.front());
      jobs.push_back(ready_.front()->job);
      rows += ready_.front()->n_rows;
      ready_.pop_front();
    }
    mu_.Unlock();
    if (options_.batch_size) options_.batch_size->Observe(static_cast<double>(batch.size()));
    if (options_.batch_rows) options_.batch_rows->Observe(static_cast<double>(rows));
    run_(jobs);
    mu_.Lock();
    for (Entry* e : batch) e->done = true;  // their submitters wake when mu_ is released
  }
}

}  // namespace lede::model_service
