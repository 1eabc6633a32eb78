#include "trainer/dqn_flags.h"

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "shared/flags/flags.h"
#include "tests/testing/status_matchers.h"

namespace lede::trainer {
namespace {

using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using ::testing::HasSubstr;

// Parses `args` into a group of `scope` started from `defaults` and applies it.
StatusOr<DqnOptions> Parse(const std::vector<std::string>& args, DqnFlagScope scope,
                           const DqnOptions& defaults = DqnOptions{}) {
  DqnFlags values(defaults);
  flags::FlagSet f;
  AddDqnFlags(f, &values, scope);
  if (Status s = f.Parse(args); !s.ok()) return s;
  DqnOptions o = defaults;
  if (Status s = ApplyDqnFlags(values, scope, &o); !s.ok()) return s;
  return o;
}

TEST(DqnFlagsTest, NoFlagsKeepTheDefaults) {
  DqnOptions defaults;
  defaults.epochs = 16;
  defaults.batch_size = 256;
  StatusOr<DqnOptions> o = Parse({}, DqnFlagScope::kTd, defaults);
  ASSERT_THAT(o, IsOk());
  EXPECT_EQ(o->epochs, 16);
  EXPECT_EQ(o->batch_size, 256);
  EXPECT_EQ(o->hidden, defaults.hidden);
  EXPECT_EQ(o->n_step, defaults.n_step);
  EXPECT_EQ(o->target_update, TargetUpdate::kHard);
  EXPECT_DOUBLE_EQ(o->gamma, defaults.gamma);
  EXPECT_DOUBLE_EQ(o->heldout_fraction, defaults.heldout_fraction);
}

TEST(DqnFlagsTest, LearningRateHasOneDefaultWhateverTheCallersDefaults) {
  DqnOptions fine_tune;
  fine_tune.lr = 3e-4;  // a caller's own default does not change the flag's
  for (DqnFlagScope scope : {DqnFlagScope::kCore, DqnFlagScope::kTd}) {
    StatusOr<DqnOptions> o = Parse({}, scope, fine_tune);
    ASSERT_THAT(o, IsOk());
    EXPECT_DOUBLE_EQ(o->lr, 1e-3);
    EXPECT_DOUBLE_EQ(o->lr, DqnOptions{}.lr);
  }
  flags::FlagSet f;
  DqnFlags values{DqnOptions{}};
  AddDqnFlags(f, &values, DqnFlagScope::kCore);
  EXPECT_THAT(f.Usage(), HasSubstr("--lr"));
  EXPECT_THAT(f.Usage(), HasSubstr("training_options.lr"));  // the help says why
}

TEST(DqnFlagsTest, CoreFlagsApply) {
  StatusOr<DqnOptions> o = Parse({"--seed", "7", "--epochs=3", "--hidden", "32", "--batch-size", "64",
                                  "--lr", "0.005", "--threads", "2"},
                                 DqnFlagScope::kCore);
  ASSERT_THAT(o, IsOk());
  EXPECT_EQ(o->seed, 7u);
  EXPECT_EQ(o->epochs, 3);
  EXPECT_EQ(o->hidden, 32);
  EXPECT_EQ(o->batch_size, 64);
  EXPECT_DOUBLE_EQ(o->lr, 0.005);
  EXPECT_EQ(o->num_threads, 2);
}

TEST(DqnFlagsTest, TdFlagsApplyOnlyInTdScope) {
  StatusOr<DqnOptions> o = Parse({"--gamma", "0.9", "--n-step", "5", "--huber-delta", "2", "--max-grad-norm", "4",
                                  "--target-update", "polyak", "--target-update-every", "50", "--polyak-tau",
                                  "0.5", "--heldout-fraction", "0.2"},
                                 DqnFlagScope::kTd);
  ASSERT_THAT(o, IsOk());
  EXPECT_DOUBLE_EQ(o->gamma, 0.9);
  EXPECT_EQ(o->n_step, 5);
  EXPECT_DOUBLE_EQ(o->huber_delta, 2);
  EXPECT_DOUBLE_EQ(o->max_grad_norm, 4);
  EXPECT_EQ(o->target_update, TargetUpdate::kPolyak);
  EXPECT_EQ(o->target_update_every, 50);
  EXPECT_DOUBLE_EQ(o->polyak_tau, 0.5);
  EXPECT_DOUBLE_EQ(o->heldout_fraction, 0.2);
  // Not declared in the core scope: an unknown flag.
  EXPECT_THAT(Parse({"--gamma", "0.9"}, DqnFlagScope::kCore).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("gamma")));
}

TEST(DqnFlagsTest, BadValuesNameTheFlag) {
  EXPECT_THAT(Parse({"--lr", "0"}, DqnFlagScope::kCore).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("--lr")));
  EXPECT_THAT(Parse({"--threads", "0"}, DqnFlagScope::kCore).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("--threads")));
  EXPECT_THAT(Parse({"--hidden", "99999999999"}, DqnFlagScope::kCore).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("--hidden")));
  EXPECT_THAT(Parse({"--seed", "-1"}, DqnFlagScope::kCore).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("--seed")));
  EXPECT_THAT(Parse({"--target-update", "soft"}, DqnFlagScope::kTd).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("--target-update")));
  EXPECT_THAT(Parse({"--n-step", "0"}, DqnFlagScope::kTd).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("--n-step")));
  EXPECT_THAT(Parse({"--heldout-fraction", "1"}, DqnFlagScope::kTd).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("--heldout-fraction")));
  EXPECT_THAT(Parse({"--lr", "fast"}, DqnFlagScope::kCore).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("lr")));
}

}  // namespace
}  // namespace lede::trainer
