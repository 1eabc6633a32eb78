#include "trainer/offline_metrics.h"

namespace lede::trainer {

std::vector<std::pair<std::string, double>> OfflineMetricFields(const OfflinePolicyMetrics& m) {
  return {{"n_transitions", static_cast<double>(m.n_transitions)},
          {"n_episodes", static_cast<double>(m.n_episodes)},
          {"td_loss", m.td_loss},
          {"mean_max_q", m.mean_max_q},
          {"action_agreement", m.action_agreement},
          {"exit_fraction_phase1", m.exit_fraction_phase1},
          {"exit_fraction_phase2", m.exit_fraction_phase2},
          {"behaviour_reward", m.behaviour_reward},
          {"matched_reward", m.matched_reward},
          {"behaviour_return", m.behaviour_return},
          {"matched_return", m.matched_return},
          {"matched_episodes", static_cast<double>(m.matched_episodes)}};
}

void AddOfflineMetrics(const OfflinePolicyMetrics& m, const std::string& prefix, std::map<std::string, double>* out) {
  for (const auto& [name, value] : OfflineMetricFields(m)) (*out)[prefix + name] = value;
}

}  // namespace lede::trainer
