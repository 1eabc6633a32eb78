// File: services/coordinator/remote_backend.h
//
// The speculation loop's backend over gRPC (shared/speculation/generation.h,
// SpeculationBackend): one session (a KV slot) on the verifier, each round
// drafted by the drafter (Drafter.Draft, then Verifier.Verify), or one
// Drafter.DraftAndVerify call when both run in one process (docs/design.md §3).
// The drafter's decision records come back as the round's RoundTrace.
//
// Errors: a model call's gRPC status as a Status (FromModelCall); with
// autoregressive_fallback a drafter that is UNAVAILABLE degrades the rest of
// the request to full-depth steps. Not thread-safe: one backend per request,
// used by the request's worker thread.
#ifndef LEDE_SERVICES_COORDINATOR_REMOTE_BACKEND_H_
#define LEDE_SERVICES_COORDINATOR_REMOTE_BACKEND_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/client_context.h>
#include <grpcpp/support/server_callback.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/lede/v1/experience.pb.h"
#include "proto/lede/v1/generation.pb.h"
#include "proto/lede/v1/model.grpc.pb.h"
#include "services/coordinator/replica_set.h"
#include "shared/speculation/generation.h"
#include "shared/status/status.h"
#include "shared/telemetry/lede_metrics.h"

namespace lede::coordinator {

// The latest step-cost profiles the drafter and the verifier attached to
// their responses (shared/experience/served_costs.h), which the coordinator
// writes with each request-log record. With several replicas the latest
// response's wins. Thread-safe.
class MeasuredCosts {
 public:
  void UpdateDrafter(const lede::v1::CostProfile& p) ABSL_LOCKS_EXCLUDED(mu_);
  void UpdateVerifier(const lede::v1::CostProfile& p) ABSL_LOCKS_EXCLUDED(mu_);
  // The two merged (MergeCostProfiles); false while neither has arrived.
  bool Current(lede::v1::CostProfile* out) const ABSL_LOCKS_EXCLUDED(mu_);
  // The features of the model service's own cost model (ModelInfo
  // draft_cost, verify_cost, probe_cost: PriorCostFeatures), which stand in
  // for what the profiles have not measured yet.
  void SetPrior(const speculation::CostFeatures& prior) ABSL_LOCKS_EXCLUDED(mu_);
  // The cost features the exit policy sees (LoopOptions::current_cost):
  // experience::ServedCostFeatures of the merged profile over the prior,
  // recomputed on every update (a round reads the cached value).
  speculation::CostFeatures Features() const ABSL_LOCKS_EXCLUDED(mu_);
  // Where every recomputed Features() is exported (lede_policy_cost_feature;
  // borrowed, may be null). Set before the first update.
  void SetMetrics(telemetry::StepCostMetrics* metrics) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Refresh() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  mutable absl::Mutex mu_;
  telemetry::StepCostMetrics* metrics_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool have_ ABSL_GUARDED_BY(mu_) = false;
  lede::v1::CostProfile drafter_ ABSL_GUARDED_BY(mu_), verifier_ ABSL_GUARDED_BY(mu_);
  speculation::CostFeatures prior_ ABSL_GUARDED_BY(mu_), features_ ABSL_GUARDED_BY(mu_);
};

// The cost features of a model service's own cost model as its ModelInfo
// describes it (draft_cost[l] for l in [0, L], verify_cost[E * (D + 1) + K],
// probe_cost; speculation::CostFeaturesOfTables at E = L / 2): the prior
// of MeasuredCosts. All 0 when the info carries no costs.
speculation::CostFeatures PriorCostFeatures(const lede::v1::ModelInfo& info);

// The model processes a coordinator talks to; the stubs and the flag are
// owned by the service and outlive every backend.
struct ModelClients {
  lede::v1::Verifier::Stub* verifier = nullptr;
  lede::v1::Drafter::Stub* drafter = nullptr;
  // Drafter and verifier share a process: one DraftAndVerify call per round.
  // Cleared (for every request) when the drafter answers UNIMPLEMENTED.
  std::atomic<bool>* fused_rounds = nullptr;
  absl::Duration rpc_timeout = absl::Seconds(30);  // deadline of a call when the client set none
  // How long OpenSession may wait in the verifier's queue for a KV slot (the
  // verifier refuses with RESOURCE_EXHAUSTED after it), and how long the
  // prefill may take after admission: OpenSession's deadline is their sum
  // when the client set no earlier one.
  absl::Duration max_queue_wait = absl::Seconds(300);
  absl::Duration prefill_timeout = absl::Seconds(1800);
  bool autoregressive_fallback = false;
  // The coordinator instance that owns the sessions it opens
  // (SessionLease::instance_id(); "" = none).
  std::string owner_instance;
  // Where the responses' measured step costs go (null: dropped).
  MeasuredCosts* measured_costs = nullptr;
};

// A client context for a call made on behalf of `server` (null: an
// in-process request): the client's deadline capped at `rpc_timeout` from
// now, and the client's cancellation.
std::unique_ptr<grpc::ClientContext> ModelCallContext(grpc::CallbackServerContext* server, absl::Duration rpc_timeout);

// A status from a model process, as the client should see it: a session
// whose pool is gone (FAILED_PRECONDITION: the verifier restarted) is
// UNAVAILABLE, like a process that is down; the rest keeps its code.
Status FromModelCall(const grpc::Status& s, const std::string& what);

class RemoteBackend : public speculation::SpeculationBackend {
 public:
  // `request` and `request_id` must outlive the backend. `record_trace`:
  // ask the drafter for its decision records (for experience).
  RemoteBackend(const ModelClients& clients, grpc::CallbackServerContext* server, const lede::v1::ModelInfo& info,
                const lede::v1::GenerateRequest& request, const std::string& request_id, bool record_trace);

