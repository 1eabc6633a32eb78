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
// Sampled requests (temperature > 0) are replayed in expectation. Their
// emitted tokens are a draw from the full model's warped distribution p
// (speculative sampling is lossless), so they stand for the committed path
// of any method. Per drafted position the probability that speculative
// sampling keeps a draft drawn from the exit's warped distribution q is
// sum_x min(p(x), q(x)) (Leviathan et al., arXiv 2211.17192, §3.1; "same
// warping": shared/model/sampling.h WarpedProbs with the request's
// temperature and top_p), so a round drafting K tokens at layer l from
// position i accepts sum_{j=1..K} prod_{m<j} alpha_l(i + m) tokens in
// expectation (ExpectedAcceptedLength); for a greedy trace alpha is 1 or 0
// and this is the exact length. The simulator needs integer acceptances, so
// it draws them with common random numbers: position t is accepted at layer
// l iff u_t < alpha_l(t), u_t uniform from the request's seed and t (one u_t
// for every layer and policy, so policies are compared on the same draws).
// The approximation of a sampled replay beyond the greedy one: the draft
// positions after the first are conditioned on the committed path, not on
// the drafted tokens.
#ifndef LEDE_TRAINER_COUNTERFACTUAL_H_
#define LEDE_TRAINER_COUNTERFACTUAL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shared/experience/transition.h"
#include "shared/model/cost/cost_model.h"
#include "shared/model/decoding.h"
#include "shared/speculation/exit_controller.h"
#include "shared/model/llama.h"
#include "shared/speculation/generation.h"
#include "shared/status/status.h"

namespace lede::trainer {

// The shadow tokens of one logged request (greedy, or sampled: see above).
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
  // The cost profile the request is replayed under (ExitState::cost): the
  // policy's cost features, set with the cost model that prices the replay
  // when training across cost profiles (DinkelbachOptions::cost_profiles);
  // all 0 otherwise. Acceptance does not depend on it either.
  speculation::CostFeatures cost;
  // Sampled requests only (empty for greedy ones): the settings the request
  // was served with; accept_prob[l - 1][t] = sum_x min(p_t(x), q_{l,t}(x))
  // in [0, 1], p the full model's and q the exit at layer l's warped
  // distribution predicting target[t] (1 at l = L); coupling[t] in [0, 1),
  // the uniform that decides position t in a replay.
  speculation::SamplingParams sampling;
  std::vector<std::vector<float>> accept_prob;
  std::vector<double> coupling;

  bool sampled() const { return !accept_prob.empty(); }
  // The signals predicting target[t] at layer l (t clamped to the trace).
  const speculation::ExitSignals& At(int32_t layer, int64_t t) const;
  // The probability that a draft from the exit at `layer` for target[t] is
  // accepted: greedy, 1 if it agrees with the full model and 0 if not;
  // sampled, accept_prob (t clamped to the trace).
  double AcceptProb(int32_t layer, int64_t t) const;
  // Whether the replay accepts the exit at `layer`'s draft for target[t]:
  // greedy, whether it drafts target[t]; sampled, coupling[t] < accept_prob.
  bool Accepts(int32_t layer, int64_t t) const;
};

// The speculative-sampling acceptance probability of one position: the
// chance that a token drawn from the draft distribution q is kept against
// the target distribution p, sum_x min(p(x), q(x)) (Leviathan et al., arXiv
// 2211.17192, §3.1: 1 - the total variation distance).
//   target_probs, draft_probs  [V] float32 (any float dtype), CPU, each
//                              summing to 1 (as WarpedProbs returns them)
//   returns                    in [0, 1]; 1 when p == q
// Throws c10::Error on a shape mismatch (torch glue; callers catch it at
// their torch boundary).
double ExpectedAcceptance(const at::Tensor& target_probs, const at::Tensor& draft_probs);

// The expected acceptance of an exit's logits against the full model's under
// `sampling` (both warped by shared/model/sampling.h WarpedProbs, the
// engine's transform): ExpectedAcceptance(Warp(target), Warp(draft)). With
// temperature 0 it is 1 if the argmaxes agree and 0 if not (greedy).
//   target_logits, draft_logits  [V] float32, CPU
// Throws c10::Error as ExpectedAcceptance.
double ExpectedAcceptanceOfLogits(const at::Tensor& target_logits, const at::Tensor& draft_logits,
                                  const speculation::SamplingParams& sampling);

