#include "services/model/policy_follower.h"

#include <stdlib.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <utility>

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include "shared/file/file.h"
#include "shared/file/sha256.h"
#include "shared/log/log.h"
#include "shared/rpc/grpc_status.h"
#include "shared/rpc/server.h"
#include "shared/status/status_macros.h"
#include "shared/telemetry/lede_metrics.h"
#include "shared/telemetry/metrics.h"

namespace lede::model_service {
namespace {

constexpr int kMaxArtifactBytes = 64 << 20;

std::string MakeTempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = (std::filesystem::path(base != nullptr && *base != '\0' ? base : "/tmp") /
                      "lede_policy_follower_XXXXXX")
                         .string();
  if (::mkdtemp(tmpl.data()) == nullptr) return "";
  return tmpl;
}

std::chrono::system_clock::time_point Deadline(absl::Duration timeout) {
  return absl::ToChronoTime(absl::Now() + timeout);
}

// A policy channel whose own reconnect backoff (gRPC's, between TCP connect
// attempts) follows the follower's, so a restarted service is found within
// about max_backoff rather than gRPC's default of up to 120 s.
std::shared_ptr<grpc::Channel> MakeFollowerChannel(const PolicyFollowerOptions& options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxArtifactBytes);
  const int initial_ms = static_cast<int>(absl::ToInt64Milliseconds(options.initial_backoff));
  const int max_ms = static_cast<int>(absl::ToInt64Milliseconds(options.max_backoff));
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, std::max(initial_ms, 1));
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, std::max(initial_ms, 1));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, std::max(max_ms, 1));
  if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
  return options.token.Channel(options.target,
                               options.credentials ? options.credentials : grpc::InsecureChannelCredentials(), args);
}

}  // namespace

std::shared_ptr<grpc::Channel> MakePolicyChannel(const std::string& target,
                                                 std::shared_ptr<grpc::ChannelCredentials> credentials,
                                                 const std::string& tls_server_name,
                                                 const rpc::InternalToken& token) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxArtifactBytes);
  if (!tls_server_name.empty()) args.SetSslTargetNameOverride(tls_server_name);
  return token.Channel(target, credentials ? credentials : grpc::InsecureChannelCredentials(), args);
}

// --- PolicyFollower ----------------------------------------------------------

PolicyFollower::PolicyFollower(PolicyFollowerOptions options)
    : options_(std::move(options)),
      channel_(MakeFollowerChannel(options_)),
      stub_(lede::v1::Policy::NewStub(channel_)),
      temp_dir_(MakeTempDir()),
      follow_(options_.clock) {
  if (temp_dir_.empty()) {
    logging::LogEvent("error", "policy_follower_tempdir_failed", {{"target", options_.target}});
  }
}

PolicyFollower::~PolicyFollower() {
  Stop();
  if (!temp_dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(temp_dir_, ec);
  }
}

void PolicyFollower::Start() {
  follow_.Start([this] { FollowLoop(); });
}

void PolicyFollower::Stop() {
  follow_.Stop([this] {  // the stream the follow thread may be blocked in
    absl::MutexLock lock(&mu_);
    if (stream_context_ != nullptr) stream_context_->TryCancel();
  });
}

std::shared_ptr<const policy::dqn::Artifact> PolicyFollower::current() const {
  absl::MutexLock lock(&mu_);
  return current_;
}

std::string PolicyFollower::version() const {
  absl::MutexLock lock(&mu_);
  return version_;
}

bool PolicyFollower::WaitForPolicy(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto loaded = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return current_ != nullptr; };
  return mu_.AwaitWithTimeout(absl::Condition(&loaded), timeout);
}

bool PolicyFollower::WaitForVersion(const std::string& version, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto reached = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return version_ == version; };
  return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
}

Status PolicyFollower::FetchOnce() {
  absl::MutexLock fetch_lock(&fetch_mu_);
  grpc::ClientContext context;
  context.set_deadline(Deadline(options_.rpc_timeout));
  lede::v1::GetPolicyRequest request;  // version "" = the serving one
  lede::v1::PolicyArtifact response;
  grpc::Status rpc_status = stub_->GetPolicy(&context, request, &response);
  if (!rpc_status.ok()) return rpc::FromGrpcStatus(rpc_status, "policy GetPolicy");
  if (response.version() == version()) return OkStatus();
  Status status = Install(response);
  if (!status.ok()) {
    n_rejected_.fetch_add(1);
    if (response.version() != last_rejected_) {  // log and count a refusal once per version
      last_rejected_ = response.version();
      if (options_.metrics != nullptr) options_.metrics->RecordPolicyReload(false);
      logging::LogEvent("warning", "policy_rejected",
                    {{"version", response.version()},
                     {"serving", version().empty() ? std::string("none") : version()},
                     {"reason", status.ToString()}});
    }
  }
  return status;
}

