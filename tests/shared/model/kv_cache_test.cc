// Tests of shared/model/kv_cache.h: layout, slot bookkeeping, rollback.
#include "shared/model/kv_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "gtest/gtest.h"
#include "shared/model/llama.h"
#include "tests/shared/model/model_fixtures.h"
#include "tests/testing/status_matchers.h"

namespace lede::model {
namespace {

using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using testing::TinyConfig;

// K/V per layer are [S, n_kv_heads, C, head_dim] and the scratch [S, D_max + 1, d] (docs/design.md §4).
TEST(KvCacheTest, LayoutFollowsDesign) {
  KvCacheOptions o;
  o.n_slots = 3;
  o.capacity = 40;
  o.max_draft_len = 5;
  auto cache = KvCache::Create(TinyConfig(), o);
  ASSERT_THAT(cache, IsOk());
  EXPECT_EQ(cache->n_layers(), 4);
  EXPECT_EQ(cache->k(0).sizes(), (std::vector<int64_t>{3, 2, 40, 8}));
  EXPECT_EQ(cache->v(3).sizes(), (std::vector<int64_t>{3, 2, 40, 8}));
  EXPECT_EQ(cache->exit_hidden().sizes(), (std::vector<int64_t>{3, 6, 32}));
  EXPECT_EQ(cache->bytes(), (4 * 2 * 3 * 2 * 40 * 8 + 3 * 6 * 32) * 4);
}

// Bad sizes are refused, naming the option.
TEST(KvCacheTest, BadOptionsAreInvalidArgument) {
  KvCacheOptions o;
  o.capacity = 1000;  // > max_seq_len 96
  EXPECT_THAT(KvCache::Create(TinyConfig(), o), StatusIs(StatusCode::kInvalidArgument));
  o.capacity = 0;
  o.n_slots = 0;
  EXPECT_THAT(KvCache::Create(TinyConfig(), o), StatusIs(StatusCode::kInvalidArgument));
}

// Slots are handed out until none is left, then RESOURCE_EXHAUSTED; freeing makes one reusable.
TEST(KvCacheTest, AllocateUntilExhaustedThenFree) {
  KvCacheOptions o;
  o.n_slots = 2;
  auto cache = KvCache::Create(TinyConfig(), o);
  ASSERT_THAT(cache, IsOk());
  auto a = cache->Allocate();
  auto b = cache->Allocate();
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  EXPECT_NE(*a, *b);
  EXPECT_THAT(cache->Allocate(), StatusIs(StatusCode::kResourceExhausted));
  EXPECT_THAT(cache->Free(*a), IsOk());
  EXPECT_THAT(cache->Free(*a), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(cache->Allocate(), IsOk());
}

// Commit only moves forward within capacity; Truncate only moves back.
TEST(KvCacheTest, CommitAndTruncateRanges) {
  auto cache = KvCache::Create(TinyConfig(), KvCacheOptions{});
  ASSERT_THAT(cache, IsOk());
  auto s = cache->Allocate();
  ASSERT_THAT(s, IsOk());
  EXPECT_THAT(cache->Commit(*s, 10), IsOk());
  EXPECT_EQ(cache->length(*s), 10);
  EXPECT_THAT(cache->Commit(*s, 5), StatusIs(StatusCode::kOutOfRange));
  EXPECT_THAT(cache->Commit(*s, 97), StatusIs(StatusCode::kOutOfRange));
  EXPECT_THAT(cache->Truncate(*s, 11), StatusIs(StatusCode::kOutOfRange));
  EXPECT_THAT(cache->Truncate(*s, 4), IsOk());
  EXPECT_EQ(cache->length(*s), 4);
}

// Rejected draft positions are invisible to the next pass: after rolling
// back and overwriting them, logits equal those of a cache that never saw them.
TEST(KvCacheTest, RollbackDropsRejectedDraftTokens) {
  c10::InferenceMode guard;
  auto m = LlamaModel::RandomInit(TinyConfig(), 9, ModelOptions{}, 0.3);
  ASSERT_THAT(m, IsOk());
  const LlamaModel& model = **m;
  auto ids = [](std::vector<int64_t> v) { return at::tensor(v, at::kLong).view({1, -1}); };
  auto run = [&](KvCache& cache, std::vector<int64_t> tokens, int64_t pos) {
    return model.ExitLogits(model.Forward(model.Embed(ids(tokens)), 0, 4, pos, &cache, 0));
  };
  auto dirty = KvCache::Create(model.config(), KvCacheOptions{});
  auto clean = KvCache::Create(model.config(), KvCacheOptions{});
  ASSERT_THAT(dirty, IsOk());
  ASSERT_THAT(clean, IsOk());
  run(*dirty, {1, 2, 3}, 0);
  ASSERT_THAT(dirty->Commit(0, 3), IsOk());
  run(*dirty, {40, 41, 42}, 3);  // drafts, then rejected
  ASSERT_THAT(dirty->Truncate(0, 3), IsOk());
  at::Tensor after = run(*dirty, {7, 8}, 3);
  run(*clean, {1, 2, 3}, 0);
  at::Tensor expected = run(*clean, {7, 8}, 3);
  EXPECT_LE((after - expected).abs().max().item<float>(), 1e-6);
}

// A pool in a named segment is the same memory in every process that maps
// it: K/V, scratch and committed lengths written through one view are read
// through the other (docs/design.md §4 "Shared KV cache").
TEST(KvCacheTest, SharedPoolIsVisibleThroughAttach) {
  KvCacheOptions o;
  o.n_slots = 2;
  o.capacity = 16;
  o.max_draft_len = 3;
  o.shared_memory_name = "/lede-kv-test-" + std::to_string(::getpid());
  auto owner = KvCache::Create(TinyConfig(), o);
  ASSERT_THAT(owner, IsOk());
  KvCacheOptions attach;
  attach.shared_memory_name = o.shared_memory_name;
  auto view = KvCache::Attach(TinyConfig(), attach);
  ASSERT_THAT(view, IsOk());
  EXPECT_EQ(view->epoch(), owner->epoch());
  EXPECT_EQ(view->n_slots(), 2);
  EXPECT_EQ(view->capacity(), 16);
  EXPECT_EQ(view->k(1).sizes(), owner->k(1).sizes());
  auto slot = owner->Allocate();
  ASSERT_THAT(slot, IsOk());
  ASSERT_THAT(owner->Commit(*slot, 5), IsOk());
  owner->k(2).select(0, *slot).fill_(1.5f);
  view->exit_hidden().select(0, *slot).fill_(-2.0f);
  EXPECT_EQ(view->length(*slot), 5);
  EXPECT_EQ(view->n_in_use(), 1);
  EXPECT_TRUE(at::equal(view->k(2), owner->k(2)));
  EXPECT_FLOAT_EQ(owner->exit_hidden()[*slot][0][0].item<float>(), -2.0f);
}

// PoolBytes is what a shared pool's segment takes (the size the KV budget
// is checked against), and grows by S x L x 2 x n_kv_heads x head_dim x 4
// bytes per token of capacity (float32 K and V), up to alignment.
TEST(KvCacheTest, PoolBytesIsTheSegmentSize) {
  KvCacheOptions o;
  o.n_slots = 3;
  o.capacity = 40;
  o.max_draft_len = 5;
  o.shared_memory_name = "/lede-kv-bytes-test-" + std::to_string(::getpid());
  auto pool = KvCache::Create(TinyConfig(), o);
  ASSERT_THAT(pool, IsOk());
  struct stat st {};
  const int fd = shm_open(o.shared_memory_name.c_str(), O_RDONLY, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(fstat(fd, &st), 0);
  close(fd);
  EXPECT_EQ(static_cast<int64_t>(st.st_size), KvCache::PoolBytes(TinyConfig(), o));
  // 64 more tokens: 3 slots x 4 layers x K,V x 2 heads x 8 dims x 4 bytes each.
  KvCacheOptions longer = o;
  longer.capacity = o.capacity + 64;
  EXPECT_EQ(KvCache::PoolBytes(TinyConfig(), longer) - KvCache::PoolBytes(TinyConfig(), o),
            64 * 3 * 4 * 2 * 2 * 8 * 4);
  // Capacity 0 stands for the model's window.
  KvCacheOptions window = o;
  window.capacity = 0;
  longer.capacity = TinyConfig().max_seq_len;
  EXPECT_EQ(KvCache::PoolBytes(TinyConfig(), window), KvCache::PoolBytes(TinyConfig(), longer));
}

// CapacityWithin is the largest capacity whose pool fits the budget, at most
// the window, and 0 when one token per slot does not fit.
TEST(KvCacheTest, CapacityWithinIsTheLargestThatFits) {
  KvCacheOptions o;
  o.n_slots = 2;
  o.max_draft_len = 4;
  o.capacity = 50;
  const int64_t budget = KvCache::PoolBytes(TinyConfig(), o);
  const int64_t fits = KvCache::CapacityWithin(TinyConfig(), o, budget);
  ASSERT_GE(fits, 50);
  KvCacheOptions at = o;
  at.capacity = fits;
  EXPECT_LE(KvCache::PoolBytes(TinyConfig(), at), budget);
  at.capacity = fits + 1;
  EXPECT_GT(KvCache::PoolBytes(TinyConfig(), at), budget);
  EXPECT_EQ(KvCache::CapacityWithin(TinyConfig(), o, int64_t{1} << 40), TinyConfig().max_seq_len);
  EXPECT_EQ(KvCache::CapacityWithin(TinyConfig(), o, 1024), 0);
}

// Session words (issue 39): a slot holds its session's id; a draft begins
// only under the slot's current session (seen through another mapping of
// the pool, as the drafter process sees it), and a freed slot whose last
// session still has a draft running is not handed out again until that
// draft ends, so a stale draft can never write into a new session's K/V.
TEST(KvCacheTest, SessionWordsFenceStaleDrafts) {
  KvCacheOptions o;
  o.n_slots = 1;
  o.capacity = 16;
  o.max_draft_len = 3;
  o.shared_memory_name = "/lede-kv-test-session-" + std::to_string(::getpid());
  auto owner = KvCache::Create(TinyConfig(), o);
  ASSERT_THAT(owner, IsOk());
  KvCacheOptions attach;
  attach.shared_memory_name = o.shared_memory_name;
  auto drafter = KvCache::Attach(TinyConfig(), attach);
  ASSERT_THAT(drafter, IsOk());

  EXPECT_THAT(owner->Allocate(KvCache::kNoSession), StatusIs(StatusCode::kInvalidArgument));
  auto slot = owner->Allocate(0xA11CEull);
  ASSERT_THAT(slot, IsOk());
  EXPECT_EQ(drafter->session(*slot), 0xA11CEull);
  EXPECT_FALSE(drafter->BeginDrafting(*slot, 0xB0Bull)) << "a foreign id began a draft";
  EXPECT_FALSE(drafter->BeginDrafting(*slot, KvCache::kNoSession));
  EXPECT_FALSE(drafter->BeginDrafting(7, 0xA11CEull)) << "a slot out of range";
  EXPECT_EQ(drafter->n_drafting(*slot), 0);
  ASSERT_TRUE(drafter->BeginDrafting(*slot, 0xA11CEull));

  // The session closes while its draft runs: the slot is free, but not
  // reusable until the draft ends.
  ASSERT_THAT(owner->Free(*slot), IsOk());
  EXPECT_EQ(owner->session(*slot), KvCache::kNoSession);
  EXPECT_EQ(owner->n_in_use(), 0);
  EXPECT_THAT(owner->Allocate(0xB0Bull), StatusIs(StatusCode::kResourceExhausted));
  EXPECT_FALSE(drafter->BeginDrafting(*slot, 0xA11CEull)) << "a closed session began a draft";
  drafter->EndDrafting(*slot);
  EXPECT_EQ(owner->n_drafting(*slot), 0);
  auto next = owner->Allocate(0xB0Bull);
  ASSERT_THAT(next, IsOk());
  EXPECT_EQ(*next, *slot);
  EXPECT_FALSE(drafter->BeginDrafting(*next, 0xA11CEull)) << "the stale id drafts on the new session";
  EXPECT_TRUE(drafter->BeginDrafting(*next, 0xB0Bull));
  drafter->EndDrafting(*next);
}

// Attaching refuses a segment that does not exist or was made for another
// model, naming the mismatch; a recreated pool has a new epoch.
TEST(KvCacheTest, AttachRefusesMissingOrMismatchedPools) {
  KvCacheOptions o;
  o.n_slots = 1;
  o.capacity = 8;
  o.shared_memory_name = "/lede-kv-test-mismatch-" + std::to_string(::getpid());
  EXPECT_THAT(KvCache::Attach(TinyConfig(), o), StatusIs(StatusCode::kNotFound));
  auto owner = KvCache::Create(TinyConfig(), o);
  ASSERT_THAT(owner, IsOk());
  ModelConfig other = TinyConfig();
  other.n_layers += 1;
  EXPECT_THAT(KvCache::Attach(other, o), StatusIs(StatusCode::kFailedPrecondition));
  const uint64_t first_epoch = owner->epoch();
  auto again = KvCache::Create(TinyConfig(), o);  // a restarted verifier
  ASSERT_THAT(again, IsOk());
  auto view = KvCache::Attach(TinyConfig(), o);
  ASSERT_THAT(view, IsOk());
  EXPECT_NE(view->epoch(), first_epoch);
  EXPECT_EQ(view->epoch(), again->epoch());
  owner = again;  // the first pool goes away without removing the new one's name
  EXPECT_THAT(KvCache::Attach(TinyConfig(), o), IsOk());
}

// A CPU pool is not attached as a CUDA one (the header names the pool's
// device), and on a libtorch without CUDA a shared pool on a GPU is refused
// with a message that says what it needs, instead of a crash.
TEST(KvCacheTest, SharedPoolsNameTheirDevice) {
  KvCacheOptions o;
  o.n_slots = 1;
  o.capacity = 8;
  o.shared_memory_name = "/lede-kv-test-device-" + std::to_string(::getpid());
  auto owner = KvCache::Create(TinyConfig(), o);
  ASSERT_THAT(owner, IsOk());
  KvCacheOptions on_gpu = o;
  on_gpu.device = c10::Device(c10::kCUDA, 0);
  EXPECT_THAT(KvCache::Attach(TinyConfig(), on_gpu),
              StatusIs(StatusCode::kFailedPrecondition, ::testing::HasSubstr("device is cpu, expected cuda:0")));
  if (!at::hasCUDA()) {
    on_gpu.shared_memory_name += "-gpu";
    EXPECT_THAT(KvCache::Create(TinyConfig(), on_gpu),
                StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("needs a CUDA build")));
  }
}

}  // namespace
}  // namespace lede::model
