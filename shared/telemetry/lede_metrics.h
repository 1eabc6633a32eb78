// File: shared/telemetry/lede_metrics.h
//
// The project's metric names (docs/design.md §6), defined once, on prometheus-cpp
// (metrics.h). Names and bucket boundaries follow vLLM's (vllm/v1/metrics/
// loggers.py, vllm/v1/spec_decode/metrics.py; see docs/metrics.md) under
// the lede_ prefix, so a vLLM dashboard ports by renaming `vllm:` to `lede_`;
// LEDE's own metrics (exit layer, draft length, policy) sit beside them.
// Units are in the name (seconds, tokens) and in the help text.
//
//   vLLM-compatible                                   LEDE's own
//   lede_spec_decode_num_drafts_total                 lede_spec_decode_num_emitted_tokens_total
//   lede_spec_decode_num_draft_tokens_total           lede_spec_decode_acceptance_length
//   lede_spec_decode_num_accepted_tokens_total        lede_spec_decode_exit_layer
//   lede_spec_decode_num_accepted_tokens_per_pos_total{position}
//                                                     lede_spec_decode_draft_length
//   lede_time_to_first_token_seconds                  lede_round_latency_seconds
//   lede_inter_token_latency_seconds                  lede_requests_total{method,status}
//   lede_e2e_request_latency_seconds                  lede_policy_decision_latency_seconds
//   lede_request_success_total{finished_reason}       lede_policy_version{version}
//   lede_prompt_tokens_total                          lede_policy_version_number
//   lede_generation_tokens_total                      lede_policy_reloads_total{outcome}
//   lede_num_requests_running                         lede_kv_slots_in_use, _capacity,
//                                                     lede_kv_cache_usage_perc
//   lede_num_requests_waiting                         lede_experience_{records_written,
//   lede_request_queue_time_seconds                     records_dropped,shards_written}_total
//   lede_iteration_tokens (vllm:iteration_tokens_total) lede_iteration_batch_size
//   lede_draft_batch_size
//
// Every process builds one SpecDecodeMetrics on its Registry and serves it
// with MetricsServer. All metrics are registered by every process (simplest;
// a few idle series cost nothing): unlabelled metrics appear at 0 from the
// start, labelled ones once a label set is used. Constructing it twice on the
// same Registry shares the metrics (prometheus-cpp merges a re-registration
// with the same name, type and labels).
//
// Dashboards (rate windows to taste; vLLM computes the same in PromQL):
//   acceptance rate  sum(rate(lede_spec_decode_num_accepted_tokens_total[1m]))
//                  / sum(rate(lede_spec_decode_num_draft_tokens_total[1m]))
//   mean acceptance length (tokens per speculation round)
//                    1 + sum(rate(lede_spec_decode_num_accepted_tokens_total[1m]))
//                      / sum(rate(lede_spec_decode_num_drafts_total[1m]))
//   serving policy   lede_policy_version == 1   (see below)
//
// Info-gauge pattern for lede_policy_version{version}: the series for the
// current version is 1 and every earlier version seen by this process is 0
// (series are never deleted, so references stay valid); `max by (version)
// (lede_policy_version) == 1` names the version each process serves.
// lede_policy_version_number carries the same version as a number so a
// panel can plot it and `changes()` can count reloads.
//
// Thread-safety: every member may be used from any thread (prometheus-cpp's
// metrics are atomic). SetPolicyVersion() and the per-position counters take
// a mutex. Ownership: the Registry must outlive this struct; the references
// point into it.
//
// Example:
//   lede::telemetry::Registry registry;
//   lede::telemetry::SpecDecodeMetrics metrics(registry);
//   metrics.RecordRound(/*exit_layer=*/4, /*n_drafted=*/5, /*n_accepted=*/3,
//                       /*latency_s=*/0.012);
//   metrics.RecordRequest("Generate", lede::StatusCode::kOk, /*latency_s=*/0.8);
//   metrics.RecordSuccess("length");
//   metrics.SetPolicyVersion("v3", lede::telemetry::PolicyVersionNumber("v3"));
#ifndef LEDE_SHARED_TELEMETRY_LEDE_METRICS_H_
#define LEDE_SHARED_TELEMETRY_LEDE_METRICS_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "shared/status/status.h"
#include "shared/telemetry/metrics.h"