Status PolicyFollower::Install(const lede::v1::PolicyArtifact& response) {
  if (temp_dir_.empty()) return InternalError("policy follower: no temporary directory");
  if (file::Sha256Hex(response.weights_safetensors()) != response.sha256()) {
    return InvalidArgumentError("GetPolicy: sha256 does not match the weights received");
  }
  // A fixed subdirectory name: the wire's version string never becomes a path.
  const std::string dir = temp_dir_ + "/incoming";
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir, ec);
  if (ec) return InternalError("policy follower: cannot create " + dir + ": " + ec.message());
  LEDE_RETURN_IF_ERROR(file::WriteFileAtomically(dir + "/" + policy::dqn::kWeightsFile,
                                                 response.weights_safetensors()));
  LEDE_RETURN_IF_ERROR(
      file::WriteFileAtomically(dir + "/" + policy::dqn::kMetadataFile, response.metadata_json()));
  StatusOr<policy::dqn::Artifact> artifact =
      policy::dqn::LoadArtifact(dir, options_.model_fingerprint);
  std::filesystem::remove_all(dir, ec);
  if (!artifact.ok()) return artifact.status();
  if (artifact->metadata.version != response.version()) {
    return InvalidArgumentError("GetPolicy: policy.json names version '" +
                                artifact->metadata.version + "', the response '" +
                                response.version() + "'");
  }
  if (options_.n_layers > 0) {
    for (int32_t l : artifact->metadata.decision.candidate_layers) {
      if (l < 1 || l >= options_.n_layers) {
        return InvalidArgumentError("policy.json: candidate layer " + std::to_string(l) +
                                    " outside [1, " + std::to_string(options_.n_layers) +
                                    ") of the model");
      }
    }
  }
  std::string previous;
  {
    absl::MutexLock lock(&mu_);
    previous = version_;
    current_ = std::make_shared<const policy::dqn::Artifact>(*std::move(artifact));
    version_ = response.version();
  }
  last_rejected_.clear();
  n_accepted_.fetch_add(1);
  if (options_.metrics != nullptr) {
    options_.metrics->RecordPolicyReload(true);
    options_.metrics->SetPolicyVersion(response.version(),
                                       telemetry::PolicyVersionNumber(response.version()));
  }
  logging::LogEvent("info", "policy_loaded",
                {{"version", response.version()},
                 {"previous", previous.empty() ? std::string("none") : previous},
                 {"sha256", response.sha256()}});
  return OkStatus();
}

void PolicyFollower::FollowLoop() {
  absl::Duration backoff = options_.initial_backoff;
  bool healthy = true;  // to log a lost connection once per outage
  while (true) {
    grpc::ClientContext context;
    {
      // Checked under mu_, where Stop()'s interrupt looks for the stream.
      absl::MutexLock lock(&mu_);
      if (follow_.stopping()) return;
      stream_context_ = &context;
    }
    n_connects_.fetch_add(1);
    lede::v1::WatchPolicyRequest request;
    request.set_known_version(version());
    std::unique_ptr<grpc::ClientReader<lede::v1::PolicyVersion>> reader =
        stub_->WatchPolicy(&context, request);
    lede::v1::PolicyVersion message;
    Status fetch_status;
    while (reader->Read(&message)) {
      if (message.version() != version()) fetch_status = FetchOnce();
      if (!fetch_status.ok()) {
        context.TryCancel();  // retry through a reconnect, with backoff
        break;
      }
      backoff = options_.initial_backoff;
      if (!healthy) logging::LogEvent("info", "policy_watch_restored", {{"target", options_.target}});
      healthy = true;
    }
    grpc::Status finish = reader->Finish();
    {
      absl::MutexLock lock(&mu_);
      stream_context_ = nullptr;
      if (follow_.stopping()) return;
    }
    if (healthy && fetch_status.ok()) {
      logging::LogEvent("warning", "policy_watch_lost",
                    {{"target", options_.target},
                     {"code", std::to_string(static_cast<int>(finish.error_code()))},
                     {"reason", finish.error_message()},
                     {"version", version().empty() ? std::string("none") : version()}});
    }
    healthy = false;
    if (!follow_.SleepUnlessStopped(backoff)) return;
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

// --- RemoteDecisionController -------------------------------------------------

RemoteDecisionController::RemoteDecisionController(
    std::shared_ptr<lede::v1::Policy::StubInterface> stub, RemoteDecisionOptions options)
    : stub_(std::move(stub)), options_(std::move(options)) {}

std::string RemoteDecisionController::name() const {
  return version_.empty() ? "remote" : "remote:" + version_;
}

model::Action RemoteDecisionController::Decide(const model::ExitState& state) {
  ++n_calls_;
  float features[model::kExitFeatureDim];
  model::ExitFeatures(state, features);
  lede::v1::DecideRequest request;
  request.add_states()->mutable_features()->Add(features, features + model::kExitFeatureDim);
  request.set_version(options_.version);
  lede::v1::DecideResponse response;
  grpc::ClientContext context;
  context.set_deadline(Deadline(options_.timeout));
  grpc::Status rpc_status = stub_->Decide(&context, request, &response);
  if (rpc_status.ok() && (response.actions_size() != 1 || response.q_continue_size() != 1 ||
                          response.q_exit_size() != 1)) {
    rpc_status = grpc::Status(grpc::StatusCode::INTERNAL,
                              "Decide answered " + std::to_string(response.actions_size()) +
                                  " actions for 1 state");
  }
  last_status_ = rpc::FromGrpcStatus(rpc_status, "policy Decide");
  if (!rpc_status.ok()) {
    ++n_failures_;
    if (options_.failures != nullptr) options_.failures->Increment();
    return model::Action::kContinue;  // never drafts a wrong token; see the header
  }
  version_ = response.version();
  last_q_ = {response.q_continue(0), response.q_exit(0)};
  return response.actions(0) == lede::v1::EXIT_ACTION_EXIT ? model::Action::kExit
                                                           : model::Action::kContinue;
}

}  // namespace lede::model_service
