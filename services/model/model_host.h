// File: services/model/model_host.h
//
// Internal to lede::model_service (its API is model_service.h): the ModelHost
// that LoadModelHost builds (model_host.cc) and both services share (the
// loaded model, the KV pool, the cost model and the drafter's policy), and
// the wire conversions the verifier (verifier_service.cc) and the drafter
// (drafter_service.cc) have in common. Uses libtorch.
#ifndef LEDE_SERVICES_MODEL_MODEL_HOST_H_
#define LEDE_SERVICES_MODEL_MODEL_HOST_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "policy/dqn/artifact.h"
#include "proto/lede/v1/model.pb.h"
#include "services/model/model_service.h"
#include "services/model/policy_follower.h"
#include "shared/experience/served_costs.h"
#include "shared/log/log.h"
#include "shared/model/kv_cache.h"
#include "shared/model/llama.h"
#include "shared/speculation/generation.h"
#include "shared/status/status.h"
#include "shared/telemetry/lede_metrics.h"

namespace lede::model_service {

// The loaded model, the KV pool and (drafter) the policy.
class ModelHost {
 public:
  ModelServiceOptions options;
  std::shared_ptr<const model::LlamaModel> model;
  std::string fingerprint;
  std::unique_ptr<telemetry::SpecDecodeMetrics> metrics;  // null without a registry

  // The pool; a drafter re-attaches when the verifier made a new one.
  absl::Mutex pool_mu;
  std::shared_ptr<model::KvCache> cache ABSL_GUARDED_BY(pool_mu);  // the pointer

  // Costs of the served cost model, in full-depth steps.
  std::string cost_model = "accelerator";
  std::vector<double> draft_cost, verify_cost;
  double probe_cost = 0;

  // The costs of the steps this process serves, measured as it serves them
  // (shared/experience/served_costs.h); null until the pool is known.
  std::unique_ptr<experience::ServedCostMeter> served_costs;

  // One timed step (seconds of compute in this process): into the meter
  // and, with a registry, its lede_model_*_seconds gauge. Thread-safe.
  void RecordDraftStep(int32_t exit_layer, int32_t n_drafts, double seconds) {
    if (!served_costs) return;
    const double median = served_costs->RecordDraft(exit_layer, n_drafts, seconds);
    if (metrics && median > 0) metrics->SetDraftStepSeconds(exit_layer, median);
  }
  void RecordVerifyStep(int32_t n_drafts, double seconds) {
    if (!served_costs) return;
    const double median = served_costs->RecordVerify(n_drafts, seconds);
    if (metrics && median > 0) metrics->SetVerifySeconds(n_drafts, median);
  }
  void RecordBatchStep(int32_t rows, double seconds) {
    if (!served_costs) return;
    const double median = served_costs->RecordBatch(rows, seconds);
    if (metrics && median > 0) metrics->SetBatchStepSeconds(rows, median);
  }
  // The measured profile into a response's measured_costs, at most once a
  // second per process (the coordinator keeps the latest; a few hundred
  // bytes, not every round); the other responses carry none.
  template <typename Response>
  void MaybeAttachCosts(Response* resp) {
    if (served_costs && served_costs->AttachDue(absl::Now())) *resp->mutable_measured_costs() = served_costs->Snapshot();
  }

  // LEDE policy: followed from the policy service, or loaded from a directory.
  std::unique_ptr<PolicyFollower> follower;
  std::shared_ptr<const policy::dqn::Artifact> local_policy;
  std::shared_ptr<lede::v1::Policy::Stub> policy_stub;  // remote decisions

  std::shared_ptr<const policy::dqn::Artifact> policy() const {
    return follower ? follower->current() : local_policy;
  }

  std::shared_ptr<model::KvCache> Pool() {
    absl::MutexLock lock(&pool_mu);
    return cache;
  }

  // The pool of `epoch`: the current one, or (drafter) a re-attached one.
  // Errors: kFailedPrecondition when the epoch is not the pool's (the
  // verifier restarted; the session is gone).
  StatusOr<std::shared_ptr<model::KvCache>> PoolOfEpoch(uint64_t epoch) {
    absl::MutexLock lock(&pool_mu);
    if (cache && cache->epoch() == epoch) return cache;
    if (!options.kv_pool_name.empty() && !owns_pool) {
      model::KvCacheOptions o;
      o.shared_memory_name = options.kv_pool_name;
      o.dtype = model->options().dtype;
      auto attached = model::KvCache::Attach(model->config(), o);
      if (attached.ok()) {
        cache = std::make_shared<model::KvCache>(std::move(*attached));
        logging::LogEvent("info", "kv_pool_attached", {{"epoch", std::to_string(cache->epoch())}});
        if (cache->epoch() == epoch) return cache;
      }
    }
    return FailedPreconditionError("pool_epoch: session of KV pool epoch " + std::to_string(epoch) +
                                   " is gone (the pool is at " +
                                   std::to_string(cache ? cache->epoch() : 0) + ")");
  }

  void FillInfo(lede::v1::ModelInfo* info) {
    const model::ModelConfig& c = model->config();
    std::shared_ptr<model::KvCache> pool = Pool();
    info->set_n_layers(static_cast<int32_t>(c.n_layers));
    info->set_vocab_size(static_cast<int32_t>(c.vocab_size));
    info->set_capacity(pool ? pool->capacity() : 0);
    info->set_n_slots(pool ? static_cast<int32_t>(pool->n_slots()) : 0);
    info->set_max_draft_length(pool ? static_cast<int32_t>(pool->max_draft_len()) : 0);
    for (int32_t id : c.eos_ids) info->add_eos_ids(id);
    info->set_bos_id(c.bos_id);
    info->set_model_fingerprint(fingerprint);
    info->set_kv_pool_name(options.kv_pool_name);
    info->set_pool_epoch(pool ? pool->epoch() : 0);
    info->set_cost_model(cost_model);
    for (double x : draft_cost) info->add_draft_cost(x);
    for (double x : verify_cost) info->add_verify_cost(x);
    info->set_probe_cost(probe_cost);
    if (auto p = policy()) info->set_policy_version(p->metadata.version);
    if (served_costs) *info->mutable_measured_costs() = served_costs->Snapshot();
  }

  bool owns_pool = false;
};

// The request's sampling parameters (top_p 0 = 1), and their check.
// ValidateSampling errors: kInvalidArgument naming the field.
speculation::SamplingParams SamplingFromProto(const lede::v1::SamplingParams& p);
Status ValidateSampling(const speculation::SamplingParams& s);

// [K, V] float32 little-endian bytes <-> tensor (both at the torch boundary).
// ProbsFromBytes errors: kInvalidArgument when the size is not K x V x 4.
StatusOr<std::string> ProbsToBytes(const at::Tensor& probs);
StatusOr<at::Tensor> ProbsFromBytes(const std::string& bytes, int64_t K, int64_t V);

// The error of a call whose session id is not the slot's session.
Status NotThisSession(int64_t slot);

// A batched step's intra-op threads (--batch-threads), set once per thread
// that runs batches (a handler thread, flat combining).
void SetBatchThreads(int n_threads);

}  // namespace lede::model_service

#endif  // LEDE_SERVICES_MODEL_MODEL_HOST_H_
