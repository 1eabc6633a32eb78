#include "trainer/heldout_split.h"

#include <string>

#include <gtest/gtest.h>

namespace lede::trainer {
namespace {

TEST(SplitHashTest, IsFnvMixingFromTheSplitBasis) {
  EXPECT_EQ(SplitHash(""), kSplitHashBasis);
  const uint64_t a = (kSplitHashBasis ^ static_cast<uint64_t>('a')) * kSplitHashPrime;
  EXPECT_EQ(SplitHash("a"), a);
  EXPECT_EQ(SplitHash("ab"), (a ^ static_cast<uint64_t>('b')) * kSplitHashPrime);
  // Bytes above 0x7f are mixed as unsigned values.
  EXPECT_EQ(SplitHash("\xff"), (kSplitHashBasis ^ 0xffull) * kSplitHashPrime);
}

TEST(HeldOutSplitTest, SameUnitSameSideAndAboutTheFraction) {
  int held = 0;
  for (int i = 0; i < 4000; ++i) {
    const std::string id = "req-" + std::to_string(i);
    const bool h = IsHeldOut(id, 0.25);
    EXPECT_EQ(h, IsHeldOut(id, 0.25));
    held += h ? 1 : 0;
  }
  EXPECT_GT(held, 800);
  EXPECT_LT(held, 1200);
}

TEST(HeldOutSplitTest, ALargerFractionOnlyAddsUnits) {
  for (int i = 0; i < 2000; ++i) {
    const std::string id = "request/" + std::to_string(i);
    if (IsHeldOut(id, 0.1)) {
      EXPECT_TRUE(IsHeldOut(id, 0.3)) << id;
    }
  }
}

TEST(HeldOutSplitTest, ZeroHoldsOutNoneAndOneHoldsOutAll) {
  for (int i = 0; i < 500; ++i) {
    const std::string id = std::to_string(i);
    EXPECT_FALSE(IsHeldOut(id, 0.0));
    EXPECT_FALSE(IsHeldOut(id, -1.0));
    EXPECT_TRUE(IsHeldOut(id, 1.0));
  }
}

}  // namespace
}  // namespace lede::trainer
