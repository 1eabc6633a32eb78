// File: services/policy/policy_service.h
//
// PolicyService: the lede.v1.Policy gRPC service (proto/lede/v1/policy.proto,
// docs/design.md §3) over a ServingPolicy.
//
//   Decide       Q-values and the greedy action (policy/dqn/
//                dqn_exit_controller.h GreedyAction: kExit only if
//                q_exit > q_continue) for a batch of decision states, with
//                the serving version's QNetwork. Remote decision mode,
//                offline evaluation and A/B use it; the drafter embeds the
//                policy instead (a remote call per layer costs more than the
//                layer).
//   GetPolicy    the bytes of a version's policy.json and policy.safetensors
//                and the SHA-256 of the latter, for drafters to load.
//   WatchPolicy  streams the serving version when it differs from the
//                caller's and at every later change.
//
// Status codes (shared/rpc/grpc_status.h, codes kept value for value):
//   Decide:      INVALID_ARGUMENT for an empty batch or a state without
//                exactly kExitFeatureDim finite features (the message names
//                states[i].features); FAILED_PRECONDITION if no version is
//                loaded yet or `version` is set and is not the serving one.
//   GetPolicy:   NOT_FOUND for a version that does not exist;
//                INVALID_ARGUMENT for a malformed version name;
//                FAILED_PRECONDITION if no version is loaded yet (version "")
//                or the named version exists but fails validation.
//   WatchPolicy: OK when the client cancels or the service shuts down.
//
// Uses gRPC's synchronous API: Decide costs microseconds (one QNetwork
// forward per state, ~0.4 us at H = 64), so it runs on the gRPC thread.
// WatchPolicy holds one server thread per watcher while it waits.
//
// Thread-safety: all methods are thread-safe. Ownership: the ServingPolicy
// and the metrics are borrowed and must outlive the service (and the
// grpc::Server it is registered with).
#ifndef LEDE_SERVICES_POLICY_POLICY_SERVICE_H_
#define LEDE_SERVICES_POLICY_POLICY_SERVICE_H_

#include <atomic>
#include <cstdint>

#include "proto/lede/v1/policy.grpc.pb.h"
#include "services/policy/serving_policy.h"
#include "shared/rpc/security.h"

namespace lede::telemetry {
struct SpecDecodeMetrics;
}

namespace lede::policy_service {

class PolicyService final : public lede::v1::Policy::Service {
 public:
  // `serving` must not be null; `metrics` may be null. When set, every call
  // counts lede_requests_total{method, status} and its latency.
  // With a non-empty `token`, every call must carry it (security.h
  // InternalToken; UNAUTHENTICATED otherwise).
  PolicyService(ServingPolicy* serving, telemetry::SpecDecodeMetrics* metrics,
                rpc::InternalToken token = rpc::InternalToken());

  grpc::Status Decide(grpc::ServerContext* context, const lede::v1::DecideRequest* request,
                      lede::v1::DecideResponse* response) override;
  grpc::Status GetPolicy(grpc::ServerContext* context, const lede::v1::GetPolicyRequest* request,
                         lede::v1::PolicyArtifact* response) override;
  grpc::Status WatchPolicy(grpc::ServerContext* context, const lede::v1::WatchPolicyRequest* request,
                           grpc::ServerWriter<lede::v1::PolicyVersion>* writer) override;

  // Ends every WatchPolicy stream (with OK) and refuses new ones
  // (UNAVAILABLE), so that grpc::Server::Shutdown() need not wait for its
  // grace deadline. Call before shutting the server down. Idempotent.
  void Shutdown();

  // WatchPolicy streams open now (accepted and not yet ended).
  int64_t n_watchers() const { return n_watchers_.load(); }

 private:
  ServingPolicy* const serving_;
  telemetry::SpecDecodeMetrics* const metrics_;
  const rpc::InternalToken token_;
  std::atomic<bool> shutting_down_{false};
  std::atomic<int64_t> n_watchers_{0};
};

}  // namespace lede::policy_service

#endif  // LEDE_SERVICES_POLICY_POLICY_SERVICE_H_
