// File: shared/speculation/exit_controller.h
//
// The decision process of LEDE (docs/design.md §2; the seed paper's dual-control
// MDP), as the drafting loop sees it. Torch-free: the engine computes the
// confidence signals from exit logits (exit_signals.h) and asks an
// ExitController; implementations (static, threshold, DQN, exploration)
// live in policy/ and never see a tensor.
//
// Round start: before any probe the controller is asked once with
// phase kRoundStart, layer 0 and only C_trace (no probe has been paid for):
// kExit means "speculate this round" (go on to phase 1), kContinue means "a
// plain full-depth step, no probes". This lets a policy stop speculating
// where it does not pay without paying for probes it will not use (a
// candidate-layer probe costs an LM-head evaluation).
// Phase 1 (exit layer): for the first draft token of a speculation round the
// drafter runs the blocks up to each candidate layer l in turn, probes the
// exit distribution p_l = softmax(head(norm(h_l))), and asks Decide():
// kExit fixes l* = l and drafts from p_l; kContinue runs on to the next
// candidate. Passing the last candidate without an exit makes the round a
// plain full-depth (autoregressive) step.
// Phase 2 (draft length): after each drafted token the drafter computes the
// next exit distribution at l* and asks again: kExit means "confident, keep
// drafting" (the next token is drafted from it), kContinue means "stop and
// verify now". The round also stops at max_draft_len or when the request's
// remaining token budget is reached, without a decision.
#ifndef LEDE_SHARED_SPECULATION_EXIT_CONTROLLER_H_
#define LEDE_SHARED_SPECULATION_EXIT_CONTROLLER_H_

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace lede::speculation {

enum class Phase : int32_t { kExitLayer = 1, kDraftLength = 2, kRoundStart = 3 };
enum class Action : int32_t { kContinue = 0, kExit = 1 };

// The confidence signals of one exit distribution p = softmax(logits)
// (computed by ProbeSignals, exit_signals.h; defined here, torch-free, so
// that simulators and controllers share them).
struct ExitSignals {
  float top1_prob = 0;  // max_v p(v)
  float top_k_nll = 0;  // C_k = -(1/k) sum_{v in top-k} log p(v)
  float entropy = 0;    // H = -sum_v p(v) log p(v), nats
  float top1_nll = 0;   // -log max_v p(v)
  float margin = 0;     // log p(top-1) - log p(top-2), nats
  int32_t top1 = 0;     // argmax_v p(v) (lowest id on ties)
};

// What a speculation round costs on the hardware that runs it, in units of
// one autoregressive (full-depth) step: the cost profile a cost-conditioned
// policy sees (docs/training.md "What the policy sees of the hardware").
// Three numbers summarize a cost model (shared/model/cost/cost_features.h
// CostFeaturesOf): what a wasted probe costs, what drafting one token
// through all L layers costs (drafting at exit layer l costs about
// probe + layer * l / L), and what each more verified position adds to a
// verification. The accelerator model of a large model has verify = 0 and
// layer = 1 (a verification of K + 1 positions costs one step); a CPU at
// 8-bit weights verifies each more position at 0.2-0.5 of a step, which is
// why the best static draft length there is 1 or 2. All 0 = unknown (a
// policy of an older feature spec, or a caller that knows no costs).
struct CostFeatures {
  float probe = 0;   // CostModel::ControlledProbe(): an exit head and its signals
  float layer = 0;   // L x the cost of one more block in a draft step
  float verify = 0;  // the cost of one more verified position
  bool operator==(const CostFeatures& o) const { return probe == o.probe && layer == o.layer && verify == o.verify; }
  bool operator<(const CostFeatures& o) const {
    if (probe != o.probe) return probe < o.probe;
    if (layer != o.layer) return layer < o.layer;
    return verify < o.verify;
  }
};

// The state at one decision point (docs/design.md §2 "State at candidate layer l").
struct ExitState {
  Phase phase = Phase::kExitLayer;
  int32_t layer = 0;       // l: candidate layer (phase 1) or l* (phase 2), in [1, L); 0 at round start
  int32_t n_layers = 0;    // L
  int32_t draft_pos = 0;   // tokens drafted so far in this round (0 in phase 1)
  int32_t max_draft_len = 0;  // D_max of the round
  // Probe signals of the exit distribution p_l (0 at round start).
  float top1_prob = 0;     // max_v p_l(v)
  float top_k_nll = 0;     // C_k^l: mean -log p_l of the top-k tokens
  float entropy = 0;       // H^l = -sum_v p_l(v) log p_l(v), nats
  // C_trace: mean -log p_L(top-1) of the full model's distributions that
  // decided the last W emitted tokens (a running confidence of the sequence).
  float trace_nll = 0;
  // log p_l(top-1) - log p_l(top-2) of the probe, nats (0 at round start).
  float margin = 0;
  // Product of top1_prob of the tokens drafted so far in this round (1 before
  // the first draft): the round's own estimate of "every draft so far is
  // accepted" (s_i of the one-step stopping rule, adaptive-speculation.md §c).
  float draft_conf = 1;
  // The request's recent acceptance: an exponential moving average of
  // accepted / drafted over its speculation rounds (AcceptanceEma below).
  float accept_ema = kAcceptEmaPrior;
  // Context n-gram signals of the probe's top-1 token c (ContextNgram
  // below; 0 at round start and for states without a probe): 1 when c is
  // the prompt-lookup continuation of the context (the token that followed
  // the most recent earlier occurrence of the last context token), and 1
  // when the trigram (x[-2], x[-1], c) already occurred in the context.
  float lookup_match = 0;
  float trigram_seen = 0;
  // The load: how many sessions the server is decoding at once (this one
  // included; >= 1), as the caller knows it (the coordinator's requests in
  // flight, its queued ones included; 1 in-process). Batching changes what a draft and a
  // verification cost (shared/model/cost/cost_model.h, cost models at a load),
  // so a policy that sees it can draft less, or not at all, under load
  // (docs/design.md §2).
  int32_t load = 1;
  // The deployment's cost profile (CostFeatures above), as the caller
  // knows it: the model service's measured step costs when served, the
  // cost model of the run in-process.
  CostFeatures cost;
  // The request's sampling temperature (0: greedy). Speculative sampling
  // accepts a draft with probability sum_v min(p_L(v), q_l(v)) of the
  // temperature-warped distributions, not when the argmaxes agree, so the
  // same exit signals predict less acceptance at a higher temperature
  // (docs/training.md "Sampled traffic"). Set by the backend that holds the
  // session, from its sampling (DraftRequest::temperature).
  float temperature = 0;

  static constexpr float kAcceptEmaPrior = 0.5f;
};

// The committed tokens a round's context n-gram signals look back over
// (the last kNgramWindow of prompt + emitted, ending with the pending token).
inline constexpr int64_t kNgramWindow = 512;

// The context n-gram signals of a candidate token `c` following ctx[0..n)
// (prompt-lookup decoding, Saxena 2023; the n-gram matches of REST, He et
// al. 2023, as acceptance signals rather than as drafts): whether c is the
// token that followed the most recent earlier occurrence of ctx[n-1], and
// whether the trigram (ctx[n-2], ctx[n-1], c) occurs in ctx. Both are 0 for
// n < 2. O(n) time, no allocation; torch-free so that the engine, the
// services and the trainer's replays compute the same values.
struct NgramSignals {
  float lookup_match = 0;
  float trigram_seen = 0;
};
inline NgramSignals ContextNgram(const int32_t* ctx, int64_t n, int32_t c) {
  NgramSignals out;
  if (n < 2) return out;
  const int32_t last = ctx[n - 1], before = ctx[n - 2];
  bool looked_up = false;
  for (int64_t j = n - 1; j >= 1; --j) {  // ctx[j] follows an occurrence of `last`
    if (ctx[j - 1] != last) continue;
    if (!looked_up) {
      out.lookup_match = ctx[j] == c ? 1.0f : 0.0f;
      looked_up = true;
    }
    if (ctx[j] == c && j >= 2 && ctx[j - 2] == before) {
      out.trigram_seen = 1.0f;
      break;
    }
  }
  return out;
}

// The request's acceptance EMA after a round that drafted n_drafted >= 1
// tokens and had n_accepted of them accepted (rounds without drafts leave
// it). A round's rate counts the drafts up to and including the first
// rejected one, n_accepted / min(n_drafted, n_accepted + 1): the drafts
// after a rejection never reach the verdict, so the rate does not depend on
// how long a policy kept drafting after it (and a replay of logged traffic,
// trainer/counterfactual.h, reproduces it exactly).
inline constexpr float kAcceptEmaWeight = 0.3f;  // weight of the newest round
inline float UpdateAcceptEma(float ema, int32_t n_drafted, int32_t n_accepted) {
  if (n_drafted <= 0) return ema;
  const int32_t judged = n_drafted < n_accepted + 1 ? n_drafted : n_accepted + 1;
  return (1.0f - kAcceptEmaWeight) * ema +
         kAcceptEmaWeight * static_cast<float>(n_accepted) / static_cast<float>(judged);
}

// Number of features of ExitFeatures(), and the name of this feature spec
// (policy artifacts record it; one of a spec other than this and v3 is
// refused).
// lede-features-v4 is v3 with the load appended, v5 is v4 with the cost
// profile appended, v6 is v5 with the temperature appended (policy
// artifacts of v3, v4 and v5 are read as v6 with a zero weight on what they
// lack, policy/dqn/artifact.h).
inline constexpr int kExitFeatureDim = 18;
inline constexpr char kExitFeatureSpec[] = "lede-features-v6";
// The older feature specs that are still read, each a prefix of this one
// (its first `dim` features): policy artifacts (policy/dqn/artifact.h) and
// experience shards (shared/experience/experience.h) of these specs read
// with what they lack at 0.
struct OlderFeatureSpec {
  const char* name;
  int dim;
};
inline constexpr OlderFeatureSpec kOlderExitFeatureSpecs[] = {
    {"lede-features-v3", 13}, {"lede-features-v4", 14}, {"lede-features-v5", 17}};
// Where ExitFeatures puts the bias, the load, the first of the three cost
// features (the deployment's features follow the request's) and the
// temperature.
inline constexpr int kBiasFeature = 12;
inline constexpr int kLoadFeature = 13;
inline constexpr int kCostFeature = 14;
inline constexpr int kTemperatureFeature = 17;

// min(temperature, kTemperatureFeatureMax) / kTemperatureFeatureMax: the
// temperature feature (0 greedy, 0.4 at the OpenAI API's 0.8, 1 from 2 on,
// where the API's range ends; a NaN reads as 0, greedy).
inline constexpr float kTemperatureFeatureMax = 2.0f;
inline float TemperatureFeature(float temperature) {
  if (!(temperature > 0)) return 0.0f;
  return (temperature < kTemperatureFeatureMax ? temperature : kTemperatureFeatureMax) / kTemperatureFeatureMax;
}

// log2(load) / kLoadFeatureLog2Max, capped at 1: the load feature (0 for one
// session, 1 for 256 or more: the batch sizes of GPU serving).
inline constexpr float kLoadFeatureLog2Max = 8.0f;
inline float LoadFeature(int32_t load) {
  const float log2 = std::log2(static_cast<float>(load > 1 ? load : 1));
  return (log2 < kLoadFeatureLog2Max ? log2 : kLoadFeatureLog2Max) / kLoadFeatureLog2Max;
}

// The network's input, each roughly in [0, 1] or O(1):
//   [phase == 2, l / L, draft_pos / max_draft_len, top1_prob, top_k_nll / 4,
//    entropy / 4, trace_nll / 4, min(margin, 16) / 8, draft_conf, accept_ema,
//    lookup_match, trigram_seen, 1 (bias feature), LoadFeature(load),
//    min(cost.probe, 2), min(cost.layer, 4) / 2, min(cost.verify, 2),
//    TemperatureFeature(temperature)]
// (round start is the only state with l / L == 0)
inline void ExitFeatures(const ExitState& s, float out[kExitFeatureDim]) {
  out[0] = s.phase == Phase::kDraftLength ? 1.0f : 0.0f;
  out[1] = s.n_layers > 0 ? static_cast<float>(s.layer) / s.n_layers : 0.0f;
  out[2] = s.max_draft_len > 0 ? static_cast<float>(s.draft_pos) / s.max_draft_len : 0.0f;
  out[3] = s.top1_prob;
  out[4] = s.top_k_nll / 4.0f;
  out[5] = s.entropy / 4.0f;
  out[6] = s.trace_nll / 4.0f;
  out[7] = (s.margin < 16.0f ? s.margin : 16.0f) / 8.0f;
  out[8] = s.draft_conf;
  out[9] = s.accept_ema;
  out[10] = s.lookup_match;
  out[11] = s.trigram_seen;
  out[kBiasFeature] = 1.0f;
  out[kLoadFeature] = LoadFeature(s.load);
  out[kCostFeature] = s.cost.probe < 2.0f ? s.cost.probe : 2.0f;
  out[kCostFeature + 1] = (s.cost.layer < 4.0f ? s.cost.layer : 4.0f) / 2.0f;
  out[kCostFeature + 2] = s.cost.verify < 2.0f ? s.cost.verify : 2.0f;
  out[kTemperatureFeature] = TemperatureFeature(s.temperature);
}

// The state of a probe decision (phase 1 or 2) from its exit signals; the
// request-level features (trace_nll, draft_conf, accept_ema) are the
// caller's to set. `Signals` is any type with top1_prob, top_k_nll, entropy
// and margin (ExitSignals).
template <typename Signals>
ExitState ProbeState(const Signals& sig, Phase phase, int32_t layer, int32_t n_layers, int32_t draft_pos,
                     int32_t max_draft_len) {
  ExitState st;
  st.phase = phase;
  st.layer = layer;
  st.n_layers = n_layers;
  st.draft_pos = draft_pos;
  st.max_draft_len = max_draft_len;
  st.top1_prob = sig.top1_prob;
  st.top_k_nll = sig.top_k_nll;
  st.entropy = sig.entropy;
  st.margin = sig.margin;
  return st;
}

// The round-start state (no probe yet); trace_nll and accept_ema are the
// caller's to set.
inline ExitState RoundStartState(int32_t n_layers, int32_t max_draft_len) {
  ExitState st;
  st.phase = Phase::kRoundStart;
  st.n_layers = n_layers;
  st.max_draft_len = max_draft_len;
  return st;
}

// Where the policy is consulted and what it may choose.
// The two probe flags trade what a decision sees against what it costs
// (an LM-head evaluation per probe, h / L of a step under the accelerator
// model; four layer-equivalents for a 128k vocabulary):
//  - probe_candidates: phase 1 probes the exit distribution at each
//    candidate layer it visits (a "continue" wastes that head). false: the
//    exit layer is chosen from the request's history (C_trace, acceptance
//    EMA; the probe signals of the state are 0) and only l* pays a head,
//    the one its first draft needs anyway.
//  - lookahead_probe: phase 2 decides on the next token's own exit
//    distribution (stopping wastes that head). false: it decides from the
//    signals of the token just drafted, before paying for the next probe,
//    so stopping costs nothing.
struct DecisionSpec {
  std::vector<int32_t> candidate_layers;  // ascending, each in [1, L); phase-1 decision points
  int32_t max_draft_len = 8;   // D_max: phase 2 stops here without a decision
  int32_t top_k = 4;           // k of C_k^l
  int32_t trace_window = 8;    // W of C_trace, in emitted tokens
  bool probe_candidates = true;
  bool lookahead_probe = true;
};

// Chooses exits. Called from the drafting loop, once per decision.
// Thread-safety: one controller per request (controllers may hold RNG
// state); Decide is never called concurrently on one instance.
class ExitController {
 public:
  virtual ~ExitController() = default;
  virtual std::string name() const = 0;
  // The action at `state`.
  virtual Action Decide(const ExitState& state) = 0;
  // Called once per round after the round-start gate said kExit: phase 1
  // starts at the first candidate layer >= the returned layer; the
  // candidates below it are passed without a probe (their blocks still
  // run). For controllers that choose the exit layer from the request's
  // history instead of from probes, so they pay for no probe they do not
  // use. The default, 0, probes every candidate.
  virtual int32_t FirstProbeLayer(const ExitState& round_start) { return 0; }
};

// One decision and what came of it, recorded by the engine for experience.
struct Decision {
  ExitState state;
  Action action = Action::kContinue;
  // For an action that drafted a token (phase-1 kExit, phase-2 kExit): the
  // index of that token in the round (0-based) and whether the verifier
  // accepted it. -1 for an action that drafted nothing.
  int32_t draft_index = -1;
  bool accepted = false;
  // Whether this decision wasted an exit-head probe (one that drafted
  // nothing: a phase-1 kContinue with probe_candidates, a phase-2 stop with
  // lookahead_probe); RoundRecord::n_probes counts exactly these. Decisions
  // that probe nothing (phase 1 from the history, phase 2 on the token just
  // drafted) cost no probe, and rewards must not charge one.
  bool wasted_probe = false;
};

// The decisions of one speculation round, in order; the round is the
// episode (its last decision is terminal).
struct RoundTrace {
  int64_t round_index = 0;   // within the request
  int32_t exit_layer = 0;    // l*, 0 when no exit was taken (full-depth step)
  int32_t n_drafted = 0;
  int32_t n_accepted = 0;
  std::vector<Decision> decisions;
};

}  // namespace lede::speculation
#endif  // LEDE_SHARED_SPECULATION_EXIT_CONTROLLER_H_
