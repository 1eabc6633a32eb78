// File: trainer/counterfactual.h
//
// Dense counterfactual labels for LEDE's exit policy ("shadow tokens", DEL,
// arXiv 2504.05598; docs/design.md §2 "Beyond the paper").
//
// Under greedy decoding every method emits the same tokens (lossless), so a
// logged greedy request fixes the committed sequence z. Whether the exit at
// layer l agrees with z at a position, and the probe signals of that exit,
// then do not depend on the policy: one uncached pass over prompt + z
// computes them for every layer and position (ComputeShadowTrace). With
// them any policy can be replayed on logged traffic without the model:
// ShadowBackend is a speculation::SpeculationBackend whose probes look the
// signals up, and Simulate runs the real loop (speculation::RunGeneration,
// speculation::RunAdaptiveRound) on it, so a simulated request makes the
// engine's decisions on the engine's signals.
//
// Exactness: the rounds, decisions and acceptances of a simulated greedy
// request are those of the engine up to floating-point differences between
// an uncached pass and incremental decoding (1e-6 relative), with one
// documented approximation: after a draft is rejected, the engine's later
// drafts of that round run on the wrong token, whose exit signals the
// committed sequence does not contain; the simulator uses the committed
// path's signals at that position instead. Those drafts are rejected either
// way (acceptance is a prefix), so only a policy's decision to keep
// drafting after a rejection, and hence that round's cost, can differ.
//
// Sampling requests have no policy-independent labels; the trainer keeps
// learning from their logged (on-policy) transitions only.
#ifndef LEDE_TRAINER_COUNTERFACTUAL_H_
#define LEDE_TRAINER_COUNTERFACTUAL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shared/experience/transition.h"
#include "shared/model/cost_model.h"
#include "shared/model/decoding.h"
#include "shared/speculation/exit_controller.h"
#include "shared/model/llama.h"
#include "shared/speculation/generation.h"
#include "shared/status/status.h"

namespace lede::trainer {

// The shadow tokens of one greedy request.
struct ShadowTrace {
  std::string id;                 // request id (experience request_id)
  int32_t n_layers = 0;           // L
  int32_t top_k = 4;              // k of C_k in the signals
  int64_t max_new_tokens = 0;     // of the logged request
  std::vector<int32_t> prompt;    // P ids
  // z: the emitted tokens, then the EOS that ended the request if one did
  // (stop_at_eos: EOS is not emitted but ends the generation).
  std::vector<int32_t> target;
  std::vector<int32_t> eos_ids;   // the model's stop tokens
  // probes[l - 1][t], l in [1, L], t in [0, |target|): the signals of the
  // exit at layer l at the position of the token before target[t] (the last
  // prompt token for t = 0), i.e. of the distribution that predicts
  // target[t]; probes[L - 1] is the full model (verifier).
  std::vector<std::vector<speculation::ExitSignals>> probes;
  // The load the request is replayed at (speculation::ExitState::load, >= 1): the
  // policy's load feature, and the cost model at a load that prices it in
  // training (trainer/dinkelbach.h DinkelbachOptions::loads). Greedy
  // acceptance does not depend on it, so one trace serves every load.
  int32_t load = 1;

