// File: trainer/retrain_metrics.h
//
// The retraining service's progress and decisions as Prometheus metrics:
// `lede-train --watch --metrics HOST:PORT` serves them at
// /metrics (shared/telemetry/metrics_server.h), `lede-train --once` prints
// them as one logfmt line and can write them as a textfile for node
// exporter's textfile collector (--metrics-textfile). One RetrainMetrics per
// process, updated after each Retrainer::RunOnce() (trainer/retrain.h).
//
//   lede_retrain_runs_total{decision}          counter  runs by outcome: published, rejected,
//                                                       no_new_data, failed, locked (another
//                                                       retraining held the policy root)
//   lede_retrain_candidates_trained_total      counter  candidates trained and evaluated
//                                                       (= published + rejected)
//   lede_retrain_shards_read_total             counter  new shards read (request log or experience)
//   lede_retrain_shards_skipped_total{reason}  counter  new shards skipped in part or whole, by
//                                                       reason: corrupt (truncated, corrupt,
//                                                       unreadable), other_model (records of
//                                                       another model than the serving policy's)
//   lede_retrain_requests_read_total           counter  logged requests in new request-log shards
//   lede_retrain_transitions_read_total        counter  usable new transitions (td trainer)
//   lede_retrain_training_seconds_total        counter  wall time spent training candidates, seconds
//   lede_retrain_last_candidate_speedup        gauge    the last candidate's held-out replay speed-up
//                                                       over autoregressive (NaN before one)
//   lede_retrain_last_serving_speedup          gauge    the serving policy's, on the same requests
//   lede_retrain_last_training_seconds         gauge    the last candidate's training time, seconds
//   lede_retrain_last_run_seconds              gauge    the last run's wall time, seconds
//   lede_retrain_last_run_timestamp_seconds    gauge    Unix time the last run ended
//   lede_retrain_last_publish_timestamp_seconds gauge   Unix time of the last publication (0: none)
//
// The speed-up gauges are set only when the decision metric is a speed-up
// (the request log's held-out replay, or td's prompt replay); td's offline
// matched return (reward units) leaves them as they were.
//
// Thread-safety: Record*() may be called from any thread (prometheus-cpp's
// metrics are atomic); Logfmt() reads a consistent-enough snapshot for a log
// line (each value atomically). Ownership: the Registry must outlive this.
//
// Example:
//   lede::telemetry::Registry registry;
//   lede::trainer::RetrainMetrics metrics(registry);
//   StatusOr<RetrainOutcome> r = retrainer->RunOnce();
//   if (r.ok()) metrics.RecordRun(*r, seconds); else metrics.RecordFailure(seconds);
//   std::puts(metrics.Logfmt().c_str());
#ifndef LEDE_TRAINER_RETRAIN_METRICS_H_
#define LEDE_TRAINER_RETRAIN_METRICS_H_

#include <string>

#include "shared/status/status.h"
#include "shared/telemetry/metrics.h"
#include "trainer/retrain.h"

namespace lede::trainer {

class RetrainMetrics {
 public:
  // Registers the metrics above on `registry` (each decision's series starts
  // at 0, so a dashboard sees them before the first run).
  explicit RetrainMetrics(telemetry::Registry& registry);

  // A run that ended with `outcome` after `run_seconds` of wall time.
  void RecordRun(const RetrainOutcome& outcome, double run_seconds);
  // A run that failed (RunOnce returned an error) after `run_seconds`.
  void RecordFailure(double run_seconds);
  // A run refused because another retraining held the policy root's lock
  // (IsPolicyRootLocked); nothing was read or written.
  void RecordLocked(double run_seconds);

  // One logfmt line of every value, e.g.
  //   event=retrain_metrics runs_published=1 runs_rejected=0 runs_no_new_data=1 runs_failed=0
  //   candidates_trained=1 shards_read=3 shards_skipped=1 shards_skipped_other_model=1 requests_read=200
  //   transitions_read=0
  //   training_seconds=51.2 last_candidate_speedup=1.43 last_serving_speedup=1.28 ...
  std::string Logfmt() const;

  // Writes the Prometheus text exposition of `registry` to `path` atomically
  // (write + rename), as node exporter's textfile collector reads it.
  // Errors: kInternal naming the path.
  static Status WriteTextfile(const telemetry::Registry& registry, const std::string& path);

 private:
  telemetry::Counter& runs_published_;
  telemetry::Counter& runs_rejected_;
  telemetry::Counter& runs_no_new_data_;
  telemetry::Counter& runs_failed_;
  telemetry::Counter& runs_locked_;
  telemetry::Counter& candidates_trained_;
  telemetry::Counter& shards_read_;
  telemetry::Counter& shards_skipped_corrupt_;
  telemetry::Counter& shards_skipped_other_model_;
  telemetry::Counter& requests_read_;
  telemetry::Counter& transitions_read_;
  telemetry::Counter& training_seconds_;
  telemetry::Gauge& last_candidate_speedup_;
  telemetry::Gauge& last_serving_speedup_;
  telemetry::Gauge& last_training_seconds_;
  telemetry::Gauge& last_run_seconds_;
  telemetry::Gauge& last_run_timestamp_;
  telemetry::Gauge& last_publish_timestamp_;
};

}  // namespace lede::trainer

#endif  // LEDE_TRAINER_RETRAIN_METRICS_H_
