// File: shared/experience/transition.h
//
// Rewards and transitions of LEDE's decision process (docs/design.md §2):
//   a draft token that the verifier accepts:  accept_reward + depth_term(l*)
//   a draft token that it rejects:            reject_reward + depth_term(l*)
//   "continue" (phase 1: go deeper; phase 2: stop and verify): continue_reward
//   a decision that wasted an exit-head probe (Decision::wasted_probe):
//   probe_reward on top
//   either action at round start (speculate or not): 0, a gate whose value is
//   what follows
// where the depth term is the share of a full-depth step that drafting at l*
// saves. The paper's (default) term is (L - l*) / L, which assumes that
// verification is nearly free (memory-bound GPUs). A cost-aware variant takes
// it from a cost model: 1 - cost(draft one token at l*) - cost(verify) / D_ref,
// and charges each wasted probe its cost, so that on
// hardware where speculation does not pay the learned policy falls back to
// full-depth steps (declining at round start, before any probe).
//
// A third form, Throughput, rewards exactly "tokens emitted minus cost spent"
// (in full-depth steps) under a cost model, so that the return of a round is
// its tokens minus its cost and a policy that maximizes it maximizes
// throughput against the autoregressive rate of one token per step:
//   drafted token: [accepted] - draft_cost[l*]     wasted probe: -probe_cost
//   round end (added to its last decision): 1 - verify_cost[E][K]
//   (the verifier's own token, minus the verification pass)
//   round start and a plain full-depth step: 0 (1 token for 1 step).
// The paper's reward, by contrast, gives +1 + (L - l*)/L per accepted token
// however many rounds it takes, so it learns to draft long.
// Torch-free and proto-free.
#ifndef LEDE_SHARED_EXPERIENCE_TRANSITION_H_
#define LEDE_SHARED_EXPERIENCE_TRANSITION_H_

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "shared/speculation/exit_controller.h"

namespace lede::experience {

struct RewardSpec {
  std::string cost_model = "accelerator";  // name recorded with each transition
  double accept_reward = 1.0;
  double reject_reward = -2.0;
  double continue_reward = -0.01;
  // Added to a decision that wasted an exit-head probe (the probe's price;
  // 0 for the paper's rewards, which charge continue_reward instead). Only
  // Decision::wasted_probe is charged: with probe_candidates or
  // lookahead_probe off, "continue" probes nothing and costs nothing.
  double probe_reward = 0.0;
  // depth_term[l] for l in [0, L]: saving of drafting at exit layer l.
  std::vector<double> depth_term;
  // round_end[E][K]: added to a round's last decision when it drafted K >= 1
  // tokens at E (empty: 0).
  std::vector<std::vector<double>> round_end;
  // Added to the last decision of a round that drafted nothing (a plain
  // full-depth step: 1 token for 1 step); 0 for the paper's rewards.
  double step_end = 0.0;
  // Added to every decision (the price of the decision machinery itself).
  double decision_reward = 0.0;
  // rho of the Dinkelbach form (throughput rewards), 0 for the other forms.
  double rho = 0.0;

  // The paper's rewards: depth_term[l] = (L - l) / L.
  static RewardSpec Paper(int32_t n_layers);
  // Cost-aware rewards from per-layer draft costs and one verification cost,
  // in units of a full-depth step: depth_term[l] = 1 - draft_cost[l] -
  // verify_cost / tokens_per_verify (the verification share one accepted
  // token carries when a round emits tokens_per_verify tokens),
  // continue_reward = 0 and probe_reward = -probe_cost.
  static RewardSpec FromCosts(const std::string& name, const std::vector<double>& draft_cost,
                              double verify_cost, double tokens_per_verify, double probe_cost);

  // Throughput rewards from per-layer draft costs draft_cost[l], l in
  // [0, L], verification costs verify_cost[E][K] for K in [0, D_max], the
  // cost of one probe and of one decision; all in full-depth steps. The
  // return of a round is its tokens minus rho times its cost: the Dinkelbach
  // form of maximizing tokens per unit cost (Dinkelbach 1967; at rho = the
  // optimal throughput the two objectives have the same optimum, so the
  // trainer sets rho to the throughput of the policy being improved and
  // iterates, adaptive-speculation.md §c). rho = 1 is the throughput reward
  // of before (tokens minus cost against one token per step).
  static RewardSpec Throughput(const std::string& name, const std::vector<double>& draft_cost,
                               const std::vector<std::vector<double>>& verify_cost, double probe_cost,
                               double decision_cost = 0.0, double rho = 1.0);

  double RoundEnd(int32_t exit_layer, int32_t n_drafted) const {
    if (n_drafted <= 0) return step_end;
    if (round_end.empty()) return 0.0;
    const auto& row = round_end.at(exit_layer);
    return row.at(std::min<size_t>(n_drafted, row.size() - 1));
  }
  double Accepted(int32_t layer) const { return accept_reward + depth_term.at(layer); }
  double Rejected(int32_t layer) const { return reject_reward + depth_term.at(layer); }
};

// One (s, a, r, s', done) tuple with its bookkeeping (proto: lede.v1.Transition).
struct Transition {
  std::array<float, speculation::kExitFeatureDim> state{};
  speculation::Action action = speculation::Action::kContinue;
  float reward = 0;
  std::array<float, speculation::kExitFeatureDim> next_state{};  // zeros when done
  bool done = false;
  speculation::Phase phase = speculation::Phase::kExitLayer;
  int32_t layer = 0;
  int32_t n_layers = 0;
  int32_t draft_pos = 0;
  std::string request_id;
  int64_t round_index = 0;
  int32_t decision_index = 0;
  std::string policy_version;
  std::string model_fingerprint;
  std::string reward_cost_model;
};

// Rewards one round's decisions (the round is the episode; its last decision
// is terminal). An action that drafted a token gets Accepted/Rejected(l*) by
// the verifier's verdict on that token; every other action gets
// continue_reward; a decision that wasted a probe adds probe_reward.
std::vector<Transition> ToTransitions(const speculation::RoundTrace& round, const RewardSpec& rewards,
                                      const std::string& request_id, const std::string& policy_version,
                                      const std::string& model_fingerprint);

}  // namespace lede::experience
#endif  // LEDE_SHARED_EXPERIENCE_TRANSITION_H_
