// End-to-end test of the batch retraining loop over real
// processes: lede-policy (hot reload of the policy root's SERVING pointer),
// a co-located lede-model (the drafter follows the policy service) and
// lede-coordinator (experience to a local store) on 127.0.0.1:0.
//  1. A handful of requests with epsilon-greedy exploration (and two
//     without) log experience; the behaviour version is in the summaries.
//  2. The Retrainer runs once with the margin forced (-inf), so it
//     publishes; a thread keeps issuing requests during the swap.
//  3. The policy service and later summaries serve the new version, and
//     every request in flight during the swap succeeded.
//  4. SERVING is pointed at a copy of the new version with flipped weight
//     bytes: the policy service refuses it
//     (lede_policy_reloads_total{outcome="rejected"} increases) and requests
//     keep succeeding with the previous version.
// No timing assertions: every wait is a bounded wait for an eventual
// condition.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policy/dqn/artifact.h"
#include "policy/dqn/artifact_store.h"
#include "proto/lede/v1/generation.grpc.pb.h"
#include "shared/storage/object_store.h"
#include "tests/shared/telemetry/telemetry_test_util.h"
#include "tests/testing/process.h"
#include "tests/testing/retrain_once.h"
#include "tests/testing/s3rver.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/wait.h"
#include "shared/experience/experience.h"
#include "trainer/retrain.h"

namespace lede {
namespace {

using ::lede::testing::WaitUntil;

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using ::lede::testing::IsOk;
using lede::v1::GenerateRequest;
using lede::v1::GenerateResponse;
using lede::v1::GenerationSummary;

const std::string kSource = LEDE_SOURCE_DIR;
const std::string kModel = kSource + "/models/lede-tiny";

struct CallResult {
  grpc::Status status;
  GenerationSummary summary;
  bool has_summary = false;
};

CallResult Generate(lede::v1::Generation::Stub& stub, const GenerateRequest& request) {
  CallResult r;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 60s);
  auto reader = stub.Generate(&ctx, request);
  GenerateResponse resp;
  while (reader->Read(&resp)) {
    if (resp.has_summary()) {
      r.summary = resp.summary();
      r.has_summary = true;
    }
  }
  r.status = reader->Finish();
  return r;
}

GenerateRequest Request(const std::string& prompt, const std::string& id, float epsilon, uint64_t seed,
                        int max_new_tokens = 24) {
  GenerateRequest r;
  r.set_request_id(id);
  r.set_prompt(prompt);
  r.set_max_new_tokens(max_new_tokens);
  r.set_seed(seed);
  r.set_method(lede::v1::SPECULATION_METHOD_LEDE);
  r.mutable_speculation()->set_epsilon(epsilon);
  return r;
}

std::vector<std::string> ReadPrompts(const std::string& path, size_t skip, size_t count) {
  std::ifstream in(path);
  std::vector<std::string> out;
  std::string line;
  for (size_t i = 0; std::getline(in, line) && out.size() < count; ++i) {
    if (i < skip || line.empty()) continue;
    out.push_back(nlohmann::json::parse(line)["prompt"].get<std::string>());
  }
  return out;
}

std::string Metrics(int port) { return telemetry::test_util::HttpGet(port, "/metrics").body; }

// The value of one series in Prometheus text (0 when absent).
double Series(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, series.size() + 1, series + " ") == 0) return std::stod(line.substr(series.size() + 1));
  }
  return 0;
}

// Request ids with at least one transition in the store.
std::set<std::string> LoggedRequests(const std::string& dir) {
  std::set<std::string> ids;
  auto store = storage::OpenObjectStore(dir);
  if (!store.ok()) return ids;
  auto read = experience::ReadShardsFromStore(**store, "");
  if (!read.ok()) return ids;
  for (const experience::Transition& t : read->transitions) ids.insert(t.request_id);
  return ids;
}

// Issues greedy requests until stopped, counting failures and versions.
class BackgroundTraffic {
 public:
  BackgroundTraffic(std::string target, std::vector<std::string> prompts)
      : target_(std::move(target)), prompts_(std::move(prompts)) {
    thread_ = std::thread([this] { Run(); });
  }
  ~BackgroundTraffic() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  int ok() const { return ok_; }
  std::vector<std::string> failures() {
    std::lock_guard<std::mutex> lock(mu_);
    return failures_;
  }
  std::map<std::string, int> versions() {
    std::lock_guard<std::mutex> lock(mu_);
    return versions_;
  }

