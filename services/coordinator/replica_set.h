// File: services/coordinator/replica_set.h
//
// ReplicaSet: the model replicas a coordinator spreads sessions over. A
// replica is one verifier + drafter pair on one KV pool (split), or one
// `lede-model --role both` process (co-located: both addresses equal);
// several coordinators may share the same replicas, and the slot accounting
// stays in each replica (docs/design.md §3-§4).
//
// Discovery: a static list, and/or a DNS name that resolves to several
// addresses (a Kubernetes headless Service: one A record per model pod),
// re-resolved every refresh_interval; each address is a replica with the
// verifier and drafter on the configured ports. A replica that disappears
// from DNS gets no new sessions; its open sessions finish on it.
//
// Placement: each replica's load comes from the lease renewals this
// coordinator sends anyway (about once a second: RenewLeaseResponse's slots,
// free slots and waiting sessions), corrected for the sessions this
// coordinator opened or closed on it since, so placing a session costs no
// extra call. Candidates() orders the replicas for a new session: those not
// marked failed recently first, then the most estimated free slots (free
// minus waiting), then the fewest sessions of this coordinator, then a
// rotating tie-break. The caller opens the session on the first and, when
// that replica is down, draining or full, marks it and tries the next; every
// round of a session then stays on its replica.
//
// Thread-safety: every method is thread-safe; Replica objects are shared
// (std::shared_ptr) and outlive their removal from the set while a session
// uses them. Torch-free.
#ifndef LEDE_SERVICES_COORDINATOR_REPLICA_SET_H_
#define LEDE_SERVICES_COORDINATOR_REPLICA_SET_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <grpcpp/channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/lede/v1/model.grpc.pb.h"
#include "services/coordinator/session_lease.h"
#include "shared/rpc/security.h"
#include "shared/status/status.h"

namespace lede::coordinator {

// Where one replica's services listen ("host:port"); drafter == verifier
// means co-located (one DraftAndVerify call per round).
struct ReplicaTarget {
  std::string verifier;
  std::string drafter;
  bool operator==(const ReplicaTarget& o) const { return verifier == o.verifier && drafter == o.drafter; }
};

// Parses a --replicas list: comma-separated entries "VERIFIER" (co-located)
// or "VERIFIER+DRAFTER", each a host:port.
// Errors: kInvalidArgument naming the entry (empty, no port, bad port).
StatusOr<std::vector<ReplicaTarget>> ParseReplicaTargets(const std::string& list);

struct ReplicaSetOptions {
  std::vector<ReplicaTarget> targets;  // static replicas
  // DNS discovery ("" = none): every address `dns_name` resolves to is a
  // replica with its verifier on verifier_port and its drafter on
  // drafter_port (0 = co-located, the verifier's port).
  std::string dns_name;
  int verifier_port = 50052;
  int drafter_port = 50054;
  absl::Duration refresh_interval = absl::Seconds(10);
  // A replica that failed to open a session (down, draining, queue full)
  // goes to the back of the candidates for this long.
  absl::Duration failure_backoff = absl::Seconds(2);
  // Channels to the model services.
  std::shared_ptr<grpc::ChannelCredentials> credentials;  // null = insecure
  rpc::InternalToken token;  // sent on every call (security.h); empty = none
  grpc::ChannelArguments channel_args;
  // This coordinator's lease on each replica's verifier (owner_name,
  // TTL, renewal period; on_renewed is set by the set itself).
  SessionLeaseOptions lease;
  // Start the leases (and their first, synchronous renewal) in Create(); off
  // in unit tests that feed loads by hand.
  bool start_leases = true;
  // Called after every load report with the KV slots of all replicas that
  // reported (capacity, and in use); the coordinator's lede_kv_slots_*
  // gauges (on a lease thread; must be quick).
  std::function<void(int64_t capacity, int64_t in_use)> on_slots;
};

class Replica {
 public:
  Replica(ReplicaTarget target, const ReplicaSetOptions& options);
  ~Replica();
  Replica(const Replica&) = delete;
  Replica& operator=(const Replica&) = delete;

