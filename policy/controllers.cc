#include "policy/controllers.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace lede::policy {

using speculation::Action;
using speculation::Phase;

std::string StaticExitController::name() const {
  return "static:E=" + std::to_string(exit_layer_) + ",D=" + std::to_string(draft_len_);
}

Action StaticExitController::Decide(const speculation::ExitState& s) {
  if (s.phase == Phase::kRoundStart) return Action::kExit;  // always speculates
  if (s.phase == Phase::kExitLayer) return s.layer >= exit_layer_ ? Action::kExit : Action::kContinue;
  return s.draft_pos < draft_len_ ? Action::kExit : Action::kContinue;
}

std::string ThresholdExitController::name() const {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "threshold:lambda=%.3g,tau=%.3g", exit_threshold_, draft_threshold_);
  return buf;
}

Action ThresholdExitController::Decide(const speculation::ExitState& s) {
  if (s.phase == Phase::kRoundStart) return Action::kExit;  // always speculates
  const float threshold = s.phase == Phase::kExitLayer ? exit_threshold_ : draft_threshold_;
  return s.top1_prob >= threshold ? Action::kExit : Action::kContinue;
}

std::string EpsilonGreedyController::name() const {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "eps=%.3g:", epsilon_);
  return buf + behaviour_.name();
}

Action EpsilonGreedyController::Decide(const speculation::ExitState& s) {
  // Ask the behaviour first so that its own state (if any) advances the same
  // way whether or not this decision explores.
  const Action greedy = behaviour_.Decide(s);
  if (std::uniform_real_distribution<double>(0.0, 1.0)(rng_) < epsilon_) {
    return std::uniform_int_distribution<int>(0, 1)(rng_) == 1 ? Action::kExit : Action::kContinue;
  }
  return greedy;
}

// ------------------------------------------------------ calibrated stop

std::string CalibratedStopController::name() const {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "calibrated:E=%d,rho=%.3g%s", exit_layer_, rho_, lookahead_ ? ",lookahead" : "");
  return buf;
}

double CalibratedStopController::Marginal(int32_t layer, int32_t i) const {
  const auto& row = costs_->marginal.at(static_cast<size_t>(layer));
  return row.at(static_cast<size_t>(std::clamp<int32_t>(i, 1, static_cast<int32_t>(row.size()) - 1)));
}

Action CalibratedStopController::Decide(const speculation::ExitState& s) {
  if (s.phase == Phase::kRoundStart) return Action::kExit;
  if (s.phase == Phase::kExitLayer) {
    if (s.layer < exit_layer_) return Action::kContinue;
    s_ = 1.0;
    // Without lookahead the first draft's acceptance is not known before its
    // probe; without phase-1 probes the state has no signals to judge it by.
    if (!lookahead_ || !phase_one_probe_) return Action::kExit;
    const double p = model_->Predict(s);
    if (p < rho_ * Marginal(s.layer, 1)) return Action::kContinue;
    s_ = p;
    return Action::kExit;
  }
  double p = 0;
  if (lookahead_) {
    p = model_->Predict(s);  // the token this decision would draft
  } else {
    s_ *= model_->Predict(s);  // the token just drafted
    p = next_->Predict(s);     // the one a "keep drafting" would draft
  }
  const double next = s_ * p;
  if (next < rho_ * Marginal(s.layer, s.draft_pos + 1)) return Action::kContinue;
  if (lookahead_) s_ = next;
  return Action::kExit;
}

// ---------------------------------------------------------------- DEL

std::string DelController::name() const {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "del:tau=%.3g", tau_);
  return buf;
}

Action DelController::Decide(const speculation::ExitState& s) {
  if (s.phase == Phase::kRoundStart) {
    // The request's own acceptance, relative to what the layer it used last
    // gets on average, shifts every layer's rate.
    const double shift = last_layer_ > 0 ? s.accept_ema - rates_.at(last_layer_) : 0.0;
    double best = 1.0;  // a plain step: 1 token per unit cost
    layer_ = 0;
    for (int32_t l : layers_) {
      if (l <= 0 || l >= static_cast<int32_t>(costs_->round.size())) continue;
      const double a = std::clamp(rates_.at(l) + shift, 0.01, 0.99);
      double a_pow = a;
      for (int32_t d = 1; d <= max_draft_len_ && d < static_cast<int32_t>(costs_->round[l].size()); ++d) {
        a_pow *= a;  // a^{d+1}
        const double tpl = ((1.0 - a_pow) / (1.0 - a)) / costs_->round[l][d];
        if (tpl > best) best = tpl, layer_ = l, length_ = d;
      }
    }
    if (layer_ == 0) return Action::kContinue;
    last_layer_ = layer_;
    return Action::kExit;
  }
  if (s.phase == Phase::kExitLayer) return s.layer >= layer_ ? Action::kExit : Action::kContinue;
  return s.draft_pos < length_ && s.top1_prob >= tau_ ? Action::kExit : Action::kContinue;
}

// -------------------------------------------------------------- AdaEDL

std::string AdaEdlController::name() const {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "adaedl:E=%d,gamma=%.3g,lambda=%.3g", exit_layer_, gamma_, lambda_);
  return buf;
}

Action AdaEdlController::Decide(const speculation::ExitState& s) {
  if (s.phase == Phase::kRoundStart) return Action::kExit;
  if (s.phase == Phase::kExitLayer && s.layer < exit_layer_) return Action::kContinue;
  const float bound = 1.0f - std::sqrt(std::max(0.0f, gamma_ * s.entropy));
  return bound >= lambda_ ? Action::kExit : Action::kContinue;
}

}  // namespace lede::policy
