// Tests of shared/model/kv_cache.h: layout, slot bookkeeping, paging, rollback.
#include "shared/model/kv_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <optional>
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

// A paged pool: n_slots sequences of at most `capacity` tokens (0: the
// window) sharing n_blocks blocks of block_tokens tokens.
KvCacheOptions Paged(int64_t n_slots, int64_t capacity, int64_t block_tokens, int64_t n_blocks,
                     int64_t max_draft_len) {
  KvCacheOptions o;
  o.n_slots = n_slots;
  o.capacity = capacity;
  o.block_tokens = block_tokens;
  o.n_blocks = n_blocks;
  o.max_draft_len = max_draft_len;
  return o;
}

// A shared pool of `o` (shared_memory_name set) in *owner, and a second
// mapping of it in *view, as the drafter process attaches it.
void CreateAndAttach(const KvCacheOptions& o, std::optional<KvCache>* owner, std::optional<KvCache>* view) {
  auto created = KvCache::Create(TinyConfig(), o);
  ASSERT_THAT(created, IsOk());
  owner->emplace(std::move(*created));
  KvCacheOptions attach;
  attach.shared_memory_name = o.shared_memory_name;
  auto attached = KvCache::Attach(TinyConfig(), attach);
  ASSERT_THAT(attached, IsOk());
  view->emplace(std::move(*attached));
}

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

