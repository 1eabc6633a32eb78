#include "services/model/model_service.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "policy/controllers.h"
#include "policy/dqn/artifact.h"
#include "policy/dqn/dqn_exit_controller.h"
#include "policy/dqn/method_factory.h"
#include "services/model/admission_queue.h"
#include "services/model/batch_scheduler.h"
#include "services/model/policy_follower.h"
#include "services/model/session_leases.h"
#include "shared/model/batch.h"
#include "shared/model/cost_model.h"
#include "shared/model/decoding.h"
#include "shared/model/kv_cache.h"
#include "shared/model/llama.h"
#include "shared/model/torch_boundary.h"
#include "shared/rpc/grpc_status.h"
#include "shared/rpc/security.h"
#include "shared/rpc/server.h"
#include "shared/speculation/generation.h"
#include "shared/speculation/method.h"
#include "shared/status/status_macros.h"
#include "shared/telemetry/lede_metrics.h"
#include "shared/telemetry/metrics.h"

namespace lede::model_service {

using rpc::ToGrpcStatus;
using Clock = std::chrono::steady_clock;

namespace {

// Observes the wall time of every decision of the wrapped controller in
// lede_policy_decision_latency_seconds (in-process DQN, threshold rule, or a
// remote Decide call). Borrows both; one per Draft call.
class TimedExitController final : public model::ExitController {
 public:
  TimedExitController(model::ExitController& inner, telemetry::Histogram& latency)
      : inner_(inner), latency_(latency) {}
  std::string name() const override { return inner_.name(); }
  model::Action Decide(const model::ExitState& state) override {
    const auto t0 = Clock::now();
    model::Action a = inner_.Decide(state);
    latency_.Observe(std::chrono::duration<double>(Clock::now() - t0).count());
    return a;
  }

 private:
  model::ExitController& inner_;
  telemetry::Histogram& latency_;
};

}  // namespace

// The loaded model, the KV pool and (drafter) the policy.
class ModelHost {
 public:
  ModelServiceOptions options;
  std::shared_ptr<const model::LlamaModel> model;
  std::string fingerprint;
  std::unique_ptr<telemetry::SpecDecodeMetrics> metrics;  // null without a registry

  // The pool; a drafter re-attaches when the verifier made a new one.
  std::mutex pool_mu;
  std::shared_ptr<model::KvCache> cache;  // guarded by pool_mu (the pointer)

  // Costs of the served cost model, in full-depth steps.
  std::string cost_model = "accelerator";
  std::vector<double> draft_cost, verify_cost;
  double probe_cost = 0;

  // LEDE policy: followed from the policy service, or loaded from a directory.
  std::unique_ptr<PolicyFollower> follower;
  std::shared_ptr<const policy::dqn::Artifact> local_policy;
  std::shared_ptr<lede::v1::Policy::Stub> policy_stub;  // remote decisions

  std::shared_ptr<const policy::dqn::Artifact> policy() const {
    return follower ? follower->current() : local_policy;
  }

  std::shared_ptr<model::KvCache> Pool() {
    std::lock_guard<std::mutex> lock(pool_mu);
    return cache;
  }

