// File: services/policy/serving_policy.h
//
// ServingPolicy: the policy version the policy service runs (docs/design.md §3
// "policy service ... hot-reloads a new version from the object store after
// validating it"), read from a policy root laid out as policy/dqn/artifact.h
// describes: <root>/<version>/{policy.safetensors, policy.json} plus the
// pointer file <root>/SERVING.
//
// Ownership rule: only Reload() replaces the serving version, and it
// replaces it whole: a LoadedPolicy is immutable once published and is
// handed out as std::shared_ptr<const LoadedPolicy>, so a request that took
// the old version keeps it alive until it finishes; a swap never fails or
// tears a request.
//
// Reload() reads SERVING (with a store: after mirroring the store's); when it names a version other than the serving
// one, it loads and validates that version (LoadArtifact with the expected
// model fingerprint; candidate layers within [1, L) when L is known; the
// metadata's version equals the directory name) and swaps it in. A version
// that fails validation is refused: the old version keeps serving,
// lede_policy_reloads_total{outcome="rejected"} counts it once (once per
// distinct failure while SERVING keeps naming it, although every poll
// retries it: an unfinished save may complete later), and a logfmt line
// names the reason. A successful swap counts outcome="ok" and moves
// lede_policy_version{version} / lede_policy_version_number.
//
// Example:
//   telemetry::Registry registry;
//   telemetry::SpecDecodeMetrics metrics(registry);
//   ServingPolicyOptions options;
//   options.policy_root = "models/lede-tiny/policy";
//   options.model_fingerprint = "07e04f79d11d13b5";
//   ServingPolicy serving(options, &metrics);
//   serving.Reload();            // the first version (Status says why not)
//   serving.StartPolling();      // then every reload_interval
//   std::shared_ptr<const LoadedPolicy> p = serving.Current();
//   if (p) p->artifact.network.Forward(features, q);
//
// Thread-safety: every method is thread-safe. Reload() calls are serialized
// among themselves; Current() and WaitForChange() never wait for a load.
#ifndef LEDE_SERVICES_POLICY_SERVING_POLICY_H_
#define LEDE_SERVICES_POLICY_SERVING_POLICY_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "policy/dqn/artifact.h"
#include "policy/poll_thread.h"
#include "shared/clock/clock.h"
#include "shared/status/status.h"

namespace lede::telemetry {
struct SpecDecodeMetrics;
}
namespace lede::storage {
class ObjectStore;
}

namespace lede::policy_service {

// One loaded, validated policy version with the exact bytes it was loaded
// from (served by GetPolicy, so a drafter validates the same files).
struct LoadedPolicy {
  std::string version;              // == artifact.metadata.version == its directory name
  std::string sha256;               // SHA-256 (lowercase hex) of weights_safetensors
  std::string metadata_json;        // bytes of policy.json
  std::string weights_safetensors;  // bytes of policy.safetensors
  policy::dqn::Artifact artifact;   // parsed and validated
};

struct ServingPolicyOptions {
  // Directory holding SERVING and one subdirectory per version. Required.
  std::string policy_root;
  // When set, the store the policies are published to: every Reload() first
  // mirrors the store's SERVING version into policy_root (downloaded,
  // validated, then SERVING; policy/dqn/artifact_store.h), so a trainer on
  // another machine publishes without a shared file system. A store that
  // cannot be read (or holds no version yet) leaves the serving version as
  // it is; before any version is served, policy_root's own SERVING (a copy
  // seeded at deployment) is served meanwhile.
  std::shared_ptr<storage::ObjectStore> store;
  // ModelConfig::ArchitectureFingerprint() of the drafting model; "" accepts
  // any model (only the other checks apply).
  std::string model_fingerprint;
  // L of the drafting model; 0 = unknown (candidate layers are then only
  // checked to be ascending and >= 1 by LoadArtifact).
  int32_t n_layers = 0;
  // Period of the background poll of SERVING (StartPolling).
  absl::Duration reload_interval = absl::Seconds(1);
  // Time source of the poll period (borrowed; must outlive the
  // ServingPolicy). nullptr = Clock::Real(); tests pass a FakeClock.
  // WaitForChange()'s timeout stays on the real clock (it bounds how long a
  // WatchPolicy handler goes without checking for cancellation).
  Clock* clock = nullptr;
  // Example: policy_root = "/srv/policies/llama3-8b", model_fingerprint =
  // "07e04f79d11d13b5", n_layers = 32, reload_interval = absl::Milliseconds(500).
};

// Loads version `version` of `options.policy_root` (bytes + LoadArtifact +
// the checks above), without touching any ServingPolicy.
// Errors: kInvalidArgument for an invalid version name; kNotFound if the
// version directory or one of its files is missing; kInvalidArgument naming
// the fault for a file that fails validation (LoadArtifact's list, a
// metadata version other than `version`, a candidate layer >= L, a file that
// changed between reading and validating).
StatusOr<std::shared_ptr<const LoadedPolicy>> LoadPolicyVersion(const ServingPolicyOptions& options,
                                                               const std::string& version);

class ServingPolicy {
 public:
  // `metrics` may be null (no metrics); when set it is borrowed and must
  // outlive this object. Loads nothing: call Reload() or StartPolling().
  ServingPolicy(ServingPolicyOptions options, telemetry::SpecDecodeMetrics* metrics);
  ~ServingPolicy();  // StopPolling()
  ServingPolicy(const ServingPolicy&) = delete;
  ServingPolicy& operator=(const ServingPolicy&) = delete;

