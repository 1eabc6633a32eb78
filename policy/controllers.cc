#include "policy/controllers.h"

#include <cstdio>

namespace lede::policy {

using model::Action;
using model::Phase;

std::string StaticExitController::name() const {
  return "static:E=" + std::to_string(exit_layer_) + ",D=" + std::to_string(draft_len_);
}

Action StaticExitController::Decide(const model::ExitState& s) {
  if (s.phase == Phase::kRoundStart) return Action::kExit;  // always speculates
  if (s.phase == Phase::kExitLayer) return s.layer >= exit_layer_ ? Action::kExit : Action::kContinue;
  return s.draft_pos < draft_len_ ? Action::kExit : Action::kContinue;
}

std::string ThresholdExitController::name() const {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "threshold:lambda=%.3g,tau=%.3g", exit_threshold_, draft_threshold_);
  return buf;
}

Action ThresholdExitController::Decide(const model::ExitState& s) {
  if (s.phase == Phase::kRoundStart) return Action::kExit;  // always speculates
  const float threshold = s.phase == Phase::kExitLayer ? exit_threshold_ : draft_threshold_;
  return s.top1_prob >= threshold ? Action::kExit : Action::kContinue;
}

std::string EpsilonGreedyController::name() const {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "eps=%.3g:", epsilon_);
  return buf + behaviour_.name();
}

Action EpsilonGreedyController::Decide(const model::ExitState& s) {
  // Ask the behaviour first so that its own state (if any) advances the same
  // way whether or not this decision explores.
  const Action greedy = behaviour_.Decide(s);
  if (std::uniform_real_distribution<double>(0.0, 1.0)(rng_) < epsilon_) {
    return std::uniform_int_distribution<int>(0, 1)(rng_) == 1 ? Action::kExit : Action::kContinue;
  }
  return greedy;
}

}  // namespace lede::policy