  // The pool of `epoch`: the current one, or (drafter) a re-attached one.
  // Errors: kFailedPrecondition when the epoch is not the pool's (the
  // verifier restarted; the session is gone).
  StatusOr<std::shared_ptr<model::KvCache>> PoolOfEpoch(uint64_t epoch) {
    std::lock_guard<std::mutex> lock(pool_mu);
    if (cache && cache->epoch() == epoch) return cache;
    if (!options.kv_pool_name.empty() && !owns_pool) {
      model::KvCacheOptions o;
      o.shared_memory_name = options.kv_pool_name;
      o.dtype = model->options().dtype;
      auto attached = model::KvCache::Attach(model->config(), o);
      if (attached.ok()) {
        cache = std::make_shared<model::KvCache>(std::move(*attached));
        rpc::LogEvent("info", "kv_pool_attached", {{"epoch", std::to_string(cache->epoch())}});
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
  }

  bool owns_pool = false;
};

namespace {

// Slot bookkeeping of the verifier: per-session options and last use.
struct SessionState {
  speculation::SessionOptions options;
  Clock::time_point last_used;
  std::string request_id;
  std::string owner;   // coordinator instance ("" = none: idle reclaim only)
  uint64_t id = model::KvCache::kNoSession;  // the session id (the slot's word in the pool)
  int busy = 0;        // calls computing on the slot now (prefill, verify)
  bool doomed = false; // the owner's lease is gone: freed when no call is busy
};

speculation::SamplingParams SamplingFromProto(const lede::v1::SamplingParams& p) {
  speculation::SamplingParams s;
  s.temperature = p.temperature();
  s.top_p = p.top_p() == 0.0f ? 1.0 : p.top_p();
  s.seed = p.seed();
  return s;
}

Status ValidateSampling(const speculation::SamplingParams& s) {
  if (!(s.temperature >= 0.0) || !std::isfinite(s.temperature)) {
    return InvalidArgumentError("sampling.temperature: must be a finite number >= 0");
  }
  if (!(s.top_p > 0.0 && s.top_p <= 1.0)) return InvalidArgumentError("sampling.top_p: must be in (0, 1]");
  return OkStatus();
}

// [K, V] float32 little-endian bytes <-> tensor (both at the torch boundary).
StatusOr<std::string> ProbsToBytes(const at::Tensor& probs) {
  if (!probs.defined() || probs.numel() == 0) return std::string();
  return model::TorchBoundary("draft_probs", [&]() -> StatusOr<std::string> {
    at::Tensor p = probs.to(at::kFloat).contiguous();
    return std::string(static_cast<const char*>(p.data_ptr()), p.numel() * sizeof(float));
  });
}

StatusOr<at::Tensor> ProbsFromBytes(const std::string& bytes, int64_t K, int64_t V) {
  if (bytes.empty()) return at::Tensor();
  if (static_cast<int64_t>(bytes.size()) != K * V * static_cast<int64_t>(sizeof(float))) {
    return InvalidArgumentError("draft_probs: " + std::to_string(bytes.size()) + " bytes, expected K x V x 4 = " +
                                std::to_string(K * V * 4));
  }
  return model::TorchBoundary("draft_probs", [&]() -> StatusOr<at::Tensor> {
    at::Tensor t = at::empty({K, V}, at::kFloat);
    std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
    return t;
  });
}

// A fresh session id: 64 random bits from the OS's generator (never 0), so
// that a caller can name only the sessions it opened.
uint64_t DrawSessionId() {
  static std::mutex mu;
  static std::random_device device;
  std::lock_guard<std::mutex> lock(mu);
  for (;;) {
    const uint64_t id = (static_cast<uint64_t>(device()) << 32) ^ static_cast<uint64_t>(device());
    if (id != model::KvCache::kNoSession) return id;
  }
}

// The error of a call whose session id is not the slot's session.
Status NotThisSession(int64_t slot) {
  return FailedPreconditionError("session_id: slot " + std::to_string(slot) +
                                 " holds no session of this id (it was closed, or the caller never opened it)");
}

Status CheckTokens(const google::protobuf::RepeatedField<int32_t>& ids, int64_t V, const char* field) {
  for (int i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= V) {
      return InvalidArgumentError(std::string(field) + "[" + std::to_string(i) + "]: token id " +
                                  std::to_string(ids[i]) + " outside [0, " + std::to_string(V) + ")");
    }
  }
  return OkStatus();
}

// The service boundary's conversion of the wire method (UNSPECIFIED = LEDE)
// and its parameters to the one method vocabulary. Errors: kInvalidArgument
// for a value outside the enum.
StatusOr<speculation::MethodSpec> MethodSpecFromProto(lede::v1::SpeculationMethod method,
                                                      const lede::v1::SpeculationParams& params) {
  speculation::MethodSpec spec;
  switch (method) {
    case lede::v1::SPECULATION_METHOD_AUTOREGRESSIVE:
      spec.method = speculation::SpeculationMethod::kAutoregressive;
      break;
    case lede::v1::SPECULATION_METHOD_STATIC:
      spec.method = speculation::SpeculationMethod::kStatic;
      break;
    case lede::v1::SPECULATION_METHOD_THRESHOLD:
      spec.method = speculation::SpeculationMethod::kThreshold;
      break;
    case lede::v1::SPECULATION_METHOD_UNSPECIFIED:
    case lede::v1::SPECULATION_METHOD_LEDE:
      spec.method = speculation::SpeculationMethod::kLede;
      break;
    default:
      return InvalidArgumentError("method: unknown speculation method " + std::to_string(static_cast<int>(method)));
  }
  spec.exit_layer = params.exit_layer();
  spec.draft_len = params.draft_length();
  spec.threshold = params.threshold();
  spec.epsilon = params.epsilon();
  return spec;
}

}  // namespace

StatusOr<std::shared_ptr<ModelHost>> LoadModelHost(const ModelServiceOptions& options, bool create_pool,
                                                   prometheus::Registry* registry) {
  auto host = std::make_shared<ModelHost>();
  host->options = options;
  if (options.threads > 0) at::set_num_threads(options.threads);
  model::ModelOptions mo;
  LEDE_ASSIGN_OR_RETURN(mo.kernels, model::ParseKernels(options.kernels));
  LEDE_ASSIGN_OR_RETURN(mo.graphs, model::ParseGraphMode(options.graphs));
  LEDE_ASSIGN_OR_RETURN(mo.weights, model::ParseWeightFormat(options.weights));
  LEDE_ASSIGN_OR_RETURN(mo.device, model::ParseDevice(options.device));
  LEDE_ASSIGN_OR_RETURN(mo.dtype, model::ParseDtype(options.dtype));
  if (!mo.device.is_cpu() && !options.kv_pool_name.empty()) {
    return InvalidArgumentError("kv_pool: a shared KV pool (split drafter and verifier) is CPU-only so far; "
                                "on " + options.device + " run --role both without --kv-pool");
  }
  LEDE_ASSIGN_OR_RETURN(std::unique_ptr<model::LlamaModel> loaded,
                        model::LlamaModel::Load(options.model_path, mo));
  host->model = std::shared_ptr<const model::LlamaModel>(std::move(loaded));
  const model::ModelConfig& c = host->model->config();
  host->fingerprint = c.ArchitectureFingerprint();
  if (registry != nullptr) host->metrics = std::make_unique<telemetry::SpecDecodeMetrics>(*registry);

  model::KvCacheOptions ko;
  ko.n_slots = options.n_slots;
  ko.capacity = options.capacity;
  ko.max_draft_len = options.max_draft_len;
  ko.shared_memory_name = options.kv_pool_name;
  ko.dtype = host->model->options().dtype;
  ko.device = host->model->options().device;
  if (create_pool) {
    LEDE_ASSIGN_OR_RETURN(model::KvCache cache, model::KvCache::Create(c, ko));
    host->cache = std::make_shared<model::KvCache>(std::move(cache));
    host->owns_pool = true;
  } else {
    if (options.kv_pool_name.empty()) {
      return InvalidArgumentError("kv_pool: a drafter without a verifier in its process needs the pool's name");
    }
    LEDE_ASSIGN_OR_RETURN(model::KvCache cache, model::KvCache::Attach(c, ko));
    host->cache = std::make_shared<model::KvCache>(std::move(cache));
  }
  if (host->metrics) host->metrics->kv_slots_capacity.Set(static_cast<double>(host->cache->n_slots()));

  // Cost model of the rewards (ModelInfo).
  std::unique_ptr<model::CostModel> cm;
  if (!options.calibration_path.empty()) {
    LEDE_ASSIGN_OR_RETURN(model::Calibration cal, model::ReadCalibrationFile(options.calibration_path));
    cm = model::MakeMeasuredCostModel(cal);
  } else {
    cm = model::MakeAcceleratorCostModel(c);
  }
  host->cost_model = cm->name();
  const int64_t L = c.n_layers, D = host->cache->max_draft_len();
  for (int64_t l = 0; l <= L; ++l) host->draft_cost.push_back(l == 0 ? 0.0 : cm->ControlledDraftToken(l));
  for (int64_t e = 0; e <= L; ++e) {
    for (int64_t k = 0; k <= D; ++k) host->verify_cost.push_back(e == 0 ? 0.0 : cm->Verify(e, k));
  }
  host->probe_cost = cm->ControlledProbe();

  if (!options.policy_target.empty()) {
    PolicyFollowerOptions po;
    po.target = options.policy_target;
    LEDE_ASSIGN_OR_RETURN(po.credentials, rpc::MakeChannelCredentials(options.policy_tls, "policy_tls"));
    po.tls_server_name = options.policy_tls.enabled() ? options.policy_tls.server_name : "";
    po.token = options.internal_token;
    po.model_fingerprint = host->fingerprint;
    po.n_layers = static_cast<int32_t>(L);
    po.metrics = host->metrics.get();
    host->follower = std::make_unique<PolicyFollower>(po);
    Status first = host->follower->FetchOnce();
    if (!first.ok()) rpc::LogEvent("warn", "policy_fetch_failed", {{"error", first.ToString()}});
    host->follower->Start();
    if (options.remote_decisions) {
      host->policy_stub = lede::v1::Policy::NewStub(MakePolicyChannel(options.policy_target, po.credentials, po.tls_server_name, po.token));
    }
  } else if (!options.policy_dir.empty()) {
    const std::filesystem::path dir(options.policy_dir);
    auto artifact = std::filesystem::exists(dir / policy::dqn::kMetadataFile)
                        ? policy::dqn::LoadArtifact(options.policy_dir, host->fingerprint)
                        : policy::dqn::LoadServingArtifact(options.policy_dir, host->fingerprint);
    if (!artifact.ok()) return artifact.status();
    host->local_policy = std::make_shared<const policy::dqn::Artifact>(std::move(*artifact));
    if (host->metrics) {
      host->metrics->SetPolicyVersion(host->local_policy->metadata.version,
                                      telemetry::PolicyVersionNumber(host->local_policy->metadata.version));
    }
  }
  return host;
}

Status Readiness(ModelHost& host) {
  if (!host.model) return UnavailableError("model: not loaded");
  const bool drafter = !host.owns_pool && !host.options.kv_pool_name.empty();
  if (drafter) {
    std::lock_guard<std::mutex> lock(host.pool_mu);
    model::KvCacheOptions o;
    o.shared_memory_name = host.options.kv_pool_name;
    o.dtype = host.model->options().dtype;
    auto current = model::KvCache::Attach(host.model->config(), o);
    if (!current.ok()) {
      return UnavailableError("kv_pool: " + std::string(current.status().message()) +
                              " (the verifier has not created it yet)");
    }
    if (!host.cache || host.cache->epoch() != current->epoch()) {
      host.cache = std::make_shared<model::KvCache>(std::move(*current));
      rpc::LogEvent("info", "kv_pool_attached", {{"epoch", std::to_string(host.cache->epoch())}});
    }
  } else if (!host.Pool()) {
    return UnavailableError("kv_pool: not created");
  }
  if (host.follower && host.follower->current() == nullptr) {
    return UnavailableError("policy: no policy fetched yet from the policy service " + host.options.policy_target);
  }
  return OkStatus();
}

// ---------------------------------------------------------------- Verifier

namespace {

// A batched step's intra-op threads (--batch-threads), set once per thread
// that runs batches (a handler thread, flat combining).
void SetBatchThreads(int n_threads) {
  static thread_local bool threads_set = false;
  if (threads_set) return;
  at::set_num_threads(std::max(1, n_threads));
  model::SetFusedThreads(n_threads);
  threads_set = true;
}

// --max-batch 1: every call is a step of one session.
void ObserveSoloStep(ModelHost& host, int64_t n_rows) {
  if (!host.metrics) return;
  host.metrics->iteration_batch_size.Observe(1);
  host.metrics->iteration_tokens.Observe(static_cast<double>(n_rows));
}

}  // namespace

struct VerifierService::Impl {
  explicit Impl(std::shared_ptr<ModelHost> h)
      : host(std::move(h)), leases([&] {
          SessionLeaseOptions o;
          o.clock = host->options.clock;
          o.default_ttl = host->options.lease_default_ttl;
          return o;
        }()) {}