namespace lede::telemetry {

// Bucket sets, shared so that dashboards and tests agree.
std::vector<double> TokenCountBuckets();         // 0, 1, ..., 16 (tokens per round)
std::vector<double> ExitLayerBuckets();          // 1, 2, ..., 32 (layer index)
std::vector<double> RoundLatencyBuckets();       // 0.25 ms .. ~8 s, seconds
// vLLM's boundaries (seconds): TTFT 0.001 .. 2560 (22 bounds), inter-token
// latency 0.01 .. 80 (19 bounds), end-to-end request latency 0.3 .. 7680
// (21 bounds).
std::vector<double> TimeToFirstTokenBuckets();
std::vector<double> InterTokenLatencyBuckets();
std::vector<double> RequestLatencyBuckets();
// One exit decision: 1 us .. 1 s in a 1-2.5-5 series (in-process DQN ~0.4 us,
// a remote Decide ~0.7 ms), seconds.
std::vector<double> DecisionLatencyBuckets();

// Speculative positions with their own lede_spec_decode_num_accepted_tokens_per_pos_total
// series; accepted tokens at deeper positions are counted at the last one.
inline constexpr int kMaxAcceptedPositions = 16;

// The gRPC name of a status code ("OK", "INVALID_ARGUMENT", ...), the
// `status` label of lede_requests_total.
std::string GrpcCodeName(StatusCode code);

// A number for lede_policy_version_number from a version name (artifact.h:
// "v3", "20250101-1200"): its decimal digits read as one integer (3,
// 202501011200), at most the first 15 digits so it is exact as a double;
// 0 if there are none.
double PolicyVersionNumber(std::string_view version);

// The metrics, in groups by what they watch; SpecDecodeMetrics (below)
// registers them all. Each group registers its families when constructed,
// in the order of its fields. Thread-safety and ownership: as above.

// Speculative decoding: rounds, draft and accepted tokens (counters in
// tokens or rounds).
struct SpeculationMetrics {
  explicit SpeculationMetrics(Registry& registry);
  SpeculationMetrics(const SpeculationMetrics&) = delete;
  SpeculationMetrics& operator=(const SpeculationMetrics&) = delete;

  // One decode round. A speculation round (n_drafted > 0) drafted n_drafted
  // tokens at `exit_layer` and kept n_accepted of them, then the verifier
  // added one more: num_drafts += 1, num_draft_tokens += n_drafted,
  // num_accepted_tokens += n_accepted, accepted_per_pos{position=i} += 1 for
  // i in [0, n_accepted), num_emitted_tokens += n_accepted + 1, and one
  // observation each of acceptance_length (n_accepted), draft_length
  // (n_drafted) and exit_layer. An autoregressive step (n_drafted == 0)
  // only adds 1 to num_emitted_tokens (exit_layer is ignored). Both observe
  // round_latency (latency_s, seconds; skipped if negative or NaN).
  // Out-of-range arguments are clamped (n_drafted to >= 0, n_accepted to
  // [0, n_drafted]) rather than aborting the server; the counters stay
  // consistent: accepted <= draft tokens, emitted = accepted + rounds.
  // Does not touch lede_generation_tokens_total: a round may emit tokens past
  // EOS or max_tokens that the request then drops; count those separately.
  void RecordRound(int exit_layer, int n_drafted, int n_accepted, double latency_s);

  // The counter of accepted tokens at draft position `position` (0-based;
  // clamped to [0, kMaxAcceptedPositions - 1]); created on first use.
  Counter& AcceptedAtPosition(int position);

