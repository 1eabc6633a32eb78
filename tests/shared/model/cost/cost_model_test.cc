// Tests of shared/model/cost/cost_model.h: the measured cost model from the
// in-context round table and from the older block tables, the calibration
// file format, and the round calibration's shape.
#include "shared/model/cost/cost_model.h"

#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/shared/model/model_fixtures.h"
#include "tests/testing/status_matchers.h"

namespace lede::model::cost {
namespace {

using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using ::testing::HasSubstr;

// Block and head tables: block(T) = 100 + 10 T, head(T) = 50 + 5 T us.
Calibration TableCalibration(int64_t n_layers) {
  Calibration c;
  c.model_fingerprint = "f";
  c.device = "cpu";
  c.n_layers = n_layers;
  for (int t = 1; t <= 16; ++t) {
    c.block_us.push_back(100.0 + 10.0 * t);
    c.head_us.push_back(50.0 + 5.0 * t);
  }
  c.step_us = 1500.0;
  c.decision_us = 12.0;
  return c;
}

RoundRecord Round(int32_t exit_layer, int32_t n_drafted) {
  RoundRecord r;
  r.exit_layer = exit_layer;
  r.n_drafted = n_drafted;
  return r;
}

TEST(MeasuredCostModelTest, BlockTablesPriceDraftsAndVerification) {
  const Calibration c = TableCalibration(4);
  auto m = MakeMeasuredCostModel(c);
  EXPECT_DOUBLE_EQ(m->DraftToken(2), (2 * 110.0 + 55.0) / 1500.0);
  // Layers < E for the last draft, layers >= E for K + 1 positions, head for K + 1.
  EXPECT_DOUBLE_EQ(m->Verify(1, 3), (110.0 + 3 * 140.0 + 70.0) / 1500.0);
  EXPECT_DOUBLE_EQ(m->Probe(), 55.0 / 1500.0);
  EXPECT_DOUBLE_EQ(m->Decision(), 12.0 / 1500.0);
  EXPECT_DOUBLE_EQ(m->RoundCost(Round(0, 0)), 1.0);
}

TEST(MeasuredCostModelTest, RoundTableIsPricedByItsMonotoneEntries) {
  Calibration c = TableCalibration(3);
  c.ar_step_us = 1000.0;
  // E = 1: exactly 1200 + 300 K. E = 2: {1000, 3000, 2000}: not monotone,
  // made {1000, 2500, 2500} (the violating pair pooled); its least-squares
  // slope over K = 1..3 is 500.
  c.round_us = {{1500.0, 1800.0, 2100.0}, {1000.0, 3000.0, 2000.0}};
  auto m = MakeMeasuredCostModel(c);
  EXPECT_DOUBLE_EQ(m->DraftToken(1), 0.3);
  EXPECT_DOUBLE_EQ(m->DraftToken(2), 0.5);
  for (int32_t k : {1, 2, 3, 6}) {  // beyond the table too: 0.3 per further draft
    SCOPED_TRACE(k);
    EXPECT_NEAR(m->Verify(1, k), 1.2, 1e-12);
    EXPECT_NEAR(m->RoundCost(Round(1, k)), 1.2 + 0.3 * k, 1e-12);
  }
  EXPECT_NEAR(m->RoundCost(Round(2, 1)), 1.0, 1e-12);
  EXPECT_NEAR(m->RoundCost(Round(2, 2)), 2.5, 1e-12);
  EXPECT_NEAR(m->RoundCost(Round(2, 3)), 2.5, 1e-12);
  EXPECT_NEAR(m->RoundCost(Round(2, 5)), 2.5 + 2 * 0.5, 1e-12);
  // A round of one more draft never costs less.
  for (int32_t e : {1, 2}) {
    for (int32_t k = 1; k < 8; ++k) EXPECT_LE(m->RoundCost(Round(e, k)), m->RoundCost(Round(e, k + 1)) + 1e-12);
  }
  // Units are the autoregressive round of the same loop, not the kernel step.
  EXPECT_DOUBLE_EQ(m->RoundCost(Round(0, 0)), 1.0);
  EXPECT_DOUBLE_EQ(m->Probe(), 55.0 / 1000.0);
  EXPECT_DOUBLE_EQ(m->Decision(), 12.0 / 1000.0);
  // Exit layers outside the table fall back to the block tables.
  EXPECT_DOUBLE_EQ(m->DraftToken(3), (3 * 110.0 + 55.0) / 1000.0);
  // A speed-up of rounds is tokens over their cost.
  RoundRecord r = Round(1, 2);
  r.n_emitted = 3;
  EXPECT_NEAR(m->PredictedSpeedup({r, r}), 6.0 / (2 * 1.8), 1e-12);
}

// A table of the form a_K + (g + d K) E is its own fit; one cell a noisy
// pass made 30% slow is priced as its neighbours say, not as timed.
TEST(MeasuredCostModelTest, RoundTableNoiseInOneCellIsSmoothedAway) {
  const std::vector<double> a = {900.0, 1000.0, 1150.0, 1250.0};  // per K; not linear in K
  const double g = 40.0, d = 25.0;
  std::vector<std::vector<double>> exact;
  for (int e = 1; e <= 5; ++e) {
    exact.emplace_back();
    for (int k = 1; k <= 4; ++k) exact.back().push_back(a[k - 1] + (g + d * k) * e);
  }
  const std::vector<std::vector<double>> fit = SmoothRoundTable(exact);
  ASSERT_EQ(fit.size(), exact.size());
  for (size_t e = 0; e < exact.size(); ++e) {
    for (size_t k = 0; k < exact[e].size(); ++k) EXPECT_NEAR(fit[e][k], exact[e][k], 1e-6) << e << "," << k;
  }
  std::vector<std::vector<double>> noisy = exact;
  noisy[1][1] *= 1.3;  // E = 2, K = 2
  const std::vector<std::vector<double>> robust = SmoothRoundTable(noisy);
  for (size_t e = 0; e < exact.size(); ++e) {
    for (size_t k = 0; k < exact[e].size(); ++k) EXPECT_NEAR(robust[e][k], exact[e][k], 1e-3 * exact[e][k]);
  }
  Calibration c = TableCalibration(6);
  c.ar_step_us = 1000.0;
  c.round_us = noisy;
  auto m = MakeMeasuredCostModel(c);
  EXPECT_NEAR(m->RoundCost(Round(2, 2)), exact[1][1] / 1000.0, 1e-3 * exact[1][1] / 1000.0);
  // Fewer than kMinSmoothedExitLayers rows: as timed.
  const std::vector<std::vector<double>> two = {noisy[0], noisy[1]};
  EXPECT_EQ(SmoothRoundTable(two), two);
}

// Rows far from an exit layer do not price it: three deep exit layers
// timed 1.7x (as a VM timed them, with the line over all rows then pricing
// E = 1 28% under its cells) leave the shallow rows as timed.
TEST(MeasuredCostModelTest, RoundTableRowsFarAwayDoNotPriceAnExitLayer) {
  const std::vector<double> a = {900.0, 1000.0, 1150.0, 1250.0, 1500.0, 1700.0};
  const double g = 40.0, d = 25.0;
  std::vector<std::vector<double>> table;
  for (int e = 1; e <= 11; ++e) {
    table.emplace_back();
    for (int k = 1; k <= 6; ++k) table.back().push_back(a[k - 1] + (g + d * k) * e);
  }
  const std::vector<std::vector<double>> exact = table;
  for (int e = 9; e <= 11; ++e) {
    for (double& cell : table[e - 1]) cell *= 1.7;
  }
  const std::vector<std::vector<double>> fit = SmoothRoundTable(table);
  ASSERT_EQ(fit.size(), table.size());
  for (size_t e = 0; e < 6; ++e) {  // E = 1..6: windows without a slow row
    for (size_t k = 0; k < exact[e].size(); ++k) {
      EXPECT_NEAR(fit[e][k], exact[e][k], 1e-3 * exact[e][k]) << "E=" << e + 1 << " K=" << k + 1;
    }
  }
  for (size_t k = 0; k < exact[10].size(); ++k) EXPECT_GT(fit[10][k], 1.3 * exact[10][k]);  // timed slow
}

// A round with a controller's decisions pays the signals of each draft and
// of each wasted probe; a static round (no decision) pays none.
TEST(MeasuredCostModelTest, ControlledRoundsPayTheSignalsOfTheirDraftsAndProbes) {
  Calibration c = TableCalibration(4);
  c.signals_us = 30.0;
  auto m = MakeMeasuredCostModel(c);
  EXPECT_DOUBLE_EQ(m->Signals(), 30.0 / 1500.0);
  EXPECT_DOUBLE_EQ(m->ControlledDraftToken(2), m->DraftToken(2) + 30.0 / 1500.0);
  EXPECT_DOUBLE_EQ(m->ControlledProbe(), m->Probe() + 30.0 / 1500.0);
  const RoundRecord fixed = Round(2, 3);
  RoundRecord controlled = fixed;
  controlled.n_decisions = 5;
  controlled.n_probes = 1;
  EXPECT_NEAR(m->RoundCost(controlled) - m->RoundCost(fixed),
              5 * m->Decision() + 1 * m->ControlledProbe() + 3 * m->Signals(), 1e-12);
  // The accelerator model prices neither.
  auto accel = MakeAcceleratorCostModel(testing::TinyConfig());
  EXPECT_EQ(accel->Signals(), 0.0);
  EXPECT_EQ(accel->Decision(), 0.0);
}

TEST(CalibrationJsonTest, RoundTripKeepsTheRoundTable) {
  Calibration c = TableCalibration(3);
  c.ar_step_us = 990.0;
  c.round_us = {{1.0e3, 2.0e3}, {1.5e3, 2.5e3}};
  c.signals_us = 7.5;
  auto back = CalibrationFromJson(CalibrationToJson(c));
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(back->round_us, c.round_us);
  EXPECT_DOUBLE_EQ(back->signals_us, 7.5);
  EXPECT_DOUBLE_EQ(back->decision_us, 12.0);
  EXPECT_DOUBLE_EQ(back->ar_step_us, 990.0);
  EXPECT_EQ(back->block_us, c.block_us);
  // A file without a round table (written before rounds were timed) loads.
  Calibration old = TableCalibration(3);
  auto legacy = CalibrationFromJson(CalibrationToJson(old));
  ASSERT_THAT(legacy, IsOk());
  EXPECT_TRUE(legacy->round_us.empty());
}

// The steps of a few short generations, timed as a model service times
// its served ones: draft entries at the exit layers asked for only,
// verifications of 0 and K drafts, and a verification line.
TEST(CalibrateTest, TimesStepsInContextAtTheExitLayersAskedFor) {
  auto model = LlamaModel::RandomInit(testing::TinyConfig(), /*seed=*/3, ModelOptions{}, 0.3);
  ASSERT_THAT(model, IsOk());
  auto steps = TimeStepsInContext(**model, {1, 2}, /*draft_len=*/2, /*new_tokens=*/12, /*passes=*/1);
  ASSERT_THAT(steps, IsOk());
  ASSERT_EQ(steps->draft_step_s.size(), 5u);  // [L + 1], L = 4
  EXPECT_GT(steps->draft_step_s[1], 0.0);
  EXPECT_GT(steps->draft_step_s[2], 0.0);
  EXPECT_EQ(steps->draft_step_s[3], 0.0);
  ASSERT_GE(steps->verify_s.size(), 3u);
  EXPECT_GT(steps->verify_s[0], 0.0);
  EXPECT_GT(steps->verify_s[2], 0.0);
  EXPECT_GT(steps->verify_intercept_s, 0.0);
  EXPECT_THAT(TimeStepsInContext(**model, {4}, 2, 12),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("exit_layers")));
  EXPECT_THAT(TimeStepsInContext(**model, {}, 2, 12),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("exit_layers")));
  EXPECT_THAT(TimeStepsInContext(**model, {1}, 0, 12),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("draft_len")));
  EXPECT_THAT(TimeStepsInContext(**model, {1}, 2, 1),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("new_tokens")));
  EXPECT_THAT(TimeStepsInContext(**model, {1}, 2, 100),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("new_tokens")));
  EXPECT_THAT(TimeStepsInContext(**model, {1}, 2, 12, 0),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("passes")));
}

