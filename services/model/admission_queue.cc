#include "services/model/admission_queue.h"

#include <algorithm>
#include <string>

namespace lede::model_service {

AdmissionQueue::AdmissionQueue(AdmissionOptions options)
    : options_(options), clock_(options.clock != nullptr ? options.clock : clock::Clock::Real()) {}

Status AdmissionQueue::Admit(absl::Mutex* mu, const std::function<bool()>& try_admit, absl::Time deadline,
                             const std::function<bool()>& cancelled, absl::Duration* queue_time) {
  if (queue_time != nullptr) *queue_time = absl::ZeroDuration();
  if (waiting_.empty() && try_admit()) return OkStatus();
  if (n_waiting() >= options_.max_waiting) {
    return ResourceExhaustedError("every KV slot is in use and " + std::to_string(n_waiting()) +
                                  " requests are already waiting (--max-waiting " +
                                  std::to_string(options_.max_waiting) + ")");
  }
  const absl::Time start = clock_->Now();
  const uint64_t ticket = next_ticket_++;
  waiting_.push_back(ticket);
  Changed();
  for (;;) {
    if (waiting_.front() == ticket && try_admit()) {
      waiting_.pop_front();
      Changed();
      if (queue_time != nullptr) *queue_time = clock_->Now() - start;
      return OkStatus();
    }
    if (cancelled()) {
      Leave(ticket);
      return Status(StatusCode::kCancelled, "the request was cancelled while it waited for a KV slot");
    }
    const absl::Time now = clock_->Now();
    if (now >= deadline) {
      Leave(ticket);
      return DeadlineExceededError("the deadline passed after " + absl::FormatDuration(now - start) +
                                   " waiting for a KV slot");
    }
    // Real time: the clock's time is re-read when the wait ends.
    changed_.WaitWithTimeout(mu, std::min(deadline - now, options_.poll_interval));
  }
}

void AdmissionQueue::SlotFreed() { changed_.SignalAll(); }

void AdmissionQueue::Leave(uint64_t ticket) {
  waiting_.erase(std::find(waiting_.begin(), waiting_.end(), ticket));
  Changed();
}

void AdmissionQueue::Changed() {
  changed_.SignalAll();  // a new head, or the next head may find a slot too
}

}  // namespace lede::model_service