  const ReplicaTarget& target() const { return target_; }
  std::string name() const { return target_.verifier; }
  lede::v1::Verifier::Stub* verifier() const { return verifier_.get(); }
  lede::v1::Drafter::Stub* drafter() const { return drafter_.get(); }
  std::atomic<bool>* fused_rounds() { return &fused_rounds_; }
  // The owner_instance of sessions this coordinator opens here.
  const std::string& owner_instance() const { return lease_->instance_id(); }
  void StartLease() { lease_->Start(); }

  // A load report (a lease renewal's answer): slots, free slots, sessions
  // waiting for a slot, and how many sessions this coordinator had there.
  void UpdateLoad(int64_t n_slots, int64_t n_free, int64_t n_waiting, int64_t n_mine);
  // Slots and slots in use at the last report (0, 0 before one).
  std::pair<int64_t, int64_t> ReportedSlots() const;
  // Called after every UpdateLoad (set before the lease starts).
  void set_on_load(std::function<void()> f) { on_load_ = std::move(f); }
  // This coordinator opened / closed a session here (between two reports).
  void SessionOpened() { ++sessions_; }
  void SessionClosed() { --sessions_; }
  // Free slots minus waiting sessions at the last report, corrected for this
  // coordinator's sessions since; a large number before the first report
  // (an unknown replica is worth trying).
  int64_t EstimatedFreeSlots() const;
  int64_t sessions() const { return sessions_.load(); }

  // Whether both channels connect before `deadline`.
  bool Connected(std::chrono::system_clock::time_point deadline) const;

 private:
  ReplicaTarget target_;
  std::shared_ptr<grpc::Channel> verifier_channel_, drafter_channel_;
  std::unique_ptr<lede::v1::Verifier::Stub> verifier_;
  std::unique_ptr<lede::v1::Drafter::Stub> drafter_;
  std::atomic<bool> fused_rounds_;
  std::unique_ptr<SessionLease> lease_;
  std::atomic<int64_t> sessions_{0};      // open sessions of this coordinator
  mutable absl::Mutex load_mu_;
  bool have_load_ ABSL_GUARDED_BY(load_mu_) = false;
  int64_t free_at_report_ ABSL_GUARDED_BY(load_mu_) = 0;  // free - waiting
  int64_t mine_at_report_ ABSL_GUARDED_BY(load_mu_) = 0;
  int64_t slots_at_report_ ABSL_GUARDED_BY(load_mu_) = 0;
  int64_t in_use_at_report_ ABSL_GUARDED_BY(load_mu_) = 0;
  std::function<void()> on_load_;
};

class ReplicaSet {
 public:
  // Errors: kInvalidArgument when there is no static target and no dns_name,
  // or a target is malformed; a DNS name that resolves to nothing yet is not
  // an error (it is retried every refresh_interval).
  static StatusOr<std::unique_ptr<ReplicaSet>> Create(ReplicaSetOptions options);
  ~ReplicaSet();  // stops the refresh thread and the leases

  // Replicas for a new session, best first (file comment). Empty when DNS
  // has resolved nothing yet.
  std::vector<std::shared_ptr<Replica>> Candidates();
  // `replica` failed to take a session (UNAVAILABLE, or a full queue).
  void MarkFailed(const Replica& replica);
  // Every replica now (for readiness and tests).
  std::vector<std::shared_ptr<Replica>> All() const;
  // Re-resolves dns_name and adds / drops replicas (the refresh thread calls
  // it; tests may too). Returns how many replicas there are afterwards.
  size_t Refresh();

 private:
  explicit ReplicaSet(ReplicaSetOptions options) : options_(std::move(options)) {}
  std::shared_ptr<Replica> Add(const ReplicaTarget& target);

  ReplicaSetOptions options_;
  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<Replica>> replicas_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Time> failed_at_ ABSL_GUARDED_BY(mu_);  // per replica, InfinitePast = never
  uint64_t rotation_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread refresher_;
};

}  // namespace lede::coordinator

#endif  // LEDE_SERVICES_COORDINATOR_REPLICA_SET_H_
