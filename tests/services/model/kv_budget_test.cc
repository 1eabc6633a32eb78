// The verifier's KV pool sized by its memory budget (--kv-memory;
// services/model/model_host.h PlanKvPool): the automatic per-slot capacity,
// the refused starts, and a prompt that no slot of the budget holds
// (RESOURCE_EXHAUSTED) against one no window holds (INVALID_ARGUMENT).
// PlanKvPool on a Llama-3.2-1B-shaped config (no weights), LoadModelHost and
// OpenSession on stories260K (window 512, in one process).
#include <grpcpp/server_context.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/lede/v1/model.pb.h"
#include "services/model/model_host.h"
#include "services/model/model_service.h"
#include "shared/model/kv_cache.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_data.h"

namespace lede::model_service {
namespace {

using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int64_t kGiB = int64_t{1} << 30;

// Llama-3.2-1B's shape: 16 layers, 8 KV heads of 64, a 131,072-token window
// (64 KiB of float32 K/V per token and slot: 8 GiB for the window).
checkpoint::ModelConfig Llama32OneB() {
  checkpoint::ModelConfig c;
  c.dim = 2048;
  c.hidden_dim = 8192;
  c.n_layers = 16;
  c.n_heads = 32;
  c.n_kv_heads = 8;
  c.vocab_size = 128256;
  c.max_seq_len = 131072;
  return c;
}

ModelServiceOptions Options(int64_t slots, int64_t capacity, const std::string& kv_memory) {
  ModelServiceOptions o;
  o.n_slots = slots;
  o.capacity = capacity;
  o.kv_memory = kv_memory;
  o.max_draft_len = 16;
  return o;
}

// The 1B model keeps 64 KiB of float32 K/V per token. With the default 25%
// of a 24 GiB machine's 23 GiB available, the pool holds what the budget
// allows (about 94k tokens in blocks of kKvBlockTokens), however many slots
// share it, and one sequence may hold all of it.
TEST(KvBudgetTest, PoolHoldsWhatTheBudgetAllows) {
  const int64_t available = 23 * kGiB;
  StatusOr<KvPoolPlan> plan = PlanKvPool(Llama32OneB(), Options(4, 0, "25%"), c10::kFloat, available, 0);
  ASSERT_THAT(plan, IsOk());
  EXPECT_EQ(plan->budget_bytes, available / 4);
  EXPECT_LE(plan->pool_bytes, plan->budget_bytes);
  EXPECT_EQ(plan->block_tokens, kKvBlockTokens);
  EXPECT_GT(plan->n_blocks * plan->block_tokens, 94000);
  EXPECT_LE(plan->n_blocks * plan->block_tokens, 94208);
  EXPECT_EQ(plan->capacity, plan->n_blocks * plan->block_tokens);
  // One more block would not fit.
  model::KvCacheOptions ko;
  ko.n_slots = 4;
  ko.max_draft_len = 16;
  ko.capacity = plan->capacity;
  ko.block_tokens = plan->block_tokens;
  ko.n_blocks = plan->n_blocks + 1;
  EXPECT_GT(model::KvCache::PoolBytes(Llama32OneB(), ko), plan->budget_bytes);
  // Slots are cheap: 64 share about the same pool (their tables and draft
  // scratch take a few MiB).
  StatusOr<KvPoolPlan> many = PlanKvPool(Llama32OneB(), Options(64, 0, "25%"), c10::kFloat, available, 0);
  ASSERT_THAT(many, IsOk());
  EXPECT_GT(many->n_blocks, plan->n_blocks * 99 / 100);
  // A budget larger than the window needs gives one sequence the window.
  StatusOr<KvPoolPlan> roomy = PlanKvPool(Llama32OneB(), Options(1, 0, "64GiB"), c10::kFloat, available, 0);
  ASSERT_THAT(roomy, IsOk());
  EXPECT_EQ(roomy->capacity, 131072);
  EXPECT_EQ(roomy->n_blocks, 131072 / kKvBlockTokens);
}

// bfloat16 K/V hold twice the tokens of float32 in the same budget.
TEST(KvBudgetTest, CapacityFollowsTheKvDtype) {
  StatusOr<KvPoolPlan> f32 = PlanKvPool(Llama32OneB(), Options(2, 0, "4GiB"), c10::kFloat, 0, 0);
  StatusOr<KvPoolPlan> bf16 = PlanKvPool(Llama32OneB(), Options(2, 0, "4GiB"), c10::kBFloat16, 0, 0);
  ASSERT_THAT(f32, IsOk());
  ASSERT_THAT(bf16, IsOk());
  EXPECT_NEAR(static_cast<double>(bf16->n_blocks) / f32->n_blocks, 2.0, 0.01);
}

// A percentage budget of a shared pool is capped by the free space of
// /dev/shm; an explicit size is taken as given.
TEST(KvBudgetTest, PercentageOfASharedPoolIsCappedByDevShm) {
  ModelServiceOptions o = Options(4, 0, "50%");
  o.kv_pool_name = "/lede-kv";
  StatusOr<KvPoolPlan> capped = PlanKvPool(Llama32OneB(), o, c10::kFloat, 20 * kGiB, 2 * kGiB);
  ASSERT_THAT(capped, IsOk());
  EXPECT_EQ(capped->budget_bytes, 2 * kGiB);
  o.kv_memory = "6GiB";
  StatusOr<KvPoolPlan> given = PlanKvPool(Llama32OneB(), o, c10::kFloat, 20 * kGiB, 2 * kGiB);
  ASSERT_THAT(given, IsOk());
  EXPECT_EQ(given->budget_bytes, 6 * kGiB);
}

// An explicit --capacity the budget cannot hold once refuses the start with
// one line naming the flags and what the budget holds; one it holds is
// served by any number of slots.
TEST(KvBudgetTest, ExplicitCapacityBeyondTheBudgetIsRefused) {
  StatusOr<KvPoolPlan> plan = PlanKvPool(Llama32OneB(), Options(4, 131072, "6GiB"), c10::kFloat, 0, 0);
  ASSERT_THAT(plan, StatusIs(StatusCode::kInvalidArgument));
  const std::string message(plan.status().message());
  EXPECT_THAT(message, HasSubstr("--kv-memory 6GiB"));
  EXPECT_THAT(message, HasSubstr("--capacity 131072"));
  EXPECT_THAT(message, HasSubstr("holds 98"));  // 98,xxx tokens of KV
  EXPECT_EQ(message.find('\n'), std::string::npos);
  StatusOr<KvPoolPlan> fits = PlanKvPool(Llama32OneB(), Options(16, 131072, "9GiB"), c10::kFloat, 0, 0);
  ASSERT_THAT(fits, IsOk());
  EXPECT_EQ(fits->capacity, 131072);
}

// A budget that holds fewer than kMinSlotTokens is refused, as is a
// malformed size or a capacity beyond the window.
TEST(KvBudgetTest, UselessOrMalformedBudgetsAreRefused) {
  StatusOr<KvPoolPlan> tiny = PlanKvPool(Llama32OneB(), Options(8, 0, "16MiB"), c10::kFloat, 0, 0);
  ASSERT_THAT(tiny, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(tiny.status().message()), HasSubstr("raise --kv-memory"));
  EXPECT_THAT(PlanKvPool(Llama32OneB(), Options(4, 0, "lots"), c10::kFloat, 0, 0),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(PlanKvPool(Llama32OneB(), Options(4, 200000, "1TiB"), c10::kFloat, 0, 0),
              StatusIs(StatusCode::kInvalidArgument));
}

// A prompt beyond the window is INVALID_ARGUMENT; one the window holds but
// the budget's slots do not is RESOURCE_EXHAUSTED with the reason.
TEST(KvBudgetTest, PromptBeyondTheSlotIsResourceExhausted) {
  EXPECT_THAT(CheckPromptFits(100, 101, 512), IsOk());
  EXPECT_THAT(CheckPromptFits(101, 101, 512), StatusIs(StatusCode::kResourceExhausted));
  EXPECT_THAT(std::string(CheckPromptFits(300, 101, 512).message()), HasSubstr("--kv-memory"));
  EXPECT_THAT(CheckPromptFits(512, 512, 512), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(CheckPromptFits(600, 101, 512), StatusIs(StatusCode::kInvalidArgument));
}

class KvBudgetHostTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.model_path = lede::testing::Stories260KDir();
    options_.n_slots = 2;
    options_.capacity = 0;
    options_.max_draft_len = 4;
    options_.max_batch = 1;
    options_.kv_pool_name = "/lede-kv-budget-" + std::to_string(::getpid());
  }
  void TearDown() override { ::shm_unlink(options_.kv_pool_name.c_str()); }
  ModelServiceOptions options_;
};

// The verifier's pool (a shared segment) is sized by the budget: under the
// window, within the budget; a prompt longer than a slot but within the
// window is refused with RESOURCE_EXHAUSTED and the service keeps serving.
TEST_F(KvBudgetHostTest, PoolFollowsTheBudgetAndLongPromptsAreResourceExhausted) {
  options_.kv_memory = "256KiB";  // bfloat16 K/V (the default): about 380 tokens
  auto host = LoadModelHost(options_, /*create_pool=*/true, nullptr);
  ASSERT_THAT(host, IsOk());
  std::shared_ptr<model::KvCache> pool = (*host)->Pool();
  const int64_t window = (*host)->model->config().max_seq_len;
  ASSERT_EQ(window, 512);
  EXPECT_LT(pool->capacity(), window);
  EXPECT_GE(pool->capacity(), kMinSlotTokens);
  model::KvCacheOptions ko;
  ko.n_slots = 2;
  ko.max_draft_len = 4;
  ko.capacity = pool->capacity();
  ko.block_tokens = pool->block_tokens();
  ko.n_blocks = pool->n_blocks();
  ko.kv_dtype = pool->k(0).scalar_type();
  EXPECT_EQ(ko.kv_dtype, c10::kBFloat16);
  EXPECT_LE(model::KvCache::PoolBytes((*host)->model->config(), ko), int64_t{256} << 10);

  VerifierService verifier(*host);
  grpc::ServerContext context;
  lede::v1::OpenSessionRequest too_long;
  for (int64_t i = 0; i < pool->capacity() + 10; ++i) too_long.add_prompt_token_ids(1 + static_cast<int32_t>(i % 100));
  lede::v1::OpenSessionResponse response;
  grpc::Status refused = verifier.OpenSession(&context, &too_long, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("KV memory"));

  lede::v1::OpenSessionRequest beyond_window;
  for (int64_t i = 0; i < window + 1; ++i) beyond_window.add_prompt_token_ids(1);
  EXPECT_EQ(verifier.OpenSession(&context, &beyond_window, &response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);

  lede::v1::OpenSessionRequest fits;
  for (int32_t t : {1, 2, 3, 4}) fits.add_prompt_token_ids(t);
  grpc::Status opened = verifier.OpenSession(&context, &fits, &response);
  EXPECT_TRUE(opened.ok()) << opened.error_message();
}

// A request that finds every slot busy waits in the queue for at most its
// max_queue_wait_ms and is then refused with RESOURCE_EXHAUSTED naming the
// field (the coordinator's 429), not DEADLINE_EXCEEDED; the slots' sessions
// are untouched, and a negative bound is INVALID_ARGUMENT.
TEST_F(KvBudgetHostTest, FullPoolRefusesAfterTheQueueWait) {
  options_.kv_memory = "1MiB";
  auto host = LoadModelHost(options_, /*create_pool=*/true, nullptr);
  ASSERT_THAT(host, IsOk());
  VerifierService verifier(*host);
  grpc::ServerContext context;
  lede::v1::OpenSessionRequest open;
  for (int32_t t : {1, 2, 3, 4}) open.add_prompt_token_ids(t);
  open.set_max_new_tokens(8);  // a block each: the slots run out first
  std::vector<int64_t> slots;
  for (int i = 0; i < 2; ++i) {
    lede::v1::OpenSessionResponse response;
    grpc::Status opened = verifier.OpenSession(&context, &open, &response);
    ASSERT_TRUE(opened.ok()) << opened.error_message();
    slots.push_back(response.slot());
  }
  EXPECT_EQ((*host)->Pool()->n_in_use(), 2);

  open.set_max_queue_wait_ms(50);
  lede::v1::OpenSessionResponse response;
  grpc::Status queued = verifier.OpenSession(&context, &open, &response);
  EXPECT_EQ(queued.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << queued.error_message();
  EXPECT_THAT(queued.error_message(), HasSubstr("max_queue_wait_ms"));
  EXPECT_THAT(queued.error_message(), HasSubstr("50 ms"));
  EXPECT_EQ((*host)->Pool()->n_in_use(), 2);

  open.set_max_queue_wait_ms(-1);
  grpc::Status negative = verifier.OpenSession(&context, &open, &response);
  EXPECT_EQ(negative.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(negative.error_message(), HasSubstr("max_queue_wait_ms"));
}

// Sequences share the pool's blocks: with more slots than the budget holds
// whole windows, requests are admitted while the sum of their reservations
// (prompt + max_new_tokens + a draft) fits; one that does not waits in the
// queue and is refused after its max_queue_wait_ms naming the KV blocks,
// and is admitted once a session's blocks come back. A negative
// max_new_tokens is INVALID_ARGUMENT naming the field.
TEST_F(KvBudgetHostTest, SequencesShareThePoolsBlocks) {
  options_.kv_memory = "512KiB";
  options_.n_slots = 16;
  auto host = LoadModelHost(options_, /*create_pool=*/true, nullptr);
  ASSERT_THAT(host, IsOk());
  std::shared_ptr<model::KvCache> pool = (*host)->Pool();
  const int64_t n_blocks = pool->n_blocks(), block = pool->block_tokens();
  ASSERT_TRUE(pool->paged());
  ASSERT_GE(n_blocks, 3);
  ASSERT_LT(n_blocks, 16);
  EXPECT_LT(n_blocks * block, 16 * pool->capacity()) << "the slots' windows would not fit the budget";
  VerifierService verifier(*host);
  grpc::ServerContext context;
  // 4 prompt tokens + max_new_tokens + a draft (max_draft_len 4, + 1) fill one block.
  lede::v1::OpenSessionRequest one_block;
  for (int32_t t : {1, 2, 3, 4}) one_block.add_prompt_token_ids(t);
  one_block.set_max_new_tokens(block - 4 - 5);
  one_block.set_max_queue_wait_ms(50);
  std::vector<lede::v1::OpenSessionResponse> opened(n_blocks);
  for (int64_t i = 0; i < n_blocks; ++i) {
    grpc::Status s = verifier.OpenSession(&context, &one_block, &opened[i]);
    ASSERT_TRUE(s.ok()) << "session " << i << ": " << s.error_message();
  }
  EXPECT_EQ(pool->n_free_blocks(), 0);
  EXPECT_EQ(pool->n_in_use(), n_blocks);
  lede::v1::OpenSessionResponse response;
  grpc::Status queued = verifier.OpenSession(&context, &one_block, &response);
  EXPECT_EQ(queued.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << queued.error_message();
  EXPECT_THAT(queued.error_message(), HasSubstr("max_queue_wait_ms"));
  EXPECT_THAT(queued.error_message(), HasSubstr("0 of " + std::to_string(n_blocks) + " KV blocks free"));
  EXPECT_EQ(pool->n_in_use(), n_blocks);

  lede::v1::CloseSessionRequest close;
  close.set_slot(opened[0].slot());
  close.set_pool_epoch(opened[0].pool_epoch());
  close.set_session_id(opened[0].session_id());
  lede::v1::CloseSessionResponse closed;
  ASSERT_TRUE(verifier.CloseSession(&context, &close, &closed).ok());
  EXPECT_EQ(pool->n_free_blocks(), 1);
  grpc::Status admitted = verifier.OpenSession(&context, &one_block, &response);
  EXPECT_TRUE(admitted.ok()) << admitted.error_message();

  one_block.set_max_new_tokens(-1);
  grpc::Status negative = verifier.OpenSession(&context, &one_block, &response);
  EXPECT_EQ(negative.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(negative.error_message(), HasSubstr("max_new_tokens"));
}

// --kv-dtype picks the pool's K/V dtype; another value refuses the start
// naming the flag.
TEST_F(KvBudgetHostTest, KvDtypeSetsThePoolsStorage) {
  options_.kv_memory = "1MiB";
  options_.kv_dtype = "float32";
  auto f32 = LoadModelHost(options_, /*create_pool=*/true, nullptr);
  ASSERT_THAT(f32, IsOk());
  EXPECT_EQ((*f32)->Pool()->k(0).scalar_type(), c10::kFloat);
  f32->reset();
  options_.kv_dtype = "int8";
  auto refused = LoadModelHost(options_, /*create_pool=*/true, nullptr);
  ASSERT_THAT(refused, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("--kv-dtype: must be bfloat16, float32 or auto"));
}

// A budget too small for one useful slot refuses the start (the process
// then exits 2 with this line), and creates no segment.
TEST_F(KvBudgetHostTest, TooSmallBudgetRefusesTheStart) {
  options_.kv_memory = "64KiB";
  auto host = LoadModelHost(options_, /*create_pool=*/true, nullptr);
  ASSERT_THAT(host, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(host.status().message()), HasSubstr("--kv-memory 64KiB"));
  const int fd = ::shm_open(options_.kv_pool_name.c_str(), O_RDONLY, 0);
  EXPECT_LT(fd, 0);
  if (fd >= 0) ::close(fd);
}

}  // namespace
}  // namespace lede::model_service
