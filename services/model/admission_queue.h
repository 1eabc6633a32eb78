// File: services/model/admission_queue.h
//
// AdmissionQueue: the verifier's queue of sessions waiting for a KV slot.
// A request that finds every slot busy waits its turn in FIFO order instead
// of being refused; only a full queue refuses (kResourceExhausted). This is
// the waiting queue of an iteration-level scheduler (vLLM's
// Scheduler.waiting, TGI's queue),
// kept in the replica so that several coordinators can share it (slot
// accounting stays where the slots are).
//
// Protocol: the caller owns the mutex that guards its slots. Admit() is
// called with that mutex held; it runs `try_admit` (which allocates a slot
// or returns false) only for the waiter at the head of the queue, so slots
// go out in arrival order and a late arrival never overtakes an earlier one.
// Whoever frees a slot calls SlotFreed() (mutex held or not). While it
// waits, Admit() releases the mutex; it wakes on SlotFreed() and at least
// every `poll_interval` (of real time) to check `cancelled` and the
// deadline.
//
// Time: the deadline, and the time a request queued, are on
// AdmissionOptions::clock (the real clock by default), so tests drive them
// with a FakeClock (tests/testing/fake_clock.h) instead of sleeping. The
// caller's `deadline` must come from the same clock.
//
// Errors of Admit(): kResourceExhausted when max_waiting requests already
// wait (the message names --max-waiting); kDeadlineExceeded when `deadline`
// passes first; kCancelled when `cancelled()` turns true. A waiter that
// leaves wakes the next one, so an abandoned head never blocks the queue.
//
// Thread-safety: every method except SlotFreed() requires the caller's
// mutex (the one passed to Admit) to be held. Torch-free.
#ifndef LEDE_SERVICES_MODEL_ADMISSION_QUEUE_H_
#define LEDE_SERVICES_MODEL_ADMISSION_QUEUE_H_

#include <cstdint>
#include <deque>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "shared/clock/clock.h"
#include "shared/status/status.h"

namespace lede::model_service {

struct AdmissionOptions {
  // Requests that may wait for a slot at once (0: refuse when full, as
  // before the queue existed). Flag --max-waiting.
  int64_t max_waiting = 256;
  // How often a waiter re-checks cancellation and its deadline when no
  // slot is freed.
  absl::Duration poll_interval = absl::Milliseconds(50);
  // The time of deadlines and queue times (borrowed; nullptr =
  // Clock::Real()). Example: o.clock = &fake_clock;
  clock::Clock* clock = nullptr;
};

class AdmissionQueue {
 public:
  explicit AdmissionQueue(AdmissionOptions options = {});

  // Waits (releasing `lock` meanwhile) until `try_admit()` returns true for
  // this caller at the head of the queue; returns OK then, with `lock` held.
  // `try_admit` and `cancelled` run with `lock` held. `queue_time` (may be
  // null) receives the time spent waiting on the clock (zero on the fast
  // path).
  // Errors: as in the file comment; the caller is no longer queued then.
  Status Admit(absl::Mutex* mu, const std::function<bool()>& try_admit, absl::Time deadline,
               const std::function<bool()>& cancelled, absl::Duration* queue_time = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // A slot was freed: wake the waiters. Callable with or without the mutex.
  void SlotFreed();

  // Requests waiting now (the caller's mutex held).
  int64_t n_waiting() const { return static_cast<int64_t>(waiting_.size()); }

 private:
  void Leave(uint64_t ticket);
  void Changed();  // the queue changed: wake the waiters

  AdmissionOptions options_;
  clock::Clock* clock_;
  absl::CondVar changed_;
  std::deque<uint64_t> waiting_;  // tickets in arrival order
  uint64_t next_ticket_ = 0;
};

}  // namespace lede::model_service

#endif  // LEDE_SERVICES_MODEL_ADMISSION_QUEUE_H_
