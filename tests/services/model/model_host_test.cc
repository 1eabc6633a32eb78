// The threads of a batched step (services/model/model_host.h StepThreads,
// BatchStepThreads): a step that runs alone gets all of --threads, one beside
// others --batch-threads.
#include "services/model/model_host.h"

#include "gtest/gtest.h"

namespace lede::model_service {
namespace {

TEST(StepThreadsTest, AStepAloneGetsEveryThread) {
  EXPECT_EQ(StepThreads(2, 1, 0), 2);
  EXPECT_EQ(StepThreads(16, 8, 0), 16);
}

TEST(StepThreadsTest, AStepBesideOthersGetsTheBatchThreads) {
  EXPECT_EQ(StepThreads(2, 1, 1), 1);
  EXPECT_EQ(StepThreads(16, 8, 3), 8);
}

TEST(StepThreadsTest, ALargerBatchSettingIsKeptAndAtLeastOneThreadRuns) {
  EXPECT_EQ(StepThreads(1, 4, 0), 4);
  EXPECT_EQ(StepThreads(0, 0, 0), 1);
  EXPECT_EQ(StepThreads(0, 0, 2), 1);
}

TEST(StepThreadsTest, ScopesCountTheRunningSteps) {
  ModelHost host;
  host.options.threads = 2;
  host.options.batch_threads = 1;
  {
    BatchStepThreads first(host);
    EXPECT_EQ(host.running_steps.load(), 1);
    {
      BatchStepThreads second(host);
      EXPECT_EQ(host.running_steps.load(), 2);
    }
    EXPECT_EQ(host.running_steps.load(), 1);
  }
  EXPECT_EQ(host.running_steps.load(), 0);
}

}  // namespace
}  // namespace lede::model_service
