// The coordinator's copy of the model processes' measured step costs
// (services/coordinator/remote_backend.h MeasuredCosts): nothing until a
// profile arrived, then the drafter's draft entries with the verifier's
// verification entries, the latest of each.
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/lede/v1/experience.pb.h"
#include "services/coordinator/remote_backend.h"
#include "shared/telemetry/lede_metrics.h"
#include "shared/telemetry/metrics.h"

namespace lede::coordinator {
namespace {

using ::testing::HasSubstr;

lede::v1::CostProfile Profile(double draft_s, double verify_s, int64_t time_us) {
  lede::v1::CostProfile p;
  p.add_draft_step_s(0);
  p.add_draft_step_s(draft_s);
  p.add_draft_step_samples(0);
  p.add_draft_step_samples(draft_s > 0 ? 1 : 0);
  p.add_verify_s(verify_s);
  p.add_verify_samples(verify_s > 0 ? 1 : 0);
  p.set_weight_format("q8_0");
  p.set_time_us(time_us);
  return p;
}

// Before any response carried a profile there is none to log; after, the merge of the latest of each process.
TEST(MeasuredCostsTest, MergesTheLatestProfileOfEachProcess) {
  MeasuredCosts costs;
  lede::v1::CostProfile out;
  EXPECT_FALSE(costs.Current(&out));
  costs.UpdateDrafter(Profile(0.001, 0, 10));
  costs.UpdateVerifier(Profile(0, 0.004, 20));
  costs.UpdateDrafter(Profile(0.002, 0, 30));
  ASSERT_TRUE(costs.Current(&out));
  EXPECT_DOUBLE_EQ(out.draft_step_s(1), 0.002);
  EXPECT_DOUBLE_EQ(out.verify_s(0), 0.004);
  EXPECT_EQ(out.time_us(), 30);
}

// The features the policy is shown are exported as they change: the prior
// first, then those of the measured profiles.
TEST(MeasuredCostsTest, ExportsTheFeaturesThePolicySees) {
  telemetry::Registry registry;
  telemetry::SpecDecodeMetrics metrics(registry);
  MeasuredCosts costs;
  costs.SetMetrics(&metrics);
  costs.SetPrior(speculation::CostFeatures{0.25f, 1.0f, 0.0f});
  std::string text = telemetry::SerializeText(registry);
  EXPECT_THAT(text, HasSubstr("lede_policy_cost_feature{feature=\"probe\"} 0.25\n"));
  EXPECT_THAT(text, HasSubstr("lede_policy_cost_feature{feature=\"layer\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("lede_policy_cost_feature{feature=\"verify\"} 0\n"));
  // Draft steps at exit layers 1 and 2 of 4, verifications of 0, 1 and 2
  // drafts: enough to measure the layer and verify features.
  lede::v1::CostProfile drafter;
  for (double s : {0.0, 0.001, 0.002, 0.0, 0.0}) drafter.add_draft_step_s(s);
  drafter.set_time_us(10);
  lede::v1::CostProfile verifier;
  for (double s : {0.004, 0.005, 0.006}) verifier.add_verify_s(s);
  verifier.set_time_us(20);
  costs.UpdateDrafter(drafter);
  costs.UpdateVerifier(verifier);
  const speculation::CostFeatures f = costs.Features();
  EXPECT_FALSE(f == (speculation::CostFeatures{0.25f, 1.0f, 0.0f}));
  text = telemetry::SerializeText(registry);
  const std::string series = "lede_policy_cost_feature{feature=\"layer\"} ";
  const size_t at = text.find(series);
  ASSERT_NE(at, std::string::npos);
  EXPECT_NEAR(std::stod(text.substr(at + series.size())), f.layer, 1e-6);
}

}  // namespace
}  // namespace lede::coordinator
