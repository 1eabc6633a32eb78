#include "shared/experience/transition.h"

#include <algorithm>

namespace lede::experience {

RewardSpec RewardSpec::Paper(int32_t n_layers) {
  RewardSpec r;
  r.cost_model = "accelerator";
  for (int32_t l = 0; l <= n_layers; ++l) {
    r.depth_term.push_back(static_cast<double>(n_layers - l) / n_layers);
  }
  return r;
}

RewardSpec RewardSpec::FromCosts(const std::string& name, const std::vector<double>& draft_cost,
                                 double verify_cost, double tokens_per_verify, double probe_cost) {
  RewardSpec r;
  r.cost_model = name;
  r.continue_reward = 0.0;
  r.probe_reward = -probe_cost;
  const double verify_share = verify_cost / std::max(1.0, tokens_per_verify);
  for (double c : draft_cost) r.depth_term.push_back(1.0 - c - verify_share);
  return r;
}

RewardSpec RewardSpec::Throughput(const std::string& name, const std::vector<double>& draft_cost,
                                  const std::vector<std::vector<double>>& verify_cost, double probe_cost,
                                  double decision_cost, double rho) {
  RewardSpec r;
  r.cost_model = name;
  r.rho = rho;
  r.accept_reward = 1.0;
  r.reject_reward = 0.0;
  r.continue_reward = 0.0;
  r.probe_reward = -rho * probe_cost;
  r.decision_reward = -rho * decision_cost;
  r.step_end = 1.0 - rho;  // one token for one full-depth step
  for (double c : draft_cost) r.depth_term.push_back(-rho * c);
  for (const auto& row : verify_cost) {
    std::vector<double> end;
    for (double v : row) end.push_back(1.0 - rho * v);
    r.round_end.push_back(std::move(end));
  }
  return r;
}

std::vector<Transition> ToTransitions(const speculation::RoundTrace& round, const RewardSpec& rewards,
                                      const std::string& request_id, const std::string& policy_version,
                                      const std::string& model_fingerprint) {
  std::vector<Transition> out;
  const size_t n = round.decisions.size();
  for (size_t i = 0; i < n; ++i) {
    const speculation::Decision& d = round.decisions[i];
    Transition t;
    speculation::ExitFeatures(d.state, t.state.data());
    t.action = d.action;
    if (d.state.phase == speculation::Phase::kRoundStart) {
      t.reward = 0.0f;  // a gate: its value is what follows (or a plain step)
    } else if (d.draft_index >= 0) {
      t.reward = static_cast<float>(d.accepted ? rewards.Accepted(d.state.layer) : rewards.Rejected(d.state.layer));
    } else {
      t.reward = static_cast<float>(rewards.continue_reward);
    }
    if (d.wasted_probe) t.reward += static_cast<float>(rewards.probe_reward);
    t.reward += static_cast<float>(rewards.decision_reward);
    t.done = i + 1 == n;
    if (t.done) t.reward += static_cast<float>(rewards.RoundEnd(round.exit_layer, round.n_drafted));
    if (!t.done) speculation::ExitFeatures(round.decisions[i + 1].state, t.next_state.data());
    t.phase = d.state.phase;
    t.layer = d.state.layer;
    t.n_layers = d.state.n_layers;
    t.draft_pos = d.state.draft_pos;
    t.request_id = request_id;
    t.round_index = round.round_index;
    t.decision_index = static_cast<int32_t>(i);
    t.policy_version = policy_version;
    t.model_fingerprint = model_fingerprint;
    t.reward_cost_model = rewards.cost_model;
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace lede::experience