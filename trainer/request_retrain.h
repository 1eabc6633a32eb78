// File: trainer/request_retrain.h
//
// Retraining on the request log: the exit policy learned
// by the counterfactual trainer (shadow tokens, exact replay, Dinkelbach;
// trainer/dinkelbach.h) on the deployment's own logged requests, greedy and
// sampled (shared/experience/request_log.h), evaluated against the serving
// policy by replay on held-out requests (greedy ones exact, sampled ones by
// acceptance probability, trainer/counterfactual.h); no prompt file is
// needed.
//
// One run (RetrainOnRequests):
//  1. Read every request-log shard under the prefix. A truncated or corrupt
//     shard is skipped from its first bad record and counted. Shards whose
//     keys are in `processed` are old; no new shard with a usable record
//     ends the run: kNoNewData, nothing trained or written.
//  2. Only the served model's records are used (model_fingerprint): a
//     shard holding any record of another model is skipped whole (one
//     writer serves one model, so such a shard is not this deployment's
//     log), counted (n_other_model_shards) and logged once, naming the
//     shard and both fingerprints; the run goes on with the other shards
//     and publishes or rejects on their merit. New shards that hold nothing
//     usable (another model's, or bad with no good record) are returned in
//     new_shards even when nothing is trained, so that they are read once.
//  3. Split by request: IsHeldOut(request_id) (trainer/heldout_split.h) puts about heldout_fraction of
//     the requests (at least one) in the held-out set, the same request on
//     the same side in every run; the rest train. Each request's shadow
//     trace is one uncached pass over prompt + output (ComputeShadowTrace),
//     replayed at the load it was served at. Sampled requests (logged with
//     their settings) are counted and skipped: their tokens are one draw,
//     which an exact replay of another policy would not emit.
//  4. The candidate: TrainDinkelbach on the training requests (a quarter of
//     them, every 4th, select the iterate).
//  5. Both policies replayed exactly on the held-out requests under the cost
//     model; publish iff candidate - serving > publish_margin (speed-up
//     units): SaveArtifact(policy_root/<version>) then
//     PublishServingVersion. Otherwise the candidate goes to
//     policy_root/candidates/<version> and SERVING is kept.
//  6. The caller records `new_shards` as processed (also after a
//     rejection, so the same data does not trigger the same run again).
//
// Thread-safety: one run per policy root at a time.
#ifndef LEDE_TRAINER_REQUEST_RETRAIN_H_
#define LEDE_TRAINER_REQUEST_RETRAIN_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "proto/lede/v1/experience.pb.h"
#include "shared/model/cost/cost_model.h"
#include "shared/model/llama.h"
#include "shared/speculation/cost_features.h"
#include "shared/status/status.h"
#include "shared/storage/object_store.h"
#include "trainer/counterfactual.h"
#include "trainer/dinkelbach.h"

