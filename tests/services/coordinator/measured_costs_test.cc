// The coordinator's copy of the model processes' measured step costs
// (services/coordinator/remote_backend.h MeasuredCosts): nothing until a
// profile arrived, then the drafter's draft entries with the verifier's
// verification entries, the latest of each.
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/lede/v1/experience.pb.h"
#include "services/coordinator/remote_backend.h"

namespace lede::coordinator {
namespace {

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

}  // namespace
}  // namespace lede::coordinator
