// The cost features of cost tables (shared/speculation/cost_features.h):
// what a cost-conditioned policy sees of the hardware.
#include "shared/speculation/cost_features.h"

#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace lede::speculation {
namespace {

// The accelerator model of L = 8 layers with a head of h = 2
// layer-equivalents: a draft at l costs (l + h) / L, every verification 1,
// a probe h / L: features (h / L, 1, 0).
TEST(CostFeaturesTest, AcceleratorTablesGiveUnitLayerAndFreeVerification) {
  CostTables t;
  const double L = 8, h = 2;
  t.draft.assign(9, 0.0);
  for (int l = 1; l < 8; ++l) t.draft[l] = (l + h) / L;
  t.verify.assign(7, 1.0);
  t.probe = h / L;
  const CostFeatures f = CostFeaturesOfTables(t);
  EXPECT_FLOAT_EQ(f.probe, 0.25f);
  EXPECT_FLOAT_EQ(f.layer, 1.0f);
  EXPECT_FLOAT_EQ(f.verify, 0.0f);
}

// A CPU-like table: verifying each more position costs 0.4 of a step, a
// layer of a draft 1.2 / L; unknown entries (0, NaN) are left out.
TEST(CostFeaturesTest, MeasuredTablesGiveTheirSlopesAndSkipUnknownEntries) {
  CostTables t;
  t.draft = {0, 0.25, 0.40, 0, 0.70, 0};  // L = 5: 0.1 + 0.15 l, l = 3 unknown
  t.verify = {1.0, 1.4, std::numeric_limits<double>::quiet_NaN(), 2.2};
  t.probe = 0.1;
  const CostFeatures f = CostFeaturesOfTables(t);
  EXPECT_NEAR(f.layer, 5 * 0.15, 1e-5);
  EXPECT_NEAR(f.verify, 0.4, 1e-5);
  EXPECT_FLOAT_EQ(f.probe, 0.1f);
}

// A cost model that books each position's verification with its draft (a
// measured round table): the draft line's intercept above the probe is
// per-token verification, as if booked in the verify table.
TEST(CostFeaturesTest, VerificationBookedWithTheDraftCountsAsVerification) {
  CostTables booked;
  booked.draft = {0, 0.70, 0.85, 1.00, 0};  // L = 4: (0.1 + 0.45) + 0.15 l
  booked.verify = {1.0, 1.0, 1.0};
  booked.probe = 0.1;
  CostTables apart = booked;
  apart.draft = {0, 0.25, 0.40, 0.55, 0};   // 0.1 + 0.15 l
  apart.verify = {1.0, 1.45, 1.90};         // 0.45 per position
  const CostFeatures a = CostFeaturesOfTables(booked), b = CostFeaturesOfTables(apart);
  EXPECT_NEAR(a.verify, 0.45, 1e-5);
  EXPECT_NEAR(b.verify, 0.45, 1e-5);
  EXPECT_NEAR(a.layer, b.layer, 1e-5);
  EXPECT_NEAR(a.layer, 4 * 0.15, 1e-5);
}

// One known exit layer: the line through it and the probe (a draft at l is
// the probe plus l / L of the layer cost).
TEST(CostFeaturesTest, OneExitLayerIsPricedThroughTheProbe) {
  CostTables t;
  t.draft = {0, 0, 0.5, 0, 0};  // L = 4, only l = 2
  t.probe = 0.1;
  const CostFeatures f = CostFeaturesOfTables(t);
  EXPECT_NEAR(f.layer, 4 * (0.5 - 0.1) / 2, 1e-5);
  EXPECT_FLOAT_EQ(f.verify, 0.0f);  // no verification known
}

// Noise that makes a slope (or the draft line's excess over the probe)
// negative is not a negative cost: clamped to 0;
// empty tables give all 0 (unknown).
TEST(CostFeaturesTest, NegativeSlopesClampAndEmptyTablesAreUnknown) {
  CostTables t;
  t.draft = {0, 0.5, 0.4, 0};  // intercept 0.6, below the probe
  t.verify = {1.0, 0.9};
  t.probe = 0.7;
  const CostFeatures f = CostFeaturesOfTables(t);
  EXPECT_FLOAT_EQ(f.layer, 0.0f);
  EXPECT_FLOAT_EQ(f.verify, 0.0f);
  EXPECT_TRUE(CostFeaturesOfTables(CostTables{}) == CostFeatures{});
}

// A cost that is not finite or is negative is refused naming the feature
// under the caller's prefix; valid features (zeros included) pass.
TEST(CostFeaturesTest, CheckCostFeaturesNamesTheBadFeature) {
  EXPECT_TRUE(CheckCostFeatures({0.1f, 1.0f, 0.4f}, "cost.").ok());
  EXPECT_TRUE(CheckCostFeatures(CostFeatures{}, "cost.").ok());
  const Status negative = CheckCostFeatures({0.1f, -1.0f, 0.4f}, "cost.");
  EXPECT_EQ(negative.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(negative.message()).find("cost.layer: "), std::string::npos) << negative.message();
  const Status nan = CheckCostFeatures({0.1f, 1.0f, std::numeric_limits<float>::quiet_NaN()}, "profile ");
  EXPECT_EQ(nan.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(nan.message()).find("profile verify: "), std::string::npos) << nan.message();
  EXPECT_FALSE(CheckCostFeatures({std::numeric_limits<float>::infinity(), 1.0f, 0.0f}, "").ok());
}

// The features enter the network input clamped and scaled (ExitFeatures):
// probe and verify as they are up to 2, layer / 2 up to 4.
TEST(CostFeaturesTest, ExitFeaturesCarryTheCostProfile) {
  ExitState s;
  s.cost = {0.3f, 1.0f, 0.45f};
  float out[kExitFeatureDim];
  ExitFeatures(s, out);
  EXPECT_FLOAT_EQ(out[14], 0.3f);
  EXPECT_FLOAT_EQ(out[15], 0.5f);
  EXPECT_FLOAT_EQ(out[16], 0.45f);
  s.cost = {9.0f, 9.0f, 9.0f};
  ExitFeatures(s, out);
  EXPECT_FLOAT_EQ(out[14], 2.0f);
  EXPECT_FLOAT_EQ(out[15], 2.0f);
  EXPECT_FLOAT_EQ(out[16], 2.0f);
}

}  // namespace
}  // namespace lede::speculation