 private:
  void Run() {
    auto stub = testing::LedeCluster::NewStub(target_);
    for (int i = 0; !stop_; ++i) {
      CallResult r = Generate(*stub, Request(prompts_[i % prompts_.size()], "bg-" + std::to_string(i), 0, i, 16));
      std::lock_guard<std::mutex> lock(mu_);
      if (r.status.ok() && r.has_summary) {
        ++ok_;
        ++versions_[r.summary.policy_version()];
      } else {
        failures_.push_back("bg-" + std::to_string(i) + ": code " + std::to_string(r.status.error_code()) + " " +
                            r.status.error_message());
      }
    }
  }

  std::string target_;
  std::vector<std::string> prompts_;
  std::atomic<bool> stop_{false};
  std::atomic<int> ok_{0};
  std::mutex mu_;
  std::vector<std::string> failures_;
  std::map<std::string, int> versions_;
  std::thread thread_;
};

// The whole loop: serve with exploration, retrain, reload while serving,
// and refuse a corrupted version.
TEST(RetrainE2eTest, PublishesFollowsAndRefusesCorruptVersions) {
  ::lede::testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const fs::path root = tmp.path() / "policy";
  fs::copy(kModel + "/policy", root, fs::copy_options::recursive);
  auto serving0 = policy::dqn::ResolveServingVersion(root.string());
  ASSERT_THAT(serving0.status(), IsOk());
  const std::string v0 = *serving0;  // the shipped SERVING version, whichever it is

  testing::ClusterOptions o;
  o.binaries = testing::LedeBinaries{LEDE_MODEL_BIN, LEDE_COORDINATOR_BIN, LEDE_POLICY_BIN};
  o.model_dir = kModel;
  o.policy_root = root.string();
  o.colocated = true;
  o.policy_service = true;
  o.experience_shard_age_s = 0.2;
  testing::LedeCluster cluster(o);
  ASSERT_THAT(cluster.Start(), IsOk());
  auto stub = cluster.NewStub();
  const int policy_metrics = cluster.policy()->metrics_port();

  // 1. Traffic with exploration (epsilon 0.2) and without.
  const std::vector<std::string> prompts = ReadPrompts(kModel + "/prompts/story.jsonl", 24, 8);
  ASSERT_EQ(prompts.size(), 8u);
  std::set<std::string> explore_ids;
  for (int i = 0; i < 8; ++i) {
    const bool explore = i < 6;
    const std::string id = (explore ? "explore-" : "greedy-") + std::to_string(i);
    CallResult r = Generate(*stub, Request(prompts[i], id, explore ? 0.2f : 0.0f, i));
    ASSERT_TRUE(r.status.ok()) << id << ": " << r.status.error_message();
    ASSERT_TRUE(r.has_summary) << id;
    EXPECT_EQ(r.summary.policy_version(), explore ? v0 + "+eps=0.200" : v0) << id;
    if (explore) explore_ids.insert(id);
  }
  // The coordinator writes its shards within the shard age.
  ASSERT_TRUE(WaitUntil(
      [&] {
        const std::set<std::string> logged = LoggedRequests(cluster.experience_dir());
        return std::includes(logged.begin(), logged.end(), explore_ids.begin(), explore_ids.end());
      },
      30s, 100ms))
      << "experience of the exploration requests never reached " << cluster.experience_dir();

  // 2. Retrain once (forced), with requests in flight.
  BackgroundTraffic traffic(cluster.coordinator_target(), prompts);
  ASSERT_TRUE(WaitUntil([&] { return traffic.ok() > 0 || !traffic.failures().empty(); }, 30s, 100ms));
  trainer::RetrainOptions ro;
  ro.experience_url = cluster.experience_dir();
  ro.policy_root = root.string();
  ro.model_dir = kModel;
  ro.eval_prompts = kModel + "/prompts/story.jsonl";
  ro.eval_prompt_skip = 40;
  ro.eval_prompt_count = 2;
  ro.eval_new_tokens = 16;
  ro.eval_threads = 1;
  ro.version_prefix = "e2e";
  ro.dqn.epochs = 2;
  auto outcome = lede::testing::RetrainAndPublish(ro);
  ASSERT_THAT(outcome.status(), IsOk());
  const std::string v1 = outcome->candidate_version;
  EXPECT_EQ(v1, "e2e-1");
  EXPECT_EQ(outcome->serving_version, v0);
  EXPECT_TRUE(fs::exists(root / v1 / "report.json"));
  EXPECT_GT(outcome->report["data"]["behaviour_versions"][v0 + "+eps=0.200"]["transitions"].get<int64_t>(), 0);

  // 3. The policy service and the drafter follow; later summaries carry v1.
  EXPECT_TRUE(WaitUntil(
      [&] { return Series(Metrics(policy_metrics), "lede_policy_version{version=\"" + v1 + "\"}") == 1; }, 30s, 100ms))
      << Metrics(policy_metrics);
  std::string seen;
  EXPECT_TRUE(WaitUntil(
      [&] {
        CallResult r = Generate(*stub, Request(prompts[0], "after-swap", 0, 0, 8));
        seen = r.status.ok() && r.has_summary ? r.summary.policy_version() : "error: " + r.status.error_message();
        return seen == v1;
      },
      30s, 100ms))
      << "last summary policy_version: " << seen;
  // Let the background traffic run on the new version too, then stop it.
  ASSERT_TRUE(WaitUntil([&] { return traffic.versions().count(v1) > 0 || !traffic.failures().empty(); }, 30s, 100ms));
  traffic.Stop();
  EXPECT_THAT(traffic.failures(), ::testing::IsEmpty());
  EXPECT_GT(traffic.ok(), 0);
  for (const auto& [version, n] : traffic.versions()) {
    EXPECT_TRUE(version == v0 || version == v1) << version << " x" << n;
  }

  // 4. A corrupted version: v1's files, its own name, flipped weight bytes.
  const std::string bad = "e2e-corrupt";
  const fs::path bad_dir = root / bad;
  fs::copy(root / v1, bad_dir, fs::copy_options::recursive);
  {
    nlohmann::json meta = nlohmann::json::parse(std::ifstream(bad_dir / policy::dqn::kMetadataFile));
    meta["version"] = bad;
    std::ofstream(bad_dir / policy::dqn::kMetadataFile) << meta.dump(2);
    std::fstream w(bad_dir / policy::dqn::kWeightsFile, std::ios::in | std::ios::out | std::ios::binary);
    w.seekg(0, std::ios::end);
    const std::streamoff size = w.tellg();
    ASSERT_GT(size, 64);
    for (std::streamoff off = size - 32; off < size - 16; ++off) {
      w.seekg(off);
      char c = 0;
      w.read(&c, 1);
      c = static_cast<char>(c ^ 0x5a);
      w.seekp(off);
      w.write(&c, 1);
    }
  }
  ASSERT_THAT(policy::dqn::LoadArtifact(bad_dir.string()).status(),
              ::lede::testing::StatusIs(StatusCode::kInvalidArgument));
  const std::string rejected_series = "lede_policy_reloads_total{outcome=\"rejected\"}";
  const double rejected_before = Series(Metrics(policy_metrics), rejected_series);
  {
    std::ofstream(root / "SERVING.tmp-test") << bad << "\n";
    fs::rename(root / "SERVING.tmp-test", root / "SERVING");
  }
  EXPECT_TRUE(WaitUntil([&] { return Series(Metrics(policy_metrics), rejected_series) > rejected_before; }, 30s, 100ms))
      << Metrics(policy_metrics);
  EXPECT_EQ(Series(Metrics(policy_metrics), "lede_policy_version{version=\"" + v1 + "\"}"), 1);
  for (int i = 0; i < 3; ++i) {
    CallResult r = Generate(*stub, Request(prompts[i], "after-corrupt-" + std::to_string(i), 0, i, 16));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    ASSERT_TRUE(r.has_summary);
    EXPECT_EQ(r.summary.policy_version(), v1);
  }
  EXPECT_THAT(cluster.policy()->Log(), ::testing::HasSubstr("policy_rejected"));
}

