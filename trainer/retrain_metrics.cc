#include "trainer/retrain_metrics.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>

#include "shared/file/file.h"

namespace lede::trainer {
namespace {

using telemetry::Counter;
using telemetry::CounterFamily;
using telemetry::Gauge;
using telemetry::Registry;
using telemetry::UnlabelledCounter;
using telemetry::UnlabelledGauge;

Counter& RunsCounter(Registry& r, const char* decision) {
  return CounterFamily(r, "lede_retrain_runs_total",
                       "Retraining runs by outcome: published, rejected, no_new_data, failed, locked.")
      .Add({{"decision", decision}});
}

Counter& SkippedCounter(Registry& r, const char* reason) {
  return CounterFamily(r, "lede_retrain_shards_skipped_total",
                       "New shards skipped in part or whole, by reason: corrupt (truncated, corrupt or "
                       "unreadable), other_model (records of another model than the serving policy's).")
      .Add({{"reason", reason}});
}

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void Append(std::string* line, const char* key, double value) {
  char buf[96];
  if (std::isnan(value)) {
    std::snprintf(buf, sizeof(buf), " %s=NaN", key);
  } else if (value == std::floor(value) && std::fabs(value) < 1e15) {
    std::snprintf(buf, sizeof(buf), " %s=%.0f", key, value);
  } else {
    std::snprintf(buf, sizeof(buf), " %s=%.4f", key, value);
  }
  *line += buf;
}

}  // namespace

RetrainMetrics::RetrainMetrics(Registry& r)
    : runs_published_(RunsCounter(r, "published")),
      runs_rejected_(RunsCounter(r, "rejected")),
      runs_no_new_data_(RunsCounter(r, "no_new_data")),
      runs_failed_(RunsCounter(r, "failed")),
      runs_locked_(RunsCounter(r, "locked")),
      candidates_trained_(UnlabelledCounter(r, "lede_retrain_candidates_trained_total",
                                            "Candidate policies trained and evaluated (published or rejected).")),
      shards_read_(
          UnlabelledCounter(r, "lede_retrain_shards_read_total", "New shards read (request log or experience).")),
      shards_skipped_corrupt_(SkippedCounter(r, "corrupt")),
      shards_skipped_other_model_(SkippedCounter(r, "other_model")),
      requests_read_(UnlabelledCounter(r, "lede_retrain_requests_read_total",
                                       "Logged requests read from new request-log shards.")),
      transitions_read_(UnlabelledCounter(r, "lede_retrain_transitions_read_total",
                                          "Usable new experience transitions read (td trainer).")),
      training_seconds_(
          UnlabelledCounter(r, "lede_retrain_training_seconds_total", "Wall time spent training candidates, seconds.")),
      last_candidate_speedup_(UnlabelledGauge(r, "lede_retrain_last_candidate_speedup",
                                              "The last candidate's held-out replay speed-up over autoregressive.")),
      last_serving_speedup_(UnlabelledGauge(r, "lede_retrain_last_serving_speedup",
                                            "The serving policy's held-out replay speed-up, on the same requests.")),
      last_training_seconds_(
          UnlabelledGauge(r, "lede_retrain_last_training_seconds", "The last candidate's training time, seconds.")),
      last_run_seconds_(UnlabelledGauge(r, "lede_retrain_last_run_seconds", "The last run's wall time, seconds.")),
      last_run_timestamp_(
          UnlabelledGauge(r, "lede_retrain_last_run_timestamp_seconds", "Unix time the last run ended, seconds.")),
      last_publish_timestamp_(UnlabelledGauge(r, "lede_retrain_last_publish_timestamp_seconds",
                                              "Unix time of the last publication, seconds (0: none yet).")) {
  last_candidate_speedup_.Set(std::numeric_limits<double>::quiet_NaN());
  last_serving_speedup_.Set(std::numeric_limits<double>::quiet_NaN());
}

void RetrainMetrics::RecordRun(const RetrainOutcome& o, double run_seconds) {
  switch (o.decision) {
    case RetrainDecision::kPublished:
      runs_published_.Increment();
      last_publish_timestamp_.Set(UnixNow());
      break;
    case RetrainDecision::kRejected:
      runs_rejected_.Increment();
      break;
    case RetrainDecision::kNoNewData:
      runs_no_new_data_.Increment();
      break;
  }
  const bool trained = o.decision != RetrainDecision::kNoNewData;
  if (trained) candidates_trained_.Increment();
  shards_read_.Increment(static_cast<double>(o.n_new_shards));
  shards_skipped_corrupt_.Increment(static_cast<double>(o.n_bad_shards));
  shards_skipped_other_model_.Increment(static_cast<double>(o.n_other_model_shards));
  requests_read_.Increment(static_cast<double>(o.n_new_requests));
  transitions_read_.Increment(static_cast<double>(o.n_new_transitions));
  if (o.train_seconds > 0) training_seconds_.Increment(o.train_seconds);
  if (trained) {
    last_training_seconds_.Set(o.train_seconds);
    if (o.metric_name == "heldout_replay_speedup" || o.metric_name == "replay_predicted_speedup") {
      last_candidate_speedup_.Set(o.candidate_metric);
      last_serving_speedup_.Set(o.serving_metric);
    }
  }
  last_run_seconds_.Set(run_seconds);
  last_run_timestamp_.Set(UnixNow());
}

void RetrainMetrics::RecordFailure(double run_seconds) {
  runs_failed_.Increment();
  last_run_seconds_.Set(run_seconds);
  last_run_timestamp_.Set(UnixNow());
}

void RetrainMetrics::RecordLocked(double run_seconds) {
  runs_locked_.Increment();
  last_run_seconds_.Set(run_seconds);
  last_run_timestamp_.Set(UnixNow());
}

std::string RetrainMetrics::Logfmt() const {
  std::string line = "event=retrain_metrics";
  Append(&line, "runs_published", runs_published_.Value());
  Append(&line, "runs_rejected", runs_rejected_.Value());
  Append(&line, "runs_no_new_data", runs_no_new_data_.Value());
  Append(&line, "runs_failed", runs_failed_.Value());
  Append(&line, "runs_locked", runs_locked_.Value());
  Append(&line, "candidates_trained", candidates_trained_.Value());
  Append(&line, "shards_read", shards_read_.Value());
  Append(&line, "shards_skipped", shards_skipped_corrupt_.Value() + shards_skipped_other_model_.Value());
  Append(&line, "shards_skipped_other_model", shards_skipped_other_model_.Value());
  Append(&line, "requests_read", requests_read_.Value());
  Append(&line, "transitions_read", transitions_read_.Value());
  Append(&line, "training_seconds", training_seconds_.Value());
  Append(&line, "last_candidate_speedup", last_candidate_speedup_.Value());
  Append(&line, "last_serving_speedup", last_serving_speedup_.Value());
  Append(&line, "last_training_seconds", last_training_seconds_.Value());
  Append(&line, "last_run_seconds", last_run_seconds_.Value());
  return line;
}

Status RetrainMetrics::WriteTextfile(const Registry& registry, const std::string& path) {
  return file::WriteFileAtomically(path, telemetry::SerializeText(registry));
}

}  // namespace lede::trainer