// A bfloat16 pool stores K/V in half the bytes (the scratch stays in the
// compute dtype); the fused path (rounding each position's K/V as it writes
// them, reading them in AttendPagedRowsBf16) computes what the eager path
// computes on the same pool, and both stay near a float32 pool.
TEST(KvCacheTest, Bfloat16PoolHalvesTheBytesAndComputesAsTheEagerPath) {
  const KvCacheOptions f32 = Paged(2, 0, 8, 16, 3);
  KvCacheOptions bf16 = f32;
  bf16.kv_dtype = c10::kBFloat16;
  EXPECT_EQ(KvCache::BlockBytes(TinyConfig(), bf16) * 2, KvCache::BlockBytes(TinyConfig(), f32));
  EXPECT_LT(KvCache::PoolBytes(TinyConfig(), bf16), KvCache::PoolBytes(TinyConfig(), f32));
  bf16.shared_memory_name = "/lede-kv-test-bf16-" + std::to_string(::getpid());
  auto shared = KvCache::Create(TinyConfig(), bf16);
  ASSERT_THAT(shared, IsOk());
  EXPECT_EQ(shared->k(0).scalar_type(), at::kBFloat16);
  EXPECT_EQ(shared->exit_hidden().scalar_type(), at::kFloat);
  KvCacheOptions attach;
  attach.shared_memory_name = bf16.shared_memory_name;
  auto view = KvCache::Attach(TinyConfig(), attach);
  ASSERT_THAT(view, IsOk());
  EXPECT_EQ(view->k(3).scalar_type(), at::kBFloat16) << "the drafter reads the pool's K/V dtype";
  attach.kv_dtype = c10::kFloat;
  EXPECT_THAT(KvCache::Attach(TinyConfig(), attach), StatusIs(StatusCode::kFailedPrecondition));

  c10::InferenceMode guard;
  ModelOptions eager_options;
  eager_options.kernels = Kernels::kEager;
  auto fused = LlamaModel::RandomInit(TinyConfig(), 5, ModelOptions{}, 0.3);
  auto eager = LlamaModel::RandomInit(TinyConfig(), 5, eager_options, 0.3);
  ASSERT_THAT(fused, IsOk());
  ASSERT_THAT(eager, IsOk());
  bf16.shared_memory_name.clear();
  auto cf = KvCache::Create(TinyConfig(), bf16);
  auto ce = KvCache::Create(TinyConfig(), bf16);
  auto full = KvCache::Create(TinyConfig(), f32);
  for (auto* c : {&cf, &ce, &full}) {
    ASSERT_THAT(*c, IsOk());
    ASSERT_THAT((*c)->Allocate(1, 30), IsOk());
  }
  auto ids = [](std::vector<int64_t> v) { return at::tensor(v, at::kLong).view({1, -1}); };
  const int64_t L = (*fused)->n_layers();
  auto step = [&](const LlamaModel& m, KvCache& c, const std::vector<int64_t>& tokens, int64_t pos) {
    return m.ExitLogits(m.Forward(m.Embed(ids(tokens)), 0, L, pos, &c, 0));
  };
  std::vector<int64_t> tokens = {4, 8, 15, 16, 23, 42};
  int64_t pos = 0;
  for (int round = 0; round < 8; ++round) {
    at::Tensor a = step(**fused, *cf, tokens, pos), b = step(**eager, *ce, tokens, pos);
    at::Tensor reference = step(**fused, *full, tokens, pos);
    EXPECT_LT((a - b).abs().max().item<float>(), 1e-4) << "round " << round;
    // bfloat16 keeps 8 bits of mantissa; through this random model's four
    // layers the logits move by up to 3% of their scale (a wrong block or
    // position would move them by their whole scale).
    EXPECT_LT((a - reference).abs().max().item<float>(), 5e-2 * reference.abs().max().item<float>())
        << "round " << round;
    pos += static_cast<int64_t>(tokens.size());
    for (auto* c : {&cf, &ce, &full}) ASSERT_THAT((*c)->Commit(0, pos), IsOk());
    tokens = {static_cast<int64_t>(reference[0][-1].argmax().item<int64_t>())};
  }
  for (int64_t l = 0; l < L; ++l) EXPECT_TRUE(at::equal(cf->k(l), ce->k(l))) << "K of layer " << l;
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
  std::optional<KvCache> owner, view;
  ASSERT_NO_FATAL_FAILURE(CreateAndAttach(o, &owner, &view));
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

// BlocksWithin is the most blocks whose pool fits the budget, at most what
// backs every slot in full, and 0 when one block does not fit.
TEST(KvCacheTest, BlocksWithinIsTheMostThatFit) {
  const KvCacheOptions o = Paged(4, 64, 8, 10, 4);
  const int64_t budget = KvCache::PoolBytes(TinyConfig(), o);
  const int64_t fits = KvCache::BlocksWithin(TinyConfig(), o, budget);
  ASSERT_GE(fits, 10);
  KvCacheOptions at = o;
  at.n_blocks = fits;
  EXPECT_LE(KvCache::PoolBytes(TinyConfig(), at), budget);
  at.n_blocks = fits + 1;
  EXPECT_GT(KvCache::PoolBytes(TinyConfig(), at), budget);
  // One block: 4 layers x K,V x 2 heads x 8 positions x 8 dims x 4 bytes.
  EXPECT_EQ(KvCache::BlockBytes(TinyConfig(), o), 4 * 2 * 2 * 8 * 8 * 4);
  EXPECT_EQ(KvCache::BlocksWithin(TinyConfig(), o, int64_t{1} << 40), 4 * 8);
  EXPECT_EQ(KvCache::BlocksWithin(TinyConfig(), o, 1024), 0);
}

// A paged pool: K/V per layer are [NB, n_kv_heads, P, head_dim]; a slot gets
// blocks for what it reserves (plus a draft's D_max + 1 positions) when it is
// allocated, more as Commit grows it, and gives them back when freed; a
// reservation the free blocks cannot hold is RESOURCE_EXHAUSTED with the
// pool unchanged (docs/design.md §4).
TEST(KvCacheTest, PagedSlotsHoldWhatTheyReserve) {
  const KvCacheOptions o = Paged(4, 64, 8, 10, 3);
  auto cache = KvCache::Create(TinyConfig(), o);
  ASSERT_THAT(cache, IsOk());
  EXPECT_TRUE(cache->paged());
  EXPECT_EQ(cache->k(0).sizes(), (std::vector<int64_t>{10, 2, 8, 8}));
  EXPECT_EQ(cache->block_table().sizes(), (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(cache->n_free_blocks(), 10);

  // 5 tokens + 4 of draft room: 2 blocks.
  auto a = cache->Allocate(1, 5);
  ASSERT_THAT(a, IsOk());
  EXPECT_EQ(cache->n_slot_blocks(*a), 2);
  EXPECT_EQ(cache->mapped_tokens(*a), 16);
  EXPECT_EQ(cache->n_free_blocks(), 8);
  EXPECT_EQ(cache->blocks_of(*a)[0], 0);
  EXPECT_EQ(cache->blocks_of(*a)[1], 1);
  EXPECT_EQ(cache->blocks_of(*a)[2], -1);
  EXPECT_EQ(cache->RowOf(*a, 9, 1), (1 * 2 + 1) * 8 + 1);

  // 40 tokens + 4: 6 blocks; a third such reservation finds 2 free.
  auto b = cache->Allocate(2, 40);
  ASSERT_THAT(b, IsOk());
  EXPECT_EQ(cache->n_free_blocks(), 2);
  EXPECT_THAT(cache->Allocate(3, 40), StatusIs(StatusCode::kResourceExhausted, ::testing::HasSubstr("KV blocks")));
  EXPECT_EQ(cache->n_in_use(), 2);
  EXPECT_EQ(cache->n_free_blocks(), 2);

  // Committing 14 tokens of `a` wants 14 + 4 = 18 positions: a third block.
  ASSERT_THAT(cache->Commit(*a, 14), IsOk());
  EXPECT_EQ(cache->n_slot_blocks(*a), 3);
  EXPECT_EQ(cache->blocks_of(*a)[2], 8);
  // 24 committed wants 28 (4 blocks); one is free: granted as far as it goes.
  ASSERT_THAT(cache->Commit(*a, 24), IsOk());
  EXPECT_EQ(cache->n_slot_blocks(*a), 4);
  EXPECT_EQ(cache->n_free_blocks(), 0);
  // Past its blocks with none free: refused, length unchanged.
  EXPECT_THAT(cache->Commit(*a, 40), StatusIs(StatusCode::kResourceExhausted));
  EXPECT_EQ(cache->length(*a), 24);

  // Freeing `b` returns its 6 blocks; a reservation of the whole capacity
  // (reserve 0) needs 8.
  ASSERT_THAT(cache->Free(*b), IsOk());
  EXPECT_EQ(cache->n_free_blocks(), 6);
  EXPECT_EQ(cache->blocks_of(*b)[0], -1);
  EXPECT_THAT(cache->Allocate(3), StatusIs(StatusCode::kResourceExhausted));
  ASSERT_THAT(cache->Free(*a), IsOk());
  EXPECT_EQ(cache->n_free_blocks(), 10);
  auto whole = cache->Allocate(3);
  ASSERT_THAT(whole, IsOk());
  EXPECT_EQ(cache->mapped_tokens(*whole), 64);
  EXPECT_THAT(KvCache::Create(TinyConfig(), [&] {
                KvCacheOptions few = o;
                few.n_blocks = 7;  // under one sequence of 64 tokens
                return few;
              }()),
              StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("n_blocks")));
}

// A paged slot freed while a draft of its session still runs keeps its
// blocks (the draft may still write them) until that draft ends; the next
// Allocate takes them back. The drafter sees the table through Attach.
TEST(KvCacheTest, PagedBlocksOfARunningDraftComeBackWhenItEnds) {
  KvCacheOptions o = Paged(2, 32, 8, 4, 3);
  o.shared_memory_name = "/lede-kv-test-paged-" + std::to_string(::getpid());
  std::optional<KvCache> owner, drafter;
  ASSERT_NO_FATAL_FAILURE(CreateAndAttach(o, &owner, &drafter));
  EXPECT_TRUE(drafter->paged());
  EXPECT_EQ(drafter->block_tokens(), 8);
  EXPECT_EQ(drafter->n_blocks(), 4);

  auto a = owner->Allocate(0xA, 20);  // 24 positions: 3 blocks
  ASSERT_THAT(a, IsOk());
  EXPECT_EQ(drafter->n_slot_blocks(*a), 3);
  EXPECT_EQ(drafter->blocks_of(*a)[2], 2);
  ASSERT_TRUE(drafter->BeginDrafting(*a, 0xA));
  ASSERT_THAT(owner->Free(*a), IsOk());
  EXPECT_EQ(owner->n_slot_blocks(*a), 3) << "the running draft's blocks were given back";
  EXPECT_EQ(owner->n_free_blocks(), 1);
  EXPECT_THAT(owner->Allocate(0xB, 20), StatusIs(StatusCode::kResourceExhausted));
  drafter->EndDrafting(*a);
  auto b = owner->Allocate(0xB, 20);
  ASSERT_THAT(b, IsOk());
  EXPECT_EQ(*b, *a) << "the first free slot is reused";
  EXPECT_EQ(owner->n_slot_blocks(*b), 3);
  EXPECT_EQ(owner->n_free_blocks(), 1);
}

// A sequence whose blocks are scattered through the pool (two sequences
// growing in turn) computes what a contiguous slot computes: the fused path
// (paged attention), the eager path (gathered K/V) and the static-shape path
// (rows from the device block table), prefill and decode.
TEST(KvCacheTest, PagedPoolComputesWhatAContiguousPoolDoes) {
  c10::InferenceMode guard;
  ModelOptions fused_options, eager_options;
  eager_options.kernels = Kernels::kEager;
  auto fused = LlamaModel::RandomInit(TinyConfig(), 11, fused_options, 0.3);
  auto eager = LlamaModel::RandomInit(TinyConfig(), 11, eager_options, 0.3);
  ASSERT_THAT(fused, IsOk());
  ASSERT_THAT(eager, IsOk());
  const int64_t L = (*fused)->n_layers();
  const KvCacheOptions paged_options = Paged(3, 0, 8, 30, 3);
  auto contiguous = KvCache::Create(TinyConfig(), KvCacheOptions{});
  auto paged = KvCache::Create(TinyConfig(), paged_options);
  auto paged_eager = KvCache::Create(TinyConfig(), paged_options);
  auto paged_static = KvCache::Create(TinyConfig(), paged_options);
  ASSERT_THAT(contiguous, IsOk());
  ASSERT_THAT(paged, IsOk());
  ASSERT_THAT(paged_eager, IsOk());
  ASSERT_THAT(paged_static, IsOk());
  auto ids = [](std::vector<int64_t> v) { return at::tensor(v, at::kLong).view({1, -1}); };
  // Slot 1 of each paged pool: slot 0 takes blocks in between as both grow.
  for (KvCache* c : {&*paged, &*paged_eager, &*paged_static}) {
    ASSERT_THAT(c->Allocate(1, 1), IsOk());
    ASSERT_THAT(c->Allocate(2, 10), IsOk());
  }
  auto step = [&](const LlamaModel& m, KvCache& c, int64_t slot, const std::vector<int64_t>& tokens, int64_t pos) {
    return m.ExitLogits(m.Forward(m.Embed(ids(tokens)), 0, L, pos, &c, slot));
  };
  auto static_step = [&](KvCache& c, int64_t slot, const std::vector<int64_t>& tokens, int64_t pos) {
    const auto lopts = at::TensorOptions().dtype(at::kLong);
    return (*eager)->ExitLogits((*eager)->StaticForward((*eager)->Embed(ids(tokens)), 0, L, at::tensor({pos}, lopts),
                                                        at::tensor({slot}, lopts), c.capacity(), c));
  };
  std::vector<int64_t> tokens = {5, 17, 3, 9, 44, 2, 8, 30, 12, 7};
  int64_t pos = 0;
  for (int round = 0; round < 12; ++round) {
    at::Tensor want = step(**fused, *contiguous, 0, tokens, pos);
    at::Tensor got = step(**fused, *paged, 1, tokens, pos);
    at::Tensor got_eager = step(**eager, *paged_eager, 1, tokens, pos);
    at::Tensor got_static = static_step(*paged_static, 1, tokens, pos);
    EXPECT_LT((got - want).abs().max().item<float>(), 1e-5) << "fused, round " << round;
    EXPECT_LT((got_eager - want).abs().max().item<float>(), 1e-4) << "eager, round " << round;
    EXPECT_LT((got_static - want).abs().max().item<float>(), 1e-4) << "static, round " << round;
    pos += static_cast<int64_t>(tokens.size());
    ASSERT_THAT(contiguous->Commit(0, pos), IsOk());
    for (KvCache* c : {&*paged, &*paged_eager, &*paged_static}) {
      ASSERT_THAT(c->Commit(1, pos), IsOk());
      ASSERT_THAT(c->Commit(0, c->length(0) + 3), IsOk());  // the other sequence grows too
    }
    tokens = {static_cast<int64_t>(want[0][-1].argmax().item<int64_t>())};
  }
  // Slot 1's blocks are not one run: the pool interleaved them.
  const int64_t* table = paged->blocks_of(1);
  bool scattered = false;
  for (int64_t i = 1; i < paged->n_slot_blocks(1); ++i) scattered |= table[i] != table[i - 1] + 1;
  EXPECT_TRUE(scattered);
}

// Session words: a slot holds its session's id; a draft begins
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
  std::optional<KvCache> owner, drafter;
  ASSERT_NO_FATAL_FAILURE(CreateAndAttach(o, &owner, &drafter));

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
  checkpoint::ModelConfig other = TinyConfig();
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
