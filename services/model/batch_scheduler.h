// File: services/model/batch_scheduler.h
//
// BatchScheduler: the verifier's iteration-level scheduler (continuous
// batching; vLLM's Scheduler.running, TGI's batching loop). Handler
// threads Submit() one job each (a session's prefill chunk or round
// verification) and block until it ran. Up to n_workers batches run at a
// time, each on one of the submitting threads (flat combining: no scheduler
// thread, no hand-off): the oldest waiting submitter, when a runner's place
// is free, takes the waiting jobs in arrival order, up to its share (below)
// and max_batch, and hands them to the run function as one batch (the model service runs
// model::RunBatch: one pass over the weights for all of them), then marks
// them done; jobs submitted while batches run form the next ones. Sessions
// join and leave the batch at round boundaries.
//
// Filling a batch: the open sessions (set_n_sessions) are shared out among
// the runner places. The submitter that may start the next batch takes a
// share of ceil(sessions still to come / free places) jobs (fewer places
// when the sessions bring few rows: min_split_rows), sessions still
// to come being the open ones not in a running batch, and waits, up to
// max_wait after its job could start (or wait_fraction of the recent batches'
// run time, when longer), until that many are there. A session
// between two of its rounds (its coordinator streaming, its drafter
// drafting) is a job that will come; starting without it split 16 AR
// streams into batches of one or two (75% of the steps ran alone, each at
// the price of a solo step), and one batch of every session would leave
// the second runner, and a core, idle. With one runner the share is every
// session (vLLM's one batch per step); at one open session, sessions
// unknown, or max_wait and wait_fraction 0, a job runs at once, as without a scheduler
// (Triton's dynamic batcher has the same two knobs: preferred batch size
// and max queue delay).
//
// A batch also holds at most max_batch_tokens rows (vLLM's token budget
// per step), so that compute-bound work (prompts that came together) is
// spread over the runners instead of one long batch.
//
// Jobs are opaque here (torch-free): the run function knows their type.
// The scheduler does not look at deadlines or cancellation: a job, once
// submitted, runs in a coming batch (a step is bounded: one forward over at
// most max_batch sessions' rows), and the handler checks its caller between
// jobs (a chunked prefill stops at the next chunk boundary).
//
// Metrics (when given): lede_iteration_batch_size (jobs per batch) and
// lede_iteration_tokens (rows per batch, as the job sizes the submitters
// declare) per batch.
//
// Thread-safety: Submit() is thread-safe and blocks the caller until its job
// ran (the caller may run other callers' jobs meanwhile); the run function is
// called on submitting threads, up to n_workers calls at once on disjoint
// jobs, and must not throw. The destructor waits for the batches in flight;
// Submit() after it began returns false without running the job.
#ifndef LEDE_SERVICES_MODEL_BATCH_SCHEDULER_H_
#define LEDE_SERVICES_MODEL_BATCH_SCHEDULER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace prometheus {
class Histogram;
}