TEST(CalibrationJsonTest, MalformedContextStepsAreRefusedNamingThem) {
  Calibration c = TableCalibration(3);
  c.context_steps.draft_step_s = {0, 1e-3, 2e-3};  // n_layers + 1 = 4 wanted
  c.context_steps.verify_s = {5e-3, 6e-3};
  EXPECT_THAT(CalibrationFromJson(CalibrationToJson(c)),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("context_steps")));
  c.context_steps.draft_step_s = {0, 1e-3, 2e-3, 0};
  c.context_steps.verify_s = {5e-3, -6e-3};
  EXPECT_THAT(CalibrationFromJson(CalibrationToJson(c)),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("context_steps")));
  c.context_steps.verify_s = {5e-3, 6e-3};
  EXPECT_THAT(CalibrationFromJson(CalibrationToJson(c)), IsOk());
}

TEST(CalibrationJsonTest, MalformedRoundTableIsRefusedNamingIt) {
  Calibration c = TableCalibration(3);
  c.ar_step_us = 1000.0;
  c.round_us = {{1.0e3, 2.0e3}};  // n_layers - 1 = 2 rows wanted
  EXPECT_THAT(CalibrationFromJson(CalibrationToJson(c)),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("round_us")));
  c.round_us = {{1.0e3, 2.0e3}, {1.0e3, -1.0}};
  EXPECT_THAT(CalibrationFromJson(CalibrationToJson(c)),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("round_us")));
  c.round_us = {{1.0e3, 2.0e3}, {1.0e3}};
  EXPECT_THAT(CalibrationFromJson(CalibrationToJson(c)),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("round_us")));
}