  std::shared_ptr<ModelHost> host;
  SessionLeases leases;
  std::mutex mu;                              // slot allocation, sessions and the queue
  std::map<int64_t, SessionState> sessions;   // by slot
  AdmissionQueue queue{[&] {                  // sessions waiting for a slot (guarded by mu)
    AdmissionOptions o;
    o.max_waiting = host->options.max_waiting;
    return o;
  }()};

  // One session's work for the batch scheduler (null at --max-batch 1).
  struct BatchJob {
    model::KvCache* cache = nullptr;
    model::BatchItem item;
    model::BatchResult result;
  };
  std::unique_ptr<BatchScheduler> scheduler;

  // The scheduler's run function (on a handler thread): model::RunBatch per
  // pool (one pool in practice: the verifier's own).
  void RunJobs(const std::vector<void*>& jobs) {
    SetBatchThreads(host->options.batch_threads);
    std::map<model::KvCache*, std::vector<BatchJob*>> by_pool;
    for (void* j : jobs) by_pool[static_cast<BatchJob*>(j)->cache].push_back(static_cast<BatchJob*>(j));
    for (auto& [cache, group] : by_pool) {
      std::vector<model::BatchItem> items;
      items.reserve(group.size());
      for (BatchJob* j : group) items.push_back(j->item);
      std::vector<model::BatchResult> results;
      try {
        results = model::RunBatch(*host->model, *cache, items);
      } catch (const std::exception& e) {  // RunBatch converts libtorch's; this is bad_alloc and the like
        model::BatchResult failed;
        failed.status = InternalError(std::string("batch: ") + e.what());
        results.assign(group.size(), failed);
      }
      for (size_t k = 0; k < group.size(); ++k) group[k]->result = std::move(results[k]);
    }
  }

  // Runs `job` in the next batched step. Errors: kUnavailable when the
  // service is stopping.
  Status RunInBatch(BatchJob& job, int64_t n_rows) {
    if (!scheduler->Submit(&job, n_rows)) return UnavailableError("verifier: shutting down");
    return job.result.status;
  }

