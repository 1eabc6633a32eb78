// Tests of services/coordinator/replica_set.h without model processes:
// --replicas parsing, placement by the load reports (fed by hand: no
// leases), failure back-off, rotation among equals, DNS discovery of
// "localhost". Channels to the (unused) addresses are never connected.
#include "services/coordinator/replica_set.h"

#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"

namespace lede::coordinator {
namespace {

using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using ::testing::HasSubstr;

TEST(ParseReplicaTargetsTest, ColocatedAndSplitEntries) {
  auto targets = ParseReplicaTargets("10.0.0.1:50052,10.0.0.2:50052+10.0.0.2:50054");
  ASSERT_THAT(targets, IsOk());
  ASSERT_EQ(targets->size(), 2u);
  EXPECT_EQ((*targets)[0].verifier, "10.0.0.1:50052");
  EXPECT_EQ((*targets)[0].drafter, "10.0.0.1:50052");  // co-located
  EXPECT_EQ((*targets)[1].verifier, "10.0.0.2:50052");
  EXPECT_EQ((*targets)[1].drafter, "10.0.0.2:50054");
}

TEST(ParseReplicaTargetsTest, BadEntriesNameTheEntry) {
  EXPECT_THAT(ParseReplicaTargets("host"), StatusIs(StatusCode::kInvalidArgument, HasSubstr("'host'")));
  EXPECT_THAT(ParseReplicaTargets("a:1,,b:2"), StatusIs(StatusCode::kInvalidArgument, HasSubstr("empty entry")));
  EXPECT_THAT(ParseReplicaTargets("a:0"), StatusIs(StatusCode::kInvalidArgument, HasSubstr("1..65535")));
  EXPECT_THAT(ParseReplicaTargets("a:1+b:99999"), StatusIs(StatusCode::kInvalidArgument, HasSubstr("99999")));
  EXPECT_THAT(ParseReplicaTargets("a:x1"), StatusIs(StatusCode::kInvalidArgument));
}

ReplicaSetOptions Static(int n) {
  ReplicaSetOptions o;
  for (int i = 0; i < n; ++i) {
    const std::string a = "127.0.0.1:" + std::to_string(41000 + i);
    o.targets.push_back(ReplicaTarget{a, a});
  }
  o.start_leases = false;
  return o;
}

// Index of `r` among `all` (by verifier address).
int IndexOf(const std::vector<std::shared_ptr<Replica>>& all, const std::shared_ptr<Replica>& r) {
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i] == r) return static_cast<int>(i);
  }
  return -1;
}

TEST(ReplicaSetTest, NoReplicaIsInvalidArgument) {
  ReplicaSetOptions o;
  EXPECT_THAT(ReplicaSet::Create(o), StatusIs(StatusCode::kInvalidArgument, HasSubstr("no replica")));
}

// The most estimated free slots first; this coordinator's own opens since
// the report count against a replica, waiting sessions too.
TEST(ReplicaSetTest, MostFreeSlotsFirstCorrectedForOwnSessions) {
  auto set = ReplicaSet::Create(Static(3));
  ASSERT_THAT(set, IsOk());
  const auto all = (*set)->All();
  all[0]->UpdateLoad(8, 1, 0, 0);
  all[1]->UpdateLoad(8, 6, 2, 0);  // 6 free but 2 waiting: 4
  all[2]->UpdateLoad(8, 3, 0, 0);
  auto order = (*set)->Candidates();
  EXPECT_EQ(IndexOf(all, order[0]), 1);
  EXPECT_EQ(IndexOf(all, order[1]), 2);
  EXPECT_EQ(IndexOf(all, order[2]), 0);
  EXPECT_EQ(all[1]->EstimatedFreeSlots(), 4);
  // Two sessions opened here on replica 1 since its report: 2 left there.
  all[1]->SessionOpened();
  all[1]->SessionOpened();
  EXPECT_EQ(all[1]->EstimatedFreeSlots(), 2);
  order = (*set)->Candidates();
  EXPECT_EQ(IndexOf(all, order[0]), 2);  // 3 free
  // The next report already counts them as this coordinator's.
  all[1]->UpdateLoad(8, 4, 0, 2);
  EXPECT_EQ(all[1]->EstimatedFreeSlots(), 4);
  all[1]->SessionClosed();
  EXPECT_EQ(all[1]->EstimatedFreeSlots(), 5);
}

// A replica that refused a session goes to the back while its back-off lasts.
TEST(ReplicaSetTest, FailedReplicaGoesLast) {
  ReplicaSetOptions o = Static(2);
  o.failure_backoff = absl::Hours(1);
  auto set = ReplicaSet::Create(o);
  ASSERT_THAT(set, IsOk());
  const auto all = (*set)->All();
  all[0]->UpdateLoad(4, 4, 0, 0);
  all[1]->UpdateLoad(4, 1, 0, 0);
  EXPECT_EQ((*set)->Candidates()[0], all[0]);
  (*set)->MarkFailed(*all[0]);
  const auto order = (*set)->Candidates();
  EXPECT_EQ(order[0], all[1]);
  EXPECT_EQ(order[1], all[0]);  // still tried, last
}

// Replicas that look alike take turns at the front.
TEST(ReplicaSetTest, EqualReplicasRotate) {
  auto set = ReplicaSet::Create(Static(3));
  ASSERT_THAT(set, IsOk());
  std::set<std::string> firsts;
  for (int i = 0; i < 3; ++i) firsts.insert((*set)->Candidates()[0]->name());
  EXPECT_EQ(firsts.size(), 3u);
}

// A DNS name's addresses become replicas on the configured ports.
TEST(ReplicaSetTest, DnsNameResolvesToReplicas) {
  ReplicaSetOptions o;
  o.dns_name = "localhost";
  o.verifier_port = 41234;
  o.drafter_port = 0;  // co-located
  o.start_leases = false;
  auto set = ReplicaSet::Create(o);
  ASSERT_THAT(set, IsOk());
  const auto all = (*set)->All();
  ASSERT_FALSE(all.empty());
  for (const auto& r : all) {
    EXPECT_THAT(r->target().verifier, ::testing::AnyOf("127.0.0.1:41234", "[::1]:41234"));
    EXPECT_EQ(r->target().drafter, r->target().verifier);
  }
  EXPECT_EQ((*set)->Refresh(), all.size());  // unchanged on a second resolution
}

}  // namespace
}  // namespace lede::coordinator
