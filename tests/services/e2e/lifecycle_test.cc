// Process lifecycle across real processes: a coordinator killed
// with SIGKILL while it holds every KV slot loses no capacity for more than
// its lease (failure 2), at 4 and at 16 slots; a restarted coordinator of
// the same --instance-name frees its predecessor's slots at once.
// Integration label: each suite starts a split cluster (a few seconds).
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "gtest/gtest.h"
#include "proto/lede/v1/generation.grpc.pb.h"
#include "tests/shared/telemetry/telemetry_test_util.h"
#include "tests/testing/process.h"
#include "tests/testing/slot_holders.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/wait.h"

namespace lede {
namespace {

using ::lede::testing::ChildProcess;
using ::lede::testing::ClusterOptions;
using ::lede::testing::IsOk;
using ::lede::testing::LedeCluster;
using ::lede::testing::SlotHolders;
using ::lede::v1::GenerateRequest;
using ::lede::v1::GenerateResponse;
using namespace std::chrono_literals;

std::string ModelDir() { return std::string(LEDE_SOURCE_DIR) + "/models/lede-tiny"; }

double SlotsInUse(int metrics_port) {
  return telemetry::test_util::MetricValue(metrics_port, "lede_kv_slots_in_use");
}

GenerateRequest ShortRequest() {
  GenerateRequest r;
  r.set_prompt("Once upon a time");
  r.set_max_new_tokens(8);
  return r;
}

grpc::Status Generate(lede::v1::Generation::Stub& stub, const GenerateRequest& request) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 30s);
  auto reader = stub.Generate(&ctx, request);
  GenerateResponse resp;
  while (reader->Read(&resp)) {
  }
  return reader->Finish();
}


// A split cluster with kSlots slots whose coordinator has a stable name.
template <int kSlots>
class CoordinatorCrashTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ClusterOptions o;
    o.binaries = {LEDE_MODEL_BIN, LEDE_COORDINATOR_BIN, LEDE_POLICY_BIN};
    o.model_dir = ModelDir();
    o.slots = kSlots;
    o.experience_url = "none";
    o.model_args = {"--max-waiting", "0"};  // a full pool refuses (no queue)
    o.coordinator_args = {"--instance-name", "lifecycle-test-coordinator", "--max-new-tokens-limit", "256"};
    cluster_ = new LedeCluster(o);
    if (Status s = cluster_->Start(); !s.ok()) *setup_error_ = s.ToString();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(setup_error_->empty()) << *setup_error_; }

  static double InUse() { return SlotsInUse(cluster_->verifier()->metrics_port()); }
  static std::string Logs() {
    return "\nverifier log:\n" + ChildProcess::Tail(cluster_->verifier()->Log(), 2000) + "\ncoordinator log:\n" +
           ChildProcess::Tail(cluster_->coordinator()->Log(), 1500);
  }

  // SIGKILLs the cluster's coordinator while it holds every slot, restarts
  // it (same --instance-name): its first renewal frees the old slots.
  void RestartedCoordinatorFreesSlotsAtOnce() {
    {
      SlotHolders held;
      ASSERT_TRUE(held.Open(cluster_->coordinator_target(), kSlots)) << Logs();
      ASSERT_EQ(InUse(), kSlots) << Logs();
      auto refused = cluster_->NewStub();
      EXPECT_EQ(Generate(*refused, ShortRequest()).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
      cluster_->coordinator()->Kill();
      const auto t0 = std::chrono::steady_clock::now();
      ASSERT_THAT(cluster_->StartCoordinator(), IsOk());
      // Freed by the restart's first renewal, not by the lease's lapse (5 s)
      // and certainly not by the 300 s idle timeout.
      EXPECT_TRUE(lede::testing::WaitUntil([] { return InUse() == 0; }, 30s, 20ms)) << InUse() << Logs();
      auto stub = cluster_->NewStub();
      const grpc::Status served = Generate(*stub, ShortRequest());
      EXPECT_TRUE(served.ok()) << served.error_code() << " " << served.error_message() << Logs();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      EXPECT_LT(s, 30.0);
      EXPECT_THAT(cluster_->verifier()->WaitForLog("reason=replaced_by_new_instance", 1s), IsOk()) << Logs();
    }
  }

  // SIGKILLs an unnamed extra coordinator (2 s lease) holding every slot;
  // the cluster's coordinator serves again once the lease lapses.
  void VanishedCoordinatorSlotsComeBackAfterItsLease() {
    auto extra = cluster_->StartExtraCoordinator(false, "none",
                                                 {"--instance-name", "", "--session-lease-ttl-s", "2"});
    ASSERT_THAT(extra, IsOk());
    {
      SlotHolders held;
      ASSERT_TRUE(held.Open((*extra)->grpc_target(), kSlots)) << Logs();
      ASSERT_EQ(InUse(), kSlots) << Logs();
      (*extra)->Kill();
      const auto t0 = std::chrono::steady_clock::now();
      auto stub = cluster_->NewStub();
      grpc::Status last;
      EXPECT_TRUE(lede::testing::WaitUntil(
          [&] {
            last = Generate(*stub, ShortRequest());
            return last.ok();
          },
          30s, 100ms))
          << last.error_message() << Logs();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      // About 2 s (the lease) plus a sweep; the margin is for a loaded CI
      // machine: the bug was 300 s.
      EXPECT_LT(s, 30.0);
      EXPECT_TRUE(lede::testing::WaitUntil([] { return InUse() == 0; }, 10s, 20ms)) << InUse() << Logs();
      EXPECT_THAT(cluster_->verifier()->WaitForLog("reason=lease_lapsed", 1s), IsOk()) << Logs();
    }
  }

  static inline LedeCluster* cluster_ = nullptr;
  static inline std::string* setup_error_ = new std::string();
};

using CoordinatorCrashTest4 = CoordinatorCrashTest<4>;
using CoordinatorCrashTest16 = CoordinatorCrashTest<16>;

// Failure 2 at the default 4 slots: a SIGKILLed coordinator restarted under
// its name gets every slot back at once.
TEST_F(CoordinatorCrashTest4, RestartedCoordinatorFreesSlotsAtOnce) { RestartedCoordinatorFreesSlotsAtOnce(); }
// ... and a coordinator that never comes back loses them after its lease.
TEST_F(CoordinatorCrashTest4, VanishedCoordinatorSlotsComeBackAfterItsLease) {
  VanishedCoordinatorSlotsComeBackAfterItsLease();
}
// The same at 16 slots (the half-capacity case of the issue).
TEST_F(CoordinatorCrashTest16, RestartedCoordinatorFreesSlotsAtOnce) { RestartedCoordinatorFreesSlotsAtOnce(); }
TEST_F(CoordinatorCrashTest16, VanishedCoordinatorSlotsComeBackAfterItsLease) {
  VanishedCoordinatorSlotsComeBackAfterItsLease();
}

}  // namespace
}  // namespace lede