namespace lede::model_service {

struct BatchSchedulerOptions {
  // Jobs per batch, >= 1 (--max-batch). The service runs jobs on the
  // handler threads without a scheduler at 1 (today's one-sequence passes).
  int64_t max_batch = 8;
  // Batches that may run at once (--batch-workers): with 2 a second batch
  // runs while the first computes, so both cores of this machine work (as
  // two handler threads do at --max-batch 1) without the spin-waits of an
  // OpenMP team; sessions split between the two.
  int n_workers = 1;
  // Longest a batch's start waits for sessions still to come (see the file
  // comment; --batch-wait-us). Zero: start as soon as a runner is free.
  absl::Duration max_wait = absl::ZeroDuration();
  // The wait may also run to this fraction of the recent batches' run time
  // (an average of the last few, wall-clock), when that is longer than
  // max_wait (--batch-wait-fraction). A step bound by reading the weights
  // costs about as much with 16 sessions as with 4 (measured: the
  // factor-5 model's 16-row step was 2.4x a 1-row step), so a batch that
  // waits a fraction of a step for the sessions between their rounds gains
  // more than the wait costs; a fixed 500 us was shorter than one
  // session's round trip through the coordinator on a busy 2-core machine,
  // and 16 autoregressive streams ran 3.3 sessions per step. 0: max_wait
  // alone.
  double wait_fraction = 0.0;
  // With more than one runner: the open sessions are shared out among only
  // as many places as they bring rows, min_split_rows each (rows per job
  // averaged over recent jobs smaller than that; --batch-split-rows), and a
  // batch starts beside a running one only with that many rows waiting. Below it a step is
  // bound by reading the weights and two batches read them twice, where
  // one batch shares the read: 16 autoregressive streams (1 row each) run
  // as one batch, 16 LEDE rounds (K + 1 rows each) as two. 0: always
  // share among the free places.
  int64_t min_split_rows = 0;
  // Rows (tokens) per batch, vLLM's max_num_batched_tokens (--max-batch-tokens):
  // a batch takes its first job whatever its size, then jobs while their
  // rows stay within this. Above a few tens of rows a CPU step is bound by
  // computing, so a larger batch gains nothing and holds its core while
  // the other idles: 15 prompts that arrived together once ran as one
  // 444-row batch for 730 ms on one core. 0: no limit.
  int64_t max_batch_tokens = 0;
  // Observed once per batch when not null (borrowed; outlive the scheduler).
  prometheus::Histogram* batch_size = nullptr;  // lede_iteration_batch_size
  prometheus::Histogram* batch_rows = nullptr;  // lede_iteration_tokens
  // Example: BatchSchedulerOptions{.max_batch = 16}
};

class BatchScheduler {
 public:
  // Runs one batch: `jobs` (1 to max_batch, in arrival order) are the
  // pointers given to Submit(); it must finish every job (write its result
  // into it) before returning, and must not throw. Called on a submitting
  // thread.
  using RunFn = std::function<void(const std::vector<void*>& jobs)>;

  BatchScheduler(BatchSchedulerOptions options, RunFn run);
  ~BatchScheduler();
  BatchScheduler(const BatchScheduler&) = delete;
  BatchScheduler& operator=(const BatchScheduler&) = delete;

  // Queues `job` (borrowed until this returns) of `n_rows` rows (for the
  // rows metric) and blocks until a batch with it ran, running batches on
  // this thread when a runner's place is free. Returns false, without
  // running it, when the scheduler is stopping.
  bool Submit(void* job, int64_t n_rows);

  int64_t max_batch() const { return options_.max_batch; }
  // Jobs submitted and not yet taken into a batch (thread-safe).
  int64_t n_ready() const;
  // The sessions that may submit jobs (the service's open sessions), for
  // filling batches; before the first call the scheduler fills none.
  // Thread-safe; a submitter waiting to fill re-checks at once.
  void set_n_sessions(int64_t n);

 private:
  struct Entry {
    void* job;
    int64_t n_rows;
    bool done;
    absl::Time arrival;
  };

  // The next batch's share of the sessions (mu_ held): see the file comment.
  int64_t ShareLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const BatchSchedulerOptions options_;
  const RunFn run_;
  mutable absl::Mutex mu_;
  std::deque<Entry*> ready_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int n_running_ ABSL_GUARDED_BY(mu_) = 0;  // batches running now
  int64_t n_taken_ ABSL_GUARDED_BY(mu_) = 0;   // jobs in the batches running now
  int64_t n_sessions_ ABSL_GUARDED_BY(mu_) = 0;  // set_n_sessions; 0 = unknown
  // Exponential average (weight 1/4 on the newest) of the run function's
  // wall time per batch; zero before the first batch.
  absl::Duration recent_run_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  // Exponential average (weight 1/16 on the newest) of the rows per
  // submitted job of fewer than min_split_rows rows (a session's round, not
  // a prefill chunk: 25-token prompts of 16 sessions split 16 one-row
  // autoregressive sessions into two batches for the next steps).
  double recent_rows_ ABSL_GUARDED_BY(mu_) = 1.0;
  int64_t ready_rows_ ABSL_GUARDED_BY(mu_) = 0;  // rows of the jobs in ready_
};

}  // namespace lede::model_service

#endif  // LEDE_SERVICES_MODEL_BATCH_SCHEDULER_H_
