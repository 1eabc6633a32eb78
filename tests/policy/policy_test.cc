// Tests of policy/: the baseline controllers, exploration, and the rewards of
// DESIGN.md §2.
#include <cmath>

#include "gtest/gtest.h"
#include "policy/controllers.h"
#include "policy/transition.h"

namespace lede::policy {
namespace {

using model::Action;
using model::Decision;
using model::ExitState;
using model::Phase;

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

// Rewards follow DESIGN.md §2: accepted 1 + (L - l*)/L, rejected -2 + (L - l*)/L,
// continue -0.01, round start 0; only the round's last decision is terminal.
TEST(TransitionTest, PaperRewardsAndTerminalFlags) {
  model::RoundTrace round;
  round.round_index = 4;
  round.decisions = {
      Decision{State(Phase::kRoundStart, 0, 0, 0), Action::kExit, -1, false},
      Decision{State(Phase::kExitLayer, 2, 0, 0.3f), Action::kContinue, -1, false},
      Decision{State(Phase::kExitLayer, 3, 0, 0.9f), Action::kExit, 0, true},
      Decision{State(Phase::kDraftLength, 3, 1, 0.8f), Action::kExit, 1, false},
      Decision{State(Phase::kDraftLength, 3, 2, 0.2f), Action::kContinue, -1, false},
  };
  std::vector<Transition> t = ToTransitions(round, RewardSpec::Paper(12), "req", "v1", "fp");
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
  float next[model::kExitFeatureDim];
  model::ExitFeatures(round.decisions[3].state, next);
  for (int k = 0; k < model::kExitFeatureDim; ++k) EXPECT_EQ(t[2].next_state[k], next[k]);
}

// The cost-aware variant takes its depth term and continue penalty from costs.
TEST(TransitionTest, CostAwareRewards) {
  RewardSpec r = RewardSpec::FromCosts("measured", {0.0, 0.4, 0.6}, 2.0, 4.0, 0.1);
  EXPECT_DOUBLE_EQ(r.Accepted(1), 1.0 + (1.0 - 0.4 - 0.5));
  EXPECT_DOUBLE_EQ(r.Rejected(2), -2.0 + (1.0 - 0.6 - 0.5));
  EXPECT_DOUBLE_EQ(r.continue_reward, -0.1);
}

// Throughput rewards sum, over a round, to its tokens minus its cost.
TEST(TransitionTest, ThroughputRewardsSumToTokensMinusCost) {
  // L = 12: draft cost (l + 1) / 12, verification 1 whatever K, probe 1/12.
  std::vector<double> draft_cost;
  for (int l = 0; l <= 12; ++l) draft_cost.push_back((l + 1) / 12.0);
  std::vector<std::vector<double>> verify(13, std::vector<double>(9, 1.0));
  RewardSpec r = RewardSpec::Throughput("accelerator", draft_cost, verify, 1.0 / 12);
  model::RoundTrace round;
  round.exit_layer = 3;
  round.n_drafted = 2;
  round.n_accepted = 1;
  round.decisions = {
      Decision{State(Phase::kRoundStart, 0, 0, 0), Action::kExit, -1, false},
      Decision{State(Phase::kExitLayer, 2, 0, 0.3f), Action::kContinue, -1, false},
      Decision{State(Phase::kExitLayer, 3, 0, 0.9f), Action::kExit, 0, true},
      Decision{State(Phase::kDraftLength, 3, 1, 0.8f), Action::kExit, 1, false},
      Decision{State(Phase::kDraftLength, 3, 2, 0.2f), Action::kContinue, -1, false},
  };
  double sum = 0;
  for (const Transition& t : ToTransitions(round, r, "q", "v", "f")) sum += t.reward;
  // Tokens: 1 accepted + 1 from the verifier = 2. Cost: 2 probes (layer 2,
  // and the stop) + 2 drafts at layer 3 + 1 verification.
  const double cost = 2.0 / 12 + 2 * (4.0 / 12) + 1.0;
  EXPECT_NEAR(sum, 2.0 - cost, 1e-6);
}

}  // namespace
}  // namespace lede::policy
