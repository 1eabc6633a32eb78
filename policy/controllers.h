// File: policy/controllers.h
//
// Exit controllers that need no learning (docs/design.md §2 baselines) and the
// exploration wrapper used to collect experience. All implement
// speculation::ExitController (shared/speculation/exit_controller.h) and are torch-free.
//
// Thread-safety: one instance per request (EpsilonGreedyController holds an
// RNG); Decide() is not reentrant.
#ifndef LEDE_POLICY_CONTROLLERS_H_
#define LEDE_POLICY_CONTROLLERS_H_

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "policy/acceptance_model.h"
#include "shared/speculation/exit_controller.h"

namespace lede::policy {

// The baselines always speculate (kExit at round start).
//
// Static LayerSkip (Elhoushi et al., arXiv 2404.16710): exit at layer E,
// draft D tokens. Phase 1 exits at the first candidate layer >= E (use
// candidate_layers = {E} for exactly E); phase 2 keeps drafting while fewer
// than D tokens are drafted.
class StaticExitController : public speculation::ExitController {
 public:
  StaticExitController(int32_t exit_layer, int32_t draft_len)
      : exit_layer_(exit_layer), draft_len_(draft_len) {}
  std::string name() const override;
  speculation::Action Decide(const speculation::ExitState& s) override;

 private:
  int32_t exit_layer_, draft_len_;
};

// Confidence thresholds: phase 1 exits at the first candidate layer whose
// top-1 probability is >= exit_threshold (lambda; LITE, arXiv 2310.18581 /
// CALM-style early exit); phase 2 keeps drafting while the next token's
// top-1 probability is >= draft_threshold (tau; Draft & Verify, arXiv
// 2309.08168, stops drafting below a confidence threshold).
class ThresholdExitController : public speculation::ExitController {
 public:
  ThresholdExitController(float exit_threshold, float draft_threshold)
      : exit_threshold_(exit_threshold), draft_threshold_(draft_threshold) {}
  std::string name() const override;
  speculation::Action Decide(const speculation::ExitState& s) override;

 private:
  float exit_threshold_, draft_threshold_;
};

// Exploration for data collection: with probability epsilon a uniformly
// random action (random exits and random stops), else the behaviour
// controller's action. Deterministic for a seed.
class EpsilonGreedyController : public speculation::ExitController {
 public:
  // Borrows `behaviour`, which must outlive this controller.
  EpsilonGreedyController(speculation::ExitController& behaviour, double epsilon, uint64_t seed)
      : behaviour_(behaviour), epsilon_(epsilon), rng_(seed) {}
  std::string name() const override;
  speculation::Action Decide(const speculation::ExitState& s) override;

 private:
  speculation::ExitController& behaviour_;
  double epsilon_;
  std::mt19937_64 rng_;
};

// The costs a rule-based controller weighs, in units of one full-depth step
// (from a cost model, shared/model/cost/cost_model.h; the bench fills them).
struct RoundCosts {
  // marginal[l][i], i in [1, D_max]: the extra cost of drafting the i-th
  // token of a round at exit layer l once its probe is paid:
  // ControlledDraftToken(l) + Verify(l, i) - Verify(l, i - 1) for i > 1,
  // and ControlledDraftToken(l) + Verify(l, 1) - Step() for i = 1 (against
  // a plain step); ControlledDraftToken includes the draft's signals.
  std::vector<std::vector<double>> marginal;
  // round[l][d]: the cost of a whole round of d drafts at l (d * ControlledDraftToken
  // + Verify + decisions), d in [1, D_max]; round[0] unused.
  std::vector<std::vector<double>> round;
};

// Calibrated stopping rule (SpecDec++, arXiv 2405.19715; DISCO, arXiv
// 2405.04304; the one-step rule of adaptive-speculation.md §c): exit at
// layer E (phase 1 probes only E), then draft the i-th token iff
// s_i = prod_{j <= i} p_j >= rho * marginal[E][i], with p_j the calibrated
// acceptance probability of draft j (AcceptanceModel) and rho the target
// throughput (tokens per unit cost, tuned). Optimal for a monotone stopping
// problem when p is calibrated.
class CalibratedStopController : public speculation::ExitController {
 public:
  // `current` predicts the acceptance of the token a probe drafts. With
  // lookahead (DecisionSpec::lookahead_probe) a decision sees the probe of
  // the token it would draft and uses `current` alone. Without it, a
  // decision sees the token just drafted: s takes that token's own
  // `current` estimate, and `next` (required then) predicts the following
  // token's acceptance from the same probe; phase 1 exits at E unchecked,
  // as static does. `phase_one_probe` false (DecisionSpec::probe_candidates
  // false: phase-1 states carry no probe signals) makes phase 1 exit at E
  // unchecked with lookahead too; checked on the empty signals it would
  // never exit (measured: 0.98x, below autoregressive decoding).
  CalibratedStopController(std::shared_ptr<const AcceptanceModel> current, int32_t exit_layer, double rho,
                           std::shared_ptr<const RoundCosts> costs, bool lookahead = true,
                           std::shared_ptr<const AcceptanceModel> next = nullptr, bool phase_one_probe = true)
      : model_(std::move(current)), next_(std::move(next)), exit_layer_(exit_layer), rho_(rho),
        costs_(std::move(costs)), lookahead_(lookahead || next_ == nullptr), phase_one_probe_(phase_one_probe) {}
  std::string name() const override;
  speculation::Action Decide(const speculation::ExitState& s) override;
  int32_t FirstProbeLayer(const speculation::ExitState&) override { return exit_layer_; }