// The values are timings (not asserted); the table's shape and units are.
TEST(CalibrateTest, TimesARoundOfEveryExitLayerAndDraftLength) {
  auto model = LlamaModel::RandomInit(testing::TinyConfig(), /*seed=*/3, ModelOptions{}, 0.3);
  ASSERT_THAT(model, IsOk());
  auto cal = Calibrate(**model, /*repeats=*/2, nullptr, /*round_passes=*/1, /*round_max_draft_len=*/3);
  ASSERT_THAT(cal, IsOk());
  ASSERT_EQ(cal->round_us.size(), 3u);  // E = 1..L-1, L = 4
  for (const auto& row : cal->round_us) {
    ASSERT_EQ(row.size(), 3u);
    for (double us : row) EXPECT_GT(us, 0.0);
  }
  EXPECT_GT(cal->ar_step_us, 0.0);
  EXPECT_GT(cal->signals_us, 0.0);
  EXPECT_EQ(cal->decision_us, 0.0);  // no decide function given
  // It loads back as a valid calibration.
  EXPECT_THAT(CalibrationFromJson(CalibrationToJson(*cal)), IsOk());
  // A draft length the context cannot hold the 4 warm-up rounds and three
  // timed rounds of is left out (context 96, prompt 48: 47 tokens of room,
  // K + 1 <= 47 / 7, K <= 5).
  auto capped = Calibrate(**model, 2, nullptr, /*round_passes=*/1, /*round_max_draft_len=*/16);
  ASSERT_THAT(capped, IsOk());
  ASSERT_EQ(capped->round_us.size(), 3u);
  EXPECT_EQ(capped->round_us[0].size(), 5u);
  // On the workload's prompts: whole generations, every (E, K) timed.
  std::vector<std::vector<int32_t>> prompts = {{1, 5, 9, 13}, {1, 7, 7, 2, 30, 31, 8, 4, 4}};
  auto on_prompts = Calibrate(**model, 2, nullptr, /*round_passes=*/2, /*round_max_draft_len=*/4, prompts,
                              /*round_new_tokens=*/24);
  ASSERT_THAT(on_prompts, IsOk());
  ASSERT_EQ(on_prompts->round_us.size(), 3u);
  for (const auto& row : on_prompts->round_us) {
    ASSERT_EQ(row.size(), 4u);
    for (double us : row) EXPECT_GT(us, 0.0);
  }
  EXPECT_GT(on_prompts->ar_step_us, 0.0);
  // Its generations' steps, timed as a model service times its served
  // ones: a draft time per exit layer, verifications of 0..4 drafts and a
  // line through them; they load back.
  const ServedStepCosts& steps = on_prompts->context_steps;
  ASSERT_EQ(steps.draft_step_s.size(), 5u);  // [L + 1]
  EXPECT_EQ(steps.draft_step_s[0], 0.0);
  EXPECT_EQ(steps.draft_step_s[4], 0.0);
  for (int e = 1; e <= 3; ++e) EXPECT_GT(steps.draft_step_s[e], 0.0) << e;
  ASSERT_EQ(steps.verify_s.size(), 5u);
  for (double s : steps.verify_s) EXPECT_GT(s, 0.0);
  EXPECT_GT(steps.verify_intercept_s, 0.0);
  auto reloaded = CalibrationFromJson(CalibrationToJson(*on_prompts));
  ASSERT_THAT(reloaded, IsOk());
  EXPECT_EQ(reloaded->context_steps.draft_step_s, steps.draft_step_s);
  EXPECT_EQ(reloaded->context_steps.verify_s, steps.verify_s);
  EXPECT_DOUBLE_EQ(reloaded->context_steps.verify_slope_s, steps.verify_slope_s);
  // The synthetic prompt's calibration has none.
  EXPECT_TRUE(cal->context_steps.draft_step_s.empty());
  // Prompts that cannot hold the generation are refused, naming the field.
  std::vector<std::vector<int32_t>> too_long = {std::vector<int32_t>(95, 1)};
  EXPECT_THAT(Calibrate(**model, 2, nullptr, 1, 4, too_long, 24),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("round_prompts")));
  EXPECT_THAT(Calibrate(**model, 2, nullptr, 1, 4, prompts, 1),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("round_new_tokens")));
  // Without round passes, only the kernel tables.
  auto kernels_only = Calibrate(**model, 2, nullptr, /*round_passes=*/0);
  ASSERT_THAT(kernels_only, IsOk());
  EXPECT_TRUE(kernels_only->round_us.empty());
}

