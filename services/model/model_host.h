// File: services/model/model_host.h
//
// Internal to lede::model_service (its API is model_service.h): the ModelHost
// that LoadModelHost builds (model_host.cc) and both services share (the
// loaded model, the KV pool, the cost model and the drafter's policy), and
// the wire conversions the verifier (verifier_service.cc) and the drafter
// (drafter_service.cc) have in common. Uses libtorch.
#ifndef LEDE_SERVICES_MODEL_MODEL_HOST_H_
#define LEDE_SERVICES_MODEL_MODEL_HOST_H_

#include <atomic>
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
  // exit_layer: of the drafts (K >= 1); for K = 0 the layer a full-depth
  // step resumed at after a probe, 0 for an autoregressive step.
  void RecordVerifyStep(int32_t exit_layer, int32_t n_drafts, double seconds) {
    if (!served_costs) return;
    const double median = served_costs->RecordVerify(exit_layer, n_drafts, seconds);
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
        log::LogEvent("info", "kv_pool_attached", {{"epoch", std::to_string(cache->epoch())}});
        if (cache->epoch() == epoch) return cache;
      }
    }
    return FailedPreconditionError("pool_epoch: session of KV pool epoch " + std::to_string(epoch) +
                                   " is gone (the pool is at " +
                                   std::to_string(cache ? cache->epoch() : 0) + ")");
  }

  void FillInfo(lede::v1::ModelInfo* info) {
    const checkpoint::ModelConfig& c = model->config();
    std::shared_ptr<model::KvCache> pool = Pool();
    info->set_n_layers(static_cast<int32_t>(c.n_layers));
    info->set_vocab_size(static_cast<int32_t>(c.vocab_size));
    info->set_capacity(pool ? pool->capacity() : 0);
    info->set_context_window(c.max_seq_len);
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

  // Batched steps running now in this process (BatchStepThreads).
  std::atomic<int> running_steps{0};
};

// The intra-op threads of a batched step that starts while
// `other_steps_running` other steps of this process run: all of `threads`
// (--threads) when it runs alone, so a lone session's prefill chunks and
// rounds get every core as `lede generate --threads` does; `batch_threads`
// (--batch-threads) beside others, so the steps that run at once share the
// cores (docs/serving.md "Threads"). At least 1. The thread count does not
// change any output (the kernels split whole output blocks).
int StepThreads(int threads, int batch_threads, int other_steps_running);

// A batched step's scope on its handler thread: counts the step in
// host.running_steps from construction to destruction and sets the thread's
// compute threads to StepThreads (SetComputeThreads). Thread-safe; the
// ModelHost must outlive it.
class BatchStepThreads {
 public:
  explicit BatchStepThreads(ModelHost& host);
  ~BatchStepThreads();
  BatchStepThreads(const BatchStepThreads&) = delete;
  BatchStepThreads& operator=(const BatchStepThreads&) = delete;

 private:
  ModelHost& host_;
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

// The calling thread's intra-op threads for model work (libtorch's and the
// fused kernels', model::SetDecodeThreads; both are per thread): --threads
// on a handler thread that decodes, verifies or prefills alone,
// --batch-threads on one that runs a batched step. Cheap when the thread
// already runs at `n_threads`.
void SetComputeThreads(int n_threads);

// Whether a prompt of `prompt_tokens` fits a sequence of `capacity` tokens
// (it must leave room for one new token) of a model whose window is
// `window`. Errors: kInvalidArgument when it exceeds the window (no
// deployment could serve it); kResourceExhausted, with the reason, when the
// window would hold it but this pool (sized by the KV budget) does not.
Status CheckPromptFits(int64_t prompt_tokens, int64_t capacity, int64_t window);

// How the verifier's KV pool is sized by its memory budget (--kv-memory;
// docs/serving.md "KV memory"): blocks of block_tokens tokens that the
// --slots sequences share (model::KvCache, paged).
struct KvPoolPlan {
  int64_t budget_bytes = 0;  // the resolved --kv-memory
  int64_t capacity = 0;      // tokens one sequence may hold (prompt, new tokens, a draft)
  int64_t block_tokens = 0;  // tokens per KV block
  int64_t n_blocks = 0;      // blocks in the pool: n_blocks x block_tokens tokens in all
  int64_t pool_bytes = 0;    // model::KvCache::PoolBytes of the pool; <= budget_bytes
};

// Tokens per KV block of the verifier's pool (vLLM's --block-size is 16 on
// GPUs; on the CPU a longer block keeps attention's reads sequential).
inline constexpr int64_t kKvBlockTokens = 64;

// Resolves --kv-memory (a size, or a percentage of `available_bytes`, the
// machine's MemAvailable; a shared segment's budget is at most
// `shm_free_bytes`, the free space of /dev/shm, when given as a percentage)
// and sizes the pool: as many blocks as the budget holds, shared by --slots
// sequences. --capacity 0 lets one sequence hold the whole pool, at most the
// model's window; an explicit --capacity must fit the pool once.
// Errors: kInvalidArgument (a start that must be refused), one line naming
// --kv-memory and --capacity with what would fit: a bad size or slot count;
// an explicit capacity the budget cannot hold once; an automatic capacity
// under min(window, kMinSlotTokens) tokens.
StatusOr<KvPoolPlan> PlanKvPool(const checkpoint::ModelConfig& config, const ModelServiceOptions& options,
                                c10::ScalarType kv_dtype, int64_t available_bytes, int64_t shm_free_bytes);

// The fewest tokens an automatic capacity may give a sequence: a request
// needs room for its prompt, its new tokens and a draft; a budget that
// holds less serves no useful request.
inline constexpr int64_t kMinSlotTokens = 256;

}  // namespace lede::model_service

#endif  // LEDE_SERVICES_MODEL_MODEL_HOST_H_
