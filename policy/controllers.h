// File: policy/controllers.h
//
// Exit controllers that need no learning (DESIGN.md §2 baselines) and the
// exploration wrapper used to collect experience. All implement
// model::ExitController (shared/model/exit_controller.h) and are torch-free.
//
// Thread-safety: one instance per request (EpsilonGreedyController holds an
// RNG); Decide() is not reentrant.
#ifndef LEDE_POLICY_CONTROLLERS_H_
#define LEDE_POLICY_CONTROLLERS_H_

#include <cstdint>
#include <memory>
#include <random>
#include <string>

#include "shared/model/exit_controller.h"

namespace lede::policy {

// The baselines always speculate (kExit at round start).
//
// Static LayerSkip (Elhoushi et al., arXiv 2404.16710): exit at layer E,
// draft D tokens. Phase 1 exits at the first candidate layer >= E (use
// candidate_layers = {E} for exactly E); phase 2 keeps drafting while fewer
// than D tokens are drafted.
class StaticExitController : public model::ExitController {
 public:
  StaticExitController(int32_t exit_layer, int32_t draft_len)
      : exit_layer_(exit_layer), draft_len_(draft_len) {}
  std::string name() const override;
  model::Action Decide(const model::ExitState& s) override;

 private:
  int32_t exit_layer_, draft_len_;
};

// Confidence thresholds: phase 1 exits at the first candidate layer whose
// top-1 probability is >= exit_threshold (lambda; LITE, arXiv 2310.18581 /
// CALM-style early exit); phase 2 keeps drafting while the next token's
// top-1 probability is >= draft_threshold (tau; Draft & Verify, arXiv
// 2309.08168, stops drafting below a confidence threshold).
class ThresholdExitController : public model::ExitController {
 public:
  ThresholdExitController(float exit_threshold, float draft_threshold)
      : exit_threshold_(exit_threshold), draft_threshold_(draft_threshold) {}
  std::string name() const override;
  model::Action Decide(const model::ExitState& s) override;

 private:
  float exit_threshold_, draft_threshold_;
};

// Exploration for data collection: with probability epsilon a uniformly
// random action (random exits and random stops), else the behaviour
// controller's action. Deterministic for a seed.
class EpsilonGreedyController : public model::ExitController {
 public:
  // Borrows `behaviour`, which must outlive this controller.
  EpsilonGreedyController(model::ExitController& behaviour, double epsilon, uint64_t seed)
      : behaviour_(behaviour), epsilon_(epsilon), rng_(seed) {}
  std::string name() const override;
  model::Action Decide(const model::ExitState& s) override;

 private:
  model::ExitController& behaviour_;
  double epsilon_;
  std::mt19937_64 rng_;
};

}  // namespace lede::policy

#endif  // LEDE_POLICY_CONTROLLERS_H_
