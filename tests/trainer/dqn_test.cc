// Tests of trainer/dqn.h: n-step TD targets, learning a synthetic MDP,
// determinism, reports and artifact export.
#include "trainer/dqn.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policy/dqn/artifact.h"
#include "policy/dqn/dqn_exit_controller.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace lede::trainer {
namespace {

using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using experience::Transition;
using policy::dqn::QNetwork;
using policy::dqn::QNetworkWeights;
constexpr int kIn = speculation::kExitFeatureDim;

std::array<float, kIn> Features(float v) {
  std::array<float, kIn> f{};
  f.fill(v);
  f[kIn - 1] = 1.0f;
  return f;
}

Transition Make(const std::string& request, int64_t round, int32_t index, float reward, bool done,
                float state, float next_state) {
  Transition t;
  t.request_id = request;
  t.round_index = round;
  t.decision_index = index;
  t.reward = reward;
  t.done = done;
  t.state = Features(state);
  if (!done) t.next_state = Features(next_state);
  return t;
}

// A network whose Q is [0.5, 2.0] everywhere: all weights zero, fc3 bias set.
QNetwork ConstantQ() {
  QNetworkWeights w;
  w.hidden = 2;
  w.fc1_weight.assign(2 * kIn, 0.0f);
  w.fc1_bias.assign(2, 0.0f);
  w.fc2_weight.assign(4, 0.0f);
  w.fc2_bias.assign(2, 0.0f);
  w.fc3_weight.assign(4, 0.0f);
  w.fc3_bias = {0.5f, 2.0f};
  return *QNetwork::Create(w);
}

// The synthetic MDP: one-decision episodes with uniform random features and
// uniform random (behaviour) actions; exiting earns +1 when feature 3
// (top1_prob) > 0.5 and -1 otherwise; continuing earns 0. The optimal
// greedy policy exits iff feature 3 > 0.5.
std::vector<Transition> SyntheticMdp(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<Transition> ts;
  for (int i = 0; i < n; ++i) {
    Transition t;
    for (int k = 0; k < kIn - 1; ++k) t.state[k] = u(rng);
    t.state[kIn - 1] = 1.0f;
    t.phase = t.state[0] > 0.5f ? speculation::Phase::kDraftLength : speculation::Phase::kExitLayer;
    t.state[0] = t.phase == speculation::Phase::kDraftLength ? 1.0f : 0.0f;
    t.action = u(rng) < 0.5f ? speculation::Action::kExit : speculation::Action::kContinue;
    t.reward = t.action == speculation::Action::kExit ? (t.state[3] > 0.5f ? 1.0f : -1.0f) : 0.0f;
    t.done = true;
    t.request_id = "r" + std::to_string(i / 8);
    t.round_index = i % 8;
    t.policy_version = "explore";
    ts.push_back(t);
  }
  return ts;
}

DqnOptions FastOptions() {
  DqnOptions o;
  o.hidden = 32;
  o.epochs = 15;
  o.batch_size = 64;
  o.lr = 3e-3;
  o.seed = 7;
  return o;
}

bool SameBytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// n-step targets of a 3-decision episode (gamma 0.9, rewards -0.01, 1.5,
// -1.75, the last terminal) match hand-computed values for n = 1, 2, 5,
// whatever the input order and with another episode interleaved.
TEST(DqnTest, NStepTargetsMatchHandComputedValues) {
  std::vector<Transition> ts = {
      Make("req", 4, 2, -1.75f, true, 0.3f, 0.0f),
      Make("other", 4, 0, 9.0f, true, 0.9f, 0.0f),
      Make("req", 4, 0, -0.01f, false, 0.1f, 0.2f),
      Make("req", 5, 0, 7.0f, true, 0.8f, 0.0f),
      Make("req", 4, 1, 1.5f, false, 0.2f, 0.3f),
  };
  const QNetwork q = ConstantQ();  // max_a Q = 2.0

  auto y2 = ComputeNStepTargets(ts, 0.9, 2);
  ASSERT_EQ(y2.size(), ts.size());
  // t0: -0.01 + 0.9 * 1.5 = 1.34, bootstraps from s_2 with 0.9^2.
  EXPECT_NEAR(y2[2].reward_sum, 1.34, 1e-6);
  EXPECT_NEAR(y2[2].bootstrap_discount, 0.81, 1e-12);
  EXPECT_EQ(y2[2].steps, 2);
  EXPECT_EQ(y2[2].bootstrap_state, Features(0.3f));
  // t1: 1.5 + 0.9 * -1.75 = -0.075; the episode ends within 2 steps.
  EXPECT_NEAR(y2[4].reward_sum, -0.075, 1e-6);
  EXPECT_EQ(y2[4].bootstrap_discount, 0.0);
  // t2: terminal, k = 1.
  EXPECT_NEAR(y2[0].reward_sum, -1.75, 1e-6);
  EXPECT_EQ(y2[0].bootstrap_discount, 0.0);
  EXPECT_EQ(y2[0].steps, 1);
  // Other episodes are untouched by this one.
  EXPECT_NEAR(y2[1].reward_sum, 9.0, 1e-6);
  EXPECT_NEAR(y2[3].reward_sum, 7.0, 1e-6);
  const std::vector<double> g2 = TdTargets(y2, q);
  EXPECT_NEAR(g2[2], 1.34 + 0.81 * 2.0, 1e-5);
  EXPECT_NEAR(g2[4], -0.075, 1e-5);
  EXPECT_NEAR(g2[0], -1.75, 1e-5);

  const std::vector<double> g1 = TdTargets(ComputeNStepTargets(ts, 0.9, 1), q);
  EXPECT_NEAR(g1[2], -0.01 + 0.9 * 2.0, 1e-5);
  EXPECT_NEAR(g1[4], 1.5 + 0.9 * 2.0, 1e-5);
  EXPECT_NEAR(g1[0], -1.75, 1e-5);

  const std::vector<double> g5 = TdTargets(ComputeNStepTargets(ts, 0.9, 5), q);
  EXPECT_NEAR(g5[2], -0.01 + 0.9 * 1.5 + 0.81 * -1.75, 1e-5);
}

// A gap in decision_index (a lost record) ends the chain, which then
// bootstraps from the last contiguous transition's next_state.
TEST(DqnTest, NStepTargetsStopAtGaps) {
  std::vector<Transition> ts = {Make("req", 0, 0, 1.0f, false, 0.1f, 0.2f),
                                Make("req", 0, 2, 5.0f, true, 0.3f, 0.0f)};
  auto y = ComputeNStepTargets(ts, 0.5, 3);
  EXPECT_EQ(y[0].steps, 1);
  EXPECT_NEAR(y[0].reward_sum, 1.0, 1e-9);
  EXPECT_NEAR(y[0].bootstrap_discount, 0.5, 1e-12);
  EXPECT_EQ(y[0].bootstrap_state, Features(0.2f));
}

// Training on the synthetic MDP learns the optimal action (>= 95% of fresh
// states) quickly (well under a second on one core).
TEST(DqnTest, LearnsSyntheticMdp) {
  const std::vector<Transition> data = SyntheticMdp(4000, 1);
  const auto start = std::chrono::steady_clock::now();
  auto result = TrainDqn(data, FastOptions());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_THAT(result, IsOk());
  std::printf("trained in %.3f s, held-out agreement %.3f\n", seconds,
              result->epochs.back().heldout.action_agreement);

  const std::vector<Transition> fresh = SyntheticMdp(2000, 99);
  int correct = 0;
  for (const Transition& t : fresh) {
    float q[policy::dqn::kNumActions];
    result->network.Forward(t.state.data(), q);
    const bool exit = policy::dqn::GreedyAction(q) == speculation::Action::kExit;
    correct += exit == (t.state[3] > 0.5f);
  }
  EXPECT_GE(correct, 0.95 * fresh.size()) << correct << " / " << fresh.size();
}

// The same seed gives byte-identical weights (and artifact files); another seed does not.
// Training starts load-blind: a network's weights on the load feature (the
// last input) start at zero, so a network trained on experience at one
// load (feature 0: one session) does not depend on the load at all, and a
// dependence grows only where targets differ between loads. (With random
// weights there, one policy trained on the same replays priced alike at
// loads 1 and 16 ran at 1.67x at load 1 and 1.33x at load 16.)
TEST(DqnTest, TrainingStartsLoadBlind) {
  std::vector<Transition> ts = SyntheticMdp(2000, 11);
  for (Transition& t : ts) {
    t.state[speculation::kBiasFeature] = 1.0f;
    t.state[speculation::kLoadFeature] = 0.0f;  // load 1
    for (int c = speculation::kCostFeature; c < kIn; ++c) t.state[c] = 0.0f;  // costs unknown
  }
  auto r = TrainDqn(ts, FastOptions());
  ASSERT_THAT(r, IsOk());
  const QNetworkWeights& w = r->network.weights();
  for (int32_t h = 0; h < w.hidden; ++h) {
    for (int c = speculation::kLoadFeature; c < kIn; ++c) EXPECT_EQ(w.fc1_weight[h * kIn + c], 0.0f) << "unit " << h;
  }
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (int i = 0; i < 100; ++i) {
    std::array<float, kIn> f;
    for (int k = 0; k < speculation::kBiasFeature; ++k) f[k] = u(rng);
    f[speculation::kBiasFeature] = 1.0f;
    for (int c = speculation::kCostFeature; c < kIn; ++c) f[c] = 0.0f;
    float alone[policy::dqn::kNumActions], busy[policy::dqn::kNumActions];
    f[speculation::kLoadFeature] = 0.0f;
    r->network.Forward(f.data(), alone);
    f[speculation::kLoadFeature] = speculation::LoadFeature(64);
    f[speculation::kCostFeature + 2] = 0.4f;  // nor on the cost profile
    r->network.Forward(f.data(), busy);
    for (int a = 0; a < policy::dqn::kNumActions; ++a) EXPECT_EQ(alone[a], busy[a]);
  }
}

TEST(DqnTest, SameSeedGivesIdenticalWeights) {
  std::vector<Transition> data = SyntheticMdp(1000, 2);
  // Multi-step episodes, so that bootstrapping and the target network matter.
  for (size_t i = 0; i < data.size(); ++i) {
    data[i].request_id = "r" + std::to_string(i / 4);
    data[i].round_index = 0;
    data[i].decision_index = static_cast<int32_t>(i % 4);
    data[i].done = i % 4 == 3;
    if (!data[i].done) data[i].next_state = data[i + 1].state;
  }
  DqnOptions o = FastOptions();
  o.epochs = 3;
  o.target_update_every = 10;
  auto a = TrainDqn(data, o);
  auto b = TrainDqn(data, o);
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  const QNetworkWeights& wa = a->network.weights();
  const QNetworkWeights& wb = b->network.weights();
  EXPECT_TRUE(SameBytes(wa.fc1_weight, wb.fc1_weight));
  EXPECT_TRUE(SameBytes(wa.fc1_bias, wb.fc1_bias));
  EXPECT_TRUE(SameBytes(wa.fc2_weight, wb.fc2_weight));
  EXPECT_TRUE(SameBytes(wa.fc2_bias, wb.fc2_bias));
  EXPECT_TRUE(SameBytes(wa.fc3_weight, wb.fc3_weight));
  EXPECT_TRUE(SameBytes(wa.fc3_bias, wb.fc3_bias));
  EXPECT_EQ(a->epochs.back().td_loss, b->epochs.back().td_loss);

  o.target_update = TargetUpdate::kPolyak;
  auto p1 = TrainDqn(data, o);
  auto p2 = TrainDqn(data, o);
  ASSERT_THAT(p1, IsOk());
  ASSERT_THAT(p2, IsOk());
  EXPECT_TRUE(SameBytes(p1->network.weights().fc2_weight, p2->network.weights().fc2_weight));

  o.target_update = TargetUpdate::kHard;
  o.seed = 8;
  auto c = TrainDqn(data, o);
  ASSERT_THAT(c, IsOk());
  EXPECT_FALSE(SameBytes(wa.fc2_weight, c->network.weights().fc2_weight));
}

// Reports: one per epoch through the callback, counts that add up, a
// held-out split of whole requests, rates within [0, 1].
TEST(DqnTest, ReportsEveryEpochAndSplitsWholeRequests) {
  const std::vector<Transition> data = SyntheticMdp(800, 3);  // 100 requests of 8 rounds
  DqnOptions o = FastOptions();
  o.epochs = 4;
  o.heldout_fraction = 0.2;
  std::vector<DqnEpochReport> seen;
  auto r = TrainDqn(data, o, [&seen](const DqnEpochReport& e) { seen.push_back(e); });
  ASSERT_THAT(r, IsOk());
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(r->epochs.size(), 4u);
  EXPECT_EQ(seen.back().epoch, 4);
  EXPECT_EQ(r->n_transitions, 800);
  EXPECT_EQ(r->n_requests, 100);
  EXPECT_EQ(r->n_episodes, 800);
  EXPECT_EQ(r->n_heldout_transitions, 20 * 8);  // 20 whole requests
  EXPECT_EQ(r->n_train_transitions + r->n_heldout_transitions, 800);
  EXPECT_EQ(r->n_train_episodes + r->n_heldout_episodes, 800);
  EXPECT_EQ(r->behaviour_versions, std::vector<std::string>{"explore"});
  for (const DqnEpochReport& e : seen) {
    EXPECT_TRUE(std::isfinite(e.td_loss));
    EXPECT_TRUE(std::isfinite(e.heldout.td_loss));
    for (double rate : {e.train.exit_fraction_phase1, e.train.exit_fraction_phase2, e.train.action_agreement,
                        e.heldout.action_agreement}) {
      EXPECT_GE(rate, 0.0);
      EXPECT_LE(rate, 1.0);
    }
  }
  // The greedy policy, where it agrees with the behaviour, earns more than the random behaviour.
  EXPECT_GT(seen.back().heldout.matched_reward, seen.back().heldout.behaviour_reward);
  EXPECT_EQ(r->OfflineMetrics().at("heldout_matched_reward"), seen.back().heldout.matched_reward);
}

// Non-finite and repeated transitions are dropped; bad options and empty data are refused.
TEST(DqnTest, RejectsBadOptionsAndData) {
  std::vector<Transition> data = SyntheticMdp(100, 4);
  DqnOptions o = FastOptions();
  o.epochs = 1;
  o.gamma = 1.5;
  EXPECT_THAT(TrainDqn(data, o), StatusIs(StatusCode::kInvalidArgument));
  o = FastOptions();
  o.n_step = 0;
  EXPECT_THAT(TrainDqn(data, o), StatusIs(StatusCode::kInvalidArgument));
  o = FastOptions();
  o.epochs = 1;
  EXPECT_THAT(TrainDqn({}, o), StatusIs(StatusCode::kInvalidArgument));
  data[5].reward = std::nanf("");
  data[9].state[2] = INFINITY;
  data.push_back(data[0]);  // logged twice
  auto r = TrainDqn(data, o);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->n_dropped, 2);
  EXPECT_EQ(r->n_duplicates, 1);
  EXPECT_EQ(r->n_transitions, 98);
}