  const speculation::ModelLimits& limits() const override { return limits_; }
  StatusOr<speculation::Prefilled> Open(const std::vector<int32_t>& prompt,
                                        const speculation::SessionOptions& options) override;
  StatusOr<speculation::Draft> DraftRound(int64_t session, const speculation::DraftRequest& r) override;
  StatusOr<speculation::Verdict> VerifyRound(int64_t session, int32_t pending_token,
                                             const speculation::Draft& d) override;
  // Frees the slot with a context of its own: a cancelled request still frees it.
  void Close(int64_t session) override;

  // The committed length of the slot after the prefill (the prompt length).
  void set_position(int64_t n) { position_ = n; }
  // True once the drafter was down and the request fell back to full-depth steps.
  bool fell_back() const { return fallback_; }

 private:
  speculation::Verdict ToVerdict(const lede::v1::VerifyResponse& resp);
  // Closes the session an OpenSession that failed without an answer may
  // have left on the verifier (by request id and owner instance).
  void CloseOrphan();
  void SendClose(const lede::v1::CloseSessionRequest& req);
  speculation::Draft FromDraftResponse(const lede::v1::DraftResponse& resp, int32_t round_index);

  ModelClients clients_;
  grpc::CallbackServerContext* server_;
  const lede::v1::GenerateRequest& request_;
  std::string request_id_;
  bool record_trace_;
  speculation::ModelLimits limits_;
  lede::v1::SamplingParams sampling_;
  std::string probs_bytes_;
  lede::v1::VerifyResponse verdict_;  // of a DraftAndVerify call, until VerifyRound takes it
  bool have_verdict_ = false;
  int64_t slot_ = 0;
  uint64_t epoch_ = 0;
  uint64_t session_id_ = 0;  // OpenSessionResponse.session_id: named by every later call
  int64_t position_ = 0;  // committed length of the slot
  bool open_ = false;
  bool fallback_ = false;
};

// The speculation loop's backend over several model replicas
// (replica_set.h): Open() places the session on the best candidate and, when
// that replica is down or draining (UNAVAILABLE) or its queue is full
// (RESOURCE_EXHAUSTED), marks it and opens on the next; every later call
// goes to the chosen replica's RemoteBackend, so a session never moves. A
// replica that dies mid-session ends it with UNAVAILABLE (RemoteBackend).
// Errors of Open(): the last replica's error when every one refused (or
// UNAVAILABLE when the set is empty); other errors at once. Not
// thread-safe: one backend per request, like RemoteBackend.
class ReplicaBackend : public speculation::SpeculationBackend {
 public:
  // `replicas`, `request` and `request_id` must outlive the backend;
  // `base` carries the timeouts and the fallback (its stubs are ignored).
  ReplicaBackend(ReplicaSet& replicas, const ModelClients& base, grpc::CallbackServerContext* server,
                 const lede::v1::ModelInfo& info, const lede::v1::GenerateRequest& request,
                 const std::string& request_id, bool record_trace);

  const speculation::ModelLimits& limits() const override { return limits_; }
  StatusOr<speculation::Prefilled> Open(const std::vector<int32_t>& prompt,
                                        const speculation::SessionOptions& options) override;
  StatusOr<speculation::Draft> DraftRound(int64_t session, const speculation::DraftRequest& r) override;
  StatusOr<speculation::Verdict> VerifyRound(int64_t session, int32_t pending_token,
                                             const speculation::Draft& d) override;
  void Close(int64_t session) override;

  void set_position(int64_t n) { position_ = n; }
  bool fell_back() const { return backend_ != nullptr && backend_->fell_back(); }
  // The replica the session runs on ("" before Open succeeded).
  std::string replica_name() const { return replica_ ? replica_->name() : ""; }

 private:
  ReplicaSet& replicas_;
  ModelClients base_;
  grpc::CallbackServerContext* server_;
  const lede::v1::ModelInfo& info_;
  const lede::v1::GenerateRequest& request_;
  const std::string& request_id_;
  bool record_trace_;
  speculation::ModelLimits limits_;
  int64_t position_ = 0;
  std::shared_ptr<Replica> replica_;
  std::unique_ptr<RemoteBackend> backend_;
  bool closed_ = false;
};

}  // namespace lede::coordinator

#endif  // LEDE_SERVICES_COORDINATOR_REMOTE_BACKEND_H_
