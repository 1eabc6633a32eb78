// File: policy/poll_thread.h
//
// PollThread: the one background thread that keeps a process's exit policy
// current, shared by the policy service (services/policy/serving_policy.h:
// re-reads SERVING every reload interval) and the drafter
// (services/model/policy_follower.h: follows WatchPolicy, reconnecting with
// backoff). It owns what both need and nothing about policies: start once,
// sleep on an injectable Clock unless stopped, stop by waking the sleep,
// interrupting a blocking call the caller names, and joining.
//
// A body runs once on the thread and loops on its own terms, e.g.
//   PollThread poll(clock);
//   poll.Start([&] { do Reload(); while (poll.SleepUnlessStopped(interval)); });
//   ...
//   poll.Stop();            // wakes the sleep, joins
// or, when the body blocks in something else (a streaming RPC):
//   poll.Stop([&] { absl::MutexLock l(&mu); if (ctx) ctx->TryCancel(); });
//
// Stop() sets stopping() before it calls `interrupt`, so a body that checks
// stopping() under the same lock it publishes its blocking call under is
// either stopped before it blocks or interrupted after.
//
// Thread-safety: every method may be called from any thread; Start() and
// Stop() are serialized among themselves. The body must not call Start() or
// Stop() on its own PollThread. Ownership: the Clock is borrowed and must
// outlive the PollThread.
#ifndef LEDE_POLICY_POLL_THREAD_H_
#define LEDE_POLICY_POLL_THREAD_H_

#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "shared/clock/clock.h"

namespace lede::policy {

class PollThread {
 public:
  // `clock` times SleepUnlessStopped (nullptr = Clock::Real(); tests pass a
  // FakeClock). Starts nothing.
  explicit PollThread(Clock* clock = nullptr);
  ~PollThread();  // Stop()
  PollThread(const PollThread&) = delete;
  PollThread& operator=(const PollThread&) = delete;

  // Starts a thread running `body` once, with stopping() false. A no-op
  // while a thread started earlier has not been stopped; after Stop(), starts
  // a new one.
  void Start(std::function<void()> body) ABSL_LOCKS_EXCLUDED(start_mu_, mu_);

  // Sets stopping(), wakes SleepUnlessStopped, calls `interrupt` (when set;
  // to cancel what the body blocks in) and joins the thread. A no-op when no
  // thread runs.
  void Stop(const std::function<void()>& interrupt = nullptr) ABSL_LOCKS_EXCLUDED(start_mu_, mu_);

  // Waits up to `d` on the clock; returns false as soon as Stop() is called
  // (or already was), true when `d` passed.
  bool SleepUnlessStopped(absl::Duration d) ABSL_LOCKS_EXCLUDED(mu_);

  // Whether Stop() has been called since the last Start().
  bool stopping() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  Clock* const clock_;
  absl::Mutex start_mu_ ABSL_ACQUIRED_BEFORE(mu_);  // serializes Start() / Stop()
  std::thread thread_;                              // touched under start_mu_
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace lede::policy

#endif  // LEDE_POLICY_POLL_THREAD_H_