  Counter& num_drafts;            // lede_spec_decode_num_drafts_total
  Counter& num_draft_tokens;      // lede_spec_decode_num_draft_tokens_total
  Counter& num_accepted_tokens;   // lede_spec_decode_num_accepted_tokens_total
  Family<Counter>& accepted_per_pos;  // lede_spec_decode_num_accepted_tokens_per_pos_total{position}
  Counter& num_emitted_tokens;    // lede_spec_decode_num_emitted_tokens_total
  Histogram& acceptance_length;   // lede_spec_decode_acceptance_length (accepted drafts/round)
  Histogram& exit_layer;          // lede_spec_decode_exit_layer
  Histogram& draft_length;        // lede_spec_decode_draft_length
  Histogram& round_latency;       // lede_round_latency_seconds
  // Autoregressive steps of speculative requests taken because the load was
  // above the coordinator's --speculation-max-load (rounds).
  Counter& load_disabled_rounds;  // lede_spec_decode_load_disabled_rounds_total

 private:
  absl::Mutex pos_mu_;
  std::vector<Counter*> per_pos_ ABSL_GUARDED_BY(pos_mu_);  // [kMaxAcceptedPositions], lazily filled
};

// Requests: outcomes, tokens, latencies and the queue.
struct RequestMetrics {
  explicit RequestMetrics(Registry& registry);
  RequestMetrics(const RequestMetrics&) = delete;
  RequestMetrics& operator=(const RequestMetrics&) = delete;

  // A finished request: lede_requests_total{method, status=GrpcCodeName(code)}
  // += 1 and one e2e_request_latency observation (latency_s, seconds; skipped
  // if negative). `method` is the decoding method or RPC name, e.g. "lede",
  // "Decide". Takes the family mutex (a map lookup); fine once per request.
  void RecordRequest(std::string_view method, StatusCode code, double latency_s);

  // A request that completed: lede_request_success_total{finished_reason}
  // += 1, with vLLM's reasons "stop" (EOS or a stop string), "length"
  // (max tokens or the context), "abort" (cancelled by the client).
  void RecordSuccess(std::string_view finished_reason);

  Family<Counter>& requests;         // lede_requests_total{method,status}
  Family<Counter>& request_success;  // lede_request_success_total{finished_reason}
  Counter& generation_tokens;        // lede_generation_tokens_total
  Counter& prompt_tokens;            // lede_prompt_tokens_total
  Histogram& time_to_first_token;    // lede_time_to_first_token_seconds
  Histogram& inter_token_latency;    // lede_inter_token_latency_seconds
  Histogram& e2e_request_latency;    // lede_e2e_request_latency_seconds
  Gauge& num_requests_running;       // lede_num_requests_running (holding a KV slot)
  Gauge& num_requests_waiting;       // lede_num_requests_waiting (admitted, no slot yet)
  // lede_request_queue_time_seconds: the verifier's FIFO wait for a KV slot
  // (vLLM's vllm:request_queue_time_seconds). The coordinators' two gauges
  // above count their own requests, the queued ones among the waiting.
  Histogram& request_queue_time;
};

// Batched steps (continuous batching, --max-batch): sessions and rows per
// step. Without a scheduler (--max-batch 1) every call is a step of one
// session.
struct BatchMetrics {
  explicit BatchMetrics(Registry& registry);

  Histogram& iteration_batch_size;  // lede_iteration_batch_size (sessions)
  Histogram& iteration_tokens;      // lede_iteration_tokens (rows; vLLM's iteration_tokens_total)
  // The drafter's batched steps (--max-batch > 1): sessions whose draft
  // step or phase-1 probe ran in one pass (one row each).
  Histogram& draft_batch_size;      // lede_draft_batch_size (sessions)
};

// The exit policy: decision latency, the serving version, reloads.
struct ExitPolicyMetrics {
  explicit ExitPolicyMetrics(Registry& registry);
  ExitPolicyMetrics(const ExitPolicyMetrics&) = delete;
  ExitPolicyMetrics& operator=(const ExitPolicyMetrics&) = delete;

  // Makes `version` the serving policy: lede_policy_version{version} = 1, the
  // previously current version's series = 0, lede_policy_version_number =
  // `version_number`.
  void SetPolicyVersion(const std::string& version, double version_number);