  // The prefill of a new session in chunks of --prefill-chunk positions,
  // one batched step each, so that it does not stall the running sessions
  // for its whole length; while it is the only open session the rest of the
  // prompt goes in one step (nobody to stall; one pass instead of several).
  // Stops at a chunk boundary when the caller left or the session was doomed
  // (closed, or its owner's lease lapsed).
  StatusOr<speculation::Prefilled> PrefillBatched(model::KvCache& cache, int64_t slot,
                                                  const std::vector<int32_t>& prompt,
                                                  const speculation::SessionOptions& so,
                                                  grpc::ServerContext* context) {
    const int64_t P = static_cast<int64_t>(prompt.size());
    const int64_t chunk = std::max<int64_t>(1, host->options.prefill_chunk);
    for (int64_t start = 0; start < P;) {
      if (start > 0 && context != nullptr && context->IsCancelled()) {
        return Status(StatusCode::kCancelled, "the caller left during the prefill");
      }
      int64_t len = std::min(chunk, P - start);
      {
        std::lock_guard<std::mutex> lock(mu);
        auto it = sessions.find(slot);
        if (start > 0 && (it == sessions.end() || it->second.doomed)) {  // (busy: the slot is still this session's)  // closed or its lease lapsed: EndCall frees it
          return FailedPreconditionError("slot: the session was freed during the prefill");
        }
        if (sessions.size() <= 1) len = P - start;  // alone
      }
      BatchJob job;
      job.cache = &cache;
      job.item.kind = model::BatchItem::Kind::kPrefill;
      job.item.slot = slot;
      job.item.options = so;
      job.item.prompt = &prompt;
      job.item.chunk_start = start;
      job.item.chunk_len = len;
      start += len;
      LEDE_RETURN_IF_ERROR(RunInBatch(job, job.item.chunk_len));
      if (job.result.prefilled) return job.result.first;
    }
    return InternalError("prefill: the last chunk picked no first token");
  }

  // The reaper: SweepLapsedLeases() every lease_sweep_interval (on the clock).
  absl::Mutex reaper_mu;
  bool stopping ABSL_GUARDED_BY(reaper_mu) = false;
  std::thread reaper;

  // After every allocation or free (mu held): the gauges, and the queue's
  // waiters get their chance at a freed slot.
  void SlotsChanged(model::KvCache& cache) {
    if (host->metrics) host->metrics->kv_slots_in_use.Set(static_cast<double>(cache.n_in_use()));
    SessionsChanged();
    queue.SlotFreed();
  }

  // After sessions changed (mu held): the scheduler fills batches up to the
  // open sessions (lock order: mu, then the scheduler's).
  void SessionsChanged() {
    if (scheduler) scheduler->set_n_sessions(static_cast<int64_t>(sessions.size()));
  }

  // Frees sessions idle past the timeout (their coordinator is gone). Only
  // sessions without an owner: owned ones follow their owner's lease.
  void ReclaimIdle(model::KvCache& cache) {
    const auto now = Clock::now();
    for (auto it = sessions.begin(); it != sessions.end();) {
      if (it->second.owner.empty() && it->second.busy == 0 &&
          absl::FromChrono(now - it->second.last_used) > host->options.session_idle_timeout) {
        rpc::LogEvent("warn", "session_reclaimed", {{"slot", std::to_string(it->first)},
                                                    {"request_id", it->second.request_id}});
        (void)cache.Free(it->first);
        it = sessions.erase(it);
      } else {
        ++it;
      }
    }
    SessionsChanged();
  }

  // Frees every session of `owners` (a busy one when its call ends).
  // Returns how many were freed or doomed.
  int FreeOwners(const std::vector<std::string>& owners, const char* reason) {
    if (owners.empty()) return 0;
    const std::set<std::string> set(owners.begin(), owners.end());
    std::shared_ptr<model::KvCache> cache = host->Pool();
    int n = 0;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (auto it = sessions.begin(); it != sessions.end();) {
        if (set.count(it->second.owner) == 0) {
          ++it;
          continue;
        }
        ++n;
        if (it->second.busy > 0) {
          it->second.doomed = true;
          ++it;
        } else {
          (void)cache->Free(it->first);
          it = sessions.erase(it);
        }
      }
      SlotsChanged(*cache);
    }
    for (const std::string& owner : owners) {
      rpc::LogEvent("warn", "owner_sessions_freed", {{"owner_instance", owner}, {"reason", reason}});
    }
    if (n > 0) rpc::LogEvent("warn", "sessions_freed", {{"n_sessions", std::to_string(n)}, {"reason", reason}});
    return n;
  }

  // Ends a busy call of session `id` on `slot`: frees the session when it
  // was closed or its owner's lease went while the call computed. Returns
  // false when it did.
  bool EndCall(model::KvCache& cache, int64_t slot, uint64_t id) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = sessions.find(slot);
    if (it == sessions.end() || it->second.id != id) return false;
    if (--it->second.busy == 0 && it->second.doomed) {
      (void)cache.Free(slot);
      sessions.erase(it);
      SlotsChanged(cache);
      return false;
    }
    return true;
  }

  void ReaperLoop() {
    lede::Clock& clock = leases.clock();
    absl::MutexLock lock(&reaper_mu);
    while (!stopping) {
      clock.AwaitWithTimeout(&reaper_mu, absl::Condition(&stopping), host->options.lease_sweep_interval);
      if (stopping) break;
      reaper_mu.Unlock();
      FreeOwners(leases.TakeExpired(), "lease_lapsed");
      reaper_mu.Lock();
    }
  }
};

VerifierService::VerifierService(std::shared_ptr<ModelHost> host)
    : impl_(std::make_unique<Impl>(std::move(host))) {
  if (impl_->host->options.max_batch > 1 && impl_->host->owns_pool) {  // a verifier (or both), not a drafter
    BatchSchedulerOptions o;
    o.max_batch = impl_->host->options.max_batch;
    o.n_workers = impl_->host->options.batch_workers;
    o.max_wait = impl_->host->options.batch_wait;
    if (impl_->host->metrics) {
      o.batch_size = &impl_->host->metrics->iteration_batch_size;
      o.batch_rows = &impl_->host->metrics->iteration_tokens;
    }
    impl_->scheduler = std::make_unique<BatchScheduler>(
        o, [impl = impl_.get()](const std::vector<void*>& jobs) { impl->RunJobs(jobs); });
  }
  impl_->reaper = std::thread([this] { impl_->ReaperLoop(); });
}