// Batch tables of two sizes, B = 1 and 4, K = 1..2, worked by hand below.
Calibration WithBatchTables(Calibration c) {
  c.batch_sizes = {1, 4};
  c.batch_exit_layer = 1;
  c.batch_context = 8;
  c.batch_step_us = {100.0, 200.0};                  // 4 sessions' steps cost 2 of one
  c.batch_verify_us = {{150.0, 200.0}, {500.0, 800.0}};
  c.batch_draft_us = {20.0, 30.0};
  return c;
}

TEST(CostModelAtLoadTest, MeasuredPricesScaleByTheBatchTables) {
  const Calibration c = WithBatchTables(TableCalibration(4));
  auto alone = MakeMeasuredCostModel(c);
  auto one = MakeMeasuredCostModelAtLoad(c, 1);
  ASSERT_THAT(one, IsOk());
  for (int32_t k = 1; k <= 4; ++k) EXPECT_DOUBLE_EQ((*one)->RoundCost(Round(2, k)), alone->RoundCost(Round(2, k)));
  auto four = MakeMeasuredCostModelAtLoad(c, 4);
  ASSERT_THAT(four, IsOk());
  // Verify K = 1: (500 / 200) / (150 / 100) = 5/3; K = 2: (800 / 200) / (200 / 100) = 2; K > 2 as K = 2.
  EXPECT_DOUBLE_EQ((*four)->Verify(2, 1), alone->Verify(2, 1) * 5.0 / 3.0);
  EXPECT_DOUBLE_EQ((*four)->Verify(2, 2), alone->Verify(2, 2) * 2.0);
  EXPECT_DOUBLE_EQ((*four)->Verify(2, 3), alone->Verify(2, 3) * 2.0);
  EXPECT_DOUBLE_EQ((*four)->Verify(2, 0), alone->Verify(2, 0));  // a plain step
  // Drafts and probes: (30 / 200) / (20 / 100) = 0.75.
  EXPECT_DOUBLE_EQ((*four)->DraftToken(3), alone->DraftToken(3) * 0.75);
  EXPECT_DOUBLE_EQ((*four)->Probe(), alone->Probe() * 0.75);
  // Decisions are per session against a step 4 sessions share: 4 * 100 / 200 = 2.
  EXPECT_DOUBLE_EQ((*four)->Decision(), alone->Decision() * 2.0);
  EXPECT_DOUBLE_EQ((*four)->Step(), 1.0);
  // B = 2 lies halfway in log2(B): factors halfway, e.g. verify K = 2 at 1.5.
  auto two = MakeMeasuredCostModelAtLoad(c, 2);
  ASSERT_THAT(two, IsOk());
  EXPECT_DOUBLE_EQ((*two)->Verify(2, 2), alone->Verify(2, 2) * 1.5);
  EXPECT_DOUBLE_EQ((*two)->Decision(), alone->Decision() * 1.5);
}

