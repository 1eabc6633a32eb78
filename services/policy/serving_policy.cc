#include "services/policy/serving_policy.h"

#include <utility>

#include "policy/dqn/artifact_store.h"
#include "shared/file/file.h"
#include "shared/file/sha256.h"
#include "shared/rpc/server.h"
#include "shared/status/status_macros.h"
#include "shared/telemetry/lede_metrics.h"

namespace lede::policy_service {
namespace {

// The Artifact checks LoadArtifact cannot make because it does not know the
// model's depth or the directory's name.
Status CheckAgainstModel(const ServingPolicyOptions& options, const std::string& version,
                         const policy::dqn::Artifact& artifact) {
  if (artifact.metadata.version != version) {
    return InvalidArgumentError("policy.json: version '" + artifact.metadata.version +
                                "' differs from its directory '" + version + "'");
  }
  if (options.n_layers > 0) {
    for (int32_t l : artifact.metadata.decision.candidate_layers) {
      if (l < 1 || l >= options.n_layers) {
        return InvalidArgumentError("policy.json: candidate layer " + std::to_string(l) +
                                    " outside [1, " + std::to_string(options.n_layers) +
                                    ") of the model");
      }
    }
  }
  return OkStatus();
}

}  // namespace

StatusOr<std::shared_ptr<const LoadedPolicy>> LoadPolicyVersion(const ServingPolicyOptions& options,
                                                               const std::string& version) {
  LEDE_RETURN_IF_ERROR(policy::dqn::ValidateVersionName(version));
  const std::string dir = policy::dqn::VersionDir(options.policy_root, version);
  // Bytes first, then the validating load: the SHA-256 comparison below
  // proves the bytes we serve are the ones that were validated.
  LEDE_ASSIGN_OR_RETURN(std::string metadata_json,
                        file::ReadFile(dir + "/" + policy::dqn::kMetadataFile));
  LEDE_ASSIGN_OR_RETURN(std::string weights, file::ReadFile(dir + "/" + policy::dqn::kWeightsFile));
  LEDE_ASSIGN_OR_RETURN(policy::dqn::Artifact artifact,
                        policy::dqn::LoadArtifact(dir, options.model_fingerprint));
  LEDE_RETURN_IF_ERROR(CheckAgainstModel(options, version, artifact));
  std::string sha256 = file::Sha256Hex(weights);
  if (sha256 != artifact.metadata.weights_sha256) {
    return InvalidArgumentError(dir + ": " + policy::dqn::kWeightsFile +
                                " changed while it was being loaded (checksum mismatch)");
  }
  auto loaded = std::make_shared<const LoadedPolicy>(LoadedPolicy{
      version, std::move(sha256), std::move(metadata_json), std::move(weights), std::move(artifact)});
  return std::shared_ptr<const LoadedPolicy>(std::move(loaded));
}

ServingPolicy::ServingPolicy(ServingPolicyOptions options, telemetry::SpecDecodeMetrics* metrics)
    : options_(std::move(options)),
      metrics_(metrics),
      poll_(options_.clock) {}

ServingPolicy::~ServingPolicy() { StopPolling(); }

Status ServingPolicy::Reload() {
  absl::MutexLock reload_lock(&reload_mu_);
  // With a store: mirror its SERVING version first. When that fails (store
  // unreachable, empty, or an unfinished upload) the serving version stays;
  // before any version is served, the local root's own SERVING (a copy
  // seeded at deployment) is served meanwhile.
  bool mirror_failed = false;
  if (options_.store != nullptr) {
    StatusOr<std::string> mirrored =
        policy::dqn::MirrorServingVersion(*options_.store, options_.policy_root, options_.model_fingerprint);
    if (!mirrored.ok()) {
      RecordRejection("", mirrored.status());
      if (Current() != nullptr) return mirrored.status();
      mirror_failed = true;
    }
  }
  StatusOr<std::string> version = policy::dqn::ResolveServingVersion(options_.policy_root);
  if (!version.ok()) {
    RecordRejection("", version.status());
    return version.status();
  }
  std::shared_ptr<const LoadedPolicy> old = Current();
  if (old != nullptr && old->version == *version) {
    if (!mirror_failed) last_rejection_.clear();
    return OkStatus();
  }
  StatusOr<std::shared_ptr<const LoadedPolicy>> loaded = LoadPolicyVersion(options_, *version);
  if (!loaded.ok()) {
    RecordRejection(*version, loaded.status());
    return loaded.status();
  }
  {
    absl::MutexLock lock(&mu_);
    current_ = *loaded;
  }
  if (!mirror_failed) last_rejection_.clear();
  if (metrics_ != nullptr) {
    metrics_->RecordPolicyReload(true);
    metrics_->SetPolicyVersion(*version, telemetry::PolicyVersionNumber(*version));
  }
  rpc::LogEvent("info", "policy_loaded",
                {{"version", *version},
                 {"previous", old != nullptr ? old->version : std::string("none")},
                 {"sha256", (*loaded)->sha256}});
  return OkStatus();
}

void ServingPolicy::RecordRejection(const std::string& version, const Status& status) {
  std::string key = version + ": " + status.ToString();
  if (key == last_rejection_) return;  // already counted and logged; still retried
  last_rejection_ = std::move(key);
  if (metrics_ != nullptr) metrics_->RecordPolicyReload(false);
  std::shared_ptr<const LoadedPolicy> serving = Current();
  rpc::LogEvent("warning", "policy_rejected",
                {{"version", version.empty() ? std::string("unknown") : version},
                 {"serving", serving != nullptr ? serving->version : std::string("none")},
                 {"reason", status.ToString()}});
}

std::shared_ptr<const LoadedPolicy> ServingPolicy::Current() const {
  absl::MutexLock lock(&mu_);
  return current_;
}

StatusOr<std::shared_ptr<const LoadedPolicy>> ServingPolicy::Get(const std::string& version) const {
  std::shared_ptr<const LoadedPolicy> serving = Current();
  if (version.empty()) {
    if (serving == nullptr) return FailedPreconditionError("no policy version is loaded yet");
    return serving;
  }
  if (serving != nullptr && serving->version == version) return serving;
  return LoadPolicyVersion(options_, version);
}

std::shared_ptr<const LoadedPolicy> ServingPolicy::WaitForChange(const std::string& known_version,
                                                                 absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  const uint64_t epoch = wake_epoch_;
  auto changed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return wake_epoch_ != epoch || (current_ != nullptr && current_->version != known_version);
  };
  mu_.AwaitWithTimeout(absl::Condition(&changed), timeout);
  return current_;
}

void ServingPolicy::WakeWaiters() {
  absl::MutexLock lock(&mu_);
  ++wake_epoch_;
}

void ServingPolicy::StartPolling() {
  poll_.Start([this] {
    do {
      Reload().IgnoreError();  // counted and logged inside
    } while (poll_.SleepUnlessStopped(options_.reload_interval));
  });
}

void ServingPolicy::StopPolling() { poll_.Stop(); }

}  // namespace lede::policy_service
