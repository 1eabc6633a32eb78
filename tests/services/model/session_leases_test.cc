// Tests of services/model/session_leases.h with a FakeClock: lapse, renewal,
// replacement by a restarted instance of the same owner, tombstones.
#include "services/model/session_leases.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/testing/fake_clock.h"
#include "tests/testing/status_matchers.h"

namespace lede::model_service {
namespace {

using ::lede::testing::FakeClock;
using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

class SessionLeasesTest : public ::testing::Test {
 protected:
  SessionLeasesTest() : leases_(Options()) {}
  SessionLeaseOptions Options() {
    SessionLeaseOptions o;
    o.clock = &clock_;
    return o;
  }
  FakeClock clock_;
  SessionLeases leases_;
};

// A lease not renewed within its TTL lapses; one renewed in time does not.
TEST_F(SessionLeasesTest, LeaseLapsesWithoutRenewal) {
  ASSERT_THAT(leases_.Renew("a", "", absl::Seconds(5)), IsOk());
  ASSERT_THAT(leases_.Renew("b", "", absl::Seconds(5)), IsOk());
  clock_.Advance(absl::Seconds(4));
  EXPECT_THAT(leases_.TakeExpired(), IsEmpty());
  ASSERT_THAT(leases_.Renew("b", "", absl::Seconds(5)), IsOk());
  clock_.Advance(absl::Seconds(1));
  EXPECT_THAT(leases_.TakeExpired(), ElementsAre("a"));
  EXPECT_FALSE(leases_.Holds("a"));
  EXPECT_TRUE(leases_.Holds("b"));
  EXPECT_THAT(leases_.TakeExpired(), IsEmpty());  // collected once
}

// A new instance of the same owner name replaces the old one at once; the
// old one is refused afterwards.
TEST_F(SessionLeasesTest, RestartedOwnerReplacesItsPredecessor) {
  ASSERT_THAT(leases_.Renew("old", "host/127.0.0.1:50051", absl::Seconds(5)), IsOk());
  ASSERT_THAT(leases_.Renew("other", "host/127.0.0.1:50061", absl::Seconds(5)), IsOk());
  auto r = leases_.Renew("new", "host/127.0.0.1:50051", absl::Seconds(5));
  ASSERT_THAT(r, IsOk());
  EXPECT_THAT(r->replaced, ElementsAre("old"));
  EXPECT_FALSE(leases_.Holds("old"));
  EXPECT_TRUE(leases_.Holds("other"));
  EXPECT_THAT(leases_.Renew("old", "host/127.0.0.1:50051", absl::Seconds(5)),
              StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT(leases_.Admit("old"), StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_TRUE(leases_.Holds("new"));
}

// An empty owner name replaces nobody; an empty instance id is invalid.
TEST_F(SessionLeasesTest, EmptyNamesReplaceNothingAndIdIsRequired) {
  ASSERT_THAT(leases_.Renew("a", "", absl::Seconds(5)), IsOk());
  auto r = leases_.Renew("b", "", absl::Seconds(5));
  ASSERT_THAT(r, IsOk());
  EXPECT_THAT(r->replaced, IsEmpty());
  EXPECT_THAT(leases_.Renew("", "x", absl::Seconds(5)), StatusIs(StatusCode::kInvalidArgument));
}

// TTLs are clamped: zero is the default, tiny and huge ones are bounded.
TEST_F(SessionLeasesTest, TtlIsClamped) {
  EXPECT_EQ(leases_.Renew("a", "", absl::ZeroDuration())->ttl, absl::Seconds(5));
  EXPECT_EQ(leases_.Renew("a", "", absl::Milliseconds(1))->ttl, absl::Seconds(1));
  EXPECT_EQ(leases_.Renew("a", "", absl::Hours(1))->ttl, absl::Seconds(60));
}

// OpenSession of an instance with no lease yet creates one with the default
// TTL, which lapses like any other; a lapsed lease admits nothing.
TEST_F(SessionLeasesTest, AdmitCreatesDefaultLease) {
  ASSERT_THAT(leases_.Admit("a"), IsOk());
  EXPECT_TRUE(leases_.Holds("a"));
  clock_.Advance(absl::Seconds(5));
  EXPECT_THAT(leases_.Admit("a"), StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT(leases_.TakeExpired(), ElementsAre("a"));
  EXPECT_THAT(leases_.Admit("a"), IsOk());  // collected: a fresh lease
}

}  // namespace
}  // namespace lede::model_service
