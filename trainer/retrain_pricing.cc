#include "trainer/retrain_pricing.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "shared/status/status_macros.h"
#include "trainer/counterfactual.h"

namespace lede::trainer {
namespace {

using experience::Transition;
using speculation::Action;
using speculation::Phase;

// Whether the decision drafted a token (speculation::Decision::draft_index >= 0).
bool Drafted(const Transition& t) { return t.phase != Phase::kRoundStart && t.action == Action::kExit; }

// Whether the decision wasted an exit-head probe under `spec`.
bool WastedProbe(const Transition& t, const speculation::DecisionSpec& spec) {
  if (t.action != Action::kContinue) return false;
  return (t.phase == Phase::kExitLayer && spec.probe_candidates) ||
         (t.phase == Phase::kDraftLength && spec.lookahead_probe);
}

// A round's exit layer and draft count.
struct RoundShape {
  int32_t exit_layer = 0;
  int32_t n_drafted = 0;
};
using RoundKey = std::pair<std::string, int64_t>;

std::map<RoundKey, RoundShape> RoundShapes(const std::vector<Transition>& transitions) {
  std::map<RoundKey, RoundShape> rounds;
  for (const Transition& t : transitions) {
    RoundShape& r = rounds[{t.request_id, t.round_index}];
    if (Drafted(t)) {
      r.exit_layer = t.layer;
      ++r.n_drafted;
    }
  }
  return rounds;
}

bool HasLayer(const experience::RewardSpec& spec, int32_t layer) {
  return layer >= 0 && static_cast<size_t>(layer) < spec.depth_term.size() &&
         (spec.round_end.empty() || static_cast<size_t>(layer) < spec.round_end.size());
}

}  // namespace

experience::RewardSpec LoggedExperienceRewards(const model::cost::CostModel& cost, int32_t n_layers,
                                               int32_t max_draft_len) {
  experience::RewardSpec spec = DinkelbachRewards(cost, n_layers, max_draft_len, /*rho=*/1.0);
  spec.decision_reward = 0.0;  // the coordinator charges no decision (its RewardSpec::Throughput call)
  return spec;
}

Status RepriceTransitions(const experience::RewardSpec& from, const experience::RewardSpec& to,
                          const speculation::DecisionSpec& behaviour, std::vector<Transition>* transitions) {
  if (from.accept_reward != to.accept_reward || from.reject_reward != to.reject_reward) {
    return InvalidArgumentError("reward specs '" + from.cost_model + "' and '" + to.cost_model +
                                "': accept_reward and reject_reward differ, and the verdicts are not logged");
  }
  const std::map<RoundKey, RoundShape> rounds = RoundShapes(*transitions);
  for (const Transition& t : *transitions) {
    if (!HasLayer(from, t.layer) || !HasLayer(to, t.layer)) {
      return InvalidArgumentError("transition layer " + std::to_string(t.layer) + " of request " + t.request_id +
                                  " round " + std::to_string(t.round_index) + ": outside the reward specs' " +
                                  std::to_string(std::min(from.depth_term.size(), to.depth_term.size())) +
                                  " layers");
    }
  }
  for (Transition& t : *transitions) {
    double delta = to.decision_reward - from.decision_reward;
    if (Drafted(t)) {
      delta += to.depth_term[t.layer] - from.depth_term[t.layer];
    } else if (t.phase != Phase::kRoundStart) {
      delta += to.continue_reward - from.continue_reward;
    }
    if (WastedProbe(t, behaviour)) delta += to.probe_reward - from.probe_reward;
    if (t.done) {
      const RoundShape& r = rounds.at({t.request_id, t.round_index});
      delta += to.RoundEnd(r.exit_layer, r.n_drafted) - from.RoundEnd(r.exit_layer, r.n_drafted);
    }
    t.reward = static_cast<float>(t.reward + delta);
    t.reward_cost_model = to.cost_model;
  }
  return OkStatus();
}

Status RepriceExperience(const model::cost::CostModel& from, const model::cost::CostModel& to, int32_t n_layers,
                         const speculation::DecisionSpec& behaviour, std::vector<Transition>* transitions) {
  int32_t max_drafted = 1;
  for (const auto& [key, r] : RoundShapes(*transitions)) max_drafted = std::max(max_drafted, r.n_drafted);
  return RepriceTransitions(LoggedExperienceRewards(from, n_layers, max_drafted),
                            LoggedExperienceRewards(to, n_layers, max_drafted), behaviour, transitions);
}

}  // namespace lede::trainer
