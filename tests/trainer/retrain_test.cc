// Tests of trainer/retrain.h: new-shard detection and the state checkpoint,
// the warm start, publish-only-if-better (both ways, forced with the
// margin), off-policy bookkeeping and report.json. A temporary local object
// store holds a few synthetic shards; the serving policy is a small random
// Q-network (offline evaluation only, so each test runs in well under 1 s),
// except ReplayEvaluation, which replays two prompts through models/lede-tiny.
#include "trainer/retrain.h"

#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policy/dqn/artifact.h"
#include "policy/dqn/q_network.h"
#include "shared/experience/transition.h"
#include "shared/storage/object_store.h"
#include "tests/testing/s3rver.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"
#include "tests/trainer/cost_profiles.h"
#include "shared/experience/experience.h"
#include "shared/experience/request_log.h"
#include "shared/telemetry/metrics.h"
#include "trainer/policy_root_lock.h"
#include "trainer/retrain_metrics.h"

namespace lede::trainer {
namespace {

namespace fs = std::filesystem;
using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using ::testing::HasSubstr;
using nlohmann::json;
using experience::Transition;
constexpr int kIn = speculation::kExitFeatureDim;
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr char kFingerprint[] = "fp-test";
constexpr char kCostModel[] = "measured";

std::string ReadText(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The feature SignalPolicy() decides on (top1_prob's place).
constexpr int kSignal = 3;

// A serving policy that exits exactly when features[kSignal] > 0.5, by a
// margin of 8 in Q at the values Round() gives on-policy states (0.1 and
// 0.9): training a warm-started candidate for a few steps keeps its
// actions there.
policy::dqn::QNetwork SignalPolicy() {
  constexpr int32_t kHidden = 16;
  policy::dqn::QNetworkWeights w;
  w.hidden = kHidden;
  w.fc1_weight.assign(kHidden * kIn, 0.0f);
  w.fc1_bias.assign(kHidden, 0.0f);
  w.fc2_weight.assign(kHidden * kHidden, 0.0f);
  w.fc2_bias.assign(kHidden, 0.0f);
  w.fc3_weight.assign(2 * kHidden, 0.0f);
  w.fc3_bias.assign(2, 0.0f);
  w.fc1_weight[0 * kIn + kSignal] = 10.0f;  // h0 = relu(10 s - 5): exit evidence
  w.fc1_bias[0] = -5.0f;
  w.fc1_weight[1 * kIn + kSignal] = -10.0f;  // h1 = relu(5 - 10 s): continue evidence
  w.fc1_bias[1] = 5.0f;
  w.fc2_weight[0 * kHidden + 0] = 1.0f;
  w.fc2_weight[1 * kHidden + 1] = 1.0f;
  constexpr int kContinueRow = static_cast<int>(speculation::Action::kContinue);
  constexpr int kExitRow = static_cast<int>(speculation::Action::kExit);
  w.fc3_weight[kExitRow * kHidden + 0] = 1.0f;
  w.fc3_weight[kExitRow * kHidden + 1] = -1.0f;
  w.fc3_weight[kContinueRow * kHidden + 0] = -1.0f;
  w.fc3_weight[kContinueRow * kHidden + 1] = 1.0f;
  return *policy::dqn::QNetwork::Create(std::move(w));
}

// One speculation round: phase-1 probes at layers 2 and 4 (continue, then
// exit, or continue = no draft when drafts == 0), then `drafts` phase-2
// decisions; the last decision is terminal. Features are random, except
// that an on-policy round's features[kSignal] is 0.9 where it exits and 0.1
// where it continues (SignalPolicy()'s actions); rewards are those of a
// throughput-like reward.
std::vector<Transition> Round(const std::string& request, int64_t round, int drafts, const std::string& version,
                              std::mt19937_64& rng, const std::string& fingerprint = kFingerprint,
                              const std::string& cost_model = kCostModel, bool on_policy = false) {
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  const int n = 2 + drafts;
  // Probe at 2, then exit at 4 (or decline: drafts == 0), then draft
  // until the last decision stops to verify.
  auto action = [n](int i) {
    return i == 0 || i == n - 1 ? speculation::Action::kContinue : speculation::Action::kExit;
  };
  auto features = [&](int i) {
    std::array<float, kIn> f{};
    for (int c = 0; c < kIn - 1; ++c) f[c] = u(rng);
    f[kIn - 1] = 1.0f;
    if (on_policy) f[kSignal] = action(i) == speculation::Action::kExit ? 0.9f : 0.1f;
    return f;
  };
  std::vector<Transition> out;
  std::array<float, kIn> s = features(0);
  for (int i = 0; i < n; ++i) {
    Transition t;
    t.state = s;
    t.phase = i < 2 ? speculation::Phase::kExitLayer : speculation::Phase::kDraftLength;
    t.layer = i < 2 ? 2 + 2 * i : 4;
    t.n_layers = 8;
    t.draft_pos = i < 2 ? 0 : i - 1;
    t.action = action(i);
    t.reward = i == 0 ? -0.02f : (u(rng) < 0.7f ? 0.6f : -0.4f);
    t.done = i == n - 1;
    if (!t.done) {
      s = features(i + 1);
      t.next_state = s;
    }
    t.request_id = request;
    t.round_index = round;
    t.decision_index = i;
    t.policy_version = version;
    t.model_fingerprint = fingerprint;
    t.reward_cost_model = cost_model;
    out.push_back(t);
  }
  return out;
}

class RetrainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(tmp_.path().empty());
    store_ = tmp_.path() / "store";
    root_ = tmp_.path() / "policy";
    fs::create_directories(store_);
    // The serving policy v1 over a fixed decision spec: SignalPolicy(), whose
    // greedy actions reproduce the on-policy synthetic episodes entirely
    // (WriteShard), which the finite-margin comparisons need.
    policy::dqn::PolicyMetadata meta;
    meta.version = "v1";
    meta.model_fingerprint = kFingerprint;
    meta.reward_cost_model = kCostModel;
    meta.decision.candidate_layers = {2, 4, 6};
    meta.decision.max_draft_len = 6;
    const policy::dqn::Artifact a{meta, SignalPolicy()};
    ASSERT_THAT(policy::dqn::SaveArtifact(policy::dqn::VersionDir(root_.string(), "v1"), a), IsOk());
    ASSERT_THAT(policy::dqn::PublishServingVersion(root_.string(), "v1"), IsOk());
  }

  // Writes a shard of `requests` requests x 3 rounds under key
  // exp/2025-01-01/<name>.lexp, the even-numbered requests on-policy for
  // v1 (Round); returns the key.
  std::string WriteShard(const std::string& name, int requests, const std::string& version = "v1",
                         const std::string& fingerprint = kFingerprint, const std::string& cost = kCostModel) {
    const std::string key = "exp/2025-01-01/" + name + ".lexp";
    const fs::path path = store_ / key;
    fs::create_directories(path.parent_path());
    auto w = experience::ShardWriter::Create(path.string());
    EXPECT_THAT(w.status(), IsOk());
    std::mt19937_64 rng(std::hash<std::string>()(name));
    for (int r = 0; r < requests; ++r) {
      for (int k = 0; k < 3; ++k) {
        for (const Transition& t : Round(name + "-req" + std::to_string(r), k, (r + k) % 4, version, rng,
                                         fingerprint, cost, /*on_policy=*/r % 2 == 0)) {
          EXPECT_THAT((*w)->Append(t), IsOk());
        }
      }
    }
    EXPECT_THAT((*w)->Finish(), IsOk());
    return key;
  }

  RetrainOptions Options(double margin) {
    RetrainOptions o;
    o.experience_url = store_.string();
    o.experience_prefix = "exp";
    o.policy_root = root_.string();
    o.publish_margin = margin;
    o.version_prefix = "rt";
    o.dqn.hidden = 16;
    o.dqn.epochs = 2;
    o.dqn.batch_size = 32;
    return o;
  }

  StatusOr<RetrainOutcome> RunOnce(const RetrainOptions& o) {
    auto r = Retrainer::Create(o);
    if (!r.ok()) return r.status();
    return (*r)->RunOnce();
  }

  std::string Serving() { return policy::dqn::ResolveServingVersion(root_.string()).value_or(""); }

  ::lede::testing::TempDir tmp_;
  fs::path store_, root_;
};

// The retraining service's metrics move with its runs: shards read and
// skipped (a truncated one), candidates trained, runs by decision, failures.
TEST_F(RetrainTest, MetricsCountShardsCandidatesAndDecisions) {
  telemetry::Registry registry;
  RetrainMetrics metrics(registry);
  const std::string before = telemetry::SerializeText(registry);
  EXPECT_THAT(before, HasSubstr("lede_retrain_runs_total{decision=\"published\"} 0\n"));
  EXPECT_THAT(before, HasSubstr("lede_retrain_shards_skipped_total{reason=\"corrupt\"} 0\n"));
  EXPECT_THAT(before, HasSubstr("lede_retrain_shards_skipped_total{reason=\"other_model\"} 0\n"));

  WriteShard("w-00000001", 12);
  WriteShard("w-00000002", 12);
  const std::string cut = WriteShard("w-00000003", 12);
  const fs::path cut_path = store_ / cut;
  fs::resize_file(cut_path, fs::file_size(cut_path) - 7);  // truncated mid-record
  auto first = RunOnce(Options(-kInf));
  ASSERT_THAT(first.status(), IsOk());
  EXPECT_EQ(first->decision, RetrainDecision::kPublished);
  EXPECT_EQ(first->n_bad_shards, 1);
  EXPECT_GT(first->train_seconds, 0.0);
  metrics.RecordRun(*first, 2.5);
  auto again = RunOnce(Options(-kInf));
  ASSERT_THAT(again.status(), IsOk());
  EXPECT_EQ(again->decision, RetrainDecision::kNoNewData);
  metrics.RecordRun(*again, 0.5);
  metrics.RecordFailure(0.25);

  const std::string text = telemetry::SerializeText(registry);
  EXPECT_THAT(text, HasSubstr("lede_retrain_runs_total{decision=\"published\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("lede_retrain_runs_total{decision=\"rejected\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("lede_retrain_runs_total{decision=\"no_new_data\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("lede_retrain_runs_total{decision=\"failed\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("lede_retrain_candidates_trained_total 1\n"));
  EXPECT_THAT(text, HasSubstr("lede_retrain_shards_read_total 3\n"));
  EXPECT_THAT(text, HasSubstr("lede_retrain_shards_skipped_total{reason=\"corrupt\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("lede_retrain_shards_skipped_total{reason=\"other_model\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("lede_retrain_transitions_read_total " +
                              std::to_string(first->n_new_transitions) + "\n"));
  EXPECT_THAT(text, HasSubstr("lede_retrain_last_run_seconds 0.25\n"));
  // td's offline metric is a return, not a speed-up: the speed-up gauges stay unset.
  EXPECT_THAT(text, HasSubstr("lede_retrain_last_candidate_speedup Nan\n"));
  const std::string line = metrics.Logfmt();
  EXPECT_THAT(line, HasSubstr("event=retrain_metrics runs_published=1 runs_rejected=0 runs_no_new_data=1"));
  EXPECT_THAT(line, HasSubstr(" shards_read=3 shards_skipped=1 shards_skipped_other_model=0 "));

  const std::string textfile = (tmp_.path() / "retrain.prom").string();
  ASSERT_THAT(RetrainMetrics::WriteTextfile(registry, textfile), IsOk());
  std::ifstream in(textfile);
  std::stringstream written;
  written << in.rdbuf();
  EXPECT_EQ(written.str(), telemetry::SerializeText(registry));
  EXPECT_THAT(RetrainMetrics::WriteTextfile(registry, (tmp_.path() / "no" / "such" / "dir" / "f").string()),
              StatusIs(StatusCode::kInternal));
}

// Shards already in the state checkpoint are skipped; only new ones start a
// run, and the replay window still includes the old ones.
TEST_F(RetrainTest, TrainsOnlyWhenNewShardsAppearAndRecordsThem) {
  const std::string a = WriteShard("w-00000001", 12);
  const std::string b = WriteShard("w-00000002", 12);
  auto first = RunOnce(Options(-kInf));
  ASSERT_THAT(first.status(), IsOk());
  EXPECT_EQ(first->decision, RetrainDecision::kPublished);
  EXPECT_EQ(first->n_new_shards, 2);

  auto state = ReadRetrainState((root_ / kRetrainStateFile).string());
  ASSERT_THAT(state.status(), IsOk());
  EXPECT_THAT(state->processed_shards, ::testing::ElementsAre(a, b));
  EXPECT_EQ(state->last_version, "rt-1");
  EXPECT_EQ(state->last_decision, "published");
  EXPECT_EQ(state->runs, 1);
  EXPECT_EQ(state->published, 1);

  auto again = RunOnce(Options(-kInf));
  ASSERT_THAT(again.status(), IsOk());
  EXPECT_EQ(again->decision, RetrainDecision::kNoNewData);
  EXPECT_EQ(again->n_new_shards, 0);
  EXPECT_EQ(Serving(), "rt-1");

  const std::string c = WriteShard("w-00000003", 12);
  auto third = RunOnce(Options(-kInf));
  ASSERT_THAT(third.status(), IsOk());
  EXPECT_EQ(third->decision, RetrainDecision::kPublished);
  EXPECT_EQ(third->n_new_shards, 1);
  EXPECT_EQ(third->candidate_version, "rt-2");
  EXPECT_EQ(third->serving_version, "rt-1");
  EXPECT_EQ(third->report["data"]["window"]["n_shards"], 3);
  EXPECT_EQ(third->report["data"]["first_new_shard"], c);
  state = ReadRetrainState((root_ / kRetrainStateFile).string());
  ASSERT_THAT(state.status(), IsOk());
  EXPECT_EQ(state->processed_shards.size(), 3u);
  EXPECT_EQ(state->runs, 2);
}

// A shard of another model among good ones (td trainer): its
// records are filtered, the shard is counted once and the run decides on
// the rest.
TEST_F(RetrainTest, AShardOfAnotherModelIsCountedAndTheRunGoesOn) {
  WriteShard("w-00000001", 12);
  WriteShard("w-00000002", 12, "v1", "fp-other");
  std::vector<std::string> lines;
  RetrainOptions o = Options(-kInf);
  o.log = [&lines](const std::string& l) { lines.push_back(l); };
  auto out = RunOnce(o);
  ASSERT_THAT(out.status(), IsOk());
  EXPECT_EQ(out->decision, RetrainDecision::kPublished);
  EXPECT_EQ(out->n_other_model_shards, 1);
  EXPECT_EQ(out->report["data"]["new_other_model_shards"], 1);
  int64_t logged = 0;
  for (const std::string& l : lines) {
    if (l.find("another model") != std::string::npos) {
      ++logged;
      EXPECT_THAT(l, HasSubstr("w-00000002.lexp"));
      EXPECT_THAT(l, HasSubstr("fp-other"));
    }
  }
  EXPECT_EQ(logged, 1);
  telemetry::Registry registry;
  RetrainMetrics metrics(registry);
  metrics.RecordRun(*out, 1.0);
  EXPECT_THAT(telemetry::SerializeText(registry),
              HasSubstr("lede_retrain_shards_skipped_total{reason=\"other_model\"} 1\n"));
}

// One retraining per policy root. While the root's lock is held
// (here by a PolicyRootLock of this process; lede-train's test holds it from
// another process), RunOnce fails at once with IsPolicyRootLocked, naming
// the holder, and reads and writes nothing; once released it runs.
TEST_F(RetrainTest, ASecondRunOnTheSameRootIsRefusedAtOnce) {
  WriteShard("w-00000001", 12);
  {
    auto held = PolicyRootLock::TryAcquire(root_.string());
    ASSERT_THAT(held.status(), IsOk());
    auto refused = RunOnce(Options(-kInf));
    EXPECT_THAT(refused.status(), StatusIs(StatusCode::kAborted, HasSubstr("pid=" + std::to_string(::getpid()))));
    EXPECT_TRUE(IsPolicyRootLocked(refused.status()));
    EXPECT_THAT(refused.status().message(), HasSubstr(root_.string()));
    EXPECT_FALSE(fs::exists(root_ / kRetrainStateFile));
    EXPECT_FALSE(fs::exists(root_ / "rt-1"));
    EXPECT_EQ(Serving(), "v1");
    telemetry::Registry registry;
    RetrainMetrics metrics(registry);
    metrics.RecordLocked(0.01);
    EXPECT_THAT(telemetry::SerializeText(registry), HasSubstr("lede_retrain_runs_total{decision=\"locked\"} 1\n"));
  }
  auto out = RunOnce(Options(-kInf));
  ASSERT_THAT(out.status(), IsOk());
  EXPECT_EQ(out->decision, RetrainDecision::kPublished);
  EXPECT_FALSE(IsPolicyRootLocked(FailedPreconditionError("x")));
  EXPECT_FALSE(IsPolicyRootLocked(Status(StatusCode::kAborted, "another abort")));
}

// Two Retrainers on one root from two threads: exactly one of them trains
// at a time; every run that trained is counted in the state, and no two
// runs share a version name.
TEST_F(RetrainTest, ConcurrentRunsNeverShareAVersionAndAreAllCounted) {
  std::set<std::string> versions;
  int64_t trained = 0;
  for (int round = 0; round < 3; ++round) {
    WriteShard("w-0000000" + std::to_string(round + 1), 12);
    std::vector<StatusOr<RetrainOutcome>> results(2, InternalError("not run"));
    std::vector<std::thread> threads;
    for (int i = 0; i < 2; ++i) threads.emplace_back([&, i] { results[i] = RunOnce(Options(-kInf)); });
    for (std::thread& t : threads) t.join();
    for (const StatusOr<RetrainOutcome>& r : results) {
      if (!r.ok()) {
        EXPECT_TRUE(IsPolicyRootLocked(r.status())) << r.status();
        continue;
      }
      if (r->decision == RetrainDecision::kNoNewData) continue;
      ++trained;
      EXPECT_TRUE(versions.insert(r->candidate_version).second) << r->candidate_version;
    }
  }
  EXPECT_EQ(trained, 3);
  auto state = ReadRetrainState((root_ / kRetrainStateFile).string());
  ASSERT_THAT(state.status(), IsOk());
  EXPECT_EQ(state->runs, trained);
  EXPECT_EQ(state->processed_shards.size(), 3u);
}

// Version names are reserved atomically: a name another writer reserved
// (mkdir of .reserved/<name>) or already saved is never handed out, with or
// without the lock; a reservation is dropped when its holder is done.
TEST(VersionReservationTest, ReservedAndSavedNamesAreSkipped) {
  ::lede::testing::TempDir tmp;
  const std::string root = (tmp.path() / "policy").string();
  fs::create_directories(fs::path(root) / "rt-1");
  auto taken = [&](const std::string& v) { return fs::exists(fs::path(root) / v); };
  auto name = [](int attempt) { return "rt-" + std::to_string(attempt + 1); };
  auto a = ReserveVersionName(root, name, taken);
  ASSERT_THAT(a.status(), IsOk());
  EXPECT_EQ(a->name(), "rt-2");  // rt-1 is a saved version
  auto b = ReserveVersionName(root, name, taken);
  ASSERT_THAT(b.status(), IsOk());
  EXPECT_EQ(b->name(), "rt-3");  // rt-2 is reserved by a
  EXPECT_TRUE(fs::is_directory(fs::path(root) / kReservedVersionsDir / "rt-2"));
  fs::create_directories(fs::path(root) / "rt-2");  // a saves its version, then lets go
  *a = VersionReservation();
  EXPECT_FALSE(fs::exists(fs::path(root) / kReservedVersionsDir / "rt-2"));
  auto c = ReserveVersionName(root, name, taken);
  ASSERT_THAT(c.status(), IsOk());
  EXPECT_EQ(c->name(), "rt-4");
}

// The same run against an S3 store (npm's s3rver on loopback): new shards
// are found by listing the bucket, trained on, and recorded as processed.
TEST_F(RetrainTest, ReadsNewShardsFromAnS3Store) {
  lede::testing::S3rver s3;
  if (!s3.available()) GTEST_SKIP() << s3.skip_reason();
  ASSERT_THAT(s3.Start("lede-retrain"), IsOk());
  ::setenv("AWS_ACCESS_KEY_ID", "S3RVER", 1);  // s3rver's built-in credentials
  ::setenv("AWS_SECRET_ACCESS_KEY", "S3RVER", 1);
  const std::string url = "s3://lede-retrain/run?endpoint=" + s3.endpoint() + "&region=us-east-1";
  auto bucket = storage::OpenObjectStore(url);
  ASSERT_THAT(bucket.status(), IsOk());
  for (const char* name : {"w-00000001", "w-00000002"}) {
    const std::string key = WriteShard(name, 12);
    std::ifstream in(store_ / key, std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    ASSERT_THAT((*bucket)->Put(key, bytes.str()), IsOk());
  }
  RetrainOptions o = Options(-kInf);
  o.experience_url = url;
  auto first = RunOnce(o);
  ASSERT_THAT(first.status(), IsOk());
  EXPECT_EQ(first->decision, RetrainDecision::kPublished);
  EXPECT_EQ(first->n_new_shards, 2);
  EXPECT_EQ(Serving(), "rt-1");
  auto again = RunOnce(o);
  ASSERT_THAT(again.status(), IsOk());
  EXPECT_EQ(again->decision, RetrainDecision::kNoNewData);
}

// The replay window keeps the most recent shards: with window_shards = 1
// only the newest shard is read.
TEST_F(RetrainTest, ReplayWindowKeepsTheMostRecentShards) {
  WriteShard("w-00000001", 12);
  const std::string b = WriteShard("w-00000002", 12);
  RetrainOptions o = Options(-kInf);
  o.window_shards = 1;
  auto r = RunOnce(o);
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_EQ(r->report["data"]["window"]["n_shards"], 1);
  EXPECT_EQ(r->report["data"]["window"]["first_shard"], b);
}

// The checkpoint can live elsewhere (--state), and a run with too few new
// transitions leaves the shards new.
TEST_F(RetrainTest, StatePathAndMinimumNewTransitions) {
  WriteShard("w-00000001", 2);
  RetrainOptions o = Options(-kInf);
  o.state_path = (tmp_.path() / "elsewhere" / "state.json").string();
  o.min_new_transitions = 100000;
  auto r = RunOnce(o);
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_EQ(r->decision, RetrainDecision::kNoNewData);
  EXPECT_EQ(r->n_new_shards, 1);
  EXPECT_FALSE(fs::exists(o.state_path));
  o.min_new_transitions = 1;
  r = RunOnce(o);
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_EQ(r->decision, RetrainDecision::kPublished);
  EXPECT_TRUE(fs::exists(o.state_path));
  EXPECT_FALSE(fs::exists(root_ / kRetrainStateFile));
}

// The candidate keeps the serving artifact's decision spec, model and
// reward cost model, and starts from its weights (0 epochs: identical).
TEST_F(RetrainTest, WarmStartKeepsTheDecisionSpecAndWeights) {
  WriteShard("w-00000001", 12);
  RetrainOptions o = Options(-kInf);
  o.dqn.epochs = 0;
  auto r = RunOnce(o);
  ASSERT_THAT(r.status(), IsOk());
  auto serving = policy::dqn::LoadArtifact(policy::dqn::VersionDir(root_.string(), "v1"));
  auto cand = policy::dqn::LoadArtifact(r->artifact_dir);
  ASSERT_THAT(serving.status(), IsOk());
  ASSERT_THAT(cand.status(), IsOk());
  EXPECT_EQ(cand->metadata.decision.candidate_layers, serving->metadata.decision.candidate_layers);
  EXPECT_EQ(cand->metadata.decision.max_draft_len, serving->metadata.decision.max_draft_len);
  EXPECT_EQ(cand->metadata.model_fingerprint, kFingerprint);
  EXPECT_EQ(cand->metadata.reward_cost_model, kCostModel);
  EXPECT_EQ(cand->network.hidden(), 16);
  EXPECT_EQ(cand->metadata.training_options.at("warm_start"), 1.0);
  EXPECT_EQ(cand->network.weights().fc2_weight, serving->network.weights().fc2_weight);
  EXPECT_EQ(cand->metadata.weights_sha256, serving->metadata.weights_sha256);

  // With training, the weights move but the spec stays.
  WriteShard("w-00000002", 12);
  o.dqn.epochs = 2;
  r = RunOnce(o);
  ASSERT_THAT(r.status(), IsOk());
  cand = policy::dqn::LoadArtifact(r->artifact_dir);
  ASSERT_THAT(cand.status(), IsOk());
  EXPECT_NE(cand->network.weights().fc2_weight, serving->network.weights().fc2_weight);
  EXPECT_EQ(cand->metadata.decision.candidate_layers, serving->metadata.decision.candidate_layers);
}

// An infinite margin never publishes: the candidate and its report go to
// candidates/, SERVING is kept, and the shards still count as processed.
TEST_F(RetrainTest, RejectedCandidateKeepsServing) {
  WriteShard("w-00000001", 12);
  auto r = RunOnce(Options(kInf));
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_EQ(r->decision, RetrainDecision::kRejected);
  EXPECT_EQ(Serving(), "v1");
  EXPECT_EQ(r->artifact_dir, (root_ / kCandidatesDir / "rt-1").string());
  EXPECT_THAT(policy::dqn::LoadArtifact(r->artifact_dir).status(), IsOk());
  EXPECT_FALSE(fs::exists(root_ / "rt-1"));
  const json report = json::parse(ReadText(r->report_path));
  EXPECT_EQ(report["decision"], "rejected");
  EXPECT_EQ(report["publish_margin"], "inf");
  auto state = ReadRetrainState((root_ / kRetrainStateFile).string());
  ASSERT_THAT(state.status(), IsOk());
  EXPECT_EQ(state->last_decision, "rejected");
  EXPECT_EQ(state->published, 0);
  EXPECT_EQ(state->processed_shards.size(), 1u);

  // The next candidate gets the next number, and a forced one is published.
  WriteShard("w-00000002", 12);
  r = RunOnce(Options(-kInf));
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_EQ(r->decision, RetrainDecision::kPublished);
  EXPECT_EQ(r->candidate_version, "rt-2");
  EXPECT_EQ(Serving(), "rt-2");
  EXPECT_THAT(policy::dqn::LoadServingArtifact(root_.string()).status(), IsOk());
}

// The decision follows the metric: a finite margin publishes exactly when
// the improvement exceeds it.
TEST_F(RetrainTest, FiniteMarginComparesTheMetric) {
  WriteShard("w-00000001", 40);
  auto dry = RunOnce(Options(kInf));  // the improvement of this data's candidate
  ASSERT_THAT(dry.status(), IsOk());
  const double improvement = dry->report["improvement"].get<double>();
  ASSERT_TRUE(std::isfinite(improvement));
  // Same data, same seed: the same candidate. Forget the shard and retry
  // with margins just below and above the improvement.
  fs::remove(root_ / kRetrainStateFile);
  auto above = RunOnce(Options(improvement + 1e-6));
  ASSERT_THAT(above.status(), IsOk());
  EXPECT_EQ(above->decision, RetrainDecision::kRejected);
  fs::remove(root_ / kRetrainStateFile);
  auto below = RunOnce(Options(improvement - 1e-6));
  ASSERT_THAT(below.status(), IsOk());
  EXPECT_EQ(below->decision, RetrainDecision::kPublished);
  EXPECT_EQ(below->report["decision_metric"], "heldout_matched_return");
}

// report.json holds both policies' numbers, the data range, per-behaviour-
// version counts (exploration flagged), filtered records, the decision and
// its reason; records of another model or cost model are not trained on.
TEST_F(RetrainTest, ReportDescribesDataPoliciesAndDecision) {
  const std::string a = WriteShard("w-00000001", 40, "v1");
  WriteShard("w-00000002", 12, "v1+eps=0.200");
  WriteShard("w-00000003", 2, "v0");
  WriteShard("w-00000004", 2, "v1", "other-model");
  const std::string d = WriteShard("w-00000005", 2, "v1", kFingerprint, "accelerator");
  auto r = RunOnce(Options(-kInf));
  ASSERT_THAT(r.status(), IsOk());
  ASSERT_TRUE(fs::exists(r->report_path));
  EXPECT_EQ(fs::path(r->report_path).parent_path(), fs::path(r->artifact_dir));
  const json report = json::parse(ReadText(r->report_path));
  EXPECT_EQ(report, r->report);
  EXPECT_EQ(report["format"], "lede-retrain-report-v1");
  EXPECT_EQ(report["decision"], "published");
  EXPECT_EQ(report["serving_version"], "v1");
  EXPECT_EQ(report["candidate_version"], "rt-1");
  EXPECT_FALSE(report["reason"].get<std::string>().empty());
  EXPECT_EQ(report["publish_margin"], "-inf");

  const json& data = report["data"];
  EXPECT_EQ(data["n_new_shards"], 5);
  EXPECT_EQ(data["first_new_shard"], a);
  EXPECT_EQ(data["last_new_shard"], d);
  EXPECT_GT(data["filtered_other_model"].get<int64_t>(), 0);
  EXPECT_GT(data["filtered_other_cost_model"].get<int64_t>(), 0);
  const json& bv = data["behaviour_versions"];
  ASSERT_EQ(bv.size(), 3u);
  EXPECT_EQ(bv["v1"]["exploration"], false);
  EXPECT_EQ(bv["v1"]["serving"], true);
  EXPECT_EQ(bv["v1+eps=0.200"]["exploration"], true);
  EXPECT_EQ(bv["v1+eps=0.200"]["requests"], 12);
  EXPECT_EQ(bv["v0"]["requests"], 2);
  EXPECT_EQ(data["exploration_transitions"], bv["v1+eps=0.200"]["transitions"]);
  EXPECT_EQ(data["n_transitions"].get<int64_t>(),
            data["split"]["train_transitions"].get<int64_t>() + data["split"]["heldout_transitions"].get<int64_t>());
  EXPECT_GT(data["split"]["heldout_requests"].get<int64_t>(), 0);
  EXPECT_FALSE(report["off_policy"].get<std::string>().empty());

  for (const char* who : {"serving", "candidate"}) {
    const json& m = report["offline"][who];
    EXPECT_EQ(m["n_transitions"], data["split"]["heldout_transitions"]) << who;
    EXPECT_TRUE(m["td_loss"].is_number()) << who;
    EXPECT_TRUE(m["action_agreement"].is_number()) << who;
    EXPECT_TRUE(m.contains("matched_return")) << who;
  }
  EXPECT_TRUE(report["replay"].is_null());  // no model: offline evaluation only

  // The artifact's metadata carries the data range and held-out metrics.
  auto cand = policy::dqn::LoadArtifact(r->artifact_dir);
  ASSERT_THAT(cand.status(), IsOk());
  EXPECT_EQ(cand->metadata.training_data.first_shard, a);
  EXPECT_EQ(cand->metadata.training_data.n_shards, 5);
  EXPECT_THAT(cand->metadata.training_data.behaviour_versions,
              ::testing::ElementsAre("v0", "v1", "v1+eps=0.200"));
  EXPECT_TRUE(std::isfinite(cand->metadata.offline_metrics.at("heldout_td_loss")));
}

// Without a SERVING version there is nothing to warm-start from or to beat.
TEST_F(RetrainTest, NeedsAServingVersion) {
  WriteShard("w-00000001", 4);
  fs::remove(root_ / "SERVING");
  EXPECT_THAT(RunOnce(Options(-kInf)).status(), StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_FALSE(fs::exists(root_ / kRetrainStateFile));
}

// Options are checked before anything is read.
TEST_F(RetrainTest, CreateRejectsBadOptions) {
  RetrainOptions o = Options(0.01);
  o.policy_root = "";
  EXPECT_THAT(Retrainer::Create(o).status(), StatusIs(StatusCode::kInvalidArgument));
  o = Options(0.01);
  o.heldout_fraction = 0;
  EXPECT_THAT(Retrainer::Create(o).status(), StatusIs(StatusCode::kInvalidArgument));
  o = Options(0.01);
  o.version_prefix = "bad/prefix";
  EXPECT_THAT(Retrainer::Create(o).status(), StatusIs(StatusCode::kInvalidArgument));
  o = Options(0.01);
  o.model_dir = "models/lede-tiny";  // without eval_prompts: the td trainer needs them
  o.trainer = "td";
  EXPECT_THAT(Retrainer::Create(o).status(), StatusIs(StatusCode::kInvalidArgument));
  o.trainer = "auto";  // the counterfactual trainer evaluates on held-out logged requests instead
  EXPECT_THAT(Retrainer::Create(o).status(), IsOk());
  o.trainer = "sgd";
  EXPECT_THAT(Retrainer::Create(o).status(), StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("trainer")));
  o = Options(0.01);
  o.trainer = "counterfactual";  // without model_dir
  EXPECT_THAT(Retrainer::Create(o).status(), StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("model_dir")));
  o = Options(0.01);
  o.dqn.lr = 0;
  EXPECT_THAT(Retrainer::Create(o).status(), StatusIs(StatusCode::kInvalidArgument));
}

// The checkpoint round-trips, a missing one is empty, a foreign one refused.
TEST_F(RetrainTest, StateRoundTrips) {
  const std::string path = (tmp_.path() / "s" / "state.json").string();
  auto empty = ReadRetrainState(path);
  ASSERT_THAT(empty.status(), IsOk());
  EXPECT_TRUE(empty->processed_shards.empty());
  RetrainState s;
  s.processed_shards = {"a/b.lexp", "c.lexp"};
  s.last_version = "rt-3";
  s.last_decision = "rejected";
  s.runs = 4;
  s.published = 2;
  ASSERT_THAT(WriteRetrainState(path, s), IsOk());
  auto back = ReadRetrainState(path);
  ASSERT_THAT(back.status(), IsOk());
  EXPECT_EQ(back->processed_shards, s.processed_shards);
  EXPECT_EQ(back->last_version, "rt-3");
  EXPECT_EQ(back->runs, 4);
  EXPECT_EQ(back->published, 2);
  std::ofstream(path) << R"({"format": "something-else"})";
  EXPECT_THAT(ReadRetrainState(path).status(), StatusIs(StatusCode::kInvalidArgument));
}

// With a model, both policies are replayed on held-out prompts and the
// decision uses the predicted speed-up under the reward's cost model.
// models/lede-tiny: 2 prompts x 16 tokens (about a second).
TEST(RetrainReplayTest, ReplayEvaluationComparesPredictedSpeedup) {
  const fs::path model = "models/lede-tiny";
  if (!fs::exists(model / "config.json")) GTEST_SKIP() << "no models/lede-tiny";
  ::lede::testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const fs::path root = tmp.path() / "policy";
  // The serving policy: a random network for lede-tiny (its architecture
  // fingerprint) rewarded under the measured cost model, deciding as the
  // shipped policies do (candidate layers 1-6, D_max 6, no probes of every
  // candidate, no lookahead probe).
  policy::dqn::PolicyMetadata meta;
  meta.version = "tiny-v1";
  meta.model_fingerprint = "07e04f79d11d13b5";
  meta.reward_cost_model = "measured";
  meta.decision.candidate_layers = {1, 2, 3, 4, 5, 6};
  meta.decision.max_draft_len = 6;
  meta.decision.probe_candidates = false;
  meta.decision.lookahead_probe = false;
  const policy::dqn::Artifact a{meta, policy::dqn::QNetwork::Random(16, 1)};
  ASSERT_THAT(policy::dqn::SaveArtifact(policy::dqn::VersionDir(root.string(), "tiny-v1"), a), IsOk());
  ASSERT_THAT(policy::dqn::PublishServingVersion(root.string(), "tiny-v1"), IsOk());
  auto serving = policy::dqn::LoadServingArtifact(root.string());
  ASSERT_THAT(serving.status(), IsOk());
  // Synthetic experience for this model and cost model.
  const fs::path shard = tmp.path() / "store" / "exp" / "a.lexp";
  fs::create_directories(shard.parent_path());
  auto w = experience::ShardWriter::Create(shard.string());
  ASSERT_THAT(w.status(), IsOk());
  std::mt19937_64 rng(5);
  for (int r = 0; r < 10; ++r) {
    for (const Transition& t : Round("req" + std::to_string(r), 0, 2, "tiny-v1+eps=0.200", rng,
                                     serving->metadata.model_fingerprint, "measured")) {
      ASSERT_THAT((*w)->Append(t), IsOk());
    }
  }
  ASSERT_THAT((*w)->Finish(), IsOk());

  RetrainOptions o;
  o.experience_url = (tmp.path() / "store").string();
  o.policy_root = root.string();
  o.model_dir = model.string();
  o.eval_prompts = (model / "prompts" / "story.jsonl").string();
  o.eval_prompt_skip = 40;
  o.eval_prompt_count = 2;
  o.eval_new_tokens = 16;
  o.publish_margin = kInf;
  o.dqn.epochs = 1;
  auto retrainer = Retrainer::Create(o);
  ASSERT_THAT(retrainer.status(), IsOk());
  auto r = (*retrainer)->RunOnce();
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_EQ(r->decision, RetrainDecision::kRejected);
  EXPECT_EQ(r->candidate_version.rfind("r", 0), 0u);  // r<UTC timestamp>
  const json& replay = r->report["replay"];
  EXPECT_EQ(r->report["decision_metric"], "replay_predicted_speedup");
  EXPECT_EQ(replay["prompts"], 2);
  EXPECT_EQ(replay["cost_model"], "measured");
  for (const char* who : {"serving", "candidate"}) {
    EXPECT_GT(replay[who]["predicted_speedup"].get<double>(), 0.0) << who;
    EXPECT_EQ(replay[who]["predicted_speedup"], replay[who]["predicted_speedup_measured"]) << who;
    const int64_t drafted = replay[who]["drafted"].get<int64_t>();
    const int64_t accepted = replay[who]["accepted"].get<int64_t>();
    EXPECT_LE(accepted, drafted) << who;
    EXPECT_DOUBLE_EQ(replay[who]["acceptance_rate"].get<double>(),
                     drafted > 0 ? static_cast<double>(accepted) / drafted : 0.0)
        << who;
    EXPECT_GT(replay[who]["tokens_per_s"].get<double>(), 0.0) << who;
    EXPECT_GT(replay[who]["tokens_per_round"].get<double>(), 0.0) << who;
  }
  EXPECT_EQ(r->report["serving_metric"], replay["serving"]["predicted_speedup"]);
  EXPECT_EQ(r->report["candidate_metric"], replay["candidate"]["predicted_speedup"]);
}

// A served-priced serving policy on models/lede-tiny (what the request-log
// trainer publishes: reward_cost_model "served") with accelerator-priced
// transitions (what the coordinator logs) and, when `profile` is given, 4
// request-log records carrying it; returns the retrainer's options (td
// trainer, replay of 2 prompts x 16 tokens, never publishing).
RetrainOptions ServedPolicyRoot(const fs::path& dir, const lede::v1::CostProfile* profile) {
  const std::string fp = "07e04f79d11d13b5";  // models/lede-tiny's architecture
  policy::dqn::PolicyMetadata meta;
  meta.version = "served-1";
  meta.model_fingerprint = fp;
  meta.reward_cost_model = "served";
  meta.decision.candidate_layers = {1, 2, 3, 4, 5, 6};
  meta.decision.max_draft_len = 6;
  meta.decision.probe_candidates = false;
  meta.decision.lookahead_probe = false;
  const fs::path root = dir / "policy";
  const policy::dqn::Artifact a{meta, policy::dqn::QNetwork::Random(16, 1)};
  EXPECT_THAT(policy::dqn::SaveArtifact(policy::dqn::VersionDir(root.string(), "served-1"), a), IsOk());
  EXPECT_THAT(policy::dqn::PublishServingVersion(root.string(), "served-1"), IsOk());
  const fs::path shard = dir / "store" / "exp" / "a.lexp";
  fs::create_directories(shard.parent_path());
  auto w = experience::ShardWriter::Create(shard.string());
  EXPECT_THAT(w.status(), IsOk());
  std::mt19937_64 rng(5);
  for (int r = 0; r < 10; ++r) {
    for (const Transition& t : Round("req" + std::to_string(r), 0, 2, "served-1", rng, fp, "accelerator")) {
      EXPECT_THAT((*w)->Append(t), IsOk());
    }
  }
  EXPECT_THAT((*w)->Finish(), IsOk());
  if (profile != nullptr) {
    auto store = storage::OpenObjectStore((dir / "store").string());
    EXPECT_THAT(store.status(), IsOk());
    auto log = experience::CreateRequestLog(std::shared_ptr<storage::ObjectStore>(std::move(*store)),
                                            experience::ExperienceLoggerOptions{});
    EXPECT_THAT(log.status(), IsOk());
    for (int i = 0; i < 4; ++i) {
      lede::v1::RequestRecord rec;
      rec.set_request_id("logged-" + std::to_string(i));
      rec.add_prompt_token_ids(1);
      rec.add_output_token_ids(2);
      rec.set_model_fingerprint(fp);
      *rec.mutable_measured_costs() = *profile;
      EXPECT_TRUE((*log)->Log(std::move(rec)));
    }
    EXPECT_THAT((*log)->Close(), IsOk());
  }
  RetrainOptions o;
  o.experience_url = (dir / "store").string();
  o.experience_prefix = "exp";
  o.policy_root = root.string();
  o.model_dir = "models/lede-tiny";
  o.eval_prompts = "models/lede-tiny/prompts/story.jsonl";
  o.eval_prompt_skip = 40;
  o.eval_prompt_count = 2;
  o.eval_new_tokens = 16;
  o.trainer = "td";
  o.publish_margin = kInf;
  o.dqn.epochs = 1;
  return o;
}

// The td trainer prices a served-priced policy with the costs the deployment
// logged with its requests: the coordinator's transitions (priced by the
// verifier's cost model) are re-priced, not filtered, the candidate keeps
// "served", and the replay's decision metric is the speed-up under the
// logged costs.
TEST(RetrainReplayTest, ServedPolicyIsPricedWithTheLoggedCosts) {
  if (!fs::exists("models/lede-tiny/config.json")) GTEST_SKIP() << "no models/lede-tiny";
  ::lede::testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const lede::v1::CostProfile profile = testing::CostlyVerificationProfile(12);
  const RetrainOptions o = ServedPolicyRoot(tmp.path(), &profile);
  auto retrainer = Retrainer::Create(o);
  ASSERT_THAT(retrainer.status(), IsOk());
  auto r = (*retrainer)->RunOnce();
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_EQ(r->decision, RetrainDecision::kRejected) << r->reason;
  EXPECT_EQ(r->n_new_transitions, 40);  // 10 rounds of 4 decisions, none filtered
  EXPECT_EQ(r->report["data"]["reward_cost_model"], "served");
  EXPECT_EQ(r->report["data"]["repriced_transitions"]["accelerator"], 40);
  EXPECT_EQ(r->report["data"]["filtered_other_cost_model"], 0);
  const json& replay = r->report["replay"];
  EXPECT_EQ(replay["cost_model"], "served");
  for (const char* who : {"serving", "candidate"}) {
    EXPECT_GT(replay[who]["predicted_speedup"].get<double>(), 0.0) << who;
    EXPECT_EQ(replay[who]["predicted_speedup"], replay[who]["predicted_speedup_served"]) << who;
  }
  auto candidate = policy::dqn::LoadArtifact(r->artifact_dir);
  ASSERT_THAT(candidate.status(), IsOk());
  EXPECT_EQ(candidate->metadata.reward_cost_model, "served");
}

// Without logged costs a served-priced policy cannot be priced: the run
// fails with FAILED_PRECONDITION naming the missing measured_costs, and
// nothing is written.
TEST(RetrainReplayTest, ServedPolicyWithoutLoggedCostsIsAPreconditionError) {
  if (!fs::exists("models/lede-tiny/config.json")) GTEST_SKIP() << "no models/lede-tiny";
  ::lede::testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const RetrainOptions o = ServedPolicyRoot(tmp.path(), nullptr);
  auto retrainer = Retrainer::Create(o);
  ASSERT_THAT(retrainer.status(), IsOk());
  EXPECT_THAT((*retrainer)->RunOnce().status(),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("measured_costs")));
  EXPECT_FALSE(fs::exists(tmp.path() / "policy" / kRetrainStateFile));
  EXPECT_EQ(policy::dqn::ResolveServingVersion(o.policy_root).value_or(""), "served-1");
}

}  // namespace
}  // namespace lede::trainer