// The expected number of drafts a round keeps when it drafts `draft_len`
// tokens at `layer` for target[next], target[next + 1], ...:
// sum_{j=1..K} prod_{m<j} AcceptProb(layer, next + m), positions past the
// trace accepting nothing. Exact for a greedy trace.
double ExpectedAcceptedLength(const ShadowTrace& trace, int32_t layer, int64_t next, int64_t draft_len);

// One uncached pass over prompt + output through all L layers with the exit
// head at each (docs/design.md §1 exits). `output` holds the emitted tokens;
// `ended_on_eos` appends eos (the model's first eos id) to the target.
// `sampling` with temperature > 0 makes a sampled trace (accept_prob and
// coupling filled, the uniforms keyed by sampling.seed).
// Errors: kInvalidArgument for an empty prompt or output, ids outside [0, V),
// or more than max_seq_len tokens, a temperature that is negative or not
// finite, top_p outside (0, 1] when sampling; kInternal on a libtorch failure.
// `probe_layers` (empty: every layer) limits the exit heads computed to those
// layers and L: the probes of any other layer are ExitSignals{} with top1 =
// -1, a draft no target token agrees with, so a replay must not exit there
// (BestStatic's exit_layers). The pass runs through a one-slot KV cache (the
// engine's prefill kernels).
StatusOr<ShadowTrace> ComputeShadowTrace(const model::LlamaModel& model, const std::vector<int32_t>& prompt,
                                         const std::vector<int32_t>& output, bool ended_on_eos,
                                         int64_t max_new_tokens, int32_t top_k, std::string id = "",
                                         const speculation::SamplingParams& sampling = {},
                                         const std::vector<int32_t>& probe_layers = {});

// Generates `prompt` greedily (autoregressive, the reference trajectory) and
// computes its shadow trace (at `probe_layers`, as above). Errors: those of
// Engine::Generate and above.
StatusOr<ShadowTrace> TraceGreedyRequest(model::Engine& engine, const std::vector<int32_t>& prompt,
                                         int64_t max_new_tokens, int32_t top_k, std::string id = "",
                                         const std::vector<int32_t>& probe_layers = {});

// As TraceGreedyRequest under `sampling`: with a temperature > 0 the
// output is the engine's autoregressive draw under `sampling` (its seed),
// and the trace a sampled one (ComputeShadowTrace); greedy otherwise.
// Errors: kInvalidArgument for a negative or non-finite temperature (which
// SamplingParams::greedy() would take for greedy); those of
// Engine::Generate and ComputeShadowTrace.
StatusOr<ShadowTrace> TraceRequest(model::Engine& engine, const std::vector<int32_t>& prompt,
                                   int64_t max_new_tokens, int32_t top_k, std::string id,
                                   const speculation::SamplingParams& sampling);

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
                                  const ControllerMaker& make, const model::cost::CostModel& cost);

// The acceptance of a replayed method on a set of traces: requests, tokens
// drafted, and drafts kept in expectation (ExpectedAcceptedLength of each
// drafting round, at the position and layer the replay reached it).
struct ReplayAcceptance {
  int64_t n_requests = 0;
  int64_t n_drafted = 0;
  double expected_accepted = 0;
  // expected_accepted / n_drafted; 0 when nothing was drafted.
  double rate() const { return n_drafted > 0 ? expected_accepted / static_cast<double>(n_drafted) : 0.0; }
};

// The expected accepted drafts of a simulated request (`result` from
// Simulate on `trace`): ExpectedAcceptedLength summed over its rounds.
double ExpectedAccepted(const ShadowTrace& trace, const speculation::GenerationResult& result);

// Held-out acceptance split by kind: greedy traces and sampled ones replayed
// under the controllers of `make`, each kind reported on its own (their
// rates are not comparable: sampling accepts less at the same agreement).
struct ReplayAcceptanceByKind {
  ReplayAcceptance greedy, sampled;
};
StatusOr<ReplayAcceptanceByKind> ReplayAcceptanceOf(const std::vector<ShadowTrace>& traces,
                                                    const speculation::DecisionSpec& spec, const ControllerMaker& make);

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
experience::RewardSpec DinkelbachRewards(const model::cost::CostModel& cost, int32_t n_layers, int32_t max_draft_len,
                                     double rho);

}  // namespace lede::trainer

#endif  // LEDE_TRAINER_COUNTERFACTUAL_H_