TEST(CostModelAtLoadTest, MeasuredRefusesLoadsItHasNoTableFor) {
  const Calibration plain = TableCalibration(4);
  EXPECT_THAT(MakeMeasuredCostModelAtLoad(plain, 1),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("--batch-sizes")));
  const Calibration c = WithBatchTables(plain);
  EXPECT_THAT(MakeMeasuredCostModelAtLoad(c, 5), StatusIs(StatusCode::kInvalidArgument, HasSubstr("load")));
  EXPECT_THAT(MakeMeasuredCostModelAtLoad(c, 0), StatusIs(StatusCode::kInvalidArgument, HasSubstr("load")));
}

TEST(CostModelAtLoadTest, AcceleratorVerificationIsFreeUntilTheBatchFillsTheRidge) {
  const checkpoint::ModelConfig config = testing::TinyConfig();
  auto alone = MakeAcceleratorCostModel(config);
  // Ridge 64 tokens: at B = 16 a round of 3 drafts verifies 64 positions, still one pass.
  auto b16 = MakeAcceleratorCostModelAtLoad(config, 16, 64.0);
  EXPECT_DOUBLE_EQ(b16->RoundCost(Round(1, 3)), alone->RoundCost(Round(1, 3)));
  EXPECT_DOUBLE_EQ(b16->Verify(1, 7), 2.0);  // 128 positions: two passes' worth
  // At B = 128 an autoregressive step already costs 2 passes; K drafts cost K + 1 of it.
  auto b128 = MakeAcceleratorCostModelAtLoad(config, 128, 64.0);
  EXPECT_DOUBLE_EQ(b128->Verify(1, 3), 4.0);
  EXPECT_DOUBLE_EQ(b128->DraftToken(2), alone->DraftToken(2));
  EXPECT_DOUBLE_EQ(b128->Probe(), alone->Probe());
}

