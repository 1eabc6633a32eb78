// File: trainer/ceilings.h
//
// Upper bounds for exit policies on greedy shadow traces
// (trainer/counterfactual.h), printed by lede-bench beside the methods:
//
//  - The hindsight oracle: every round picks its exit layer (1..L-1) and
//    draft length (1..D_max) knowing which drafts will be accepted; the least
//    total cost by dynamic programming over the trace.
//  - The belief-optimal ceiling: the Bayes-optimal policy of a controller
//    that is told P(the exit token at layer l is accepted) for every layer
//    and every position of the trajectory, before the round and for free
//    (no probe is paid, future positions included), but not the outcomes.
//    It chooses each round's (l, d) to minimize the expected cost of the
//    rest of the request under those probabilities (acceptances independent
//    across positions, as the calibrated stopping rule also assumes), and is
//    then charged what its choices really cost on the trace.
//
// Both rest on one fact of greedy decoding: every policy emits the same
// tokens (the trajectory), so the throughput tokens / cost is highest where
// the total cost is least, and an optimal policy is a shortest path, with no
// Dinkelbach rate (rho) to search. A policy that only has probabilities of
// the kind an acceptance model gives, however it uses them, cannot on
// average beat the belief-optimal ceiling computed with the same
// probabilities (it sees less: it pays for probes and sees no future
// position). So with calibrated probabilities from a model's probe
// signals, the ceiling bounds what those signals can buy.
//
// Positions: target[t] is emitted at position t (trainer/counterfactual.h);
// target[0] comes from the prefill, so a request emits target[1..N) in
// rounds. A round started when target[i-1] is pending drafts target[i..i+d)
// and emits the accepted prefix plus one token from the verifier. Costs are
// in full-depth steps: a round costs d * DraftToken(l) + Verify(l, d) and an
// autoregressive step Step() (model::cost::CostModel; decisions and probe signals
// are not charged, which only raises the bounds). Torch-free.
#ifndef LEDE_TRAINER_CEILINGS_H_
#define LEDE_TRAINER_CEILINGS_H_

#include <cstdint>
#include <vector>

#include "policy/acceptance_model.h"
#include "shared/model/cost/cost_model.h"
#include "trainer/counterfactual.h"

namespace lede::trainer {

// The emitted tokens and the total cost of a trace under a policy, to pool
// over requests (speed-up = sum tokens / sum cost).
struct TraceCost {
  double tokens = 0;
  double cost = 0;
};

// The hindsight oracle's least cost of emitting target[1..N) of `trace`
// with drafts of at most `max_draft` tokens at exit layers 1..L-1.
TraceCost HindsightOracleCost(const ShadowTrace& trace, int32_t max_draft, const model::cost::CostModel& cost);

// P(accept) per exit layer and position: p[l][t] for l in [1, L), t in
// [1, N) (row 0, row L and column 0 are unused and 0), each in [0, 1].
using AcceptanceTable = std::vector<std::vector<double>>;

// The table of `model` on `trace`: the calibrated probability of the token
// the exit at layer l drafts for target[t], from the probe's signals with
// the request's C_trace (window `trace_window`) and context n-gram signals,
// as TraceAcceptanceFeatures computes them.
AcceptanceTable CalibratedAcceptanceTable(const ShadowTrace& trace, const policy::AcceptanceModel& model,
                                          int32_t trace_window);

// The cost of the belief-optimal policy under `p` (see above), realized on
// `trace`'s true acceptances, with drafts of at most `max_draft` tokens.
// With p[l][t] = 1 where the exit at layer l drafts target[t] and 0
// elsewhere it is the hindsight oracle's cost. p must cover the trace
// (p.size() == L, each row N long); a smaller table is a programming error.
TraceCost BeliefOptimalCost(const ShadowTrace& trace, const AcceptanceTable& p, int32_t max_draft,
                            const model::cost::CostModel& cost);

}  // namespace lede::trainer

#endif  // LEDE_TRAINER_CEILINGS_H_
