// File: policy/acceptance_model.h
//
// A per-layer calibrated model of P(the exit token at layer l is accepted)
// from a probe's signals: logistic regression on
//   x = [top1_prob, min(margin, 16) / 8, entropy / 4, trace_nll / 4,
//        lookup_match, trigram_seen, 1]
// (the context n-gram signals of exit_controller.h ContextNgram: the same
// signals the DQN policy sees, so that the rule is not held back by fewer)
// fitted by Newton's method (IRLS) with a small L2 penalty, one weight
// vector per exit layer (shallow exits are overconfident, so one threshold
// shared across layers is miscalibrated: SpecBound, adaptive-speculation.md
// §b). Labels come from shadow traces (trainer/counterfactual.h): whether
// the exit's argmax equals the committed token, a policy-independent fact
// under greedy decoding. Torch-free; a model is immutable after fitting and
// safe to share between threads.
#ifndef LEDE_POLICY_ACCEPTANCE_MODEL_H_
#define LEDE_POLICY_ACCEPTANCE_MODEL_H_

#include <array>
#include <cstdint>
#include <vector>

#include "shared/speculation/exit_controller.h"
#include "shared/status/status.h"

namespace lede::policy {

inline constexpr int kAcceptanceFeatureDim = 7;
using AcceptanceFeatures = std::array<double, kAcceptanceFeatureDim>;

// x of a probe's signals, the request's C_trace and the probe token's
// context n-gram signals (0 or 1 each).
AcceptanceFeatures AcceptanceFeaturesOf(float top1_prob, float margin, float entropy, float trace_nll,
                                        float lookup_match, float trigram_seen);
inline AcceptanceFeatures AcceptanceFeaturesOf(const speculation::ExitState& s) {
  return AcceptanceFeaturesOf(s.top1_prob, s.margin, s.entropy, s.trace_nll, s.lookup_match, s.trigram_seen);
}

struct AcceptanceSample {
  AcceptanceFeatures x{};
  bool accepted = false;
};

class AcceptanceModel {
 public:
  // One fit per layer l in [1, L): samples_by_layer[l] (index 0 and L unused,
  // may be empty; an empty layer predicts the overall base rate).
  // Errors: kInvalidArgument if no layer has samples.
  static StatusOr<AcceptanceModel> Fit(const std::vector<std::vector<AcceptanceSample>>& samples_by_layer,
                                       double l2 = 1e-4, int iterations = 25);

  // P(accept) in (0, 1) at `layer` for features x.
  double Predict(int32_t layer, const AcceptanceFeatures& x) const;
  double Predict(const speculation::ExitState& s) const { return Predict(s.layer, AcceptanceFeaturesOf(s)); }
  // Mean label of the layer's samples (its unconditional acceptance).
  double BaseRate(int32_t layer) const;
  int32_t n_layers() const { return static_cast<int32_t>(weights_.size()); }

 private:
  std::vector<AcceptanceFeatures> weights_;  // [L + 1]
  std::vector<double> base_rate_;            // [L + 1]
};

}  // namespace lede::policy

#endif  // LEDE_POLICY_ACCEPTANCE_MODEL_H_
