// File: trainer/cold_start.h
//
// Cold start: the first version of a policy root for a model that
// has no trained exit policy, so that the default method of every request
// (LEDE with the serving policy) works from the first request on.
//
// The first policy is a static setting (exit layer E, draft length D), or
// plain autoregressive decoding when no static setting pays. It is written
// as an ordinary DQN artifact (policy/dqn/artifact.h, format lede-dqn-v1)
// whose greedy decisions are exactly the static controller's, so that every
// reader (the policy service, the drafter, `lede generate --mode lede`, the
// benchmark and the retrainer) loads and plans it with no special case:
//   decision spec   candidate_layers {E}, max_draft_len D, no candidate
//                   probes, no lookahead probe
//   Q-network       fc3.weight 0 and fc3.bias (0, 1): Q(exit) > Q(continue)
//                   in every state, so the round start speculates, phase 1
//                   exits at E (its only candidate) and phase 2 drafts on
//                   until D (the loop stops there without a decision).
//                   fc1/fc2 are small seeded random weights (they do not
//                   change the decisions; a retrainer warm-started from it
//                   then has gradients to follow, all-zero layers would not).
//   autoregressive  fc3.bias (1, 0): the round start never speculates.
// The metadata marks it: training_options {"cold_start": 1, "exit_layer": E,
// "draft_len": D}, training_data.n_requests 0, and offline_metrics the
// self-calibration's predicted speed-ups.
//
// E and D come from a short self-calibration on the served model
// (ChooseColdStart): a few built-in prompts (stories, code, facts) are
// decoded greedily, each request's shadow trace computed
// (trainer/counterfactual.h), and every static (E, D) replayed exactly on
// them; the best under the cost model (the accelerator model unless a
// measured calibration is given) wins, and autoregressive decoding when none
// beats it by kMinColdStartGain. Skipped, DefaultColdStart is a fixed guess.
//
// Thread-safety: free functions; ChooseColdStart runs the engine it is given.
#ifndef LEDE_TRAINER_COLD_START_H_
#define LEDE_TRAINER_COLD_START_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "policy/dqn/artifact.h"
#include "shared/checkpoint/model_config.h"
#include "shared/model/cost/cost_model.h"
#include "shared/status/status.h"
#include "trainer/counterfactual.h"