VerifierService::~VerifierService() {
  {
    absl::MutexLock lock(&impl_->reaper_mu);
    impl_->stopping = true;
  }
  impl_->reaper.join();
}

int VerifierService::SweepLapsedLeases() { return impl_->FreeOwners(impl_->leases.TakeExpired(), "lease_lapsed"); }

grpc::Status VerifierService::RenewLease(grpc::ServerContext* context, const lede::v1::RenewLeaseRequest* req,
                                         lede::v1::RenewLeaseResponse* resp) {
  if (grpc::Status auth = impl_->host->options.internal_token.Check(*context); !auth.ok()) return auth;
  if (req->ttl_ms() < 0) return ToGrpcStatus(InvalidArgumentError("ttl_ms: must be >= 0"));
  auto renewed = impl_->leases.Renew(req->instance_id(), req->owner_name(), absl::Milliseconds(req->ttl_ms()));
  if (!renewed.ok()) return ToGrpcStatus(renewed.status());
  if (!renewed->replaced.empty()) {
    resp->set_n_replaced_sessions(impl_->FreeOwners(renewed->replaced, "replaced_by_new_instance"));
  }
  resp->set_ttl_ms(absl::ToInt64Milliseconds(renewed->ttl));
  std::shared_ptr<model::KvCache> cache = impl_->host->Pool();
  std::lock_guard<std::mutex> lock(impl_->mu);
  int32_t n = 0;
  for (const auto& [slot, session] : impl_->sessions) n += session.owner == req->instance_id() ? 1 : 0;
  resp->set_n_sessions(n);
  resp->set_n_slots(static_cast<int32_t>(cache->n_slots()));
  resp->set_n_free_slots(static_cast<int32_t>(cache->n_slots() - cache->n_in_use()));
  resp->set_n_waiting(static_cast<int32_t>(impl_->queue.n_waiting()));
  return grpc::Status::OK;
}


grpc::Status VerifierService::Describe(grpc::ServerContext* context, const lede::v1::DescribeRequest*,
                                       lede::v1::ModelInfo* info) {
  if (grpc::Status auth = impl_->host->options.internal_token.Check(*context); !auth.ok()) return auth;
  impl_->host->FillInfo(info);
  return grpc::Status::OK;
}

grpc::Status VerifierService::OpenSession(grpc::ServerContext* context, const lede::v1::OpenSessionRequest* req,
                                          lede::v1::OpenSessionResponse* resp) {
  if (grpc::Status auth = impl_->host->options.internal_token.Check(*context); !auth.ok()) return auth;
  ModelHost& host = *impl_->host;
  std::shared_ptr<model::KvCache> cache = host.Pool();
  const int64_t V = host.model->config().vocab_size;
  if (req->prompt_token_ids().empty()) {
    return ToGrpcStatus(InvalidArgumentError("prompt_token_ids: empty"));
  }
  if (Status s = CheckTokens(req->prompt_token_ids(), V, "prompt_token_ids"); !s.ok()) return ToGrpcStatus(s);
  if (req->prompt_token_ids_size() >= cache->capacity()) {
    return ToGrpcStatus(InvalidArgumentError("prompt_token_ids: " + std::to_string(req->prompt_token_ids_size()) +
                                             " tokens do not fit the context window of " +
                                             std::to_string(cache->capacity())));
  }
  speculation::SessionOptions so;
  so.sampling = SamplingFromProto(req->sampling());
  if (Status s = ValidateSampling(so.sampling); !s.ok()) return ToGrpcStatus(s);
  so.record_nll = req->record_nll();
  if (!req->owner_instance().empty()) {
    impl_->FreeOwners(impl_->leases.TakeExpired(), "lease_lapsed");
    if (Status s = impl_->leases.Admit(req->owner_instance()); !s.ok()) return ToGrpcStatus(s);
  }
  int64_t slot = -1;
  const uint64_t session_id = DrawSessionId();
  {
    // A full pool queues the request (FIFO) until a slot frees, its deadline
    // passes or its caller cancels; only a full queue refuses it.
    std::unique_lock<std::mutex> lock(impl_->mu);
    auto try_admit = [&] {
      StatusOr<int64_t> allocated = cache->Allocate(session_id);
      if (!allocated.ok()) {
        impl_->ReclaimIdle(*cache);
        allocated = cache->Allocate(session_id);
      }
      if (allocated.ok()) slot = *allocated;
      return allocated.ok();
    };
    absl::Duration queued;
    Status admitted = impl_->queue.Admit(lock, try_admit, absl::FromChrono(context->deadline()),
                                         [context] { return context->IsCancelled(); }, &queued);
    if (!admitted.ok()) return ToGrpcStatus(admitted);
    if (host.metrics) host.metrics->request_queue_time.Observe(absl::ToDoubleSeconds(queued));
    SessionState& session = impl_->sessions[slot];
    session = SessionState{so, Clock::now(), req->request_id(), req->owner_instance(), session_id};
    session.busy = 1;  // the prefill below
    impl_->SlotsChanged(*cache);
  }
  const std::vector<int32_t> prompt(req->prompt_token_ids().begin(), req->prompt_token_ids().end());
  StatusOr<speculation::Prefilled> first = InternalError("prefill did not run");
  if (impl_->scheduler) {
    first = impl_->PrefillBatched(*cache, slot, prompt, so, context);
  } else {
    model::Verifier verifier(*host.model, *cache);
    first = model::PrefillSession(verifier, slot, prompt, so);
    ObserveSoloStep(host, static_cast<int64_t>(prompt.size()));
  }
  if (!impl_->EndCall(*cache, slot, session_id)) {
    return ToGrpcStatus(FailedPreconditionError("owner_instance: the session of " + req->owner_instance() +
                                                " was freed during the prefill (its lease lapsed, or its caller"
                                                " closed it)"));
  }
  // A caller that is gone (cancelled, or past its deadline) never learns the
  // slot: free it now rather than leave it to the lease or the idle reclaim.
  if (!first.ok() || context->IsCancelled()) {
    std::lock_guard<std::mutex> lock(impl_->mu);
    (void)cache->Free(slot);
    impl_->sessions.erase(slot);
    impl_->SlotsChanged(*cache);
    if (first.ok()) return grpc::Status(grpc::StatusCode::CANCELLED, "the caller left during the prefill");
    return ToGrpcStatus(first.status());
  }
  resp->set_slot(slot);
  resp->set_pool_epoch(cache->epoch());
  resp->set_session_id(session_id);
  resp->set_first_token(first->token);
  resp->set_first_nll(first->nll);
  return grpc::Status::OK;
}