 private:
  double Marginal(int32_t layer, int32_t i) const;
  std::shared_ptr<const AcceptanceModel> model_, next_;
  int32_t exit_layer_;
  double rho_;
  std::shared_ptr<const RoundCosts> costs_;
  bool lookahead_;
  bool phase_one_probe_;
  double s_ = 1.0;  // product of the round's calibrated acceptance so far
};

// DEL-style exit layer and length (Zarch et al., arXiv 2504.05598): at each
// round start the per-layer acceptance rate alpha_l is estimated (the
// layer's rate on tuning data, shifted by how the request's own acceptance
// EMA differs from that rate at the layer it used last), and the round uses
// the (l, d) that maximizes expected tokens per cost,
//   TPL(l, d) = [(1 - alpha_l^{d+1}) / (1 - alpha_l)] / round[l][d],
// or a plain step when no (l, d) beats 1 token per step. Phase 1 probes only
// l; phase 2 drafts up to d tokens and stops early when top-1 < tau.
class DelController : public speculation::ExitController {
 public:
  DelController(std::vector<double> layer_rates, std::vector<int32_t> layers, int32_t max_draft_len, float tau,
                std::shared_ptr<const RoundCosts> costs)
      : rates_(std::move(layer_rates)), layers_(std::move(layers)), max_draft_len_(max_draft_len), tau_(tau),
        costs_(std::move(costs)) {}
  std::string name() const override;
  speculation::Action Decide(const speculation::ExitState& s) override;
  int32_t FirstProbeLayer(const speculation::ExitState&) override { return layer_; }

 private:
  std::vector<double> rates_;   // [L + 1] acceptance rate per exit layer
  std::vector<int32_t> layers_;
  int32_t max_draft_len_;
  float tau_;
  std::shared_ptr<const RoundCosts> costs_;
  int32_t layer_ = 0, length_ = 0, last_layer_ = 0;
};

// AdaEDL (arXiv 2410.18351): an entropy-based lower bound on acceptance,
// 1 - sqrt(gamma * H); exit at E and keep drafting while the bound of the
// next token is >= lambda. No training.
class AdaEdlController : public speculation::ExitController {
 public:
  AdaEdlController(int32_t exit_layer, float gamma, float lambda)
      : exit_layer_(exit_layer), gamma_(gamma), lambda_(lambda) {}
  std::string name() const override;
  speculation::Action Decide(const speculation::ExitState& s) override;
  int32_t FirstProbeLayer(const speculation::ExitState&) override { return exit_layer_; }

 private:
  int32_t exit_layer_;
  float gamma_, lambda_;
};

}  // namespace lede::policy

#endif  // LEDE_POLICY_CONTROLLERS_H_