TEST(CalibrationJsonTest, RoundTripKeepsTheBatchTablesAndRefusesMalformedOnes) {
  const Calibration c = WithBatchTables(TableCalibration(4));
  auto back = CalibrationFromJson(CalibrationToJson(c));
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(back->batch_sizes, c.batch_sizes);
  EXPECT_EQ(back->batch_exit_layer, 1);
  EXPECT_EQ(back->batch_verify_us, c.batch_verify_us);
  EXPECT_EQ(back->batch_draft_us, c.batch_draft_us);
  Calibration bad = c;
  bad.batch_sizes = {2, 4};  // must start at 1
  EXPECT_THAT(CalibrationFromJson(CalibrationToJson(bad)),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("batch_sizes")));
  bad = c;
  bad.batch_verify_us[1].pop_back();  // rows of unequal length
  EXPECT_THAT(CalibrationFromJson(CalibrationToJson(bad)),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("batch_verify_us")));
}

TEST(CalibrateTest, TimesBatchedStepsOfEverySize) {
  auto model = LlamaModel::RandomInit(testing::TinyConfig(), /*seed=*/3, ModelOptions{}, 0.3);
  ASSERT_THAT(model, IsOk());
  Calibration cal;
  ASSERT_THAT(CalibrateBatches(**model, /*repeats=*/2, {1, 2, 4}, /*exit_layer=*/2, /*max_draft_len=*/3,
                               /*context=*/16, &cal),
              IsOk());
  EXPECT_EQ(cal.batch_sizes, (std::vector<int64_t>{1, 2, 4}));
  ASSERT_EQ(cal.batch_step_us.size(), 3u);
  ASSERT_EQ(cal.batch_verify_us.size(), 3u);
  ASSERT_EQ(cal.batch_draft_us.size(), 3u);
  for (size_t b = 0; b < 3; ++b) {
    EXPECT_GT(cal.batch_step_us[b], 0.0);
    EXPECT_GT(cal.batch_draft_us[b], 0.0);
    ASSERT_EQ(cal.batch_verify_us[b].size(), 3u);
    for (double us : cal.batch_verify_us[b]) EXPECT_GT(us, 0.0);
  }
  EXPECT_THAT(CalibrateBatches(**model, 2, {2, 4}, 2, 3, 16, &cal),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("batch_sizes")));
  EXPECT_THAT(CalibrateBatches(**model, 2, {1, 2}, 4, 3, 16, &cal),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("exit_layer")));
  EXPECT_THAT(CalibrateBatches(**model, 2, {1, 2}, 2, 3, 4000, &cal),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("context")));
}

}  // namespace
}  // namespace lede::model::cost