grpc::Status VerifierService::Verify(grpc::ServerContext* context, const lede::v1::VerifyRequest* req,
                                     lede::v1::VerifyResponse* resp) {
  if (grpc::Status auth = impl_->host->options.internal_token.Check(*context); !auth.ok()) return auth;
  ModelHost& host = *impl_->host;
  auto pool = host.PoolOfEpoch(req->pool_epoch());
  if (!pool.ok()) return ToGrpcStatus(pool.status());
  model::KvCache& cache = **pool;
  speculation::SessionOptions so;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto it = impl_->sessions.find(req->slot());
    if (it == impl_->sessions.end() || it->second.id != req->session_id()) {
      return ToGrpcStatus(NotThisSession(req->slot()));
    }
    if (it->second.doomed) {
      return ToGrpcStatus(FailedPreconditionError("slot: " + std::to_string(req->slot()) + " has no open session"));
    }
    it->second.last_used = Clock::now();
    ++it->second.busy;
    so = it->second.options;
  }
  // Ends the call on every path; a session doomed meanwhile is freed then.
  struct CallGuard {
    Impl* impl;
    model::KvCache& cache;
    int64_t slot;
    uint64_t id;
    ~CallGuard() { impl->EndCall(cache, slot, id); }
  } guard{impl_.get(), cache, req->slot(), req->session_id()};
  const int64_t V = host.model->config().vocab_size;
  if (req->position() != cache.length(req->slot())) {
    return ToGrpcStatus(FailedPreconditionError("position: " + std::to_string(req->position()) +
                                                " but the slot holds " + std::to_string(cache.length(req->slot()))));
  }
  if (req->pending_token() < 0 || req->pending_token() >= V) {
    return ToGrpcStatus(InvalidArgumentError("pending_token: outside [0, V)"));
  }
  if (Status s = CheckTokens(req->draft_tokens(), V, "draft_tokens"); !s.ok()) return ToGrpcStatus(s);
  speculation::Draft draft;
  draft.exit_layer = req->exit_layer();
  draft.tokens.assign(req->draft_tokens().begin(), req->draft_tokens().end());
  draft.ready_layer = req->ready_layer();
  const int64_t K = static_cast<int64_t>(draft.tokens.size());
  const int64_t L = host.model->n_layers();
  if (K > 0 && (draft.exit_layer < 1 || draft.exit_layer > L)) {
    return ToGrpcStatus(InvalidArgumentError("exit_layer: " + std::to_string(draft.exit_layer) + " outside [1, " +
                                             std::to_string(L) + "]"));
  }
  if (draft.ready_layer < 0 || draft.ready_layer > L) {
    return ToGrpcStatus(InvalidArgumentError("ready_layer: outside [0, L]"));
  }
  auto probs = ProbsFromBytes(req->draft_probs(), K, V);
  if (!probs.ok()) return ToGrpcStatus(probs.status());
  StatusOr<speculation::Verdict> verdict = InternalError("verification did not run");
  if (impl_->scheduler) {
    Impl::BatchJob job;
    job.cache = &cache;
    job.item.kind = model::BatchItem::Kind::kRound;
    job.item.slot = req->slot();
    job.item.options = so;
    job.item.pending_token = req->pending_token();
    job.item.draft = std::move(draft);
    job.item.draft_probs = *probs;
    const bool ready = job.item.draft.ready_layer != 0;
    Status ran = impl_->RunInBatch(job, K + (ready || K == 0 ? 1 : 2));
    verdict = ran.ok() ? StatusOr<speculation::Verdict>(std::move(job.result.verdict))
                       : StatusOr<speculation::Verdict>(ran);
  } else {
    model::Verifier verifier(*host.model, cache);
    verdict = model::VerifyRound(verifier, cache, req->slot(), req->pending_token(), draft, *probs, so);
    ObserveSoloStep(host, K + 1);
  }
  if (!verdict.ok()) return ToGrpcStatus(verdict.status());
  resp->set_n_accepted(verdict->n_accepted);
  for (int32_t t : verdict->tokens) resp->add_tokens(t);
  for (double x : verdict->nll) resp->add_nll(x);
  return grpc::Status::OK;
}

grpc::Status VerifierService::CloseSession(grpc::ServerContext* context, const lede::v1::CloseSessionRequest* req,
                                           lede::v1::CloseSessionResponse*) {
  if (grpc::Status auth = impl_->host->options.internal_token.Check(*context); !auth.ok()) return auth;
  ModelHost& host = *impl_->host;
  std::shared_ptr<model::KvCache> cache = host.Pool();
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (req->slot() < 0) {
    if (req->request_id().empty()) return ToGrpcStatus(InvalidArgumentError("request_id: required when slot < 0"));
    for (auto it = impl_->sessions.begin(); it != impl_->sessions.end(); ++it) {
      const SessionState& session = it->second;
      if (session.request_id != req->request_id() || session.owner != req->owner_instance()) continue;
      if (session.busy > 0) {
        it->second.doomed = true;  // still prefilling: freed when that call ends
      } else {
        (void)cache->Free(it->first);
        impl_->sessions.erase(it);
        impl_->SlotsChanged(*cache);
      }
      break;
    }
    return grpc::Status::OK;
  }
  if (cache->epoch() != req->pool_epoch()) return grpc::Status::OK;  // the pool (and session) is gone
  auto it = impl_->sessions.find(req->slot());
  if (it == impl_->sessions.end() || it->second.id != req->session_id()) {
    return ToGrpcStatus(NotThisSession(req->slot()));
  }
  if (it->second.busy > 0) {
    it->second.doomed = true;  // a call computes on it: freed when that call ends (EndCall)
    return grpc::Status::OK;
  }
  (void)cache->Free(req->slot());
  impl_->sessions.erase(it);
  impl_->SlotsChanged(*cache);
  return grpc::Status::OK;
}

// ----------------------------------------------------------------- Drafter

struct DrafterService::Impl {
  std::shared_ptr<ModelHost> host;
  VerifierService* verifier = nullptr;  // co-located, or null

