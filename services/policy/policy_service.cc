#include "services/policy/policy_service.h"

#include <cmath>
#include <string>

#include "policy/dqn/dqn_exit_controller.h"
#include "shared/speculation/exit_controller.h"
#include "shared/rpc/grpc_status.h"
#include "shared/telemetry/lede_metrics.h"

namespace lede::policy_service {
namespace {

// How often a waiting WatchPolicy call checks for client cancellation.
constexpr absl::Duration kWatchPollInterval = absl::Milliseconds(100);

}  // namespace

PolicyService::PolicyService(ServingPolicy* serving, telemetry::SpecDecodeMetrics* metrics, rpc::InternalToken token)
    : serving_(serving), metrics_(metrics), token_(std::move(token)) {}

grpc::Status PolicyService::Decide(grpc::ServerContext* context,
                                   const lede::v1::DecideRequest* request,
                                   lede::v1::DecideResponse* response) {
  if (grpc::Status auth = token_.Check(*context); !auth.ok()) return auth;
  auto finish = [&](const Status& status) {
    // No latency observation: lede_e2e_request_latency_seconds is the Generate
    // request's histogram.
    if (metrics_ != nullptr) metrics_->RecordRequest("Decide", status.code(), -1);
    return rpc::ToGrpcStatus(status);
  };
  const int n = request->states_size();
  if (n == 0) return finish(InvalidArgumentError("states: empty batch"));
  for (int i = 0; i < n; ++i) {
    const auto& features = request->states(i).features();
    if (features.size() != speculation::kExitFeatureDim) {
      return finish(InvalidArgumentError("states[" + std::to_string(i) + "].features: want " +
                                         std::to_string(speculation::kExitFeatureDim) + " values, got " +
                                         std::to_string(features.size())));
    }
    for (int j = 0; j < features.size(); ++j) {
      if (!std::isfinite(features[j])) {
        return finish(InvalidArgumentError("states[" + std::to_string(i) + "].features[" +
                                           std::to_string(j) + "]: not finite"));
      }
    }
  }
  // One snapshot for the whole batch: a concurrent swap cannot mix versions.
  std::shared_ptr<const LoadedPolicy> policy = serving_->Current();
  if (policy == nullptr) return finish(FailedPreconditionError("no policy version is loaded yet"));
  if (!request->version().empty() && request->version() != policy->version) {
    return finish(FailedPreconditionError("version: '" + request->version() +
                                          "' is not the serving version '" + policy->version + "'"));
  }
  response->set_version(policy->version);
  response->mutable_actions()->Reserve(n);
  response->mutable_q_continue()->Reserve(n);
  response->mutable_q_exit()->Reserve(n);
  for (int i = 0; i < n; ++i) {
    float q[policy::dqn::kNumActions];
    policy->artifact.network.Forward(request->states(i).features().data(), q);
    response->add_actions(policy::dqn::GreedyAction(q) == speculation::Action::kExit
                              ? lede::v1::EXIT_ACTION_EXIT
                              : lede::v1::EXIT_ACTION_CONTINUE);
    response->add_q_continue(q[0]);
    response->add_q_exit(q[1]);
  }
  return finish(OkStatus());
}

grpc::Status PolicyService::GetPolicy(grpc::ServerContext* context,
                                      const lede::v1::GetPolicyRequest* request,
                                      lede::v1::PolicyArtifact* response) {
  if (grpc::Status auth = token_.Check(*context); !auth.ok()) return auth;
  StatusOr<std::shared_ptr<const LoadedPolicy>> policy = serving_->Get(request->version());
  Status status = policy.status();
  if (!policy.ok() && !request->version().empty() && status.code() != StatusCode::kNotFound &&
      policy::dqn::ValidateVersionName(request->version()).ok()) {
    // The version exists but is not loadable: the request is well formed, the
    // stored artifact is not.
    status = FailedPreconditionError("version '" + request->version() +
                                     "' is not loadable: " + std::string(status.message()));
  }
  if (policy.ok()) {
    response->set_version((*policy)->version);
    response->set_metadata_json((*policy)->metadata_json);
    response->set_weights_safetensors((*policy)->weights_safetensors);
    response->set_sha256((*policy)->sha256);
  }
  if (metrics_ != nullptr) metrics_->RecordRequest("GetPolicy", status.code(), -1);
  return rpc::ToGrpcStatus(status);
}

grpc::Status PolicyService::WatchPolicy(grpc::ServerContext* context,
                                        const lede::v1::WatchPolicyRequest* request,
                                        grpc::ServerWriter<lede::v1::PolicyVersion>* writer) {
  if (grpc::Status auth = token_.Check(*context); !auth.ok()) return auth;
  if (shutting_down_.load()) {
    return rpc::ToGrpcStatus(UnavailableError("the policy service is shutting down"));
  }
  ++n_watchers_;
  struct Leave {
    std::atomic<int64_t>* n;
    ~Leave() { --*n; }
  } leave{&n_watchers_};
  std::string known = request->known_version();
  while (!shutting_down_.load() && !context->IsCancelled()) {
    std::shared_ptr<const LoadedPolicy> policy = serving_->WaitForChange(known, kWatchPollInterval);
    if (policy == nullptr || policy->version == known) continue;
    lede::v1::PolicyVersion message;
    message.set_version(policy->version);
    message.set_sha256(policy->sha256);
    if (!writer->Write(message)) break;  // the stream is gone
    known = policy->version;
  }
  return grpc::Status::OK;
}

void PolicyService::Shutdown() {
  shutting_down_.store(true);
  serving_->WakeWaiters();
}

}  // namespace lede::policy_service