  // The signals predicting target[t] at layer l (t clamped to the trace).
  const speculation::ExitSignals& At(int32_t layer, int64_t t) const;
  // Whether the exit at `layer` drafts target[t] (agrees with the full model).
  bool Accepts(int32_t layer, int64_t t) const { return At(layer, t).top1 == target.at(t); }
};

// One uncached pass over prompt + output through all L layers with the exit
// head at each (docs/design.md §1 exits). `output` holds the emitted tokens;
// `ended_on_eos` appends eos (the model's first eos id) to the target.
// Errors: kInvalidArgument for an empty prompt or output, ids outside [0, V),
// or more than max_seq_len tokens; kInternal on a libtorch failure.
StatusOr<ShadowTrace> ComputeShadowTrace(const model::LlamaModel& model, const std::vector<int32_t>& prompt,
                                         const std::vector<int32_t>& output, bool ended_on_eos,
                                         int64_t max_new_tokens, int32_t top_k, std::string id = "");

// Generates `prompt` greedily (autoregressive, the reference trajectory) and
// computes its shadow trace. Errors: those of Engine::Generate and above.
StatusOr<ShadowTrace> TraceGreedyRequest(model::Engine& engine, const std::vector<int32_t>& prompt,
                                         int64_t max_new_tokens, int32_t top_k, std::string id = "");

// A decoding method to replay: static (exit_layer, draft_len) or adaptive
// (controller, borrowed, one per request, with its decision spec) or
// autoregressive.
struct SimulatedMethod {
  speculation::SpeculationMode mode = speculation::SpeculationMode::kAutoregressive;
  int32_t exit_layer = 0;  // kStatic: E in [1, L]
  int32_t draft_len = 0;   // kStatic: D >= 1
  speculation::ExitController* controller = nullptr;  // kAdaptive
  speculation::DecisionSpec spec;                      // kAdaptive (max_draft_len also caps static)
};

// Replays `method` on `trace` through speculation::RunGeneration over a
// ShadowBackend. The result's tokens equal trace.target without its EOS.
// record_traces fills result.traces (the decisions, for transitions).
// Errors: kInvalidArgument for a method that does not fit the trace
// (layers outside [1, L], a missing controller).
StatusOr<speculation::GenerationResult> Simulate(const ShadowTrace& trace, const SimulatedMethod& method,
                                                 bool record_traces = false);

// Where a round of a replayed request starts: the index i of the token it
// drafts for first (target[i - 1] is pending), the request's C_trace and
// acceptance EMA, its token budget and the round's index.
struct RoundContext {
  int64_t next = 1;
  double trace_nll = 0;
  double accept_ema = speculation::ExitState::kAcceptEmaPrior;
  int64_t budget = 0;
  int64_t round_index = 0;
};

// The round contexts of a simulated request (`result` from Simulate with
// record_traces), one per round that drafted or decided anything, aligned
// with result.traces.
std::vector<RoundContext> RoundContexts(const ShadowTrace& trace, const speculation::GenerationResult& result);

// One round replayed from `context` under `controller` (adaptive, `spec`):
// its decisions (accepted flags set) and its record.
struct SimulatedRound {
  speculation::RoundTrace trace;
  speculation::RoundRecord record;
};
StatusOr<SimulatedRound> SimulateRound(const ShadowTrace& trace, const speculation::DecisionSpec& spec,
                                       speculation::ExitController& controller, const RoundContext& context);

// Makes a controller for one request (simulations run many).
using ControllerMaker = std::function<std::unique_ptr<speculation::ExitController>(int64_t request_index)>;

// Replays `method` on every trace and returns the rounds of all of them
// pooled, to be priced by any cost model. With `make`, each trace gets a
// controller of its own (method.controller is then ignored).
// Errors: those of Simulate.
StatusOr<std::vector<speculation::RoundRecord>> SimulatedRounds(const std::vector<ShadowTrace>& traces,
                                                                const SimulatedMethod& method,
                                                                const ControllerMaker& make = nullptr);

// Replays the controllers of `make` on every trace and returns the
// predicted speed-up under `cost` of all rounds pooled (tokens / cost).
StatusOr<double> SimulatedSpeedup(const std::vector<ShadowTrace>& traces, const speculation::DecisionSpec& spec,
                                  const ControllerMaker& make, const model::CostModel& cost);

// Counterfactual transitions: every trace replayed under each behaviour
// controller (ε-greedy exploration included), their decisions rewarded by
// `rewards` (experience::ToTransitions). request_id is "<trace id>#<behaviour
// index>", policy_version the behaviour's name.
StatusOr<std::vector<experience::Transition>> CounterfactualTransitions(
    const std::vector<ShadowTrace>& traces, const speculation::DecisionSpec& spec,
    const std::vector<ControllerMaker>& behaviours, const experience::RewardSpec& rewards,
    const std::string& model_fingerprint);

// The Dinkelbach throughput rewards of shared/experience/transition.h under a cost
// model for `spec` (L layers): tokens - rho * cost, probes and decisions
// charged at the cost model's price.
experience::RewardSpec DinkelbachRewards(const model::CostModel& cost, int32_t n_layers, int32_t max_draft_len,
                                     double rho);

}  // namespace lede::trainer

#endif  // LEDE_TRAINER_COUNTERFACTUAL_H_
