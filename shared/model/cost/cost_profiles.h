// File: shared/model/cost/cost_profiles.h
//
// Cost profiles of a cost-conditioned exit policy (docs/training.md "What
// the policy sees of the hardware"): the features a cost model shows the
// policy (speculation::CostFeatures, exit_controller.h), and the cost model
// of given features, with which training spans many deployments (this
// machine's weight formats and thread counts, the accelerator model and
// perturbations around them: trainer/dinkelbach.h cost_profiles).
//
// Thread-safety: free functions and an immutable CostModel.
#ifndef LEDE_SHARED_MODEL_COST_COST_PROFILES_H_
#define LEDE_SHARED_MODEL_COST_COST_PROFILES_H_

#include <cstdint>
#include <memory>
#include <string>

#include "shared/model/cost/cost_model.h"
#include "shared/speculation/exit_controller.h"
#include "shared/status/status.h"

namespace lede::model::cost {

// The features `cost` shows a policy of a model with `n_layers` layers that
// drafts at most `max_draft_len` tokens: speculation::CostFeaturesOfTables
// over draft[l] = ControlledDraftToken(l), l in [1, L), verify[0] = 1 and
// verify[k] = Verify(L / 2, k), k in [1, max_draft_len], and
// probe = ControlledProbe(). n_layers >= 2 and max_draft_len >= 1 (smaller
// values give zero layer / verify features).
speculation::CostFeatures CostFeaturesOf(const CostModel& cost, int64_t n_layers, int64_t max_draft_len);

// The features of a deployment measured by `calibration`, as the model
// services measure theirs: speculation::MeasuredStepFeatures of its steps
// timed in context (Calibration::context_steps, `lede calibrate
// --prompts`: the steps of whole generations, timed as a model service
// times its served steps, so the same function of the same kind of
// timings), with what those leave unmeasured (the probe always, any
// feature when absent: older files, a calibration on the synthetic prompt)
// from CostFeaturesOf the measured cost model of its step timings apart
// (block and head tables; its round table left out). The round table
// books the same costs differently (on the 5x widening at q8_0: verify
// 0.53 from the round table, 0.27 from the steps), and steps timed apart
// read their weights from warmer caches than in context (docs/training.md
// "What the policy sees of the hardware"), so every source that shows a
// policy a calibration's features (training profiles, lede-bench, `lede
// generate`) uses this one, and a policy is served the features it was
// trained on. The pricing itself still uses the round table
// (MakeMeasuredCostModel).
speculation::CostFeatures CostFeaturesOfCalibration(const Calibration& calibration, int64_t n_layers,
                                                    int64_t max_draft_len);

// The cost model whose features are exactly `f` (name "profile"), in units
// of an autoregressive step of a model with `n_layers` layers:
//   DraftToken(l) = f.probe + f.layer * l / L,  Probe() = f.probe,
//   Verify(E, K)  = 1 + f.verify * K,           Decision() = Signals() = 0.
// Errors: kInvalidArgument naming the feature that is not finite or < 0, or
// n_layers < 2.
StatusOr<std::unique_ptr<CostModel>> MakeProfileCostModel(const speculation::CostFeatures& f, int64_t n_layers);

// A profile from its text "probe:layer:verify" (three numbers >= 0, as
// `lede-train-counterfactual --cost-profiles` takes them).
// Errors: kInvalidArgument quoting the text.
StatusOr<speculation::CostFeatures> ParseCostFeatures(const std::string& text);

}  // namespace lede::model::cost

#endif  // LEDE_SHARED_MODEL_COST_COST_PROFILES_H_