  // Resolves SERVING and, when it names a version other than the serving one,
  // loads, validates and swaps it in (see the file comment).
  // Returns OK when the serving version now equals SERVING (swapped or
  // unchanged). Errors: those of ResolveServingVersion / LoadPolicyVersion;
  // the serving version is then unchanged.
  Status Reload() ABSL_LOCKS_EXCLUDED(reload_mu_, mu_);

  // The serving version, or null before the first successful Reload().
  // Cheap (a mutex-guarded shared_ptr copy); the result stays valid however
  // many swaps follow.
  std::shared_ptr<const LoadedPolicy> Current() const ABSL_LOCKS_EXCLUDED(mu_);

  // The serving version when `version` is "" or names it; otherwise
  // LoadPolicyVersion(version) from disk (not cached, not made serving).
  // Errors: kFailedPrecondition if `version` is "" and nothing is loaded yet;
  // else those of LoadPolicyVersion.
  StatusOr<std::shared_ptr<const LoadedPolicy>> Get(const std::string& version) const;

  // Blocks until the serving version differs from `known_version` ("" = none
  // known, so any loaded version differs), `timeout` passes, or
  // WakeWaiters() is called; returns Current() in every case (null if none
  // is loaded), so the caller compares versions and re-checks its own stop
  // conditions.
  std::shared_ptr<const LoadedPolicy> WaitForChange(const std::string& known_version,
                                                    absl::Duration timeout) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Wakes every WaitForChange() call now (server shutdown).
  void WakeWaiters() ABSL_LOCKS_EXCLUDED(mu_);

  // Starts a thread (policy/poll_thread.h) that calls Reload() every
  // reload_interval (the first call right away). Idempotent.
  void StartPolling();
  // Stops and joins the poll thread (waits for a Reload() in progress).
  // Idempotent.
  void StopPolling();

  const ServingPolicyOptions& options() const { return options_; }

 private:
  // Counts and logs a refused reload, once per distinct (version, reason).
  void RecordRejection(const std::string& version, const Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(reload_mu_);

  const ServingPolicyOptions options_;
  telemetry::SpecDecodeMetrics* const metrics_;

  absl::Mutex reload_mu_ ABSL_ACQUIRED_BEFORE(mu_);  // serializes Reload()
  std::string last_rejection_ ABSL_GUARDED_BY(reload_mu_);  // "version: reason"

  mutable absl::Mutex mu_;
  std::shared_ptr<const LoadedPolicy> current_ ABSL_GUARDED_BY(mu_);
  uint64_t wake_epoch_ ABSL_GUARDED_BY(mu_) = 0;  // bumped by WakeWaiters()
  policy::PollThread poll_;  // on options_.clock; declared last, so stopped first
};

}  // namespace lede::policy_service

#endif  // LEDE_SERVICES_POLICY_SERVING_POLICY_H_