  // Batched drafting (--max-batch > 1): every draft step and phase-1 probe
  // of a session's round is a job; the sessions drafting at the same moment
  // run their steps in one model::RunDrafterBatch pass per block span, each
  // leaving at its own exit layer, while every round's decisions stay its
  // own (its controller on its handler thread between steps). Batches start
  // at once (no wait): a session's next step depends on its previous one,
  // and a session not drafting now may be at the verifier for a while; the
  // steps that arrive while a batch runs form the next one.
  struct DraftJob {
    model::KvCache* cache = nullptr;
    model::DraftWork work;
    StatusOr<model::DraftStepResult> result = model::DraftStepResult{};
  };
  std::unique_ptr<BatchScheduler> scheduler;
  // Draft calls in progress: the sessions whose next draft step is at most
  // one decision away (the scheduler's open sessions). Counted and handed to
  // the scheduler under one lock, so the last count it hears is the count.
  absl::Mutex drafting_mu;
  int64_t drafting ABSL_GUARDED_BY(drafting_mu) = 0;

  void CountDrafting(int64_t delta) {
    if (!scheduler) return;
    absl::MutexLock lock(&drafting_mu);
    drafting += delta;
    scheduler->set_n_sessions(drafting);
  }

  // Counts one Draft call for the scheduler while it lives.
  class DraftingScope {
   public:
    explicit DraftingScope(Impl& impl) : impl_(impl) { impl_.CountDrafting(1); }
    ~DraftingScope() { impl_.CountDrafting(-1); }

   private:
    Impl& impl_;
  };

  void RunJobs(const std::vector<void*>& jobs) {
    SetBatchThreads(host->options.batch_threads);
    std::map<model::KvCache*, std::vector<DraftJob*>> by_pool;
    for (void* j : jobs) by_pool[static_cast<DraftJob*>(j)->cache].push_back(static_cast<DraftJob*>(j));
    for (auto& [cache, group] : by_pool) {
      std::vector<model::DraftWork> work;
      work.reserve(group.size());
      for (DraftJob* j : group) work.push_back(j->work);
      std::vector<StatusOr<model::DraftStepResult>> results;
      try {
        results = model::RunDrafterBatch(*host->model, *cache, work);
      } catch (const std::exception& e) {  // libtorch's are converted; this is bad_alloc and the like
        results.assign(group.size(), InternalError(std::string("draft batch: ") + e.what()));
      }
      for (size_t k = 0; k < group.size(); ++k) group[k]->result = std::move(results[k]);
    }
  }

  // The Drafter's step runner for `cache`: null (every step alone on the
  // handler thread) without a scheduler.
  model::Drafter::StepRunner RunnerFor(model::KvCache& cache) {
    if (!scheduler) return nullptr;
    return [this, &cache](const model::DraftWork& w) -> StatusOr<model::DraftStepResult> {
      DraftJob job;
      job.cache = &cache;
      job.work = w;
      if (!scheduler->Submit(&job, 1)) return UnavailableError("drafter: shutting down");
      return std::move(job.result);
    };
  }
};

DrafterService::DrafterService(std::shared_ptr<ModelHost> host, VerifierService* colocated_verifier)
    : impl_(std::make_unique<Impl>()) {
  impl_->host = std::move(host);
  impl_->verifier = colocated_verifier;
  if (impl_->host->options.max_batch > 1) {
    BatchSchedulerOptions o;
    o.max_batch = impl_->host->options.max_batch;
    o.n_workers = impl_->host->options.batch_workers;
    o.max_wait = impl_->host->options.batch_wait;
    if (impl_->host->metrics) o.batch_size = &impl_->host->metrics->draft_batch_size;
    impl_->scheduler = std::make_unique<BatchScheduler>(
        o, [impl = impl_.get()](const std::vector<void*>& jobs) { impl->RunJobs(jobs); });
  }
}

grpc::Status DrafterService::DraftAndVerify(grpc::ServerContext* context, const lede::v1::DraftRequest* req,
                                            lede::v1::DraftAndVerifyResponse* resp) {
  if (grpc::Status auth = impl_->host->options.internal_token.Check(*context); !auth.ok()) return auth;
  if (impl_->verifier == nullptr) {
    return ToGrpcStatus(UnimplementedError("DraftAndVerify: the verifier runs in another process"));
  }
  lede::v1::DraftResponse* d = resp->mutable_draft();
  grpc::Status drafted = Draft(context, req, d);
  if (!drafted.ok()) return drafted;
  lede::v1::VerifyRequest v;
  v.set_slot(req->slot());
  v.set_pool_epoch(req->pool_epoch());
  v.set_session_id(req->session_id());
  v.set_pending_token(req->pending_token());
  v.set_position(req->position());
  v.set_exit_layer(d->exit_layer());
  *v.mutable_draft_tokens() = d->draft_tokens();
  v.set_draft_probs(d->draft_probs());
  v.set_ready_layer(d->ready_layer());
  d->clear_draft_probs();  // the coordinator has no use for them now
  return impl_->verifier->Verify(context, &v, resp->mutable_verify());
}
DrafterService::~DrafterService() = default;

grpc::Status DrafterService::Describe(grpc::ServerContext* context, const lede::v1::DescribeRequest*,
                                      lede::v1::ModelInfo* info) {
  if (grpc::Status auth = impl_->host->options.internal_token.Check(*context); !auth.ok()) return auth;
  impl_->host->FillInfo(info);
  return grpc::Status::OK;
}