  // lede_policy_reloads_total{outcome="ok"|"rejected"} += 1.
  void RecordPolicyReload(bool accepted);

  Histogram& policy_decision_latency;  // lede_policy_decision_latency_seconds
  Family<Gauge>& policy_version;  // lede_policy_version{version} (info gauge)
  Gauge& policy_version_number;   // lede_policy_version_number
  Family<Counter>& policy_reloads;  // lede_policy_reloads_total{outcome}

 private:
  absl::Mutex version_mu_;
  Gauge* current_version_ ABSL_GUARDED_BY(version_mu_) = nullptr;
};

// The KV cache's sequence slots.
struct KvSlotMetrics {
  explicit KvSlotMetrics(Registry& registry);

  Gauge& kv_slots_in_use;         // lede_kv_slots_in_use
  // Capacity is lede_kv_slots_capacity, not lede_kv_slots_total: "_total"
  // is reserved for counters (promtool check metrics rejects it on a gauge).
  Gauge& kv_slots_capacity;       // lede_kv_slots_capacity
  // Blocks held / blocks in the pool, 0-1 (model::KvCache paged; a pool
  // backed in full: slots in use / slots).
  Gauge& kv_cache_usage;          // lede_kv_cache_usage_perc
};

// The deployment's measured step costs (model services; windowed medians of
// shared/experience/served_costs.h ServedCostMeter).
struct StepCostMetrics {
  explicit StepCostMetrics(Registry& registry);

  // Each sets its family's series to `seconds` (created on first use; a
  // family lookup under its mutex, fine once per served step).
  void SetDraftStepSeconds(int exit_layer, double seconds);
  void SetVerifySeconds(int draft_tokens, double seconds);
  void SetBatchStepSeconds(int rows, double seconds);
  // The coordinator: the cost profile it shows the exit policy
  // (speculation::CostFeatures, in autoregressive steps), one series per
  // feature.
  void SetPolicyCostFeatures(double probe, double layer, double verify);

  Family<Gauge>& draft_step_seconds;  // lede_model_draft_step_seconds{exit_layer}
  Family<Gauge>& verify_seconds;      // lede_model_verify_seconds{draft_tokens}
  Family<Gauge>& batch_step_seconds;  // lede_model_batch_step_seconds{rows}
  Family<Gauge>& policy_cost_feature;  // lede_policy_cost_feature{feature="probe"|"layer"|"verify"}
};

// Experience logging and the request log (shared/experience/request_log.h).
struct ExperienceLogMetrics {
  explicit ExperienceLogMetrics(Registry& registry);

  Counter& experience_records_written;  // lede_experience_records_written_total
  Counter& experience_records_dropped;  // lede_experience_records_dropped_total
  Counter& experience_shards_written;   // lede_experience_shards_written_total
  Counter& experience_shards_deleted;   // lede_experience_shards_deleted_total (retention)
  Counter& experience_bytes_deleted;    // lede_experience_bytes_deleted_total (retention)
  Counter& experience_stale_temp_files_removed;  // lede_experience_stale_temp_files_removed_total
  Counter& request_log_records_written;  // lede_request_log_records_written_total
  Counter& request_log_records_dropped;  // lede_request_log_records_dropped_total
};

// Every metric of the project: the groups above, registered in this order,
// their fields and methods used as this struct's own
// (metrics.RecordRound(...), metrics.kv_slots_in_use.Set(...)).
struct SpecDecodeMetrics : SpeculationMetrics,
                           RequestMetrics,
                           BatchMetrics,
                           ExitPolicyMetrics,
                           KvSlotMetrics,
                           StepCostMetrics,
                           ExperienceLogMetrics {
  explicit SpecDecodeMetrics(Registry& registry);
  SpecDecodeMetrics(const SpecDecodeMetrics&) = delete;
  SpecDecodeMetrics& operator=(const SpecDecodeMetrics&) = delete;
};

}  // namespace lede::telemetry

#endif  // LEDE_SHARED_TELEMETRY_LEDE_METRICS_H_
