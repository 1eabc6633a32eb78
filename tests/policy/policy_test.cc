// Tests of policy/: the baseline controllers, exploration, and the rewards of
// docs/design.md §2.
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "policy/acceptance_model.h"
#include "policy/controllers.h"
#include "shared/experience/transition.h"

namespace lede::policy {
namespace {

using speculation::Action;
using speculation::Decision;
using speculation::ExitState;
using speculation::Phase;

ExitState State(Phase phase, int32_t layer, int32_t draft_pos, float top1) {
  ExitState s;
  s.phase = phase;
  s.layer = layer;
  s.n_layers = 12;
  s.draft_pos = draft_pos;
  s.max_draft_len = 8;
  s.top1_prob = top1;
  return s;
}

// Static (E, D) always speculates, exits at E and drafts exactly D tokens.
TEST(StaticExitControllerTest, ExitsAtELayerAndDraftsD) {
  StaticExitController c(3, 2);
  EXPECT_EQ(c.Decide(State(Phase::kRoundStart, 0, 0, 0)), Action::kExit);
  EXPECT_EQ(c.Decide(State(Phase::kExitLayer, 2, 0, 0.99f)), Action::kContinue);
  EXPECT_EQ(c.Decide(State(Phase::kExitLayer, 3, 0, 0.01f)), Action::kExit);
  EXPECT_EQ(c.Decide(State(Phase::kDraftLength, 3, 1, 0.01f)), Action::kExit);
  EXPECT_EQ(c.Decide(State(Phase::kDraftLength, 3, 2, 0.99f)), Action::kContinue);
}

// Thresholds: exit at the first confident layer (lambda), keep drafting while confident (tau).
TEST(ThresholdExitControllerTest, ComparesTopOneProbability) {
  ThresholdExitController c(0.8f, 0.5f);
  EXPECT_EQ(c.Decide(State(Phase::kRoundStart, 0, 0, 0)), Action::kExit);
  EXPECT_EQ(c.Decide(State(Phase::kExitLayer, 2, 0, 0.79f)), Action::kContinue);
  EXPECT_EQ(c.Decide(State(Phase::kExitLayer, 2, 0, 0.80f)), Action::kExit);
  EXPECT_EQ(c.Decide(State(Phase::kDraftLength, 2, 1, 0.49f)), Action::kContinue);
  EXPECT_EQ(c.Decide(State(Phase::kDraftLength, 2, 1, 0.50f)), Action::kExit);
}

// Epsilon 0 follows the behaviour; epsilon 1 explores both actions about equally; seeds repeat.
TEST(EpsilonGreedyControllerTest, ExploresWithProbabilityEpsilon) {
  StaticExitController behaviour(3, 2);
  EpsilonGreedyController greedy(behaviour, 0.0, 1);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(greedy.Decide(State(Phase::kExitLayer, 2, 0, 0)), Action::kContinue);
  EpsilonGreedyController a(behaviour, 1.0, 5), b(behaviour, 1.0, 5);
  int exits = 0;
  for (int i = 0; i < 2000; ++i) {
    const Action x = a.Decide(State(Phase::kExitLayer, 2, 0, 0));
    EXPECT_EQ(x, b.Decide(State(Phase::kExitLayer, 2, 0, 0)));
    exits += x == Action::kExit;
  }
  EXPECT_NEAR(exits / 2000.0, 0.5, 5 * std::sqrt(0.25 / 2000));
}

// Rewards follow docs/design.md §2: accepted 1 + (L - l*)/L, rejected -2 + (L - l*)/L,
// continue -0.01, round start 0; only the round's last decision is terminal.
TEST(TransitionTest, PaperRewardsAndTerminalFlags) {
  speculation::RoundTrace round;
  round.round_index = 4;
  round.decisions = {
      Decision{State(Phase::kRoundStart, 0, 0, 0), Action::kExit, -1, false},
      Decision{State(Phase::kExitLayer, 2, 0, 0.3f), Action::kContinue, -1, false},
      Decision{State(Phase::kExitLayer, 3, 0, 0.9f), Action::kExit, 0, true},
      Decision{State(Phase::kDraftLength, 3, 1, 0.8f), Action::kExit, 1, false},
      Decision{State(Phase::kDraftLength, 3, 2, 0.2f), Action::kContinue, -1, false},
  };
  std::vector<experience::Transition> t = experience::ToTransitions(round, experience::RewardSpec::Paper(12), "req", "v1", "fp");
  ASSERT_EQ(t.size(), 5u);
  EXPECT_FLOAT_EQ(t[0].reward, 0.0f);
  EXPECT_FLOAT_EQ(t[1].reward, -0.01f);
  EXPECT_FLOAT_EQ(t[2].reward, 1.0f + 9.0f / 12);
  EXPECT_FLOAT_EQ(t[3].reward, -2.0f + 9.0f / 12);
  EXPECT_FLOAT_EQ(t[4].reward, -0.01f);
  for (size_t i = 0; i < t.size(); ++i) {
    EXPECT_EQ(t[i].done, i + 1 == t.size());
    EXPECT_EQ(t[i].round_index, 4);
    EXPECT_EQ(t[i].decision_index, static_cast<int32_t>(i));
  }
  float next[speculation::kExitFeatureDim];
  speculation::ExitFeatures(round.decisions[3].state, next);
  for (int k = 0; k < speculation::kExitFeatureDim; ++k) EXPECT_EQ(t[2].next_state[k], next[k]);
}

// The cost-aware variant takes its depth term and continue penalty from costs.
TEST(TransitionTest, CostAwareRewards) {
  experience::RewardSpec r = experience::RewardSpec::FromCosts("measured", {0.0, 0.4, 0.6}, 2.0, 4.0, 0.1);
  EXPECT_DOUBLE_EQ(r.Accepted(1), 1.0 + (1.0 - 0.4 - 0.5));
  EXPECT_DOUBLE_EQ(r.Rejected(2), -2.0 + (1.0 - 0.6 - 0.5));
  EXPECT_DOUBLE_EQ(r.continue_reward, 0.0);
  EXPECT_DOUBLE_EQ(r.probe_reward, -0.1);
}

// Throughput rewards sum, over a round, to its tokens minus its cost.
TEST(TransitionTest, ThroughputRewardsSumToTokensMinusCost) {
  // L = 12: draft cost (l + 1) / 12, verification 1 whatever K, probe 1/12.
  std::vector<double> draft_cost;
  for (int l = 0; l <= 12; ++l) draft_cost.push_back((l + 1) / 12.0);
  std::vector<std::vector<double>> verify(13, std::vector<double>(9, 1.0));
  experience::RewardSpec r = experience::RewardSpec::Throughput("accelerator", draft_cost, verify, 1.0 / 12);
  speculation::RoundTrace round;
  round.exit_layer = 3;
  round.n_drafted = 2;
  round.n_accepted = 1;
  round.decisions = {
      Decision{State(Phase::kRoundStart, 0, 0, 0), Action::kExit, -1, false},
      Decision{State(Phase::kExitLayer, 2, 0, 0.3f), Action::kContinue, -1, false, /*wasted_probe=*/true},
      Decision{State(Phase::kExitLayer, 3, 0, 0.9f), Action::kExit, 0, true},
      Decision{State(Phase::kDraftLength, 3, 1, 0.8f), Action::kExit, 1, false},
      Decision{State(Phase::kDraftLength, 3, 2, 0.2f), Action::kContinue, -1, false, /*wasted_probe=*/true},
  };
  double sum = 0;
  for (const experience::Transition& t : experience::ToTransitions(round, r, "q", "v", "f")) sum += t.reward;
  // Tokens: 1 accepted + 1 from the verifier = 2. Cost: 2 probes (layer 2,
  // and the stop) + 2 drafts at layer 3 + 1 verification.
  const double cost = 2.0 / 12 + 2 * (4.0 / 12) + 1.0;
  EXPECT_NEAR(sum, 2.0 - cost, 1e-6);
  // The same decisions taken without probes (phase 1 from the history,
  // phase 2 on the token just drafted) cost only the drafts and the pass.
  for (Decision& d : round.decisions) d.wasted_probe = false;
  sum = 0;
  for (const experience::Transition& t : experience::ToTransitions(round, r, "q", "v", "f")) sum += t.reward;
  EXPECT_NEAR(sum, 2.0 - (2 * (4.0 / 12) + 1.0), 1e-6);
}

// ----------------------------------------------------- acceptance model

namespace rule_based {

using speculation::Action;
using speculation::ExitState;
using speculation::Phase;

// Samples whose acceptance follows a known logistic law in top-1 probability.
std::vector<AcceptanceSample> LogisticSamples(double a, double b, uint64_t seed, int n) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<AcceptanceSample> out;
  for (int i = 0; i < n; ++i) {
    const float top1 = static_cast<float>(u(rng));
    const double p = 1.0 / (1.0 + std::exp(-(a * top1 + b)));
    out.push_back({AcceptanceFeaturesOf(top1, 1.0f, 1.0f, 1.0f, 0.0f, 0.0f), u(rng) < p});
  }
  return out;
}

TEST(AcceptanceModelTest, RecoversALogisticLawPerLayer) {
  std::vector<std::vector<AcceptanceSample>> by_layer(4);
  by_layer[1] = LogisticSamples(6.0, -4.0, 1, 20000);  // shallow: accepted only when confident
  by_layer[2] = LogisticSamples(3.0, 0.0, 2, 20000);
  auto m = AcceptanceModel::Fit(by_layer);
  ASSERT_TRUE(m.ok());
  for (float top1 : {0.1f, 0.5f, 0.9f}) {
    const auto x = AcceptanceFeaturesOf(top1, 1.0f, 1.0f, 1.0f, 0.0f, 0.0f);
    EXPECT_NEAR(m->Predict(1, x), 1.0 / (1.0 + std::exp(-(6.0 * top1 - 4.0))), 0.03) << top1;
    EXPECT_NEAR(m->Predict(2, x), 1.0 / (1.0 + std::exp(-(3.0 * top1))), 0.03) << top1;
  }
  // A layer without samples predicts the pooled base rate.
  const double pooled = m->Predict(3, AcceptanceFeaturesOf(0.5f, 1.0f, 1.0f, 1.0f, 0.0f, 0.0f));
  EXPECT_GT(pooled, 0.3);
  EXPECT_LT(pooled, 0.7);
  EXPECT_FALSE(AcceptanceModel::Fit(std::vector<std::vector<AcceptanceSample>>(3)).ok());
}

std::shared_ptr<const RoundCosts> FlatCosts(double marginal, double round_per_draft) {
  auto c = std::make_shared<RoundCosts>();
  c->marginal.assign(13, std::vector<double>(9, marginal));
  c->round.assign(13, std::vector<double>(9, 0.0));
  for (int l = 1; l < 12; ++l) {
    for (int d = 1; d <= 8; ++d) c->round[l][d] = 1.0 + d * round_per_draft * l;
  }
  return c;
}

// State() with the other probe signals the acceptance model reads.
ExitState Probe(Phase phase, int32_t layer, int32_t draft_pos, float top1) {
  ExitState s = State(phase, layer, draft_pos, top1);
  s.margin = 1.0f;
  s.entropy = 1.0f;
  s.trace_nll = 1.0f;
  return s;
}

// The one-step rule: keep drafting while the product of calibrated
// acceptance probabilities pays rho times the marginal cost.
TEST(CalibratedStopControllerTest, DraftsWhileTheRoundsProductPays) {
  std::vector<std::vector<AcceptanceSample>> by_layer(13);
  by_layer[2] = LogisticSamples(8.0, -4.0, 3, 20000);
  auto m = std::make_shared<const AcceptanceModel>(*AcceptanceModel::Fit(by_layer));
  CalibratedStopController c(m, 2, /*rho=*/1.5, FlatCosts(0.25, 0.0));  // threshold on s: 0.375
  EXPECT_EQ(c.FirstProbeLayer(Probe(Phase::kRoundStart, 0, 0, 0)), 2);
  EXPECT_EQ(c.Decide(Probe(Phase::kRoundStart, 0, 0, 0)), Action::kExit);
  EXPECT_EQ(c.Decide(Probe(Phase::kExitLayer, 2, 0, 0.95f)), Action::kExit);       // p ~ 0.97
  EXPECT_EQ(c.Decide(Probe(Phase::kDraftLength, 2, 1, 0.95f)), Action::kExit);     // s ~ 0.94
  EXPECT_EQ(c.Decide(Probe(Phase::kDraftLength, 2, 2, 0.6f)), Action::kExit);      // s ~ 0.94 * 0.69 = 0.65
  EXPECT_EQ(c.Decide(Probe(Phase::kDraftLength, 2, 3, 0.6f)), Action::kExit);      // s ~ 0.45
  EXPECT_EQ(c.Decide(Probe(Phase::kDraftLength, 2, 4, 0.6f)), Action::kContinue);  // s ~ 0.31 < 0.375
  // A new round starts from s = 1: an unconfident first draft is not worth it.
  EXPECT_EQ(c.Decide(Probe(Phase::kExitLayer, 2, 0, 0.3f)), Action::kContinue);    // p ~ 0.13
}

// Without phase-1 probes (DecisionSpec::probe_candidates false) the exit
// layer's state has no signals: the rule exits at E unchecked, lookahead or
// not, and judges the drafts after it as before.
TEST(CalibratedStopControllerTest, WithoutPhaseOneProbesExitsAtItsLayerUnchecked) {
  std::vector<std::vector<AcceptanceSample>> by_layer(13);
  by_layer[2] = LogisticSamples(8.0, -4.0, 3, 20000);
  auto m = std::make_shared<const AcceptanceModel>(*AcceptanceModel::Fit(by_layer));
  const ExitState unprobed = State(Phase::kExitLayer, 2, 0, 0.0f);  // history mode: no signals
  CalibratedStopController probed(m, 2, 1.5, FlatCosts(0.25, 0.0), /*lookahead=*/true, nullptr, true);
  EXPECT_EQ(probed.Decide(unprobed), Action::kContinue);  // judged on empty signals: p ~ 0.02
  CalibratedStopController history(m, 2, 1.5, FlatCosts(0.25, 0.0), /*lookahead=*/true, nullptr, false);
  EXPECT_EQ(history.Decide(State(Phase::kExitLayer, 1, 0, 0.0f)), Action::kContinue);  // below E
  EXPECT_EQ(history.Decide(unprobed), Action::kExit);
  EXPECT_EQ(history.Decide(Probe(Phase::kDraftLength, 2, 1, 0.95f)), Action::kExit);     // p ~ 0.97
  EXPECT_EQ(history.Decide(Probe(Phase::kDraftLength, 2, 2, 0.3f)), Action::kContinue);  // s ~ 0.97 * 0.17 < 0.375
}

// DEL: the (l, d) with the most expected tokens per cost, or a plain step.
TEST(DelControllerTest, PicksTheBestLayerAndLengthOrDeclines) {
  std::vector<double> rates(13, 0.0);
  rates[2] = 0.5;
  rates[6] = 0.95;
  auto costs = FlatCosts(0.0, 0.1);  // round[l][d] = 1 + 0.1 * d * l
  DelController c(rates, {2, 6}, 8, 0.0f, costs);
  ExitState start = Probe(Phase::kRoundStart, 0, 0, 0);
  start.accept_ema = 0.5f;
  EXPECT_EQ(c.Decide(start), Action::kExit);
  // At l = 6, alpha 0.95: TPL(6, d) = (1 - 0.95^(d+1)) / 0.05 / (1 + 0.6 d), best at d = 4 (1.331;
  // d = 3: 1.325, d = 5: 1.325), against TPL(2, d) <= 1.25 at alpha 0.5.
  EXPECT_EQ(c.FirstProbeLayer(start), 6);
  EXPECT_EQ(c.Decide(Probe(Phase::kExitLayer, 6, 0, 0.1f)), Action::kExit);
  EXPECT_EQ(c.Decide(Probe(Phase::kDraftLength, 6, 3, 0.1f)), Action::kExit);
  EXPECT_EQ(c.Decide(Probe(Phase::kDraftLength, 6, 4, 0.9f)), Action::kContinue);
  // The request accepts far less than layer 6 does on average: every layer's
  // estimate drops and no round beats a plain step.
  start.accept_ema = 0.05f;
  EXPECT_EQ(c.Decide(start), Action::kContinue);
}

TEST(AdaEdlControllerTest, StopsWhenTheEntropyBoundFalls) {
  AdaEdlController c(3, 0.5f, 0.5f);  // bound = 1 - sqrt(0.5 H) >= 0.5  <=>  H <= 0.5
  EXPECT_EQ(c.FirstProbeLayer(Probe(Phase::kRoundStart, 0, 0, 0)), 3);
  ExitState s = Probe(Phase::kExitLayer, 3, 0, 0.5f);
  s.entropy = 0.4f;
  EXPECT_EQ(c.Decide(s), Action::kExit);
  s.phase = Phase::kDraftLength;
  s.entropy = 0.6f;
  EXPECT_EQ(c.Decide(s), Action::kContinue);
  s.phase = Phase::kExitLayer;
  s.layer = 2;
  EXPECT_EQ(c.Decide(s), Action::kContinue);  // below E
}

// The Dinkelbach throughput reward: tokens - rho * cost of each part.
TEST(RewardSpecTest, ThroughputChargesRhoTimesEveryCost) {
  const std::vector<double> draft_cost = {0, 0.2, 0.3};
  const std::vector<std::vector<double>> verify = {{0, 0, 0}, {1, 1.1, 1.2}, {1, 1.1, 1.2}};
  const experience::RewardSpec r = experience::RewardSpec::Throughput("m", draft_cost, verify, 0.05, 0.01, 2.0);
  EXPECT_DOUBLE_EQ(r.rho, 2.0);
  EXPECT_DOUBLE_EQ(r.Accepted(1), 1.0 - 2.0 * 0.2);
  EXPECT_DOUBLE_EQ(r.Rejected(2), -2.0 * 0.3);
  EXPECT_DOUBLE_EQ(r.continue_reward, 0.0);
  EXPECT_DOUBLE_EQ(r.probe_reward, -2.0 * 0.05);
  EXPECT_DOUBLE_EQ(r.decision_reward, -2.0 * 0.01);
  EXPECT_DOUBLE_EQ(r.RoundEnd(1, 2), 1.0 - 2.0 * 1.2);
  EXPECT_DOUBLE_EQ(r.RoundEnd(0, 0), 1.0 - 2.0);  // a plain step: one token for one step
}

}  // namespace rule_based

}  // namespace
}  // namespace lede::policy