namespace lede::model::cost {
namespace {

// TinyConfig with 4 layers; its head in block equivalents is h.
ServedStepCosts FourLayerCosts(const checkpoint::ModelConfig& c) {
  const double h = HeadLayerEquivalents(c);
  ServedStepCosts s;
  s.draft_step_s.assign(c.n_layers + 1, 0.0);
  // One block costs 1 ms, a full step (4 blocks + head) 4 + h ms; E = 2 drafts measured.
  s.draft_step_s[2] = (2 + h) * 1e-3;
  s.verify_s = {(4 + h) * 1e-3, 0.0, (4 + h) * 1.5e-3, 0.0};
  s.verify_intercept_s = (4 + h) * 1e-3;
  s.verify_slope_s = (4 + h) * 0.25e-3;
  return s;
}

// Measured entries are priced as measured, in units of the measured autoregressive step; the exit layers and
// draft lengths never served are priced from the block share and the verification line.
TEST(ServedCostModelTest, PricesMeasuredEntriesAndExtrapolatesTheRest) {
  checkpoint::ModelConfig c = testing::TinyConfig();
  c.n_layers = 4;
  const double h = HeadLayerEquivalents(c);
  auto m = MakeServedCostModel(c, FourLayerCosts(c));
  ASSERT_THAT(m.status(), IsOk());
  const CostModel& cm = **m;
  EXPECT_EQ(cm.name(), "served");
  EXPECT_DOUBLE_EQ(cm.Verify(1, 0), 1.0);
  EXPECT_NEAR(cm.DraftToken(2), (2 + h) / (4 + h), 1e-12);
  EXPECT_NEAR(cm.DraftToken(3), (3 + h) / (4 + h), 1e-12);  // one block's share from E = 2
  EXPECT_NEAR(cm.Probe(), h / (4 + h), 1e-12);
  EXPECT_NEAR(cm.Verify(2, 2), 1.5, 1e-12);
  EXPECT_NEAR(cm.Verify(2, 1), 1.25, 1e-12);  // the line
  EXPECT_NEAR(cm.Verify(2, 3), 1.75, 1e-12);  // the line, above the measured K = 2
  // Drafts at another exit layer run through other blocks of the verifier: (L - E + h) / (L - M + h) drafts
  // at the middle exit layer M = 2 each.
  EXPECT_NEAR(cm.Verify(1, 2), 1 + 0.25 * 2 * (3 + h) / (2 + h), 1e-12);
  EXPECT_NEAR(cm.Verify(3, 2), 1 + 0.25 * 2 * (1 + h) / (2 + h), 1e-12);
  EXPECT_DOUBLE_EQ(cm.Decision(), 0.0);
  EXPECT_DOUBLE_EQ(cm.Signals(), 0.0);
  // A round of 2 drafts at E = 2: two drafts and one verification of 2.
  EXPECT_NEAR(cm.RoundCost(Round(2, 2)), 2 * (2 + h) / (4 + h) + 1.5, 1e-12);
}

// A slower verification (8-bit weights on a CPU) makes a round cost more than under the accelerator model,
// which prices any verification as one step.
TEST(ServedCostModelTest, CostlyVerificationPricesDeepDraftsHigherThanAccelerator) {
  checkpoint::ModelConfig c = testing::TinyConfig();
  c.n_layers = 4;
  auto m = MakeServedCostModel(c, FourLayerCosts(c));
  ASSERT_THAT(m.status(), IsOk());
  auto acc = MakeAcceleratorCostModel(c);
  EXPECT_GT((*m)->Verify(2, 3), acc->Verify(2, 3));
}

// Without an autoregressive step or any draft entry there is nothing to price with: FAILED_PRECONDITION, and
// a table of the wrong size names draft_step_s.
TEST(ServedCostModelTest, RefusesProfilesThatCannotPrice) {
  checkpoint::ModelConfig c = testing::TinyConfig();
  c.n_layers = 4;
  ServedStepCosts s = FourLayerCosts(c);
  s.verify_s[0] = 0.0;
  s.verify_intercept_s = 0.0;
  EXPECT_THAT(MakeServedCostModel(c, s).status(), StatusIs(absl::StatusCode::kFailedPrecondition));
  s = FourLayerCosts(c);
  s.draft_step_s.assign(5, 0.0);
  EXPECT_THAT(MakeServedCostModel(c, s).status(), StatusIs(absl::StatusCode::kFailedPrecondition));
  s.draft_step_s.assign(3, 1e-3);
  auto bad = MakeServedCostModel(c, s);
  EXPECT_THAT(bad.status(), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(bad.status().message(), HasSubstr("draft_step_s"));
}

}  // namespace
}  // namespace lede::model::cost

namespace lede::model::cost {
namespace {

RoundRecord TimedRound(int32_t exit_layer, int32_t n_drafted, double draft_s, double verify_s, int32_t n_probes = 0) {
  RoundRecord r = Round(exit_layer, n_drafted);
  r.n_probes = n_probes;
  r.draft_s = draft_s, r.verify_s = verify_s;
  return r;
}

// Rounds timed as a model service meters them: a draft entry per drafted token at its exit layer, medians
// per draft length, the verification line through the per-(E, K) medians; a round that probed and drafted
// nothing is not a verification (its step resumed after the probe), and an untimed draft adds nothing.
TEST(RoundStepTimingsTest, MediansAndLineAsTheServedMeter) {
  const int64_t L = 4;
  const double h = 0.5;
  RoundStepTimings t(L);
  for (double ar : {9e-3, 10e-3, 30e-3}) t.Add(TimedRound(0, 0, 0, ar));  // a stall among three steps
  t.Add(TimedRound(0, 0, 1e-3, 2e-3, /*n_probes=*/1));                      // probed, drafted nothing
  // At the middle exit layer M = 2 a draft counts 1: verify = 10 ms + 2 ms per draft.
  t.Add(TimedRound(2, 2, 2 * 3e-3, 14e-3));
  t.Add(TimedRound(2, 2, 2 * 5e-3, 14e-3));
  t.Add(TimedRound(2, 4, 4 * 4e-3, 18e-3));
  t.Add(TimedRound(1, 1, 0, 0));  // untimed
  const ServedStepCosts c = t.Costs(h);
  ASSERT_EQ(c.draft_step_s.size(), static_cast<size_t>(L + 1));
  EXPECT_DOUBLE_EQ(c.draft_step_s[1], 0.0);
  EXPECT_NEAR(c.draft_step_s[2], 4e-3, 1e-12);  // median of 3, 5 and 4 ms per token
  ASSERT_EQ(c.verify_s.size(), 5u);
  EXPECT_NEAR(c.verify_s[0], 10e-3, 1e-12);  // the probe's resumed step (2 ms) left out
  EXPECT_NEAR(c.verify_s[2], 14e-3, 1e-12);
  EXPECT_NEAR(c.verify_s[4], 18e-3, 1e-12);
  EXPECT_DOUBLE_EQ(c.verify_s[1], 0.0);
  EXPECT_NEAR(c.verify_intercept_s, 10e-3, 1e-9);
  EXPECT_NEAR(c.verify_slope_s, 2e-3, 1e-9);
}

}  // namespace
}  // namespace lede::model::cost
