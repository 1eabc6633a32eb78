// File: trainer/calibrated_rule.h
//
// The calibrated stopping rule (policy::CalibratedStopController: SpecDec++,
// arXiv 2405.19715; DISCO, arXiv 2405.04304; adaptive-speculation.md §c)
// fitted and tuned on shadow traces (trainer/counterfactual.h): the
// per-layer acceptance models from every position and exit layer of the
// traces, the round costs from a cost model, and the best (exit layer E,
// target throughput rho) by exact replay. Shared by lede-bench (a baseline)
// and the Dinkelbach trainer (its starting policy, trainer/dinkelbach.h).
// Torch-free; not thread-safe for concurrent calls on one output.
#ifndef LEDE_TRAINER_CALIBRATED_RULE_H_
#define LEDE_TRAINER_CALIBRATED_RULE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "policy/acceptance_model.h"
#include "policy/controllers.h"
#include "shared/model/cost/cost_model.h"
#include "shared/speculation/exit_controller.h"
#include "shared/status/status.h"
#include "trainer/counterfactual.h"

namespace lede::trainer {

// The acceptance model's inputs for every exit layer and position of one
// shadow trace: x[l][t] (l in [1, L), t in [1, N); row 0, row L and column 0
// unused) are the signals of the probe at layer l that drafts target[t],
// with C_trace over the trace's own emitted tokens before t (window
// `trace_window`) and the context n-gram signals of its top-1 token over
// prompt + target[0, t) (speculation::ContextNgram, last speculation::kNgramWindow).
std::vector<std::vector<policy::AcceptanceFeatures>> TraceAcceptanceFeatures(const ShadowTrace& trace,
                                                                             int32_t trace_window);

// Per-layer acceptance samples of shadow traces: the features of
// TraceAcceptanceFeatures at every position after the prefill's token and
// every exit layer 1..L-1. shift 0: the label is the acceptance of the token the
// probe drafts; shift 1: of the next token (the probe's features predict the
// following draft). Index [l], l in [0, L] (0 and L empty).
std::vector<std::vector<policy::AcceptanceSample>> AcceptanceSamples(const std::vector<ShadowTrace>& traces,
                                                                     int32_t trace_window, int64_t shift);

// The rule's acceptance models: of the token a probe drafts (`current`),
// and of the next token from the one just drafted (`next`, for decisions
// without the lookahead probe). Errors: kInvalidArgument without samples.
struct AcceptanceModels {
  std::shared_ptr<const policy::AcceptanceModel> current, next;
};
StatusOr<AcceptanceModels> FitAcceptanceModels(const std::vector<ShadowTrace>& traces, int32_t trace_window);

// The costs the rule weighs under `cm` for L layers and draft lengths
// 1..max_draft (policy::RoundCosts, in full-depth steps).
std::shared_ptr<const policy::RoundCosts> RoundCostsOf(const model::cost::CostModel& cm, int32_t L, int32_t max_draft);

// The rule tuned by exact replay on `traces` under `spec` (its probe flags
// and D_max): every exit layer of spec.candidate_layers (< L) and rho in
// kCalibratedRhos; the best simulated speed-up wins (ties: the first).
inline constexpr double kCalibratedRhos[] = {0.8, 1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.4, 2.8};
struct CalibratedRule {
  int32_t exit_layer = 0;
  double rho = 0;
  double speedup = 0;  // simulated on the tuning traces under the cost model
  AcceptanceModels acceptance;
  std::shared_ptr<const policy::RoundCosts> costs;
  std::string Describe() const;  // "calibrated E=2 rho=1.6"
  std::unique_ptr<speculation::ExitController> Make(const speculation::DecisionSpec& spec) const;
};
// Errors: kInvalidArgument for empty traces or no candidate layer below L.
StatusOr<CalibratedRule> TuneCalibratedRule(const std::vector<ShadowTrace>& traces, const speculation::DecisionSpec& spec,
                                            const model::cost::CostModel& cost);

}  // namespace lede::trainer

#endif  // LEDE_TRAINER_CALIBRATED_RULE_H_
