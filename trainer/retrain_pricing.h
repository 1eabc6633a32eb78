// File: trainer/retrain_pricing.h
//
// Re-pricing logged experience under another cost model, so that the td
// retrainer (trainer/retrain.h) can fine-tune a policy priced by the
// deployment's served costs (the "served" cost model, shared/model/
// cost_model.h MakeServedCostModel, read from the request log by
// trainer/request_retrain.h ReadServedCostModel) on the transitions the
// coordinator logged, which the verifier's configured cost model priced
// ("accelerator", or "measured" with a calibration).
//
// Why re-pricing is exact: the coordinator's throughput rewards
// (shared/experience/transition.h RewardSpec::Throughput, rho = 1, no
// decision cost) are the verifier's verdicts (accept / reject rewards, the
// same under every cost model) plus prices: depth_term[l] per drafted
// token, probe_reward per wasted probe, round_end[E][K] on a round's last
// decision. Swapping the prices needs only what a transition records (its
// phase, action and layer) and its round's exit layer E and draft count K,
// which the round's transitions give. The one input a transition lacks is
// whether it wasted a probe; the behaviour policy's decision spec says so
// (a phase-1 continue with probe_candidates, a phase-2 stop with
// lookahead_probe: speculation::Decision::wasted_probe), and the serving
// spec stands for it. Experience rewarded with the paper's rewards
// (coordinator --reward paper) is not a cost model's price and cannot be
// re-priced this way.
//
// Torch-free apart from the cost model interface. Thread-safety: pure
// functions.
#ifndef LEDE_TRAINER_RETRAIN_PRICING_H_
#define LEDE_TRAINER_RETRAIN_PRICING_H_

#include <cstdint>
#include <vector>

#include "shared/experience/transition.h"
#include "shared/model/cost/cost_model.h"
#include "shared/speculation/exit_controller.h"
#include "shared/status/status.h"

namespace lede::trainer {

// The rewards the coordinator gives the experience it logs when the
// verifier prices with `cost`: throughput rewards (rho = 1) with draft
// costs ControlledDraftToken(l), verification costs Verify(E, K) for K in
// [0, max_draft_len], the probe cost ControlledProbe() and no decision cost
// (services/coordinator Info(), from the verifier's ModelInfo). cost_model
// is cost.name().
experience::RewardSpec LoggedExperienceRewards(const model::cost::CostModel& cost, int32_t n_layers,
                                               int32_t max_draft_len);

// Re-prices `transitions` (rewarded under `from`) as if rewarded under `to`:
// each reward gets the difference of the two prices of what its decision
// did, and reward_cost_model becomes to.cost_model. A round is the
// transitions of one (request_id, round_index); its exit layer and draft
// count come from its drafting decisions (phase 1 or 2, action kExit).
// `behaviour` says which decisions wasted a probe (see the file comment).
// Errors: kInvalidArgument when the two specs disagree on the verdict
// rewards (accept_reward, reject_reward: the verdicts are not logged), or
// when a transition's layer is outside either spec's depth_term (naming
// the request and round); the transitions are unchanged then.
Status RepriceTransitions(const experience::RewardSpec& from, const experience::RewardSpec& to,
                          const speculation::DecisionSpec& behaviour,
                          std::vector<experience::Transition>* transitions);

// RepriceTransitions from LoggedExperienceRewards(from) to
// LoggedExperienceRewards(to), both over draft lengths up to the longest
// round in `transitions` (at least 1), for a model of `n_layers` layers.
// Errors: those of RepriceTransitions.
Status RepriceExperience(const model::cost::CostModel& from, const model::cost::CostModel& to, int32_t n_layers,
                         const speculation::DecisionSpec& behaviour, std::vector<experience::Transition>* transitions);

}  // namespace lede::trainer

#endif  // LEDE_TRAINER_RETRAIN_PRICING_H_