grpc::Status DrafterService::Draft(grpc::ServerContext* server_context, const lede::v1::DraftRequest* req,
                                   lede::v1::DraftResponse* resp) {
  if (grpc::Status auth = impl_->host->options.internal_token.Check(*server_context); !auth.ok()) return auth;
  ModelHost& host = *impl_->host;
  auto pool = host.PoolOfEpoch(req->pool_epoch());
  if (!pool.ok()) return ToGrpcStatus(pool.status());
  model::KvCache& cache = **pool;
  const model::ModelConfig& c = host.model->config();
  if (req->slot() < 0 || req->slot() >= cache.n_slots()) {
    return ToGrpcStatus(InvalidArgumentError("slot: outside [0, " + std::to_string(cache.n_slots()) + ")"));
  }
  if (req->pending_token() < 0 || req->pending_token() >= c.vocab_size) {
    return ToGrpcStatus(InvalidArgumentError("pending_token: outside [0, V)"));
  }
  if (req->context_size() > model::kNgramWindow) {
    return ToGrpcStatus(InvalidArgumentError("context: " + std::to_string(req->context_size()) +
                                             " tokens, more than " + std::to_string(model::kNgramWindow)));
  }
  speculation::SamplingParams sampling = SamplingFromProto(req->sampling());
  if (Status s = ValidateSampling(sampling); !s.ok()) return ToGrpcStatus(s);
  const lede::v1::SpeculationParams& sp = req->speculation();

  if (req->method() == lede::v1::SPECULATION_METHOD_AUTOREGRESSIVE) return grpc::Status::OK;  // nothing to draft
  StatusOr<speculation::MethodSpec> spec = MethodSpecFromProto(req->method(), sp);
  if (!spec.ok()) return ToGrpcStatus(spec.status());
  policy::dqn::MethodContext context;
  context.n_layers = static_cast<int32_t>(c.n_layers);
  context.max_draft_len = static_cast<int32_t>(cache.max_draft_len());
  if (spec->method == speculation::SpeculationMethod::kLede) {
    context.artifact = host.policy();
    if (context.artifact == nullptr) {
      return ToGrpcStatus(UnavailableError("method: LEDE needs a policy and none is loaded yet"));
    }
  }
  StatusOr<policy::dqn::MethodPlan> plan = policy::dqn::PlanMethod(*spec, context);
  if (!plan.ok()) return ToGrpcStatus(plan.status());
  model::DraftConfig config;
  config.mode = plan->mode;
  config.exit_layer = plan->exit_layer;
  config.draft_len = plan->draft_len;
  config.decision_spec = plan->decision_spec;
  config.policy_version = plan->policy_version;
  std::unique_ptr<model::ExitController> controller, explorer;
  if (spec->method == speculation::SpeculationMethod::kLede && host.options.remote_decisions && host.policy_stub) {
    controller = std::make_unique<RemoteDecisionController>(host.policy_stub);
  } else {
    controller = plan->MakeController();
  }
  if (spec->method == speculation::SpeculationMethod::kLede && spec->epsilon > 0.0f) {
    config.policy_version += "+eps=" + std::to_string(spec->epsilon).substr(0, 5);  // "+eps=0.200": behaviour policy
    explorer = std::make_unique<policy::EpsilonGreedyController>(
        *controller, spec->epsilon, speculation::RoundSeed(sampling.seed, req->position(), 3));
  }
  config.controller = explorer ? explorer.get() : controller.get();
  std::unique_ptr<TimedExitController> timed;
  if (config.controller != nullptr && host.metrics) {
    timed = std::make_unique<TimedExitController>(*config.controller, host.metrics->policy_decision_latency);
    config.controller = timed.get();
  }
  if (Status s = model::ValidateDraftConfig(config, c, cache); !s.ok()) {
    return ToGrpcStatus(InvalidArgumentError("speculation." + std::string(s.message())));
  }
  speculation::DraftRequest dr;
  dr.pending_token = req->pending_token();
  dr.position = req->position();
  dr.budget = req->budget();
  dr.trace_nll = req->trace_nll();
  if (req->has_accept_ema()) dr.accept_ema = req->accept_ema();
  if (req->load() < 0) {
    return ToGrpcStatus(InvalidArgumentError("load: " + std::to_string(req->load()) + " is negative"));
  }
  dr.load = std::max<int32_t>(1, req->load());
  dr.context.assign(req->context().begin(), req->context().end());
  dr.round_index = req->round_index();
  dr.record_trace = req->record_trace();
  // The slot stays this session's while the draft runs (kv_cache.h).
  if (!cache.BeginDrafting(req->slot(), req->session_id())) return ToGrpcStatus(NotThisSession(req->slot()));
  struct DraftingGuard {
    model::KvCache& cache;
    int64_t slot;
    ~DraftingGuard() { cache.EndDrafting(slot); }
  } drafting_guard{cache, req->slot()};
  Impl::DraftingScope drafting(*impl_);
  model::Drafter drafter(*host.model, cache, impl_->RunnerFor(cache));
  StatusOr<model::DraftOutput> out = model::DraftRound(*host.model, cache, drafter, req->slot(), config, sampling, dr);
  if (!out.ok()) return ToGrpcStatus(out.status());
  const speculation::Draft& d = out->draft;
  resp->set_exit_layer(d.exit_layer);
  for (int32_t t : d.tokens) resp->add_draft_tokens(t);
  StatusOr<std::string> probs = ProbsToBytes(out->probs);
  if (!probs.ok()) return ToGrpcStatus(probs.status());
  resp->set_draft_probs(*std::move(probs));
  resp->set_ready_layer(d.ready_layer);
  resp->set_n_probes(d.n_probes);
  resp->set_n_decisions(d.n_decisions);
  resp->set_policy_version(d.policy_version);
  for (const model::Decision& dec : d.trace.decisions) {
    lede::v1::DecisionRecord* r = resp->add_decisions();
    r->set_phase(static_cast<lede::v1::Phase>(dec.state.phase));
    r->set_layer(dec.state.layer);
    r->set_n_layers(dec.state.n_layers);
    r->set_draft_pos(dec.state.draft_pos);
    r->set_max_draft_len(dec.state.max_draft_len);
    r->set_top1_prob(dec.state.top1_prob);
    r->set_top_k_nll(dec.state.top_k_nll);
    r->set_entropy(dec.state.entropy);
    r->set_trace_nll(dec.state.trace_nll);
    r->set_margin(dec.state.margin);
    r->set_draft_conf(dec.state.draft_conf);
    r->set_accept_ema(dec.state.accept_ema);
    r->set_lookup_match(dec.state.lookup_match);
    r->set_trigram_seen(dec.state.trigram_seen);
    r->set_load(dec.state.load);
    r->set_action(dec.action == model::Action::kExit ? lede::v1::EXIT_ACTION_EXIT : lede::v1::EXIT_ACTION_CONTINUE);
    r->set_draft_index(dec.draft_index);
    r->set_wasted_probe(dec.wasted_probe);
  }
  return grpc::Status::OK;
}

}  // namespace lede::model_service