// The exported artifact loads back with the training settings and metrics, and decides as trained.
TEST(DqnTest, MakeArtifactRecordsTrainingAndLoadsBack) {
  lede::testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const std::string dir = (tmp.path() / "v1").string();
  DqnOptions o = FastOptions();
  o.epochs = 2;
  auto r = TrainDqn(SyntheticMdp(500, 5), o);
  ASSERT_THAT(r, IsOk());
  policy::dqn::PolicyMetadata meta;
  meta.version = "v1";
  meta.model_fingerprint = "feedfacefeedface";
  meta.decision.candidate_layers = {2, 4};
  meta.training_data.first_shard = "s0.lexp";
  meta.training_options["rho"] = 1.5;  // the caller's options are kept beside the DQN's
  const policy::dqn::Artifact a = MakeArtifact(*r, o, meta);
  ASSERT_THAT(policy::dqn::SaveArtifact(dir, a), IsOk());
  auto b = policy::dqn::LoadArtifact(dir, "feedfacefeedface");
  ASSERT_THAT(b, IsOk());
  EXPECT_DOUBLE_EQ(b->metadata.gamma, o.gamma);
  EXPECT_EQ(b->metadata.n_step, o.n_step);
  EXPECT_EQ(b->metadata.seed, o.seed);
  EXPECT_EQ(b->metadata.training_data.first_shard, "s0.lexp");
  EXPECT_DOUBLE_EQ(b->metadata.training_options.at("rho"), 1.5);
  EXPECT_DOUBLE_EQ(b->metadata.training_options.at("epochs"), 2.0);
  EXPECT_EQ(b->metadata.training_data.n_transitions, 500);
  EXPECT_DOUBLE_EQ(b->metadata.offline_metrics.at("td_loss"), r->epochs.back().td_loss);
  EXPECT_TRUE(SameBytes(b->network.weights().fc2_weight, r->network.weights().fc2_weight));
}

}  // namespace
}  // namespace lede::trainer
