#include "policy/poll_thread.h"

#include <utility>

namespace lede::policy {

PollThread::PollThread(Clock* clock) : clock_(clock != nullptr ? clock : Clock::Real()) {}

PollThread::~PollThread() { Stop(); }

void PollThread::Start(std::function<void()> body) {
  absl::MutexLock start_lock(&start_mu_);
  if (thread_.joinable()) return;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = false;
  }
  thread_ = std::thread(std::move(body));
}

void PollThread::Stop(const std::function<void()>& interrupt) {
  absl::MutexLock start_lock(&start_mu_);
  if (!thread_.joinable()) return;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (interrupt) interrupt();
  thread_.join();
}

bool PollThread::SleepUnlessStopped(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  return !clock_->AwaitWithTimeout(&mu_, absl::Condition(&stopping_), d);
}

bool PollThread::stopping() const {
  absl::MutexLock lock(&mu_);
  return stopping_;
}

}  // namespace lede::policy
