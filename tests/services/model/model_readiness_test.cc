// Readiness of the model service (services/model/model_service.h
// Readiness()): a verifier is ready once its pool exists; a drafter only
// while it maps the verifier's current pool, re-attaching to a new one (a
// restarted verifier) on its own and not ready while there is none.
// stories260K and a named shared-memory pool, in one process (the drafter's
// host attaches the verifier host's segment as a drafter process would).
#include <sys/mman.h>
#include <unistd.h>

#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "proto/lede/v1/model.pb.h"
#include "services/model/model_service.h"
#include "tests/testing/test_data.h"
#include "tests/testing/status_matchers.h"

namespace lede::model_service {
namespace {

using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;

class ModelReadinessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.model_path = lede::testing::Stories260KDir();
    options_.n_slots = 2;
    options_.capacity = 64;
    options_.max_draft_len = 4;
    options_.kv_pool_name = "/lede-readiness-" + std::to_string(::getpid());
  }
  void TearDown() override { ::shm_unlink(options_.kv_pool_name.c_str()); }

  static uint64_t Epoch(ModelHost& host) {
    DrafterService drafter(std::shared_ptr<ModelHost>(&host, [](ModelHost*) {}));
    lede::v1::ModelInfo info;
    drafter.Describe(nullptr, nullptr, &info);
    return info.pool_epoch();
  }

  ModelServiceOptions options_;
};

// A verifier is ready with its pool; a drafter while it maps the current
// pool; after the verifier's pool is gone the drafter is UNAVAILABLE naming
// kv_pool, and ready again (on the new epoch) once a new verifier made one.
TEST_F(ModelReadinessTest, DrafterFollowsTheVerifiersPool) {
  auto verifier = LoadModelHost(options_, /*create_pool=*/true, nullptr);
  ASSERT_THAT(verifier, IsOk());
  EXPECT_THAT(Readiness(**verifier), IsOk());
  auto drafter = LoadModelHost(options_, /*create_pool=*/false, nullptr);
  ASSERT_THAT(drafter, IsOk());
  EXPECT_THAT(Readiness(**drafter), IsOk());
  const uint64_t first_epoch = Epoch(**drafter);
  ASSERT_NE(first_epoch, 0u);

  verifier->reset();  // the verifier exits: its pool is unlinked
  ::shm_unlink(options_.kv_pool_name.c_str());
  EXPECT_THAT(Readiness(**drafter), StatusIs(StatusCode::kUnavailable));

  auto restarted = LoadModelHost(options_, /*create_pool=*/true, nullptr);
  ASSERT_THAT(restarted, IsOk());
  EXPECT_THAT(Readiness(**drafter), IsOk());
  const uint64_t second_epoch = Epoch(**drafter);
  EXPECT_NE(second_epoch, first_epoch);  // re-attached before any request asked
  EXPECT_EQ(second_epoch, Epoch(**restarted));
}

}  // namespace
}  // namespace lede::model_service
