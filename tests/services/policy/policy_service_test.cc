// Tests of services/policy (ServingPolicy, the lede.v1.Policy service, the
// lede-policy flags) and of its client in services/model/policy_follower.h
// (PolicyFollower, RemoteDecisionController), over an in-process gRPC server
// on 127.0.0.1:0 and a policy root of small versions the fixture builds for
// models/lede-tiny (first-v5, second-v6, third-v7: random Q-networks), so no
// test depends on a shipped policy. Run from the repository root (ctest's
// working directory).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <nlohmann/json.hpp>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policy/dqn/artifact.h"
#include "policy/dqn/artifact_store.h"
#include "policy/dqn/dqn_exit_controller.h"
#include "services/model/policy_follower.h"
#include "services/policy/policy_server.h"
#include "services/policy/policy_service.h"
#include "services/policy/serving_policy.h"
#include "shared/file/file.h"
#include "shared/file/sha256.h"
#include "shared/speculation/exit_controller.h"
#include "shared/checkpoint/gguf.h"
#include "shared/checkpoint/model_config.h"
#include "shared/rpc/server.h"
#include "shared/storage/object_store.h"
#include "shared/telemetry/lede_metrics.h"
#include "shared/telemetry/metrics.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"

namespace lede::policy_service {
namespace {

namespace fs = std::filesystem;
using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using ::lede::testing::WaitUntil;
using ::testing::HasSubstr;
using Json = nlohmann::json;

constexpr char kTinyConfig[] = "models/lede-tiny/config.json";
// Bound for eventual conditions (never reached when things work).
constexpr absl::Duration kWait = absl::Seconds(20);

std::string ReadAll(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteAll(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// Saves a small policy for models/lede-tiny as version `version` under
// `root`: candidate layers 1-6 (so a model of 6 layers or fewer refuses it),
// D_max 6, a Q-network of width 16 with random weights drawn from `seed`.
void SaveTestPolicy(const fs::path& root, const std::string& version, const std::string& fingerprint,
                    uint64_t seed) {
  policy::dqn::PolicyMetadata m;
  m.version = version;
  m.model_fingerprint = fingerprint;
  m.decision.candidate_layers = {1, 2, 3, 4, 5, 6};
  m.decision.max_draft_len = 6;
  m.seed = seed;
  ASSERT_THAT(policy::dqn::SaveArtifact((root / version).string(),
                                        policy::dqn::Artifact{m, policy::dqn::QNetwork::Random(16, seed)}),
              IsOk());
}

std::string TinyFingerprint() {
  auto config = checkpoint::ParseHfConfig(ReadAll(kTinyConfig), kTinyConfig);
  EXPECT_THAT(config, IsOk());
  return config.ok() ? config->ArchitectureFingerprint() : "";
}

// Decision states spread over both phases and the confidence range.
std::vector<std::array<float, speculation::kExitFeatureDim>> SomeFeatures() {
  std::vector<std::array<float, speculation::kExitFeatureDim>> out;
  for (int i = 0; i < 12; ++i) {
    speculation::ExitState s;
    s.phase = i % 3 == 0 ? speculation::Phase::kDraftLength : speculation::Phase::kExitLayer;
    s.n_layers = 12;
    s.layer = 2 + i % 5;
    s.max_draft_len = 8;
    s.draft_pos = i % 8;
    s.top1_prob = static_cast<float>(i) / 11.0f;
    s.top_k_nll = 0.3f * static_cast<float>(12 - i);
    s.entropy = 0.25f * static_cast<float>(i % 7);
    s.trace_nll = 0.1f * static_cast<float>(i);
    std::array<float, speculation::kExitFeatureDim> f;
    speculation::ExitFeatures(s, f.data());
    out.push_back(f);
  }
  return out;
}

lede::v1::DecideRequest MakeRequest(const std::vector<std::array<float, speculation::kExitFeatureDim>>& fs) {
  lede::v1::DecideRequest request;
  for (const auto& f : fs) request.add_states()->mutable_features()->Add(f.begin(), f.end());
  return request;
}

class PolicyServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(tmp_.path().empty());
    root_ = tmp_.path() / "policy";
    fingerprint_ = TinyFingerprint();
    ASSERT_EQ(fingerprint_, "07e04f79d11d13b5");
    for (const auto& [version, seed] : {std::pair<const char*, uint64_t>{"first-v5", 1}, {"second-v6", 2},
                                        {"third-v7", 3}}) {
      ASSERT_NO_FATAL_FAILURE(SaveTestPolicy(root_, version, fingerprint_, seed));
    }
    ASSERT_THAT(policy::dqn::PublishServingVersion(root_.string(), "first-v5", fingerprint_), IsOk());

    ServingPolicyOptions options;
    options.policy_root = root_.string();
    options.model_fingerprint = fingerprint_;
    options.n_layers = 12;
    options.reload_interval = absl::Seconds(1);  // on clock_: tests advance it
    options.clock = &clock_;
    serving_ = std::make_unique<ServingPolicy>(options, &metrics_);
    ASSERT_THAT(serving_->Reload(), IsOk());
    service_ = std::make_unique<PolicyService>(serving_.get(), &metrics_);
    StartServer(/*port=*/0);
  }

  void TearDown() override {
    StopServer();
    serving_->StopPolling();
  }

  void StartServer(int port) {
    runner_ = std::make_unique<rpc::ServerRunner>("policy-test");
    runner_->AddService(service_.get());
    rpc::ServerOptions options;
    options.listen_address = "127.0.0.1:" + std::to_string(port);
    // No /metrics server: the metrics are read from the Registry directly.
    options.metrics_address = "";
    options.shutdown_grace = absl::Seconds(2);
    ASSERT_THAT(runner_->Start(options, nullptr), IsOk());
    target_ = "127.0.0.1:" + std::to_string(runner_->port());
    stub_ = lede::v1::Policy::NewStub(model_service::MakePolicyChannel(target_));
  }

  void StopServer() {
    if (runner_ == nullptr) return;
    service_->Shutdown();
    runner_->Shutdown();
    runner_.reset();
  }

  grpc::Status Decide(const lede::v1::DecideRequest& request, lede::v1::DecideResponse* response) {
    grpc::ClientContext context;
    return stub_->Decide(&context, request, response);
  }

  grpc::Status GetPolicy(const std::string& version, lede::v1::PolicyArtifact* response) {
    grpc::ClientContext context;
    lede::v1::GetPolicyRequest request;
    request.set_version(version);
    return stub_->GetPolicy(&context, request, response);
  }

  // Copies version `from` to a new version `to` (policy.json's version
  // rewritten, checksum still valid).
  void CopyVersion(const std::string& from, const std::string& to) {
    fs::create_directories(root_ / to);
    fs::copy_file(root_ / from / policy::dqn::kWeightsFile, root_ / to / policy::dqn::kWeightsFile);
    Json meta = Json::parse(ReadAll(root_ / from / policy::dqn::kMetadataFile));
    meta["version"] = to;
    WriteAll(root_ / to / policy::dqn::kMetadataFile, meta.dump(2));
  }

  double Reloads(const std::string& outcome) {
    return metrics_.policy_reloads.Add({{"outcome", outcome}}).Value();
  }
  double VersionGauge(const std::string& version) {
    return metrics_.policy_version.Add({{"version", version}}).Value();
  }

  // The serving policy's poll clock; outlives serving_.
  lede::testing::FakeClock clock_;
  lede::testing::TempDir tmp_;
  fs::path root_;
  std::string fingerprint_;
  telemetry::Registry registry_;
  telemetry::SpecDecodeMetrics metrics_{registry_};
  std::unique_ptr<ServingPolicy> serving_;
  std::unique_ptr<PolicyService> service_;
  std::unique_ptr<rpc::ServerRunner> runner_;
  std::string target_;
  std::unique_ptr<lede::v1::Policy::Stub> stub_;
};

// Decide answers the serving version's QNetwork Q-values and greedy actions,
// state by state, in order.
TEST_F(PolicyServiceTest, DecideMatchesQNetwork) {
  auto artifact = policy::dqn::LoadArtifact((root_ / "first-v5").string(), fingerprint_);
  ASSERT_THAT(artifact, IsOk());
  const auto features = SomeFeatures();
  lede::v1::DecideResponse response;
  ASSERT_TRUE(Decide(MakeRequest(features), &response).ok());
  EXPECT_EQ(response.version(), "first-v5");
  ASSERT_EQ(response.actions_size(), static_cast<int>(features.size()));
  ASSERT_EQ(response.q_continue_size(), static_cast<int>(features.size()));
  ASSERT_EQ(response.q_exit_size(), static_cast<int>(features.size()));
  for (size_t i = 0; i < features.size(); ++i) {
    float q[policy::dqn::kNumActions];
    artifact->network.Forward(features[i].data(), q);
    EXPECT_EQ(response.q_continue(i), q[0]) << "state " << i;
    EXPECT_EQ(response.q_exit(i), q[1]) << "state " << i;
    const auto want = policy::dqn::GreedyAction(q) == speculation::Action::kExit
                          ? lede::v1::EXIT_ACTION_EXIT
                          : lede::v1::EXIT_ACTION_CONTINUE;
    EXPECT_EQ(response.actions(i), want) << "state " << i;
  }
  // Pinning the serving version explicitly is accepted too.
  lede::v1::DecideRequest pinned = MakeRequest(features);
  pinned.set_version("first-v5");
  EXPECT_TRUE(Decide(pinned, &response).ok());
}

// Malformed batches are INVALID_ARGUMENT naming the state; a pinned version
// that is not serving is FAILED_PRECONDITION.
TEST_F(PolicyServiceTest, DecideRejectsBadInput) {
  lede::v1::DecideResponse response;
  EXPECT_EQ(Decide(lede::v1::DecideRequest(), &response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);

  auto features = SomeFeatures();
  lede::v1::DecideRequest short_state = MakeRequest(features);
  short_state.mutable_states(1)->mutable_features()->RemoveLast();
  grpc::Status s = Decide(short_state, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("states[1].features"));

  lede::v1::DecideRequest long_state = MakeRequest(features);
  long_state.mutable_states(0)->add_features(0.5f);
  EXPECT_EQ(Decide(long_state, &response).error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    lede::v1::DecideRequest nonfinite = MakeRequest(features);
    nonfinite.mutable_states(2)->set_features(4, bad);
    s = Decide(nonfinite, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("states[2].features"));
  }

  lede::v1::DecideRequest other_version = MakeRequest(features);
  other_version.set_version("second-v6");
  EXPECT_EQ(Decide(other_version, &response).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

// GetPolicy serves the stored files byte for byte, with the SHA-256 that
// policy.json records; named versions load from disk; unknown ones are
// NOT_FOUND.
TEST_F(PolicyServiceTest, GetPolicyServesTheStoredFiles) {
  lede::v1::PolicyArtifact artifact;
  ASSERT_TRUE(GetPolicy("", &artifact).ok());
  EXPECT_EQ(artifact.version(), "first-v5");
  EXPECT_EQ(artifact.metadata_json(), ReadAll(root_ / "first-v5" / policy::dqn::kMetadataFile));
  EXPECT_EQ(artifact.weights_safetensors(), ReadAll(root_ / "first-v5" / policy::dqn::kWeightsFile));
  const std::string recorded = Json::parse(artifact.metadata_json()).at("weights_sha256");
  EXPECT_EQ(file::Sha256Hex(artifact.weights_safetensors()), recorded);
  EXPECT_EQ(artifact.sha256(), recorded);

  ASSERT_TRUE(GetPolicy("second-v6", &artifact).ok());
  EXPECT_EQ(artifact.version(), "second-v6");
  EXPECT_EQ(artifact.weights_safetensors(),
            ReadAll(root_ / "second-v6" / policy::dqn::kWeightsFile));
  // Serving is unchanged by a named fetch.
  EXPECT_EQ(serving_->Current()->version, "first-v5");

  EXPECT_EQ(GetPolicy("no-such-v9", &artifact).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(GetPolicy("../first-v5", &artifact).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// Publishing another version reaches Current(), the WatchPolicy stream, a
// PolicyFollower and the metrics, through the poll thread.
TEST_F(PolicyServiceTest, HotReloadReachesWatchersAndFollowers) {
  grpc::ClientContext watch_context;
  lede::v1::WatchPolicyRequest watch_request;  // known_version "": answered at once
  auto watch = stub_->WatchPolicy(&watch_context, watch_request);
  lede::v1::PolicyVersion seen;
  ASSERT_TRUE(watch->Read(&seen));
  EXPECT_EQ(seen.version(), "first-v5");

  model_service::PolicyFollowerOptions follower_options;
  follower_options.target = target_;
  follower_options.model_fingerprint = fingerprint_;
  follower_options.n_layers = 12;
  model_service::PolicyFollower follower(follower_options);
  follower.Start();
  ASSERT_TRUE(follower.WaitForVersion("first-v5", kWait));
  std::shared_ptr<const policy::dqn::Artifact> old_artifact = follower.current();
  ASSERT_NE(old_artifact, nullptr);
  EXPECT_EQ(old_artifact->metadata.version, "first-v5");

  serving_->StartPolling();
  // The first poll (at once) finds nothing new; the next one comes a
  // reload_interval later on the clock.
  ASSERT_TRUE(WaitUntil([&] { return clock_.n_waiting() == 1; }));
  ASSERT_THAT(policy::dqn::PublishServingVersion(root_.string(), "second-v6", fingerprint_),
              IsOk());
  clock_.Advance(serving_->options().reload_interval);
  ASSERT_TRUE(watch->Read(&seen));
  EXPECT_EQ(seen.version(), "second-v6");
  EXPECT_EQ(seen.sha256(), serving_->Current()->sha256);
  ASSERT_TRUE(follower.WaitForVersion("second-v6", kWait));
  EXPECT_EQ(follower.current()->metadata.weights_sha256, seen.sha256());
  // The old artifact stays valid for whoever still holds it.
  EXPECT_EQ(old_artifact->metadata.version, "first-v5");

  lede::v1::DecideResponse response;
  ASSERT_TRUE(Decide(MakeRequest(SomeFeatures()), &response).ok());
  EXPECT_EQ(response.version(), "second-v6");

  EXPECT_EQ(Reloads("ok"), 2);  // the initial load, then the swap
  EXPECT_EQ(Reloads("rejected"), 0);
  EXPECT_EQ(VersionGauge("second-v6"), 1);
  EXPECT_EQ(VersionGauge("first-v5"), 0);
  EXPECT_EQ(metrics_.policy_version_number.Value(), 6);  // second-v6

  watch_context.TryCancel();
  follower.Stop();
}

// A corrupted artifact is refused: the old version keeps serving, the
// rejection is counted once however often it is retried.
TEST_F(PolicyServiceTest, CorruptedArtifactIsRefused) {
  CopyVersion("first-v5", "corrupt-v2");
  std::string weights = ReadAll(root_ / "corrupt-v2" / policy::dqn::kWeightsFile);
  ASSERT_GT(weights.size(), 200u);
  for (size_t i = weights.size() - 64; i < weights.size() - 32; ++i) weights[i] ^= 0x5a;
  WriteAll(root_ / "corrupt-v2" / policy::dqn::kWeightsFile, weights);
  WriteAll(root_ / policy::dqn::kServingFile, "corrupt-v2\n");

  EXPECT_THAT(serving_->Reload(), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(serving_->Reload(), StatusIs(StatusCode::kInvalidArgument));
  ASSERT_NE(serving_->Current(), nullptr);
  EXPECT_EQ(serving_->Current()->version, "first-v5");
  lede::v1::DecideResponse response;
  ASSERT_TRUE(Decide(MakeRequest(SomeFeatures()), &response).ok());
  EXPECT_EQ(response.version(), "first-v5");
  EXPECT_EQ(Reloads("rejected"), 1);
  EXPECT_EQ(VersionGauge("first-v5"), 1);

  // The same through the poll thread: still refused, still counted once,
  // after three polls (one at once, two more a reload_interval apart).
  serving_->StartPolling();
  for (int64_t poll = 1; poll <= 3; ++poll) {
    if (poll > 1) clock_.Advance(serving_->options().reload_interval);
    // The poll thread has reloaded and waits for the next period.
    ASSERT_TRUE(WaitUntil([&] { return clock_.n_waits() == poll && clock_.n_waiting() == 1; }))
        << "poll " << poll;
  }
  EXPECT_EQ(serving_->Current()->version, "first-v5");
  EXPECT_EQ(Reloads("rejected"), 1);

  // GetPolicy of the corrupt version is refused as not loadable.
  lede::v1::PolicyArtifact artifact;
  EXPECT_EQ(GetPolicy("corrupt-v2", &artifact).error_code(), grpc::StatusCode::FAILED_PRECONDITION);

  // Pointing SERVING back at a good version recovers.
  ASSERT_THAT(policy::dqn::PublishServingVersion(root_.string(), "third-v7", fingerprint_), IsOk());
  serving_->StopPolling();
  EXPECT_THAT(serving_->Reload(), IsOk());
  EXPECT_EQ(serving_->Current()->version, "third-v7");
}

// Versions that do not fit the model (fingerprint, candidate layers >= L, a
// metadata version other than the directory) are refused.
TEST_F(PolicyServiceTest, VersionsForAnotherModelAreRefused) {
  ServingPolicyOptions options = serving_->options();
  options.n_layers = 5;  // first-v5 probes layer 6
  EXPECT_THAT(LoadPolicyVersion(options, "first-v5"), StatusIs(StatusCode::kInvalidArgument));
  options = serving_->options();
  options.model_fingerprint = "0123456789abcdef";
  EXPECT_THAT(LoadPolicyVersion(options, "first-v5"), StatusIs(StatusCode::kInvalidArgument));
  options = serving_->options();
  fs::create_directories(root_ / "renamed-v3");
  fs::copy(root_ / "first-v5", root_ / "renamed-v3", fs::copy_options::recursive);
  EXPECT_THAT(LoadPolicyVersion(options, "renamed-v3"), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(LoadPolicyVersion(options, "missing-v1"), StatusIs(StatusCode::kNotFound));
  EXPECT_THAT(LoadPolicyVersion(options, "first-v5"), IsOk());
}

// Decide calls running on another thread during many swaps all succeed, and
// each answers with one of the published versions.
TEST_F(PolicyServiceTest, DecideNeverFailsDuringSwaps) {
  const std::vector<std::string> versions = {"second-v6", "third-v7",
                                              "first-v5"};
  std::atomic<bool> done{false};
  std::atomic<int> n_ok{0}, n_failed{0}, n_unpublished{0};
  const lede::v1::DecideRequest request = MakeRequest(SomeFeatures());
  std::mutex seen_mu;
  std::string first_unpublished;  // the first reply version outside `versions`
  std::thread client([&] {
    while (!done.load() || n_ok.load() == 0) {
      lede::v1::DecideResponse response;
      grpc::ClientContext context;
      grpc::Status s = stub_->Decide(&context, request, &response);
      if (!s.ok() || response.actions_size() != request.states_size()) {
        n_failed.fetch_add(1);
        continue;
      }
      n_ok.fetch_add(1);
      if (std::find(versions.begin(), versions.end(), response.version()) == versions.end()) {
        std::lock_guard<std::mutex> lock(seen_mu);
        if (n_unpublished.fetch_add(1) == 0) first_unpublished = response.version();
      }
    }
  });
  for (int i = 0; i < 30; ++i) {
    ASSERT_THAT(policy::dqn::PublishServingVersion(root_.string(), versions[i % 3], fingerprint_),
                IsOk());
    ASSERT_THAT(serving_->Reload(), IsOk());
    ASSERT_EQ(serving_->Current()->version, versions[i % 3]);
  }
  done.store(true);
  client.join();
  EXPECT_GT(n_ok.load(), 0);
  EXPECT_EQ(n_failed.load(), 0);
  EXPECT_EQ(n_unpublished.load(), 0) << "e.g. version \"" << first_unpublished << "\"";
  EXPECT_EQ(Reloads("ok"), 31);
}

// A WatchPolicy stream that has nothing to report ends (OK) when the service
// shuts down, and new streams are refused.
TEST_F(PolicyServiceTest, WatchEndsOnShutdown) {
  grpc::ClientContext context;
  lede::v1::WatchPolicyRequest request;
  request.set_known_version("first-v5");  // up to date: the stream waits
  auto watch = stub_->WatchPolicy(&context, request);
  // The stream is open on the server before the service shuts down.
  ASSERT_TRUE(WaitUntil([&] { return service_->n_watchers() == 1; }));
  service_->Shutdown();
  lede::v1::PolicyVersion seen;
  EXPECT_FALSE(watch->Read(&seen));
  EXPECT_TRUE(watch->Finish().ok());
  EXPECT_TRUE(WaitUntil([&] { return service_->n_watchers() == 0; }));

  grpc::ClientContext late_context;
  auto late = stub_->WatchPolicy(&late_context, request);
  EXPECT_FALSE(late->Read(&seen));
  EXPECT_EQ(late->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
}

// The follower keeps its policy while the service is down, reconnects, and
// then follows a version published during the outage.
TEST_F(PolicyServiceTest, FollowerSurvivesServiceRestart) {
  model_service::PolicyFollowerOptions options;
  options.target = target_;
  options.model_fingerprint = fingerprint_;
  options.initial_backoff = absl::Milliseconds(20);
  options.max_backoff = absl::Milliseconds(200);
  lede::testing::FakeClock backoff_clock;  // the follower's reconnect backoff
  options.clock = &backoff_clock;
  model_service::PolicyFollower follower(options);
  follower.Start();
  ASSERT_TRUE(follower.WaitForVersion("first-v5", kWait));

  const int port = runner_->port();
  StopServer();
  ASSERT_THAT(policy::dqn::PublishServingVersion(root_.string(), "third-v7", fingerprint_), IsOk());
  ASSERT_THAT(serving_->Reload(), IsOk());
  // The stream is gone and the follower sleeps its backoff on the clock: it
  // keeps the last good policy meanwhile.
  ASSERT_TRUE(WaitUntil([&] { return backoff_clock.n_waiting() == 1; }));
  EXPECT_EQ(follower.version(), "first-v5");
  ASSERT_NE(follower.current(), nullptr);

  service_ = std::make_unique<PolicyService>(serving_.get(), &metrics_);
  StartServer(port);
  // Each backoff ends when the clock passes it; a reconnect that fails
  // (gRPC's own channel backoff) sleeps again.
  ASSERT_TRUE(WaitUntil([&] {
    if (backoff_clock.n_waiting() == 1) backoff_clock.Advance(options.max_backoff);
    return follower.version() == "third-v7";
  }));
  EXPECT_GE(follower.n_connects(), 2);
  follower.Stop();
}

// A follower for another model refuses the artifact and keeps nothing.
TEST_F(PolicyServiceTest, FollowerRefusesArtifactForAnotherModel) {
  model_service::PolicyFollowerOptions options;
  options.target = target_;
  options.model_fingerprint = "0123456789abcdef";
  model_service::PolicyFollower follower(options);
  EXPECT_THAT(follower.FetchOnce(), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_EQ(follower.current(), nullptr);
  EXPECT_EQ(follower.version(), "");
  EXPECT_EQ(follower.n_rejected(), 1);

  options.model_fingerprint = fingerprint_;
  options.n_layers = 4;  // first-v5 probes layers 4 to 6
  model_service::PolicyFollower shallow(options);
  EXPECT_THAT(shallow.FetchOnce(), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_EQ(shallow.current(), nullptr);
}

// RemoteDecisionController answers like the local DQN controller, and falls
// back to kContinue (counting the failure) when the service is gone.
TEST_F(PolicyServiceTest, RemoteDecisionMatchesLocalAndFallsBack) {
  auto artifact = policy::dqn::LoadArtifact((root_ / "first-v5").string(), fingerprint_);
  ASSERT_THAT(artifact, IsOk());
  policy::dqn::DqnExitController local(
      std::make_shared<const policy::dqn::QNetwork>(artifact->network), "first-v5");
  std::shared_ptr<lede::v1::Policy::StubInterface> stub =
      lede::v1::Policy::NewStub(model_service::MakePolicyChannel(target_));
  model_service::RemoteDecisionOptions options;
  options.timeout = absl::Seconds(5);
  model_service::RemoteDecisionController remote(stub, options);
  EXPECT_EQ(remote.name(), "remote");

  for (int i = 0; i < 8; ++i) {
    speculation::ExitState s;
    s.phase = i % 2 ? speculation::Phase::kDraftLength : speculation::Phase::kExitLayer;
    s.n_layers = 12;
    s.layer = 2 + i % 4;
    s.max_draft_len = 8;
    s.draft_pos = i;
    s.top1_prob = 0.12f * static_cast<float>(i);
    s.top_k_nll = 2.0f - 0.2f * static_cast<float>(i);
    s.entropy = 1.5f;
    s.trace_nll = 0.4f;
    EXPECT_EQ(remote.Decide(s), local.Decide(s)) << "state " << i;
    EXPECT_EQ(remote.last_q()[0], local.last_q()[0]);
    EXPECT_EQ(remote.last_q()[1], local.last_q()[1]);
  }
  EXPECT_EQ(remote.name(), "remote:first-v5");
  EXPECT_EQ(remote.n_failures(), 0);

  StopServer();
  model_service::RemoteDecisionOptions fast = options;
  fast.timeout = absl::Milliseconds(500);
  model_service::RemoteDecisionController orphan(stub, fast);
  speculation::ExitState s;
  s.top1_prob = 0.99f;
  EXPECT_EQ(orphan.Decide(s), speculation::Action::kContinue);
  EXPECT_EQ(orphan.n_failures(), 1);
  EXPECT_FALSE(orphan.last_status().ok());
}

// The lede-policy flags: --config, --model-config, required and unknown flags.
// With a policy store: before the store holds any version the mirror's own
// seeded SERVING is served (the empty store counted as a rejection); a
// version published to the store is then mirrored and served, and a store
// that goes bad later leaves it serving.
TEST_F(PolicyServiceTest, FollowsAPolicyStoreAndServesTheSeededCopyUntilThen) {
  auto opened = storage::OpenObjectStore((tmp_.path() / "store").string());
  ASSERT_THAT(opened, IsOk());
  std::shared_ptr<storage::ObjectStore> store = std::move(*opened);
  ServingPolicyOptions options;
  options.policy_root = root_.string();  // seeded: SERVING = first-v5
  options.model_fingerprint = fingerprint_;
  options.n_layers = 12;
  options.store = store;
  telemetry::Registry registry;
  telemetry::SpecDecodeMetrics metrics{registry};
  ServingPolicy serving(options, &metrics);
  EXPECT_THAT(serving.Reload(), IsOk());
  ASSERT_NE(serving.Current(), nullptr);
  EXPECT_EQ(serving.Current()->version, "first-v5");
  EXPECT_EQ(metrics.policy_reloads.Add({{"outcome", "rejected"}}).Value(), 1);  // the empty store

  CopyVersion("first-v5", "store-v3");
  ASSERT_THAT(policy::dqn::UploadVersion(*store, root_.string(), "store-v3", /*set_serving=*/true), IsOk());
  fs::remove_all(root_ / "store-v3");  // only the store has it now
  EXPECT_THAT(serving.Reload(), IsOk());
  EXPECT_EQ(serving.Current()->version, "store-v3");
  EXPECT_TRUE(fs::exists(root_ / "store-v3" / policy::dqn::kMetadataFile));  // mirrored

  ASSERT_THAT(store->Put(policy::dqn::kServingFile, "missing-v9\n"), IsOk());
  EXPECT_THAT(serving.Reload(), StatusIs(StatusCode::kNotFound));
  EXPECT_EQ(serving.Current()->version, "store-v3");
}

TEST(PolicyServerFlagsTest, ParsesAndValidatesFlags) {
  auto options = ParsePolicyServerFlags({"--policy-root", "/p", "--reload-interval-ms=250"});
  ASSERT_THAT(options, IsOk());
  EXPECT_EQ(options->serving.policy_root, "/p");
  EXPECT_EQ(options->serving.reload_interval, absl::Milliseconds(250));
  EXPECT_EQ(options->listen_address, "127.0.0.1:50053");
  EXPECT_EQ(options->metrics_address, "127.0.0.1:9403");
  EXPECT_EQ(options->serving.n_layers, 0);

  options = ParsePolicyServerFlags({"--policy-root=/p", "--model-config", kTinyConfig});
  ASSERT_THAT(options, IsOk());
  EXPECT_EQ(options->serving.model_fingerprint, "07e04f79d11d13b5");
  EXPECT_EQ(options->serving.n_layers, 12);

  EXPECT_THAT(ParsePolicyServerFlags({"--policy-root=/p", "--model-config", kTinyConfig,
                                      "--model-fingerprint", "0123456789abcdef"}),
              StatusIs(StatusCode::kInvalidArgument));

  {  // A .gguf of the same architecture: its llama.* metadata, the same fingerprint.
    lede::testing::TempDir gguf_dir;
    auto text = file::ReadFile(kTinyConfig);
    ASSERT_THAT(text, IsOk());
    auto config = checkpoint::ParseHfConfig(*text, kTinyConfig);
    ASSERT_THAT(config, IsOk());
    checkpoint::GgufWriter w;
    ASSERT_THAT(checkpoint::AddLlamaMetadata(*config, "lede-tiny", &w), IsOk());
    const std::vector<uint8_t> zeros(config->vocab_size * config->dim / 32 * 34, 0);  // Q8_0 zeros
    const int64_t d = config->dim, kv = config->kv_dim(), h = config->hidden_dim, v = config->vocab_size;
    auto add = [&](const std::string& name, std::vector<int64_t> shape) {
      int64_t n = 1;
      for (int64_t x : shape) n *= x;
      const auto type = shape.size() == 1 ? checkpoint::GgmlType::kF32 : checkpoint::GgmlType::kQ8_0;
      ASSERT_THAT(w.AddTensor(name, type, shape, zeros.data(), checkpoint::GgmlTypeBytes(type, n)), IsOk());
    };
    add("token_embd.weight", {v, d});
    add("output.weight", {v, d});
    add("output_norm.weight", {d});
    for (int64_t i = 0; i < config->n_layers; ++i) {
      const std::string b = "blk." + std::to_string(i) + ".";
      add(b + "attn_norm.weight", {d});
      add(b + "ffn_norm.weight", {d});
      add(b + "attn_q.weight", {d, d});
      add(b + "attn_k.weight", {kv, d});
      add(b + "attn_v.weight", {kv, d});
      add(b + "attn_output.weight", {d, d});
      add(b + "ffn_gate.weight", {h, d});
      add(b + "ffn_up.weight", {h, d});
      add(b + "ffn_down.weight", {d, h});
    }
    const std::string gguf = (gguf_dir.path() / "lede-tiny.gguf").string();
    ASSERT_THAT(w.Write(gguf), IsOk());
    options = ParsePolicyServerFlags({"--policy-root=/p", "--model-config", gguf});
    ASSERT_THAT(options, IsOk());
    EXPECT_EQ(options->serving.model_fingerprint, "07e04f79d11d13b5");
    EXPECT_EQ(options->serving.n_layers, 12);
    EXPECT_THAT(ParsePolicyServerFlags({"--policy-root=/p", "--model-config", gguf + ".missing.gguf"}),
                StatusIs(StatusCode::kNotFound));
  }
  EXPECT_THAT(ParsePolicyServerFlags({"--policy-root=/p", "--bogus=1"}),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(ParsePolicyServerFlags({"--listen", "127.0.0.1:1"}),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(ParsePolicyServerFlags({"--policy-root=/p", "--reload-interval-ms=0"}),
              StatusIs(StatusCode::kInvalidArgument));

  lede::testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  WriteAll(tmp.path() / "policy.conf",
           "# lede-policy\npolicy-root = /from/file\nlisten = 127.0.0.1:7000\n");
  const std::string config = (tmp.path() / "policy.conf").string();
  options = ParsePolicyServerFlags({"--config", config, "--listen=127.0.0.1:7001"});
  ASSERT_THAT(options, IsOk());
  EXPECT_EQ(options->serving.policy_root, "/from/file");
  EXPECT_EQ(options->listen_address, "127.0.0.1:7001");  // the command line wins
  EXPECT_THAT(ParsePolicyServerFlags({"--config", config + ".missing"}),
              StatusIs(StatusCode::kNotFound));
}

}  // namespace
}  // namespace lede::policy_service
