// Tests of trainer/retrain_pricing.h: re-pricing logged transitions from one
// cost model's rewards to another's gives the rewards the coordinator would
// have logged under the other, on hand-built rounds (probes, drafts
// accepted and rejected, a plain step), and refuses what it cannot price.
#include "trainer/retrain_pricing.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shared/experience/transition.h"
#include "tests/testing/status_matchers.h"

namespace lede::trainer {
namespace {

using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using experience::RewardSpec;
using experience::Transition;
using speculation::Action;
using speculation::Phase;

constexpr int32_t kLayers = 4;

speculation::Decision MakeDecision(Phase phase, int32_t layer, int32_t draft_pos, Action action,
                                   int32_t draft_index, bool accepted, bool wasted_probe) {
  speculation::Decision d;
  d.state.phase = phase;
  d.state.layer = layer;
  d.state.n_layers = kLayers;
  d.state.draft_pos = draft_pos;
  d.action = action;
  d.draft_index = draft_index;
  d.accepted = accepted;
  d.wasted_probe = wasted_probe;
  return d;
}

// Round 0: a wasted probe at layer 1, exit at 2 drafting 3 tokens (accepted,
// accepted, rejected), then a stop that wasted a lookahead probe. Round 1: the
// round-start gate declines (a plain full-depth step).
std::vector<speculation::RoundTrace> Rounds() {
  speculation::RoundTrace a;
  a.round_index = 0;
  a.exit_layer = 2;
  a.n_drafted = 3;
  a.n_accepted = 2;
  a.decisions = {MakeDecision(Phase::kExitLayer, 1, 0, Action::kContinue, -1, false, true),
                 MakeDecision(Phase::kExitLayer, 2, 0, Action::kExit, 0, true, false),
                 MakeDecision(Phase::kDraftLength, 2, 1, Action::kExit, 1, true, false),
                 MakeDecision(Phase::kDraftLength, 2, 2, Action::kExit, 2, false, false),
                 MakeDecision(Phase::kDraftLength, 2, 3, Action::kContinue, -1, false, true)};
  speculation::RoundTrace b;
  b.round_index = 1;
  b.decisions = {MakeDecision(Phase::kRoundStart, 0, 0, Action::kContinue, -1, false, false)};
  return {a, b};
}

std::vector<Transition> Logged(const RewardSpec& rewards) {
  std::vector<Transition> out;
  for (const speculation::RoundTrace& r : Rounds()) {
    for (Transition& t : experience::ToTransitions(r, rewards, "req-1", "v1", "fp")) out.push_back(std::move(t));
  }
  return out;
}

// Throughput rewards of a cost model whose draft at layer l costs
// draft_scale * l and whose verification of K drafts costs 1 + verify_slope * K.
RewardSpec Spec(const std::string& name, double draft_scale, double verify_slope, double probe,
                double decision) {
  std::vector<double> draft;
  std::vector<std::vector<double>> verify(kLayers + 1);
  for (int32_t l = 0; l <= kLayers; ++l) {
    draft.push_back(draft_scale * l);
    for (int32_t k = 0; k <= 4; ++k) verify[l].push_back(l == 0 ? 0.0 : 1.0 + verify_slope * k);
  }
  return RewardSpec::Throughput(name, draft, verify, probe, decision);
}

speculation::DecisionSpec Probing() {
  speculation::DecisionSpec spec;
  spec.probe_candidates = true;
  spec.lookahead_probe = true;
  return spec;
}

// Re-priced rewards are those logged under the target spec, decision by
// decision, and the transitions name the target cost model.
TEST(RepriceTransitionsTest, GivesTheRewardsOfTheOtherCostModel) {
  const RewardSpec accelerator = Spec("accelerator", 0.1, 0.05, 0.02, 0.0);
  const RewardSpec served = Spec("served", 0.15, 0.6, 0.03, 0.01);
  std::vector<Transition> ts = Logged(accelerator);
  const std::vector<Transition> want = Logged(served);
  ASSERT_THAT(RepriceTransitions(accelerator, served, Probing(), &ts), IsOk());
  ASSERT_EQ(ts.size(), want.size());
  for (size_t i = 0; i < ts.size(); ++i) {
    EXPECT_NEAR(ts[i].reward, want[i].reward, 1e-5) << "decision " << i;
    EXPECT_EQ(ts[i].reward_cost_model, "served");
  }
  // The prices moved: the round that drafted 3 ends dearer under "served".
  EXPECT_LT(ts[4].reward, Logged(accelerator)[4].reward);
}

// The verdict rewards are not logged, so specs that disagree on them cannot
// be swapped; a layer outside the specs is refused too. Nothing changes.
TEST(RepriceTransitionsTest, RefusesWhatItCannotPrice) {
  const RewardSpec accelerator = Spec("accelerator", 0.1, 0.05, 0.02, 0.0);
  std::vector<Transition> ts = Logged(accelerator);
  const float before = ts[1].reward;
  EXPECT_THAT(RepriceTransitions(accelerator, RewardSpec::Paper(kLayers), Probing(), &ts),
              StatusIs(StatusCode::kInvalidArgument));
  ts[2].layer = kLayers + 3;
  EXPECT_THAT(RepriceTransitions(accelerator, Spec("served", 0.2, 0.5, 0.0, 0.0), Probing(), &ts),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_EQ(ts[1].reward, before);
  EXPECT_EQ(ts[1].reward_cost_model, "accelerator");
}

}  // namespace
}  // namespace lede::trainer
