// File: tests/trainer/cost_profiles.h
//
// Measured step-cost profiles (lede.v1.CostProfile, as a model service's
// ServedCostMeter snapshots them: shared/experience/served_costs.h) for the
// retrainers' tests, so that the request-log trainer and the td trainer are
// priced from the same fixture.
#ifndef LEDE_TESTS_TRAINER_COST_PROFILES_H_
#define LEDE_TESTS_TRAINER_COST_PROFILES_H_

#include <cstdint>
#include <string>

#include "proto/lede/v1/experience.pb.h"

namespace lede::trainer::testing {

// A measured profile as a deployment of `n_layers` logs it: drafts at E cost
// (E + 1) x 0.1 ms, a verification of K drafts (1 + 0.5 K) x 1.2 ms for K in
// [0, 8] (an 8-bit CPU deployment, where verifying is not free), every
// entry measured 10 times, one thread.
inline lede::v1::CostProfile CostlyVerificationProfile(int32_t n_layers, const std::string& format = "q8_0") {
  lede::v1::CostProfile p;
  p.set_weight_format(format);
  p.set_threads(1);
  p.set_window(64);
  for (int32_t e = 0; e <= n_layers; ++e) {
    p.add_draft_step_s(e == 0 ? 0.0 : (e + 1) * 1e-4);
    p.add_draft_step_samples(e == 0 ? 0 : 10);
  }
  for (int32_t k = 0; k <= 8; ++k) {
    p.add_verify_s(1.2e-3 * (1 + 0.5 * k));
    p.add_verify_samples(10);
  }
  p.set_verify_intercept_s(1.2e-3);
  p.set_verify_slope_s(0.6e-3);
  p.set_head_layers(0.5);
  return p;
}

}  // namespace lede::trainer::testing

#endif  // LEDE_TESTS_TRAINER_COST_PROFILES_H_
