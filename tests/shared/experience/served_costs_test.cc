// The served-cost meter (shared/experience/served_costs.h): what a model
// service keeps of its own step timings, and the profile it hands on.
#include "shared/experience/served_costs.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/lede/v1/experience.pb.h"
#include "tests/testing/status_matchers.h"

namespace lede::experience {
namespace {

using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;

ServedCostMeter MakeMeter(int32_t window = 5) {
  ServedCostMeterOptions o;
  o.n_layers = 4;
  o.max_draft_len = 3;
  o.window = window;
  o.weight_format = "q8_0";
  o.threads = 2;
  o.head_layers = 0.5;
  return ServedCostMeter(o);
}

// The median of an odd count is the middle value, of an even count the mean of the middle two.
TEST(ServedCostsTest, MedianOfOddAndEvenCounts) {
  EXPECT_DOUBLE_EQ(Median({3, 1, 2}), 2.0);
  EXPECT_DOUBLE_EQ(Median({4, 1, 3, 2}), 2.5);
  EXPECT_DOUBLE_EQ(Median({}), 0.0);
}

// Theil-Sen recovers the line through exact points and ignores one wild point.
TEST(ServedCostsTest, TheilSenLineIgnoresAnOutlier) {
  std::vector<double> x = {0, 1, 2, 3, 4, 5};
  std::vector<double> y;
  for (double v : x) y.push_back(2.0 + 0.5 * v);
  y[3] = 40.0;  // a stalled step
  const auto [a, b] = TheilSenLine(x, y);
  EXPECT_NEAR(a, 2.0, 1e-9);
  EXPECT_NEAR(b, 0.5, 1e-9);
}

// One distinct x has no slope: the line is {0, 0}.
TEST(ServedCostsTest, TheilSenLineNeedsTwoDistinctX) {
  const auto [a, b] = TheilSenLine({1, 1, 1}, {2, 3, 4});
  EXPECT_EQ(a, 0.0);
  EXPECT_EQ(b, 0.0);
}

// A draft sample is the call's seconds per drafted token; the median over the window ignores a stall.
TEST(ServedCostsTest, DraftEntryIsWindowedMedianPerToken) {
  ServedCostMeter m = MakeMeter();
  EXPECT_DOUBLE_EQ(m.RecordDraft(2, 4, 0.004), 0.001);
  m.RecordDraft(2, 2, 0.002);
  m.RecordDraft(2, 1, 0.050);  // stalled
  const lede::v1::CostProfile p = m.Snapshot();
  ASSERT_EQ(p.draft_step_s_size(), 5);  // E in [0, L]
  EXPECT_DOUBLE_EQ(p.draft_step_s(2), 0.001);
  EXPECT_EQ(p.draft_step_samples(2), 3);
  EXPECT_EQ(p.draft_step_samples(1), 0);
  EXPECT_EQ(p.draft_step_s(1), 0.0);
  EXPECT_EQ(p.weight_format(), "q8_0");
  EXPECT_EQ(p.threads(), 2);
  EXPECT_EQ(p.window(), 5);
}

// Only the last `window` samples count: a change of speed replaces the old median.
TEST(ServedCostsTest, WindowFollowsAChangeOfSpeed) {
  ServedCostMeter m = MakeMeter(/*window=*/3);
  for (int i = 0; i < 3; ++i) m.RecordVerify(0, 0, 0.010);
  for (int i = 0; i < 3; ++i) m.RecordVerify(0, 0, 0.020);
  const lede::v1::CostProfile p = m.Snapshot();
  EXPECT_DOUBLE_EQ(p.verify_s(0), 0.020);
  EXPECT_EQ(p.verify_samples(0), 3);
}

// The verification line is fitted through every windowed sample across K (here all at the middle exit
// layer, E = 2 of 4, where a draft counts one).
TEST(ServedCostsTest, VerifyLineFitsAcrossK) {
  ServedCostMeter m = MakeMeter();
  m.RecordVerify(0, 0, 0.010);
  m.RecordVerify(0, 0, 0.010);
  for (int k = 1; k <= 3; ++k) {
    m.RecordVerify(2, k, 0.010 + 0.002 * k);
    m.RecordVerify(2, k, 0.010 + 0.002 * k);
  }
  m.RecordVerify(2, 1, 0.5);  // an outlier
  const lede::v1::CostProfile p = m.Snapshot();
  EXPECT_NEAR(p.verify_intercept_s(), 0.010, 1e-9);
  EXPECT_NEAR(p.verify_slope_s(), 0.002, 1e-9);
  ASSERT_EQ(p.verify_s_size(), 4);
  EXPECT_NEAR(p.verify_s(3), 0.016, 1e-12);
}

// Verifications at other exit layers go on the same line, each draft counted by the blocks and head its row
// runs through in the verifier against a draft at the middle exit layer M = 2: (L - E + h) / (L - M + h).
// With 1 ms per row per layer-equivalent, a draft at E = 1 costs 3.5 ms, one at E = 3 1.5 ms, and the line's
// slope is that of a draft at M, 2.5 ms. A full-depth step resumed after a probe (K = 0 at a layer) is no
// verification and is left out.
TEST(ServedCostsTest, VerifyLineCountsDraftsAtTheMiddleExitLayer) {
  ServedCostMeter m = MakeMeter(/*window=*/8);
  EXPECT_DOUBLE_EQ(m.MiddleLayerDrafts(1, 2), 2 * 3.5 / 2.5);
  EXPECT_DOUBLE_EQ(m.MiddleLayerDrafts(2, 3), 3.0);
  auto verify_ms = [](int e, int k) { return 1e-3 * (10.0 + k * (4 - e + 0.5)); };
  m.RecordVerify(0, 0, 0.010);
  for (int e = 1; e <= 3; ++e) {
    for (int k = 1; k <= 3; ++k) m.RecordVerify(e, k, verify_ms(e, k));
  }
  EXPECT_EQ(m.RecordVerify(2, 0, 0.004), 0.0);  // resumed at layer 2 after a probe
  EXPECT_EQ(m.RecordVerify(4, 1, 0.020), 0.0);  // no exit layer at L
  const lede::v1::CostProfile p = m.Snapshot();
  EXPECT_NEAR(p.verify_intercept_s(), 0.010, 1e-9);
  EXPECT_NEAR(p.verify_slope_s(), 0.0025, 1e-9);
  EXPECT_DOUBLE_EQ(p.verify_s(0), 0.010);
  EXPECT_EQ(p.verify_samples(0), 1);
  EXPECT_DOUBLE_EQ(p.head_layers(), 0.5);
}

// Samples outside the entries' ranges, negative or not finite are ignored, never a crash.
TEST(ServedCostsTest, BadSamplesAreIgnored) {
  ServedCostMeter m = MakeMeter();
  EXPECT_EQ(m.RecordDraft(0, 1, 0.1), 0.0);
  EXPECT_EQ(m.RecordDraft(5, 1, 0.1), 0.0);
  EXPECT_EQ(m.RecordDraft(1, 0, 0.1), 0.0);
  EXPECT_EQ(m.RecordDraft(1, 1, -1.0), 0.0);
  EXPECT_EQ(m.RecordVerify(2, 4, 0.1), 0.0);
  EXPECT_EQ(m.RecordVerify(2, -1, 0.1), 0.0);
  EXPECT_EQ(m.RecordVerify(0, 1, 0.1), 0.0);  // drafts need an exit layer
  EXPECT_EQ(m.RecordVerify(-1, 0, 0.1), 0.0);
  EXPECT_EQ(m.RecordVerify(0, 0, std::numeric_limits<double>::quiet_NaN()), 0.0);
  EXPECT_EQ(m.RecordBatch(0, 0.1), 0.0);
  const lede::v1::CostProfile p = m.Snapshot();
  for (int64_t n : p.draft_step_samples()) EXPECT_EQ(n, 0);
  for (int64_t n : p.verify_samples()) EXPECT_EQ(n, 0);
  EXPECT_EQ(p.batch_rows_size(), 0);
}

// Batched steps are kept by row count, ascending.
TEST(ServedCostsTest, BatchEntriesByRows) {
  ServedCostMeter m = MakeMeter();
  m.RecordBatch(16, 0.040);
  m.RecordBatch(4, 0.020);
  m.RecordBatch(16, 0.044);
  const lede::v1::CostProfile p = m.Snapshot();
  ASSERT_EQ(p.batch_rows_size(), 2);
  EXPECT_EQ(p.batch_rows(0), 4);
  EXPECT_EQ(p.batch_rows(1), 16);
  EXPECT_DOUBLE_EQ(p.batch_step_s(1), 0.042);
  EXPECT_EQ(p.batch_samples(1), 2);
}

// Create names the bad option.
TEST(ServedCostsTest, CreateRejectsBadOptions) {
  ServedCostMeterOptions o;
  o.n_layers = 0;
  EXPECT_THAT(ServedCostMeter::Create(o).status(), StatusIs(absl::StatusCode::kInvalidArgument));
  o.n_layers = 2;
  o.window = 0;
  EXPECT_THAT(ServedCostMeter::Create(o).status(), StatusIs(absl::StatusCode::kInvalidArgument));
  o.window = 8;
  o.head_layers = -1;
  EXPECT_THAT(ServedCostMeter::Create(o).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("head_layers")));
  o.head_layers = 0.2;
  EXPECT_THAT(ServedCostMeter::Create(o).status(), IsOk());
}

// A snapshot is due at most once per interval.
TEST(ServedCostsTest, AttachDueOncePerInterval) {
  ServedCostMeter m = MakeMeter();
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_TRUE(m.AttachDue(t0, absl::Seconds(1)));
  EXPECT_FALSE(m.AttachDue(t0 + absl::Milliseconds(500), absl::Seconds(1)));
  EXPECT_TRUE(m.AttachDue(t0 + absl::Milliseconds(1000), absl::Seconds(1)));
}

// The merged profile has the drafter's draft entries and the verifier's verifications; it can price rounds
// only with both parts.
TEST(ServedCostsTest, MergeTakesEachProcessPart) {
  ServedCostMeter drafter = MakeMeter();
  ServedCostMeter verifier = MakeMeter();
  drafter.RecordDraft(1, 1, 0.003);
  verifier.RecordVerify(0, 0, 0.010);
  verifier.RecordVerify(2, 2, 0.014);
  verifier.RecordBatch(3, 0.012);
  const lede::v1::CostProfile d = drafter.Snapshot(absl::FromUnixSeconds(5));
  const lede::v1::CostProfile v = verifier.Snapshot(absl::FromUnixSeconds(7));
  EXPECT_FALSE(CanPrice(d));
  EXPECT_FALSE(CanPrice(v));
  const lede::v1::CostProfile p = MergeCostProfiles(d, v);
  EXPECT_DOUBLE_EQ(p.draft_step_s(1), 0.003);
  EXPECT_DOUBLE_EQ(p.verify_s(0), 0.010);
  EXPECT_DOUBLE_EQ(p.verify_s(2), 0.014);
  EXPECT_EQ(p.batch_rows_size(), 1);
  EXPECT_EQ(p.time_us(), 7'000'000);
  EXPECT_TRUE(CanPrice(p));
}

// The features a policy sees from a deployment's profile: in units of its
// autoregressive step, the verify feature from the fitted line's slope, the
// layer feature through the one measured exit layer with the prior's probe.
TEST(ServedCostsTest, ServedCostFeaturesAreInUnitsOfTheAutoregressiveStep) {
  ServedCostMeter drafter = MakeMeter();
  ServedCostMeter verifier = MakeMeter();
  drafter.RecordDraft(1, 1, 0.003);
  verifier.RecordVerify(0, 0, 0.010);
  verifier.RecordVerify(2, 2, 0.014);
  const lede::v1::CostProfile p = MergeCostProfiles(drafter.Snapshot(), verifier.Snapshot());
  const speculation::CostFeatures prior{0.1f, 1.0f, 0.0f};
  const speculation::CostFeatures f = ServedCostFeatures(p, prior);
  EXPECT_FLOAT_EQ(f.probe, 0.1f);                   // a served draft's time holds its probes: the prior's
  EXPECT_NEAR(f.layer, 4 * (0.3 - 0.1) / 1, 1e-5);  // L = 4, one exit layer: L (d(1) - probe) / 1
  EXPECT_NEAR(f.verify, 0.002 / 0.010, 1e-5);       // slope 2 ms per draft over a 10 ms step
}

// What a profile has not measured comes from the prior; nothing measured
// at all (no autoregressive step to be the unit) is the prior.
TEST(ServedCostsTest, ServedCostFeaturesFallBackOnThePrior) {
  const speculation::CostFeatures prior{0.25f, 1.5f, 0.4f};
  lede::v1::CostProfile empty;
  const speculation::CostFeatures none = ServedCostFeatures(empty, prior);
  EXPECT_TRUE(none == prior);
  ServedCostMeter verifier = MakeMeter();
  verifier.RecordVerify(0, 0, 0.010);  // the unit, but no draft and one draft length
  const speculation::CostFeatures some = ServedCostFeatures(verifier.Snapshot(), prior);
  EXPECT_FLOAT_EQ(some.probe, 0.25f);
  EXPECT_FLOAT_EQ(some.layer, 1.5f);
  EXPECT_FLOAT_EQ(some.verify, 0.4f);
}

}  // namespace
}  // namespace lede::experience
