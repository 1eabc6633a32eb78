// File: services/model/policy_follower.h
//
// The drafter's side of the policy service (docs/design.md §3: the drafter runs
// the policy embedded in-process, "fetches the current policy from the
// policy service and follows its version").
//
// PolicyFollower fetches the serving artifact with GetPolicy, validates it
// exactly as the service did (the bytes are written to a private temporary
// directory and read back with policy::dqn::LoadArtifact and the drafter's
// expected model fingerprint, plus candidate layers within [1, L) when L is
// known), and then follows WatchPolicy in a background thread, fetching each
// new version. When the service is down it reconnects with exponential
// backoff and keeps the last good policy; a bad artifact is logged and
// refused (the old one stays), never fatal.
//
// RemoteDecisionController is the "remote decision mode": an
// ExitController that asks the service's Decide for every decision (one RPC
// per decision; for measuring what embedding the policy saves).
//
// Ownership rule: only the follower's thread replaces current(); it replaces
// it whole, and the shared_ptr it hands out keeps an artifact alive for as
// long as a caller holds it, so a swap never disturbs a request in flight.
// Thread-safety: every PolicyFollower method may be called from any thread.
//
// Example:
//   PolicyFollowerOptions options;
//   options.target = "127.0.0.1:50053";
//   options.model_fingerprint = config.ArchitectureFingerprint();
//   PolicyFollower follower(options);
//   follower.Start();
//   if (!follower.WaitForPolicy(absl::Seconds(10))) { ...no policy yet... }
//   std::shared_ptr<const policy::dqn::Artifact> a = follower.current();
//   // one DqnExitController per request over a->network
#ifndef LEDE_SERVICES_MODEL_POLICY_FOLLOWER_H_
#define LEDE_SERVICES_MODEL_POLICY_FOLLOWER_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include <grpcpp/security/credentials.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "policy/dqn/artifact.h"
#include "policy/poll_thread.h"
#include "proto/lede/v1/policy.grpc.pb.h"
#include "shared/clock/clock.h"
#include "shared/rpc/security.h"
#include "shared/speculation/exit_controller.h"
#include "shared/status/status.h"

namespace grpc {
class Channel;
class ClientContext;
}  // namespace grpc

namespace prometheus {
class Counter;
}  // namespace prometheus

namespace lede::telemetry {
struct SpecDecodeMetrics;
}  // namespace lede::telemetry

namespace lede::model_service {

// A channel to the policy service at `target` ("host:port"), insecure, with
// a receive limit large enough for any artifact (64 MiB; an H = 512 network
// is ~1 MiB). Never fails: connection errors surface on the first call.
// `credentials` null = plaintext; `tls_server_name` (when set) is the name
// the policy service's certificate must carry (gRPC's target name override).
std::shared_ptr<grpc::Channel> MakePolicyChannel(const std::string& target,
                                                 std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr,
                                                 const std::string& tls_server_name = "",
                                                 const rpc::InternalToken& token = rpc::InternalToken());

struct PolicyFollowerOptions {
  // The policy service, "host:port".
  std::string target = "127.0.0.1:50053";
  // TLS of the channel (shared/rpc/security.h MakeChannelCredentials); null
  // = plaintext. `tls_server_name`: the certificate's DNS name when it is
  // not the target's host.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  std::string tls_server_name;
  // The deployment's internal token, sent on every call (security.h).
  rpc::InternalToken token;
  // ModelConfig::ArchitectureFingerprint() of this drafter's model; "" accepts
  // any (then a policy trained for another model would be used: set it).
  std::string model_fingerprint;
  // L of this drafter's model; 0 = unknown (candidate layers unchecked).
  int32_t n_layers = 0;
  // Deadline of each GetPolicy call.
  absl::Duration rpc_timeout = absl::Seconds(10);
  // Reconnect backoff: starts here, doubles per failed attempt, capped at
  // max_backoff, back to initial after a stream delivered a message.
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(5);
  // Time source of the reconnect backoff (borrowed; must outlive the
  // follower). nullptr = Clock::Real(); tests pass a FakeClock. RPC
  // deadlines (rpc_timeout) and WaitForPolicy/WaitForVersion stay on the
  // real clock.
  Clock* clock = nullptr;
  // Optional (borrowed, must outlive the follower): SetPolicyVersion and
  // RecordPolicyReload on every accepted / refused version.
  telemetry::SpecDecodeMetrics* metrics = nullptr;
  // Example: target = "policy.lede.svc:50053", model_fingerprint =
  // "07e04f79d11d13b5", n_layers = 12, max_backoff = absl::Seconds(2).
};

class PolicyFollower {
 public:
  // Creates the private temporary directory (under $TMPDIR or /tmp) and the
  // channel; connects nothing until Start() or FetchOnce().
  explicit PolicyFollower(PolicyFollowerOptions options);
  ~PolicyFollower();  // Stop(), then removes the temporary directory
  PolicyFollower(const PolicyFollower&) = delete;
  PolicyFollower& operator=(const PolicyFollower&) = delete;

  // Starts the follow thread (policy/poll_thread.h): WatchPolicy(known_version = version()), a
  // fetch for each announced version that differs from version(), and a
  // reconnect with backoff whenever the stream ends. Returns at once (the
  // first policy arrives asynchronously; see WaitForPolicy). Idempotent.
  void Start() ABSL_LOCKS_EXCLUDED(mu_);

