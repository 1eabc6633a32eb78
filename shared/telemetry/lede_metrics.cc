#include "shared/telemetry/lede_metrics.h"

#include <algorithm>
#include <cmath>

namespace lede::telemetry {

std::vector<double> TokenCountBuckets() {
  std::vector<double> b;
  for (int i = 0; i <= 16; ++i) b.push_back(i);
  return b;
}
std::vector<double> ExitLayerBuckets() {
  std::vector<double> b;
  for (int i = 1; i <= 32; ++i) b.push_back(i);
  return b;
}
std::vector<double> RoundLatencyBuckets() {
  std::vector<double> b;
  for (int i = 0; i < 16; ++i) b.push_back(0.00025 * std::ldexp(1.0, i));
  return b;
}
std::vector<double> TimeToFirstTokenBuckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
          1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
}
std::vector<double> InterTokenLatencyBuckets() {
  return {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
          0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
}
std::vector<double> RequestLatencyBuckets() {
  return {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
          30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
}
// Sessions per batched verifier step: every size up to 16, then powers of 2.
std::vector<double> BatchSizeBuckets() {
  std::vector<double> b;
  for (int i = 1; i <= 16; ++i) b.push_back(i);
  for (int i = 32; i <= 512; i *= 2) b.push_back(i);
  return b;
}
// Rows per step: vLLM's vllm:iteration_tokens_total buckets.
std::vector<double> IterationTokenBuckets() {
  return {1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384};
}
std::vector<double> DecisionLatencyBuckets() {
  return {1e-6,   2.5e-6, 5e-6,   1e-5,  2.5e-5, 5e-5,  1e-4, 2.5e-4, 5e-4, 1e-3,
          2.5e-3, 5e-3,   1e-2,   2.5e-2, 5e-2,  0.1,   0.25, 0.5,    1.0};
}

std::string GrpcCodeName(StatusCode code) { return StatusCodeToString(code); }

double PolicyVersionNumber(std::string_view version) {
  double n = 0;
  int digits = 0;
  for (char c : version) {
    if (c < '0' || c > '9') continue;
    if (++digits > 15) break;
    n = n * 10 + (c - '0');
  }
  return n;
}

// Speculative decoding: counters in tokens or rounds, histograms per round.
SpeculationMetrics::SpeculationMetrics(Registry& r)
    : num_drafts(UnlabelledCounter(
          r, "lede_spec_decode_num_drafts_total",
          "Speculation rounds (draft then verify); autoregressive steps are not counted.")),
      num_draft_tokens(UnlabelledCounter(r, "lede_spec_decode_num_draft_tokens_total",
                                         "Tokens proposed by the drafter (tokens).")),
      num_accepted_tokens(UnlabelledCounter(
          r, "lede_spec_decode_num_accepted_tokens_total",
          "Draft tokens accepted by the verifier (tokens). Acceptance rate = "
          "rate(accepted) / rate(draft tokens).")),
      accepted_per_pos(CounterFamily(
          r, "lede_spec_decode_num_accepted_tokens_per_pos_total",
          "Accepted draft tokens by position in the draft (0-based; tokens).")),
      num_emitted_tokens(UnlabelledCounter(
          r, "lede_spec_decode_num_emitted_tokens_total",
          "Tokens emitted by decode rounds: accepted drafts plus one verifier token per "
          "round, and one per autoregressive step (tokens).")),
      acceptance_length(UnlabelledHistogram(
          r, "lede_spec_decode_acceptance_length",
          "Accepted draft tokens per speculation round (tokens; tokens emitted per round "
          "is this plus one).",
          TokenCountBuckets())),
      exit_layer(UnlabelledHistogram(
          r, "lede_spec_decode_exit_layer",
          "Exit layer used for drafting, per speculation round (layer index, 1-based count "
          "of decoder layers run).",
          ExitLayerBuckets())),
      draft_length(UnlabelledHistogram(r, "lede_spec_decode_draft_length",
                                       "Tokens drafted per speculation round (tokens).",
                                       TokenCountBuckets())),
      round_latency(UnlabelledHistogram(
          r, "lede_round_latency_seconds",
          "Wall time of one decode round, drafting plus verification, or one "
          "autoregressive step (seconds).",
          RoundLatencyBuckets())),
      load_disabled_rounds(UnlabelledCounter(
          r, "lede_spec_decode_load_disabled_rounds_total",
          "Autoregressive steps of speculative requests, taken because the requests in flight "
          "were above --speculation-max-load (rounds).")),
      per_pos_(kMaxAcceptedPositions, nullptr) {}

// Requests: outcomes, tokens, latencies and the wait for a KV slot.
RequestMetrics::RequestMetrics(Registry& r)
    : requests(CounterFamily(r, "lede_requests_total",
                             "Finished requests by decoding method or RPC and gRPC status code name.")),
      request_success(CounterFamily(
          r, "lede_request_success_total",
          "Requests that completed, by finished_reason (stop, length, abort).")),
      generation_tokens(UnlabelledCounter(r, "lede_generation_tokens_total",
                                          "Tokens returned to clients (tokens).")),
      prompt_tokens(UnlabelledCounter(r, "lede_prompt_tokens_total",
                                      "Prompt tokens of accepted requests (tokens).")),
      time_to_first_token(UnlabelledHistogram(
          r, "lede_time_to_first_token_seconds",
          "Time from request arrival to its first generated token (seconds).",
          TimeToFirstTokenBuckets())),
      inter_token_latency(UnlabelledHistogram(
          r, "lede_inter_token_latency_seconds",
          "Time per generated token after the first, per round: a round emits its tokens "
          "together, each observed at the round's latency / tokens (seconds).",
          InterTokenLatencyBuckets())),
      e2e_request_latency(UnlabelledHistogram(
          r, "lede_e2e_request_latency_seconds",
          "Time from request arrival to its last token or error (seconds).",
          RequestLatencyBuckets())),
      num_requests_running(UnlabelledGauge(
          r, "lede_num_requests_running",
          "Requests in the decode loop, holding a KV slot (requests).")),
      num_requests_waiting(UnlabelledGauge(
          r, "lede_num_requests_waiting",
          "Requests admitted and waiting for a KV slot and prefill (requests).")),
      request_queue_time(UnlabelledHistogram(
          r, "lede_request_queue_time_seconds",
          "Time an admitted session waited in the verifier's queue for a free KV slot (seconds; 0 when one was free).",
          RequestLatencyBuckets())) {}

// Batched steps of the verifier and the drafter.
BatchMetrics::BatchMetrics(Registry& r)
    : iteration_batch_size(UnlabelledHistogram(
          r, "lede_iteration_batch_size",
          "Sessions in one batched verifier step: prefill chunks, verification rounds and autoregressive "
          "steps run in one pass over the weights (sessions; 1 per call with --max-batch 1).",
          BatchSizeBuckets())),
      iteration_tokens(UnlabelledHistogram(
          r, "lede_iteration_tokens",
          "Positions (rows) in one batched verifier step, all sessions together (tokens; vLLM's "
          "vllm:iteration_tokens_total).",
          IterationTokenBuckets())),
      draft_batch_size(UnlabelledHistogram(
          r, "lede_draft_batch_size",
          "Sessions in one batched drafter step: draft tokens and phase-1 probes of several sessions, one row "
          "each, run in one pass per block (sessions; with --max-batch > 1 only).",
          BatchSizeBuckets())) {}

// The exit policy: decisions, the serving version, reloads.
ExitPolicyMetrics::ExitPolicyMetrics(Registry& r)
    : policy_decision_latency(UnlabelledHistogram(
          r, "lede_policy_decision_latency_seconds",
          "Time of one exit-policy decision in the drafter (seconds).",
          DecisionLatencyBuckets())),
      policy_version(GaugeFamily(r, "lede_policy_version",
                                 "Serving exit-policy version: 1 for the current version, "
                                 "0 for versions served earlier by this process (info gauge).")),
      policy_version_number(UnlabelledGauge(
          r, "lede_policy_version_number",
          "Serving exit-policy version as a number (digits of the version name; 0 = none "
          "loaded).")),
      policy_reloads(CounterFamily(r, "lede_policy_reloads_total",
                                   "Policy reload attempts by outcome (ok, rejected).")) {}

// KV-cache sequence slots.
KvSlotMetrics::KvSlotMetrics(Registry& r)
    : kv_slots_in_use(UnlabelledGauge(r, "lede_kv_slots_in_use",
                                      "KV-cache sequence slots holding a live sequence (slots).")),
      kv_slots_capacity(UnlabelledGauge(r, "lede_kv_slots_capacity",
                                        "KV-cache sequence slots configured (slots).")),
      kv_cache_usage(UnlabelledGauge(r, "lede_kv_cache_usage_perc",
                                     "Fraction of the KV pool's blocks held by sequences (0-1; vLLM's "
                                     "kv_cache_usage_perc).")) {}

// Measured step costs of the model services.
StepCostMetrics::StepCostMetrics(Registry& r)
    : draft_step_seconds(GaugeFamily(
          r, "lede_model_draft_step_seconds",
          "Measured seconds per drafted token at exit_layer as this drafter serves it (the round's probes, "
          "signals and decisions included): the median of its last timed Draft calls.")),
      verify_seconds(GaugeFamily(
          r, "lede_model_verify_seconds",
          "Measured seconds of one verification of draft_tokens drafts run as a step of its own (0 drafts: an "
          "autoregressive step): the median of this verifier's last timed steps.")),
      batch_step_seconds(GaugeFamily(
          r, "lede_model_batch_step_seconds",
          "Measured seconds of one batched verifier step of `rows` positions: the median of the last timed "
          "steps of that size.")),
      policy_cost_feature(GaugeFamily(
          r, "lede_policy_cost_feature",
          "The cost profile the coordinator shows the exit policy, in autoregressive steps: probe (a wasted "
          "exit probe), layer (a draft step through all layers) and verify (each more verified position), "
          "from the model services' measured step costs.")) {}

// Experience shards and the request log.
ExperienceLogMetrics::ExperienceLogMetrics(Registry& r)
    : experience_records_written(UnlabelledCounter(
          r, "lede_experience_records_written_total",
          "Experience (transition) records written to shards (records).")),
      experience_records_dropped(UnlabelledCounter(
          r, "lede_experience_records_dropped_total",
          "Experience records dropped: queue full or write error (records).")),
      experience_shards_written(UnlabelledCounter(
          r, "lede_experience_shards_written_total",
          "Experience shards completed and made visible (shards).")),
      experience_shards_deleted(UnlabelledCounter(
          r, "lede_experience_shards_deleted_total",
          "Experience shards deleted by the retention policy (shards).")),
      experience_bytes_deleted(UnlabelledCounter(
          r, "lede_experience_bytes_deleted_total",
          "Bytes of experience shards deleted by the retention policy (bytes).")),
      experience_stale_temp_files_removed(UnlabelledCounter(
          r, "lede_experience_stale_temp_files_removed_total",
          "Temporary shard files of writers that died mid-write, removed at start (files).")),
      request_log_records_written(UnlabelledCounter(
          r, "lede_request_log_records_written_total",
          "Request-log records (finished requests) written to shards (records).")),
      request_log_records_dropped(UnlabelledCounter(
          r, "lede_request_log_records_dropped_total",
          "Request-log records dropped: queue full or write error (records).")) {}

SpecDecodeMetrics::SpecDecodeMetrics(Registry& r)
    : SpeculationMetrics(r),
      RequestMetrics(r),
      BatchMetrics(r),
      ExitPolicyMetrics(r),
      KvSlotMetrics(r),
      StepCostMetrics(r),
      ExperienceLogMetrics(r) {}

Counter& SpeculationMetrics::AcceptedAtPosition(int position) {
  position = std::clamp(position, 0, kMaxAcceptedPositions - 1);
  absl::MutexLock lock(&pos_mu_);
  Counter*& c = per_pos_[position];
  if (c == nullptr) c = &accepted_per_pos.Add({{"position", std::to_string(position)}});
  return *c;
}

void SpeculationMetrics::RecordRound(int exit_layer_index, int n_drafted, int n_accepted,
                                     double latency_s) {
  n_drafted = std::max(n_drafted, 0);
  n_accepted = std::clamp(n_accepted, 0, n_drafted);
  if (n_drafted > 0) {
    num_drafts.Increment();
    num_draft_tokens.Increment(n_drafted);
    num_accepted_tokens.Increment(n_accepted);
    for (int i = 0; i < n_accepted; ++i) AcceptedAtPosition(i).Increment();
    acceptance_length.Observe(n_accepted);
    draft_length.Observe(n_drafted);
    exit_layer.Observe(exit_layer_index);
  }
  num_emitted_tokens.Increment(n_accepted + 1);
  if (latency_s >= 0) round_latency.Observe(latency_s);
}

void RequestMetrics::RecordRequest(std::string_view method, StatusCode code, double latency_s) {
  requests.Add({{"method", std::string(method)}, {"status", GrpcCodeName(code)}}).Increment();
  if (latency_s >= 0) e2e_request_latency.Observe(latency_s);
}

void RequestMetrics::RecordSuccess(std::string_view finished_reason) {
  request_success.Add({{"finished_reason", std::string(finished_reason)}}).Increment();
}

void ExitPolicyMetrics::SetPolicyVersion(const std::string& version, double version_number) {
  Gauge& next = policy_version.Add({{"version", version}});
  absl::MutexLock lock(&version_mu_);
  if (current_version_ != nullptr && current_version_ != &next) current_version_->Set(0);
  next.Set(1);
  current_version_ = &next;
  policy_version_number.Set(version_number);
}

void ExitPolicyMetrics::RecordPolicyReload(bool accepted) {
  policy_reloads.Add({{"outcome", accepted ? "ok" : "rejected"}}).Increment();
}

void StepCostMetrics::SetDraftStepSeconds(int exit_layer, double seconds) {
  draft_step_seconds.Add({{"exit_layer", std::to_string(exit_layer)}}).Set(seconds);
}

void StepCostMetrics::SetVerifySeconds(int draft_tokens, double seconds) {
  verify_seconds.Add({{"draft_tokens", std::to_string(draft_tokens)}}).Set(seconds);
}

void StepCostMetrics::SetBatchStepSeconds(int rows, double seconds) {
  batch_step_seconds.Add({{"rows", std::to_string(rows)}}).Set(seconds);
}

void StepCostMetrics::SetPolicyCostFeatures(double probe, double layer, double verify) {
  policy_cost_feature.Add({{"feature", "probe"}}).Set(probe);
  policy_cost_feature.Add({{"feature", "layer"}}).Set(layer);
  policy_cost_feature.Add({{"feature", "verify"}}).Set(verify);
}

}  // namespace lede::telemetry