namespace lede::trainer {

// A predicted speed-up below 1 + this is not worth a draft's risk: the cold
// start then decodes autoregressively.
inline constexpr double kMinColdStartGain = 0.02;

struct ColdStartChoice {
  bool speculate = false;    // false: autoregressive (E, D unused)
  int32_t exit_layer = 0;    // E in [1, L - 1]
  int32_t draft_len = 0;     // D >= 1
  double speedup = 1.0;      // predicted, over the calibration requests (1.0 when not measured)
  int64_t n_requests = 0;    // calibration requests (0: not measured)
  int64_t n_tokens = 0;      // their generated tokens
  std::string how;           // "self-calibration" or "default"
  // "E=2 D=3" or "autoregressive".
  std::string Describe() const;
};

// The fixed guess when self-calibration is skipped: E = max(1, round(L / 4)),
// D = 3 (a quarter of the depth drafts cheaply; three drafts is the middle
// of what pays on early-exit-trained checkpoints). Requires n_layers >= 2.
ColdStartChoice DefaultColdStart(int32_t n_layers);

// The best static (E, D), E in [1, L - 1] (only those of `exit_layers` when
// it is not empty), D in [1, max_draft_len], on `traces` under `cost` (exact
// replay, pooled tokens / cost); autoregressive when its speed-up is below
// 1 + kMinColdStartGain.
// Errors: kInvalidArgument for no traces or max_draft_len < 1; those of the
// replay.
StatusOr<ColdStartChoice> ChooseColdStartFromTraces(const std::vector<ShadowTrace>& traces, int32_t max_draft_len,
                                                    const model::cost::CostModel& cost,
                                                    const std::vector<int32_t>& exit_layers = {});

// How much self-calibration a model gets. The calibration decodes
// n_prompts x new_tokens tokens greedily and traces them (one pass with the
// exit head at each candidate layer); both cost about the weights one token
// runs through, so the tokens shrink as the model grows and the calibration
// takes about as long on every model: lede-tiny (5M weights per token) gets
// every prompt at full length and every exit layer, a Llama-3.2-1B shape
// (1.24B) 2 prompts of 12 tokens and exits {2, 4, 6, 8} (docs/serving.md
// "Cold start").
struct ColdStartSizing {
  int64_t n_prompts = 0;   // the first n of ColdStartPrompts()
  int64_t new_tokens = 0;  // generated per prompt
  // The exit layers E tried (ascending, in [1, L - 1]); empty: every one. A
  // model whose full calibration is not affordable tries at most
  // kMaxColdStartExits spread over the first half of its depth (round(L i /
  // 8), i = 1..4), where a static exit pays if any does: each exit tried
  // costs an LM-head pass per traced token, 4.3 blocks' work on the 1B shape.
  std::vector<int32_t> exit_layers;
};

// The calibration's work: weights per token x generated tokens summed over
// the prompts (about 30 s of decoding on one core, fewer on more).
inline constexpr double kColdStartWeightTokens = 3e10;
// At least this many generated tokens in all, and this many per prompt,
// however large the model: fewer say nothing about acceptance.
inline constexpr int64_t kMinColdStartTokens = 24;
inline constexpr int64_t kMinColdStartTokensPerPrompt = 12;
inline constexpr int32_t kMaxColdStartExits = 4;

// The weights (multiply-adds) one decoded token runs through: every block's
// Q/K/V/O and SwiGLU matrices and the LM head (the embedding is a lookup).
int64_t WeightsPerToken(const checkpoint::ModelConfig& config);

// The sizing for a model of `weights_per_token` (> 0) and `n_layers` L, at
// most `max_prompts` prompts (>= 1) of `max_new_tokens` (>= 1) each: tokens in
// all clamp(kColdStartWeightTokens / weights_per_token, kMinColdStartTokens,
// max_prompts x max_new_tokens); prompts ceil(tokens / max_new_tokens), at
// least 2 (when max_prompts allows), so no single text decides; tokens per
// prompt the rest, at least kMinColdStartTokensPerPrompt (at most
// max_new_tokens); every exit layer when the tokens are not cut, else the
// spread above. Non-positive sizes count as 1.
ColdStartSizing SizeColdStart(int64_t weights_per_token, int32_t n_layers, int64_t max_prompts,
                              int64_t max_new_tokens);

// The built-in calibration prompts (short English and code openings; model
// agnostic text, tokenized with the served model's tokenizer).
const std::vector<std::string>& ColdStartPrompts();

// Self-calibration: each of `prompts` (token ids) decoded greedily for
// `new_tokens` tokens on `engine`, traced at `exit_layers` (empty: every
// layer), then ChooseColdStartFromTraces over those layers.
// `out_of_time` (optional) is asked before every prompt after the first
// that gave a trace; true ends the calibration with the traces so far, so a
// large model's cold start stays within its time budget (lede-init-policy
// --max-seconds) on fewer requests instead of taking minutes.
// Errors: those of TraceGreedyRequest and ChooseColdStartFromTraces.
StatusOr<ColdStartChoice> ChooseColdStart(model::Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                          int64_t new_tokens, int32_t max_draft_len, const model::cost::CostModel& cost,
                                          const std::function<bool()>& out_of_time = nullptr,
                                          const std::vector<int32_t>& exit_layers = {});

// The artifact of `choice` for a model of `n_layers` layers whose
// ArchitectureFingerprint is `fingerprint`, version `version`, rewards priced
// by `cost_model` ("accelerator" or "measured"). Errors: kInvalidArgument for
// E outside [1, L - 1] or D < 1 when speculating, or a bad version name.
StatusOr<policy::dqn::Artifact> ColdStartArtifact(const ColdStartChoice& choice, int32_t n_layers,
                                                  const std::string& fingerprint, const std::string& version,
                                                  const std::string& cost_model);

// Writes the artifact into policy_root/<version> and points SERVING at it,
// unless policy_root already has a SERVING pointer (then nothing is written
// and kAlreadyExists is returned, naming what it serves).
Status WriteColdStartPolicy(const std::string& policy_root, const policy::dqn::Artifact& artifact);

}  // namespace lede::trainer

#endif  // LEDE_TRAINER_COLD_START_H_
