// File: shared/speculation/adaptive_round.h
//
// The decisions of one controller-driven speculation round (docs/design.md §2),
// written once and torch-free: a round-start gate, phase 1 (probe the
// candidate layers for the first draft token until the controller exits),
// phase 2 (after each drafted token, probe the next exit distribution at l*
// and ask whether to keep drafting). What a probe costs and computes is the
// caller's: the engine's drafter runs the blocks and the LM head
// (shared/model/decoding.cc), the trainer's shadow backend looks the
// signals up in a logged trajectory (trainer/counterfactual.h). Both run
// this function, so a simulated round makes exactly the engine's decisions
// on the same signals.
#ifndef LEDE_SHARED_SPECULATION_ADAPTIVE_ROUND_H_
#define LEDE_SHARED_SPECULATION_ADAPTIVE_ROUND_H_

#include <cstdint>

#include "shared/speculation/exit_controller.h"
#include "shared/speculation/generation.h"
#include "shared/status/status.h"

namespace lede::speculation {

// What a round's probes compute. Called in this order: ProbeLayer for
// ascending candidate layers (phase 1, the pending token); once an exit is
// taken, DraftFromProbe for the first draft; then ProbeDraft / DraftFromProbe
// pairs for rows 1, 2, ... (phase 2). Errors end the round with that status.
class DraftProbes {
 public:
  virtual ~DraftProbes() = default;
  // Phase 1: the pending token through the blocks up to `layer` (> the
  // previous call's), then the exit head; its signals.
  virtual StatusOr<ExitSignals> ProbeLayer(int32_t layer) = 0;
  // Phase 2: draft `token` (row `row` - 1's draft) at row `row` through the
  // blocks below l*, then the exit head; its signals.
  virtual StatusOr<ExitSignals> ProbeDraft(int32_t row, int32_t token) = 0;
  // The draft token taken from the last probe's distribution (argmax, or a
  // sample when sampling).
  virtual StatusOr<int32_t> DraftFromProbe() = 0;
};

// Runs the controller's round on `probes` and fills draft.exit_layer,
// tokens, ready_layer, n_probes, n_decisions and (with
// request.record_trace) trace.decisions. d_cap: the most drafts the round
// may make (budget, D_max and KV room), >= 0; candidate layers >= L are
// skipped (the last layer is the full model, not an exit).
// Errors: those of the probes.
Status RunAdaptiveRound(ExitController& controller, const DecisionSpec& spec, int32_t n_layers,
                        const DraftRequest& request, int64_t d_cap, DraftProbes& probes, Draft& draft);

}  // namespace lede::speculation

#endif  // LEDE_SHARED_SPECULATION_ADAPTIVE_ROUND_H_