  // Cancels the stream, wakes a backoff sleep and joins the thread; a fetch
  // in progress finishes first (bounded by rpc_timeout). Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // One synchronous GetPolicy of the serving version, validated and swapped
  // in when it differs from version() (usable without Start()).
  // Errors: kUnavailable / kDeadlineExceeded (service down or slow) and the
  // service's codes, prefixed "policy GetPolicy"; kInvalidArgument naming the
  // fault for an artifact that fails validation (LoadArtifact's list, a
  // version or SHA-256 that disagrees with the response, a candidate layer
  // >= L); kInternal if the temporary files cannot be written. On error
  // current() is unchanged.
  Status FetchOnce() ABSL_LOCKS_EXCLUDED(mu_, fetch_mu_);

  // The last accepted artifact, or null before the first one. Cheap
  // (a mutex-guarded shared_ptr copy); valid across later swaps.
  std::shared_ptr<const policy::dqn::Artifact> current() const ABSL_LOCKS_EXCLUDED(mu_);
  // current()'s version, "" before the first one.
  std::string version() const ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until some policy is loaded / version() == `version`, or the
  // timeout passes; returns whether it is.
  bool WaitForPolicy(absl::Duration timeout) const ABSL_LOCKS_EXCLUDED(mu_);
  bool WaitForVersion(const std::string& version, absl::Duration timeout) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Counters for tests and logs: accepted swaps, refused artifacts, stream
  // (re)connection attempts.
  int64_t n_accepted() const { return n_accepted_.load(); }
  int64_t n_rejected() const { return n_rejected_.load(); }
  int64_t n_connects() const { return n_connects_.load(); }

 private:
  void FollowLoop();
  // Validates `artifact` (the GetPolicy response) and swaps it in.
  Status Install(const lede::v1::PolicyArtifact& artifact) ABSL_EXCLUSIVE_LOCKS_REQUIRED(fetch_mu_);

  const PolicyFollowerOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<lede::v1::Policy::Stub> stub_;
  std::string temp_dir_;  // private; "" if it could not be made (FetchOnce then fails)

  absl::Mutex fetch_mu_ ABSL_ACQUIRED_BEFORE(mu_);  // one fetch at a time (temp files)
  std::string last_rejected_ ABSL_GUARDED_BY(fetch_mu_);  // version, to log a refusal once

  mutable absl::Mutex mu_;
  std::shared_ptr<const policy::dqn::Artifact> current_ ABSL_GUARDED_BY(mu_);
  std::string version_ ABSL_GUARDED_BY(mu_);
  grpc::ClientContext* stream_context_ ABSL_GUARDED_BY(mu_) = nullptr;  // to cancel the Watch

  std::atomic<int64_t> n_accepted_{0};
  std::atomic<int64_t> n_rejected_{0};
  std::atomic<int64_t> n_connects_{0};
  policy::PollThread follow_;  // runs FollowLoop on options_.clock; declared last, so stopped first
};

struct RemoteDecisionOptions {
  // Deadline of each Decide call. The drafter waits this long at most per
  // decision; a policy forward costs < 1 us, so this bounds network time.
  absl::Duration timeout = absl::Milliseconds(100);
  // "" = whatever the service serves; else Decide fails (and the controller
  // falls back, see below) unless the service serves this version.
  std::string version;
  // Optional (borrowed): incremented on every failed call.
  prometheus::Counter* failures = nullptr;
  // Example: timeout = absl::Milliseconds(20), version = "measured-v7".
};

// An ExitController that asks the policy service for every decision
// (Decide with a batch of one state: model::ExitFeatures(state)).
//
// On RPC failure (service down, deadline, FAILED_PRECONDITION for a pinned
// version) Decide returns kContinue and counts the failure. kContinue is the
// action that can never draft a wrong token: at round start it means a plain
// full-depth step, in phase 1 probe one layer deeper (past the last
// candidate: a full-depth step), in phase 2 stop and verify. So an outage
// degrades decoding to autoregressive speed and never changes its output;
// the failure counter makes the outage visible.
//
// Thread-safety: like every ExitController, one per request and never called
// concurrently; many controllers may share one stub (gRPC stubs are
// thread-safe). The stub is shared and must not be null.
class RemoteDecisionController : public model::ExitController {
 public:
  RemoteDecisionController(std::shared_ptr<lede::v1::Policy::StubInterface> stub,
                           RemoteDecisionOptions options = {});

  // "remote:<version of the last answer>" ("remote" before any).
  std::string name() const override;
  // One Decide RPC; kContinue on failure (see the class comment).
  model::Action Decide(const model::ExitState& state) override;

  // Q-values [q_continue, q_exit] of the last successful decision (zeros
  // before the first); failed calls leave them unchanged.
  const std::array<float, 2>& last_q() const { return last_q_; }
  int64_t n_calls() const { return n_calls_; }
  int64_t n_failures() const { return n_failures_; }
  // The status of the last call (OK, or the failure that made it kContinue).
  const Status& last_status() const { return last_status_; }

 private:
  std::shared_ptr<lede::v1::Policy::StubInterface> stub_;
  RemoteDecisionOptions options_;
  std::string version_;
  std::array<float, 2> last_q_{};
  int64_t n_calls_ = 0;
  int64_t n_failures_ = 0;
  Status last_status_;
};

}  // namespace lede::model_service

#endif  // LEDE_SERVICES_MODEL_POLICY_FOLLOWER_H_
