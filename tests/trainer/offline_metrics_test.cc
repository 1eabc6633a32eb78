#include "trainer/offline_metrics.h"

#include <cmath>
#include <map>
#include <set>
#include <string>

#include <gtest/gtest.h>

namespace lede::trainer {
namespace {

OfflinePolicyMetrics Filled() {
  OfflinePolicyMetrics m;
  m.n_transitions = 120;
  m.n_episodes = 30;
  m.td_loss = 0.5;
  m.mean_max_q = 1.25;
  m.action_agreement = 0.75;
  m.exit_fraction_phase1 = 0.4;
  m.exit_fraction_phase2 = 0.6;
  m.behaviour_reward = 0.1;
  m.matched_reward = 0.2;
  m.behaviour_return = 1.5;
  m.matched_return = 2.5;
  m.matched_episodes = 12;
  return m;
}

TEST(OfflineMetricsTest, EveryFieldHasOneDistinctName) {
  const auto fields = OfflineMetricFields(Filled());
  std::set<std::string> names;
  for (const auto& [name, value] : fields) EXPECT_TRUE(names.insert(name).second) << name;
  EXPECT_EQ(names.size(), 12u);
  std::map<std::string, double> by_name(fields.begin(), fields.end());
  EXPECT_EQ(by_name.at("n_transitions"), 120);
  EXPECT_EQ(by_name.at("n_episodes"), 30);
  EXPECT_EQ(by_name.at("td_loss"), 0.5);
  EXPECT_EQ(by_name.at("mean_max_q"), 1.25);
  EXPECT_EQ(by_name.at("action_agreement"), 0.75);
  EXPECT_EQ(by_name.at("exit_fraction_phase1"), 0.4);
  EXPECT_EQ(by_name.at("exit_fraction_phase2"), 0.6);
  EXPECT_EQ(by_name.at("behaviour_reward"), 0.1);
  EXPECT_EQ(by_name.at("matched_reward"), 0.2);
  EXPECT_EQ(by_name.at("behaviour_return"), 1.5);
  EXPECT_EQ(by_name.at("matched_return"), 2.5);
  EXPECT_EQ(by_name.at("matched_episodes"), 12);
}

TEST(OfflineMetricsTest, AddPrefixesEveryNameAndReplaces) {
  std::map<std::string, double> out = {{"epochs", 3}, {"heldout_td_loss", 99}};
  AddOfflineMetrics(Filled(), "heldout_", &out);
  EXPECT_EQ(out.size(), 13u);  // "epochs" kept, twelve heldout_ names
  EXPECT_EQ(out.at("epochs"), 3);
  EXPECT_EQ(out.at("heldout_td_loss"), 0.5);
  EXPECT_EQ(out.at("heldout_matched_return"), 2.5);
  EXPECT_EQ(out.at("heldout_matched_episodes"), 12);
}

TEST(OfflineMetricsTest, UnmeasuredSetIsNaNWithZeroCounts) {
  const OfflinePolicyMetrics m;
  for (const auto& [name, value] : OfflineMetricFields(m)) {
    if (name == "n_transitions" || name == "n_episodes" || name == "matched_episodes") {
      EXPECT_EQ(value, 0) << name;
    } else {
      EXPECT_TRUE(std::isnan(value)) << name;
    }
  }
}

}  // namespace
}  // namespace lede::trainer
