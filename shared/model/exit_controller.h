// File: shared/model/exit_controller.h
//
// The decision process of LEDE (DESIGN.md §2; the seed paper's dual-control
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
#ifndef LEDE_SHARED_MODEL_EXIT_CONTROLLER_H_
#define LEDE_SHARED_MODEL_EXIT_CONTROLLER_H_

#include <cstdint>
#include <string>
#include <vector>

namespace lede::model {

enum class Phase : int32_t { kExitLayer = 1, kDraftLength = 2, kRoundStart = 3 };
enum class Action : int32_t { kContinue = 0, kExit = 1 };

// The state at one decision point (DESIGN.md §2 "State at candidate layer l").
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
};

// Number of features of ExitState::Features().
inline constexpr int kExitFeatureDim = 8;

// The network's input, each roughly in [0, 1] or O(1):
//   [phase == 2, l / L, draft_pos / max_draft_len, top1_prob, top_k_nll / 4,
//    entropy / 4, trace_nll / 4, 1 (bias feature)]
// (round start is the only state with l / L == 0)
inline void ExitFeatures(const ExitState& s, float out[kExitFeatureDim]) {
  out[0] = s.phase == Phase::kDraftLength ? 1.0f : 0.0f;
  out[1] = s.n_layers > 0 ? static_cast<float>(s.layer) / s.n_layers : 0.0f;
  out[2] = s.max_draft_len > 0 ? static_cast<float>(s.draft_pos) / s.max_draft_len : 0.0f;
  out[3] = s.top1_prob;
  out[4] = s.top_k_nll / 4.0f;
  out[5] = s.entropy / 4.0f;
  out[6] = s.trace_nll / 4.0f;
  out[7] = 1.0f;
}

// Where the policy is consulted and what it may choose.
struct DecisionSpec {
  std::vector<int32_t> candidate_layers;  // ascending, each in [1, L); phase-1 probe points
  int32_t max_draft_len = 8;   // D_max: phase 2 stops here without a decision
  int32_t top_k = 4;           // k of C_k^l
  int32_t trace_window = 8;    // W of C_trace, in emitted tokens
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

}  // namespace lede::model

#endif  // LEDE_SHARED_MODEL_EXIT_CONTROLLER_H_
