// Tests of shared/model/cost/cost_profiles.h: the cost features a cost model
// shows a policy, and the cost model of given features.
#include "shared/model/cost/cost_profiles.h"

#include <cmath>
#include <limits>
#include <memory>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shared/checkpoint/model_config.h"
#include "shared/speculation/cost_features.h"
#include "tests/testing/status_matchers.h"

namespace lede::model::cost {
namespace {

using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using ::testing::HasSubstr;

checkpoint::ModelConfig Config() {
  checkpoint::ModelConfig c;
  c.dim = 64;
  c.hidden_dim = 128;
  c.n_layers = 8;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.vocab_size = 256;
  c.max_seq_len = 128;
  return c;
}

// The accelerator model: a probe is h / L, a layer of a draft 1 / L of a
// step, verification free: features (h / L, 1, 0).
TEST(CostProfilesTest, AcceleratorFeatures) {
  const checkpoint::ModelConfig c = Config();
  auto cost = MakeAcceleratorCostModel(c);
  const speculation::CostFeatures f = CostFeaturesOf(*cost, c.n_layers, 6);
  EXPECT_NEAR(f.probe, HeadLayerEquivalents(c) / c.n_layers, 1e-5);
  EXPECT_NEAR(f.layer, 1.0, 1e-5);
  EXPECT_NEAR(f.verify, 0.0, 1e-6);
}

// A calibration's features come from its step timings, as the model
// services measure theirs; its round table (which books verification with
// the drafts) does not change them, though it prices the rounds.
TEST(CostProfilesTest, CalibrationFeaturesAreThoseOfItsStepTimings) {
  Calibration steps;
  steps.n_layers = 4;
  for (int t = 1; t <= 16; ++t) {
    steps.block_us.push_back(100.0 + 40.0 * t);  // a verified position costs 40 us per block
    steps.head_us.push_back(50.0 + 20.0 * t);
  }
  steps.step_us = 4 * 140.0 + 70.0;
  Calibration rounds = steps;
  rounds.ar_step_us = 630.0;
  rounds.round_us = {{700.0, 900.0, 1100.0}, {800.0, 1100.0, 1400.0}, {900.0, 1300.0, 1700.0}};

  const speculation::CostFeatures of_steps = CostFeaturesOf(*MakeMeasuredCostModel(steps), 4, 3);
  EXPECT_GT(of_steps.verify, 0.1f);
  const speculation::CostFeatures f = CostFeaturesOfCalibration(rounds, 4, 3);
  EXPECT_NEAR(f.probe, of_steps.probe, 1e-6);
  EXPECT_NEAR(f.layer, of_steps.layer, 1e-6);
  EXPECT_NEAR(f.verify, of_steps.verify, 1e-6);
  EXPECT_EQ(CostFeaturesOfCalibration(steps, 4, 3), of_steps);
  // The round table's own features differ (it is what the pricing uses).
  EXPECT_FALSE(CostFeaturesOf(*MakeMeasuredCostModel(rounds), 4, 3) == f);
}

// A calibration timed on the workload's prompts shows the features of its
// steps in context, the same function of the same timings a model service
// shows of its served steps; the probe comes from the step timings apart.
TEST(CostProfilesTest, CalibrationFeaturesAreThoseOfItsStepsInContext) {
  Calibration c;
  c.n_layers = 4;
  for (int t = 1; t <= 16; ++t) {
    c.block_us.push_back(100.0 + 40.0 * t);
    c.head_us.push_back(50.0 + 20.0 * t);
  }
  c.step_us = 4 * 140.0 + 70.0;
  const speculation::CostFeatures apart = CostFeaturesOfCalibration(c, 4, 3);
  // Unit: the autoregressive step, 1 ms. A draft token costs 0.2 + 0.3 l / 4
  // of it at exit layer l <= M = 2 (so layer = 0.3 with draft intercept
  // 0.2), and the line adds 0.25 per draft verified at M. The deep exit
  // layer 3, timed at twice its share (its weights no longer in cache), is
  // left out of the line, as a deployment serving shallow exits never sees it.
  c.context_steps.draft_step_s = {0, 0.275e-3, 0.35e-3, 0.85e-3, 0};
  c.context_steps.verify_s = {1e-3, 1.25e-3, 1.5e-3, 1.75e-3};
  c.context_steps.verify_intercept_s = 1e-3;
  c.context_steps.verify_slope_s = 0.25e-3;
  const speculation::CostFeatures f = CostFeaturesOfCalibration(c, 4, 3);
  EXPECT_NEAR(f.probe, apart.probe, 1e-6);
  EXPECT_NEAR(f.layer, 0.3, 1e-5);
  EXPECT_NEAR(f.verify, 0.25, 1e-5);  // the line's slope / unit (the draft intercept is not added)
  const speculation::CostFeatures served = speculation::MeasuredStepFeatures(
      c.context_steps.draft_step_s, c.context_steps.verify_s, c.context_steps.verify_intercept_s,
      c.context_steps.verify_slope_s, apart);
  EXPECT_EQ(f, served);
  // Without its line, the verify feature is the slope of the medians plus
  // the part of a draft its layers do not explain (0.2 - probe).
  c.context_steps.verify_intercept_s = c.context_steps.verify_slope_s = 0;
  const speculation::CostFeatures no_line = CostFeaturesOfCalibration(c, 4, 3);
  EXPECT_NEAR(no_line.verify, 0.25 + 0.2 - apart.probe, 1e-5);
}

// The profile cost model prices as its features say, and shows exactly
// those features again (the round trip a cost-conditioned policy relies on:
// it is trained on the features of the model that prices its rewards).
TEST(CostProfilesTest, ProfileCostModelRoundTrips) {
  const speculation::CostFeatures f{0.3f, 1.2f, 0.45f};
  auto made = MakeProfileCostModel(f, 8);
  ASSERT_THAT(made, IsOk());
  const CostModel& cost = **made;
  EXPECT_EQ(cost.name(), "profile");
  EXPECT_NEAR(cost.DraftToken(4), 0.3 + 1.2 * 4 / 8, 1e-6);
  EXPECT_NEAR(cost.Verify(4, 3), 1.0 + 0.45 * 3, 1e-6);
  EXPECT_NEAR(cost.Probe(), 0.3, 1e-6);
  const speculation::CostFeatures back = CostFeaturesOf(cost, 8, 6);
  EXPECT_NEAR(back.probe, f.probe, 1e-5);
  EXPECT_NEAR(back.layer, f.layer, 1e-5);
  EXPECT_NEAR(back.verify, f.verify, 1e-5);
  // Three drafts at layer 2 and their verification: 3 (0.3 + 0.3) + 2.35.
  speculation::RoundRecord r;
  r.exit_layer = 2;
  r.n_drafted = 3;
  EXPECT_NEAR(cost.RoundCost(r), 3 * (0.3 + 1.2 * 2 / 8) + 1.0 + 0.45 * 3, 1e-6);
}

TEST(CostProfilesTest, BadProfilesAreRefusedNamingTheFeature) {
  EXPECT_THAT(MakeProfileCostModel({-0.1f, 1, 0}, 8), StatusIs(StatusCode::kInvalidArgument, HasSubstr("probe")));
  EXPECT_THAT(MakeProfileCostModel({0, std::numeric_limits<float>::infinity(), 0}, 8),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("layer")));
  EXPECT_THAT(MakeProfileCostModel({0, 1, std::nanf("")}, 8), StatusIs(StatusCode::kInvalidArgument, HasSubstr("verify")));
  EXPECT_THAT(MakeProfileCostModel({0, 1, 0}, 1), StatusIs(StatusCode::kInvalidArgument, HasSubstr("n_layers")));
}

TEST(CostProfilesTest, ParsesProbeLayerVerify) {
  auto f = ParseCostFeatures("0.2:1:0.45");
  ASSERT_THAT(f, IsOk());
  EXPECT_FLOAT_EQ(f->probe, 0.2f);
  EXPECT_FLOAT_EQ(f->layer, 1.0f);
  EXPECT_FLOAT_EQ(f->verify, 0.45f);
  for (const char* bad : {"", "0.2:1", "0.2:1:0.4:9", "a:1:0", "0.2:-1:0", "0.2::0", "0.2:1:0:", "nan:1:0"}) {
    EXPECT_THAT(ParseCostFeatures(bad), StatusIs(StatusCode::kInvalidArgument, HasSubstr("probe:layer:verify")))
        << bad;
  }
}

}  // namespace
}  // namespace lede::model::cost