namespace lede::trainer {

struct RequestRetrainOptions {
  std::string requests_prefix = "requests";  // under the experience store
  std::string policy_root;                   // SERVING is the baseline; versions are published here
  std::string version;                       // the candidate's version name (required)
  double heldout_fraction = 0.25;            // in (0, 1)
  // The most recent requests trained and evaluated on (by shard key, then
  // record order): bounds memory (measured: 1,000 requests of ~60 tokens
  // on lede-tiny, 1.9 GB peak) and how stale the traffic may be.
  int64_t max_requests = 2000;
  double publish_margin = 0.01;              // speed-up units; +inf never publishes
  // The candidate's training (spec: the candidate layers, D_max, probes;
  // dqn: epochs, threads, ...). model_fingerprint is set from the model.
  DinkelbachOptions dinkelbach = [] {
    DinkelbachOptions o;
    o.spec.candidate_layers = {1, 2, 3, 4, 5, 6};
    o.spec.max_draft_len = 6;
    o.spec.probe_candidates = false;
    o.spec.lookahead_probe = false;
    o.initial_policy = "calibrated";
    o.conservative_margin = 0.2;
    o.max_iterations = 4;
    o.dqn.epochs = 16;
    o.dqn.batch_size = 256;
    o.dqn.heldout_fraction = 0;
    return o;
  }();
  // Price rewards and replays with the costs the deployment measured and
  // logged with its requests (RequestRecord.measured_costs; ServedCostsOfLog)
  // when the log holds a usable profile; the `cost` given to
  // RetrainOnRequests otherwise. false: always `cost` (offline comparisons).
  bool price_with_logged_costs = true;
  std::function<void(const std::string&)> log;  // progress lines (logfmt); may be null
};

enum class RequestRetrainDecision { kNoNewData, kPublished, kRejected };

struct RequestRetrainOutcome {
  RequestRetrainDecision decision = RequestRetrainDecision::kNoNewData;
  std::vector<std::string> new_shards;  // to record as processed
  // n_bad_shards: every shard under the prefix that was skipped in part or
  // whole (truncated, corrupt, unreadable); n_new_bad_shards: those of them
  // that are new and not counted in n_new_other_model_shards. n_new_records: the good records of the new shards.
  int64_t n_requests = 0, n_train = 0, n_heldout = 0, n_bad_shards = 0;
  int64_t n_new_bad_shards = 0, n_new_records = 0;
  // Shards skipped whole because they hold records of another model: all
  // of them under the prefix, and the new ones (each logged once).
  int64_t n_other_model_shards = 0, n_new_other_model_shards = 0;
  double train_seconds = 0;  // wall time of tracing the requests and training the candidate
  std::string serving_version, candidate_version, artifact_dir, reason;
  double serving_speedup = 0, candidate_speedup = 0;  // replayed on the held-out requests
  // The cost model the run priced with: "served" (the logged measured
  // costs) or the name of the `cost` given.
  std::string cost_model;
  // The cost profile the replays showed the policy (ExitState::cost): the
  // features of the model that priced the run (cost_model), as the
  // coordinator sends a served policy those of its measured costs.
  speculation::CostFeatures cost_features;
  // The candidate's acceptance on the held-out requests, greedy and sampled
  // apart (trainer/counterfactual.h ReplayAcceptanceOf).
  ReplayAcceptanceByKind heldout_acceptance;
};

// The shadow trace of a logged request, at the load it was served at; a
// sampled record (temperature > 0) gives a sampled trace under its recorded
// temperature, top_p and seed.
// Errors: those of ComputeShadowTrace (an empty output is kInvalidArgument).
StatusOr<ShadowTrace> TraceLoggedRequest(const model::LlamaModel& model, const lede::v1::RequestRecord& record,
                                         int32_t top_k);

// The deployment's measured step costs in a request log, per entry the
// value of the newest record that measured it, among the records of the
// newest profile's weight format and thread count (a redeployment on other
// weights makes the older profiles stale); the verification line of the
// newest record that fitted one across exit layers (head_layers > 0; an
// older profile's line is on K alone, its medians are used). Records without measured_costs (older
// coordinators) are skipped. kNotFound when no record holds a profile that
// can price rounds (served_costs.h CanPrice); kInvalidArgument when the
// profiles' draft table is not L + 1 entries (MakeServedCostModel).
StatusOr<model::cost::ServedStepCosts> ServedCostsOfLog(const std::vector<lede::v1::RequestRecord>& records,
                                                  int64_t n_layers);

// The served cost model (shared/model/cost/cost_model.h MakeServedCostModel,
// name "served") of the step costs logged in `records` (ServedCostsOfLog),
// for `model`. The one place that turns a request log into prices: the
// request-log trainer and the td trainer (trainer/retrain.h) both price
// with it. Errors: kNotFound when no record carries a profile that can
// price (its message names measured_costs); kInvalidArgument when the
// profile does not fit the model (ServedCostsOfLog, MakeServedCostModel);
// kFailedPrecondition from MakeServedCostModel for costs with nothing to
// price a round with.
StatusOr<std::unique_ptr<model::cost::CostModel>> ServedCostModelOfLog(const std::vector<lede::v1::RequestRecord>& records,
                                                                 const model::LlamaModel& model);

// ServedCostModelOfLog of the records of `model` (by architecture
// fingerprint) in the request log under `prefix` of `store`; truncated or
// corrupt shards contribute their good records. Errors: those of
// ServedCostModelOfLog (kNotFound also when the log is empty or absent)
// and those of the store's List().
StatusOr<std::unique_ptr<model::cost::CostModel>> ReadServedCostModel(storage::ObjectStore& store,
                                                                const std::string& prefix,
                                                                const model::LlamaModel& model);

// One run (see the file comment). Rewards and replays are priced with the
// logged measured costs (ServedCostsOfLog, MakeServedCostModel) when
// options.price_with_logged_costs and the log has them, else with `cost`. Errors: kInvalidArgument for bad options;
// kFailedPrecondition for no loadable SERVING;
// the store's List() errors; those of training and of saving.
StatusOr<RequestRetrainOutcome> RetrainOnRequests(storage::ObjectStore& store, const model::LlamaModel& model,
                                                  const model::cost::CostModel& cost,
                                                  const std::set<std::string>& processed,
                                                  const RequestRetrainOptions& options);

}  // namespace lede::trainer

#endif  // LEDE_TRAINER_REQUEST_RETRAIN_H_
