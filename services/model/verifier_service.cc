// The verifier (lede.v1.Verifier): sessions and their KV slots, coordinator
// leases, the admission queue and batched prefill and verification
// (model_service.h).
#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/model/admission_queue.h"
#include "services/model/batch_scheduler.h"
#include "services/model/model_host.h"
#include "services/model/model_service.h"
#include "services/model/session_leases.h"
#include "shared/log/log.h"
#include "shared/model/batch.h"
#include "shared/model/decoding.h"
#include "shared/model/kv_cache.h"
#include "shared/model/llama.h"
#include "shared/rpc/grpc_status.h"
#include "shared/rpc/server.h"
#include "shared/speculation/generation.h"
#include "shared/status/status_macros.h"
#include "shared/telemetry/lede_metrics.h"

namespace lede::model_service {

using rpc::ToGrpcStatus;
using Clock = std::chrono::steady_clock;

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

// A fresh session id: 64 random bits from the OS's generator (never 0), so
// that a caller can name only the sessions it opened.
uint64_t DrawSessionId() {
  ABSL_CONST_INIT static absl::Mutex mu(absl::kConstInit);
  static std::random_device device;  // guarded by mu
  absl::MutexLock lock(&mu);
  for (;;) {
    const uint64_t id = (static_cast<uint64_t>(device()) << 32) ^ static_cast<uint64_t>(device());
    if (id != model::KvCache::kNoSession) return id;
  }
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

// Rows of a round's verification step: the K drafts and the pending
// token, and the last draft's shallow layers when the drafter did not
// compute them (ready_layer 0).
int64_t RoundRows(const speculation::Draft& d) {
  const int64_t K = static_cast<int64_t>(d.tokens.size());
  return K + (d.ready_layer != 0 || K == 0 ? 1 : 2);
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
  absl::Mutex mu;  // slot allocation, sessions and the queue
  std::map<int64_t, SessionState> sessions ABSL_GUARDED_BY(mu);  // by slot
  AdmissionQueue queue ABSL_GUARDED_BY(mu){[&] {  // sessions waiting for a slot
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
    BatchStepThreads step_threads(*host);  // all of --threads when the step runs alone
    std::map<model::KvCache*, std::vector<BatchJob*>> by_pool;
    for (void* j : jobs) by_pool[static_cast<BatchJob*>(j)->cache].push_back(static_cast<BatchJob*>(j));
    for (auto& [cache, group] : by_pool) {
      std::vector<model::BatchItem> items;
      items.reserve(group.size());
      for (BatchJob* j : group) items.push_back(j->item);
      std::vector<model::BatchResult> results;
      const auto step_start = std::chrono::steady_clock::now();
      try {
        results = model::RunBatch(*host->model, *cache, items);
      } catch (const std::exception& e) {  // RunBatch converts libtorch's; this is bad_alloc and the like
        model::BatchResult failed;
        failed.status = InternalError(std::string("batch: ") + e.what());
        results.assign(group.size(), failed);
      }
      RecordStepCost(items, results,
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count());
      for (size_t k = 0; k < group.size(); ++k) group[k]->result = std::move(results[k]);
    }
  }

  // A batched step of round verifications only (prefill chunks cost by
  // their length, not the rounds' price) into the served costs: by its rows
  // and, a session alone, as a verification of its K drafts.
  void RecordStepCost(const std::vector<model::BatchItem>& items, const std::vector<model::BatchResult>& results,
                      double seconds) {
    int64_t rows = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      if (items[i].kind != model::BatchItem::Kind::kRound || i >= results.size() || !results[i].status.ok()) return;
      rows += RoundRows(items[i].draft);
    }
    if (rows == 0) return;
    host->RecordBatchStep(static_cast<int32_t>(rows), seconds);
    if (items.size() == 1) {
      const speculation::Draft& d = items[0].draft;
      host->RecordVerifyStep(d.tokens.empty() ? d.ready_layer : d.exit_layer, static_cast<int32_t>(d.tokens.size()),
                             seconds);
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
        absl::MutexLock lock(&mu);
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
  void SlotsChanged(model::KvCache& cache) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (host->metrics) {
      host->metrics->kv_slots_in_use.Set(static_cast<double>(cache.n_in_use()));
      host->metrics->kv_cache_usage.Set(
          cache.paged() ? 1.0 - static_cast<double>(cache.n_free_blocks()) / static_cast<double>(cache.n_blocks())
                        : static_cast<double>(cache.n_in_use()) / static_cast<double>(cache.n_slots()));
    }
    SessionsChanged();
    queue.SlotFreed();
  }

  // After sessions changed (mu held): the scheduler fills batches up to the
  // open sessions (lock order: mu, then the scheduler's).
  void SessionsChanged() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (scheduler) scheduler->set_n_sessions(static_cast<int64_t>(sessions.size()));
  }

  // Frees sessions idle past the timeout (their coordinator is gone). Only
  // sessions without an owner: owned ones follow their owner's lease.
  void ReclaimIdle(model::KvCache& cache) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const auto now = Clock::now();
    for (auto it = sessions.begin(); it != sessions.end();) {
      if (it->second.owner.empty() && it->second.busy == 0 &&
          absl::FromChrono(now - it->second.last_used) > host->options.session_idle_timeout) {
        log::LogEvent("warn", "session_reclaimed", {{"slot", std::to_string(it->first)},
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
      absl::MutexLock lock(&mu);
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
      log::LogEvent("warn", "owner_sessions_freed", {{"owner_instance", owner}, {"reason", reason}});
    }
    if (n > 0) log::LogEvent("warn", "sessions_freed", {{"n_sessions", std::to_string(n)}, {"reason", reason}});
    return n;
  }

  // Ends a busy call of session `id` on `slot`: frees the session when it
  // was closed or its owner's lease went while the call computed. Returns
  // false when it did.
  bool EndCall(model::KvCache& cache, int64_t slot, uint64_t id) {
    absl::MutexLock lock(&mu);
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
    lede::clock::Clock& clock = leases.clock();
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
    o.wait_fraction = impl_->host->options.batch_wait_fraction;
    o.min_split_rows = impl_->host->options.batch_split_rows;
    o.max_batch_tokens = impl_->host->options.max_batch_tokens;
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
  absl::MutexLock lock(&impl_->mu);
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

namespace {

// OpenSession's own fields, before any work: the prompt (present, ids in
// the vocabulary, fitting a sequence of `capacity` tokens and the window),
// and the queue bound and new tokens not negative. Errors name the field.
Status CheckOpenSession(const lede::v1::OpenSessionRequest& req, const checkpoint::ModelConfig& config,
                        int64_t capacity) {
  if (req.prompt_token_ids().empty()) return InvalidArgumentError("prompt_token_ids: empty");
  LEDE_RETURN_IF_ERROR(CheckTokens(req.prompt_token_ids(), config.vocab_size, "prompt_token_ids"));
  LEDE_RETURN_IF_ERROR(CheckPromptFits(req.prompt_token_ids_size(), capacity, config.max_seq_len));
  if (req.max_queue_wait_ms() < 0) {
    return InvalidArgumentError("max_queue_wait_ms: must be >= 0 (0 = until the call's deadline), got " +
                                std::to_string(req.max_queue_wait_ms()));
  }
  if (req.max_new_tokens() < 0) {
    return InvalidArgumentError("max_new_tokens: must be >= 0 (0 = the whole capacity), got " +
                                std::to_string(req.max_new_tokens()));
  }
  return OkStatus();
}

}  // namespace

grpc::Status VerifierService::OpenSession(grpc::ServerContext* context, const lede::v1::OpenSessionRequest* req,
                                          lede::v1::OpenSessionResponse* resp) {
  if (grpc::Status auth = impl_->host->options.internal_token.Check(*context); !auth.ok()) return auth;
  ModelHost& host = *impl_->host;
  std::shared_ptr<model::KvCache> cache = host.Pool();
  if (Status s = CheckOpenSession(*req, host.model->config(), cache->capacity()); !s.ok()) return ToGrpcStatus(s);
  speculation::SessionOptions so;
  so.sampling = SamplingFromProto(req->sampling());
  if (Status s = ValidateSampling(so.sampling); !s.ok()) return ToGrpcStatus(s);
  so.record_nll = req->record_nll();
  // The KV the session reserves (kv_cache.h Allocate): its prompt and new
  // tokens; the whole capacity when the caller does not say.
  const int64_t reserve_tokens =
      req->max_new_tokens() > 0 ? req->prompt_token_ids_size() + req->max_new_tokens() : 0;
  if (!req->owner_instance().empty()) {
    impl_->FreeOwners(impl_->leases.TakeExpired(), "lease_lapsed");
    if (Status s = impl_->leases.Admit(req->owner_instance()); !s.ok()) return ToGrpcStatus(s);
  }
  int64_t slot = -1;
  const uint64_t session_id = DrawSessionId();
  {
    // A full pool queues the request (FIFO) until a slot frees, its deadline
    // passes or its caller cancels; only a full queue refuses it.
    absl::MutexLock lock(&impl_->mu);
    auto try_admit = [&] {
      StatusOr<int64_t> allocated = cache->Allocate(session_id, reserve_tokens);
      if (!allocated.ok()) {
        impl_->ReclaimIdle(*cache);
        allocated = cache->Allocate(session_id, reserve_tokens);
      }
      if (allocated.ok()) slot = *allocated;
      return allocated.ok();
    };
    // The queue wait is bounded by the caller's max_queue_wait_ms as well as
    // by the call's deadline; the prefill below only by the deadline.
    absl::Time deadline = absl::FromChrono(context->deadline());
    const absl::Duration max_wait = absl::Milliseconds(req->max_queue_wait_ms());
    const bool wait_bounded = max_wait > absl::ZeroDuration() && absl::Now() + max_wait < deadline;
    if (wait_bounded) deadline = absl::Now() + max_wait;
    absl::Duration queued;
    Status admitted = impl_->queue.Admit(&impl_->mu, try_admit, deadline,
                                         [context] { return context->IsCancelled(); }, &queued);
    if (wait_bounded && admitted.code() == StatusCode::kDeadlineExceeded) {
      admitted = ResourceExhaustedError("max_queue_wait_ms: no KV room was freed within " +
                                        std::to_string(req->max_queue_wait_ms()) + " ms (" +
                                        std::to_string(cache->n_in_use()) + " of " + std::to_string(cache->n_slots()) +
                                        " slots in use, " + std::to_string(cache->n_free_blocks()) + " of " +
                                        std::to_string(cache->n_blocks()) + " KV blocks free)");
    }
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
    SetComputeThreads(host.options.threads);
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
    absl::MutexLock lock(&impl_->mu);
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
    absl::MutexLock lock(&impl_->mu);
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
    const int64_t rows = RoundRows(job.item.draft);
    Status ran = impl_->RunInBatch(job, rows);
    verdict = ran.ok() ? StatusOr<speculation::Verdict>(std::move(job.result.verdict))
                       : StatusOr<speculation::Verdict>(ran);
  } else {
    SetComputeThreads(host.options.threads);
    model::Verifier verifier(*host.model, cache);
    const auto step_start = std::chrono::steady_clock::now();
    verdict = model::VerifyRound(verifier, cache, req->slot(), req->pending_token(), draft, *probs, so);
    ObserveSoloStep(host, K + 1);
    if (verdict.ok()) {
      host.RecordVerifyStep(K == 0 ? draft.ready_layer : draft.exit_layer, static_cast<int32_t>(K),
                            std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count());
    }
  }
  if (!verdict.ok()) return ToGrpcStatus(verdict.status());
  host.MaybeAttachCosts(resp);
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
  absl::MutexLock lock(&impl_->mu);
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

}  // namespace lede::model_service