// Policies through an S3 store (s3rver), no shared file system: the policy
// service follows the store's SERVING into a mirror of its own, and the
// trainer works in scratch space that starts empty (it mirrors the serving
// version and its state from the store, and uploads what it publishes).
// The new version reaches the drafter without a restart and without a
// failed request.
TEST(RetrainE2eTest, PublishesThroughAnObjectStore) {
  lede::testing::S3rver s3;
  if (!s3.available()) GTEST_SKIP() << s3.skip_reason();
  ASSERT_THAT(s3.Start("lede-policies"), IsOk());
  ::setenv("AWS_ACCESS_KEY_ID", "S3RVER", 1);  // s3rver's built-in credentials, inherited by lede-policy
  ::setenv("AWS_SECRET_ACCESS_KEY", "S3RVER", 1);
  ::unsetenv("AWS_SESSION_TOKEN");
  const std::string store_url = "s3://lede-policies/lede-tiny?endpoint=" + s3.endpoint() + "&region=us-east-1";
  ::lede::testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const fs::path mirror = tmp.path() / "policy-service-mirror";
  const fs::path scratch = tmp.path() / "trainer-scratch";

  // Deploying: the shipped serving version goes into the store.
  auto serving0 = policy::dqn::ResolveServingVersion(kModel + "/policy");
  ASSERT_THAT(serving0.status(), IsOk());
  const std::string v0 = *serving0;
  {
    auto store = storage::OpenObjectStore(store_url);
    ASSERT_THAT(store.status(), IsOk());
    ASSERT_THAT(policy::dqn::UploadVersion(**store, kModel + "/policy", v0, /*set_serving=*/true), IsOk());
  }

  testing::ClusterOptions o;
  o.binaries = testing::LedeBinaries{LEDE_MODEL_BIN, LEDE_COORDINATOR_BIN, LEDE_POLICY_BIN};
  o.model_dir = kModel;
  o.policy_root = mirror.string();
  o.calibration = testing::ServingCalibration(kModel, kModel + "/policy");  // the store serves v0
  o.policy_args = {"--policy-store", store_url};
  o.colocated = true;
  o.policy_service = true;
  o.experience_shard_age_s = 0.2;
  testing::LedeCluster cluster(o);
  ASSERT_THAT(cluster.Start(), IsOk());
  auto stub = cluster.NewStub();
  const int policy_metrics = cluster.policy()->metrics_port();
  EXPECT_TRUE(WaitUntil(
      [&] { return Series(Metrics(policy_metrics), "lede_policy_version{version=\"" + v0 + "\"}") == 1; }, 30s,
      100ms))
      << Metrics(policy_metrics);

  const std::vector<std::string> prompts = ReadPrompts(kModel + "/prompts/story.jsonl", 24, 4);
  std::set<std::string> ids;
  for (int i = 0; i < 4; ++i) {
    const std::string id = "explore-" + std::to_string(i);
    CallResult r = Generate(*stub, Request(prompts[i], id, 0.2f, i));
    ASSERT_TRUE(r.status.ok()) << id << ": " << r.status.error_message();
    ids.insert(id);
  }
  ASSERT_TRUE(WaitUntil(
      [&] {
        const std::set<std::string> logged = LoggedRequests(cluster.experience_dir());
        return std::includes(logged.begin(), logged.end(), ids.begin(), ids.end());
      },
      30s, 100ms));

  BackgroundTraffic traffic(cluster.coordinator_target(), prompts);
  ASSERT_TRUE(WaitUntil([&] { return traffic.ok() > 0 || !traffic.failures().empty(); }, 30s, 100ms));
  trainer::RetrainOptions ro;
  ro.experience_url = cluster.experience_dir();
  ro.policy_root = scratch.string();  // empty: everything comes from the store
  ro.policy_store_url = store_url;
  ro.version_prefix = "s3";
  ro.dqn.epochs = 1;
  auto outcome = lede::testing::RetrainAndPublish(ro);
  ASSERT_THAT(outcome.status(), IsOk());
  EXPECT_EQ(outcome->serving_version, v0);
  const std::string v1 = outcome->candidate_version;

  // The store serves v1 and holds the state; the policy service and the drafter follow.
  {
    auto store = storage::OpenObjectStore(store_url);
    ASSERT_THAT(store.status(), IsOk());
    auto pointer = (*store)->Get(policy::dqn::kServingFile);
    ASSERT_THAT(pointer.status(), IsOk());
    EXPECT_EQ(*pointer, v1 + "\n");
    EXPECT_THAT((*store)->Get(trainer::kRetrainStateFile).status(), IsOk());
  }
  EXPECT_TRUE(WaitUntil(
      [&] { return Series(Metrics(policy_metrics), "lede_policy_version{version=\"" + v1 + "\"}") == 1; }, 30s,
      100ms))
      << Metrics(policy_metrics) << cluster.policy()->Log();
  EXPECT_TRUE(fs::exists(mirror / v1 / policy::dqn::kMetadataFile));
  ASSERT_TRUE(WaitUntil([&] { return traffic.versions().count(v1) > 0 || !traffic.failures().empty(); }, 30s, 100ms));
  traffic.Stop();
  EXPECT_THAT(traffic.failures(), ::testing::IsEmpty());

  // A second run from fresh scratch space starts from v1 and from the
  // store's state: the shards the first run used are not new again.
  const int64_t first_shards = outcome->n_new_shards;
  ASSERT_GT(first_shards, 0);
  fs::remove_all(scratch);
  ro.publish_margin = std::numeric_limits<double>::infinity();  // a dry run
  auto again = trainer::Retrainer::Create(ro);
  ASSERT_THAT(again.status(), IsOk());
  auto second = (*again)->RunOnce();
  ASSERT_THAT(second.status(), IsOk());
  EXPECT_EQ(second->serving_version, v1);
  auto state = trainer::ReadRetrainState((*again)->state_path());
  ASSERT_THAT(state.status(), IsOk());
  EXPECT_GE(static_cast<int64_t>(state->processed_shards.size()), first_shards);
}

}  // namespace
}  // namespace lede
