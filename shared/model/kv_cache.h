// File: shared/model/kv_cache.h
//
// KvCache: the KV pool shared by drafting and verification (docs/design.md §4),
// paged as in vLLM's PagedAttention: the K/V live in NB blocks of P tokens,
// and each of S slots (sequences) maps its positions to blocks through a
// block table. Per layer l:
//   k(l), v(l)      [NB, n_kv_heads, P, head_dim]   kv_dtype, model device
//   block_table()   [S, ceil(C / P)]                int64, -1 = no block
// (position p of slot s lives in block block_table[s][p / P], row p % P), plus
// the exit-hidden-state scratch (LayerSkip's exit query cache):
//   exit_hidden()   [S, max_draft_len + 1, d]      compute dtype
// and, per slot, the committed length n (positions [0, n) hold K/V at every
// layer: the invariant after every verification). C (capacity) is the most
// tokens one sequence may hold.
//
// Two ways to size it (KvCacheOptions):
//  - backed in full (n_blocks 0, the default): NB = S x ceil(C / P) and each
//    slot owns its blocks from creation; with block_tokens 0 (P = C) this is
//    one contiguous [Hkv, C, hd] region per slot and layer.
//  - paged (0 < n_blocks < S x ceil(C / P)): a slot gets blocks when it is
//    allocated, for the tokens it reserves (its prompt and new tokens, plus a
//    draft's max_draft_len + 1), and more as Commit() grows it; Free() returns
//    them. So the sum of live sequences, not S x C, must fit the memory, and
//    slots are cheap. Blocks are only given and taken by the process that
//    created the pool (the verifier); a slot always has blocks for
//    max_draft_len + 1 positions past its committed length, so a drafter in
//    another process writes drafts only where blocks already are.
//
// Ownership rule: only Commit()/Truncate() move a slot's committed length;
// LlamaModel::Forward writes K/V at explicit positions (drafts land beyond
// the committed length and are adopted by Commit() or discarded by leaving
// the length where it is, so rejection is a truncation, never a copy).
// On the CPU the pool can live in a named POSIX shared-memory segment that
// the verifier process creates (Create with shared_memory_name) and the
// drafter process maps (Attach), docs/design.md §4. The segment starts with a
// header (magic "LEDEKV01", layout version, model fingerprint, dims, dtypes,
// block geometry, epoch) that Attach validates, then the per-slot committed
// lengths, session words, drafter counts and block counts, the block table,
// the free-block stack, then K, V of every layer and the scratch, 64-byte
// aligned.
//
// Session words (docs/security.md, the internal plane): a slot in use holds the 64-bit id of the session
// that owns it (the verifier draws a random one per session; 0 = free). A
// call that names a slot must also name its session, so a stale handle (a
// cancelled request's late Draft or Verify) or a foreign one can never touch
// the slot's next owner. A drafter in another process brackets its work on a
// slot with BeginDrafting()/EndDrafting(): BeginDrafting fails unless the
// slot still holds the session, and Allocate() never hands out a slot whose
// drafter count is not zero, so a draft that began before its session was
// freed cannot write into the next session's K/V (the count is raised
// before the session word is read, and Free clears the word before Allocate
// reads the count: sequentially consistent atomics on the shared words).
// The epoch is a random number drawn at creation: a restarted verifier
// makes a new pool with a new epoch, and requests that name the old one are
// refused instead of reading a stranger's K/V.
//
// Thread-safety: not thread-safe, except that blocks are given and taken
// under a lock of the creating process, so Commit() of distinct slots may run
// on distinct threads. Distinct slots may be used from distinct threads only
// if the caller serializes Allocate()/Free().
#ifndef LEDE_SHARED_MODEL_KV_CACHE_H_
#define LEDE_SHARED_MODEL_KV_CACHE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "shared/checkpoint/model_config.h"
#include "shared/status/status.h"

namespace lede::model {

struct KvCacheOptions {
  int64_t n_slots = 1;        // S: concurrent sequences
  int64_t capacity = 0;       // C: most tokens of one sequence; 0 = the model's max_seq_len
  int64_t block_tokens = 0;   // P: tokens per KV block; 0 = C (one block per slot)
  // NB: blocks in the pool; 0 = S x ceil(C / P) (every slot backed in full).
  // Fewer pages the pool (see above); at least ceil(C / P), so that one
  // sequence of C tokens fits.
  int64_t n_blocks = 0;
  int64_t max_draft_len = 16; // D_max: rows of the exit-hidden scratch - 1
  c10::Device device = c10::kCPU;
  c10::ScalarType dtype = c10::kFloat;  // the exit-hidden scratch's (the compute dtype)
  // K and V's storage; Undefined = dtype. The fused CPU path reads float32
  // and bfloat16 K/V (cpu::AttendPagedRows, AttendPagedRowsBf16), converting a
  // float32 position's K/V to bfloat16 (round to nearest even) as it writes
  // it; the eager path converts whole tensors. bfloat16 halves the pool.
  c10::ScalarType kv_dtype = c10::ScalarType::Undefined;
  // CPU only: "" keeps the pool in private memory; a POSIX shared-memory
  // name ("/lede-kv-main") puts it in that segment so another process can
  // Attach() it.
  std::string shared_memory_name;
  // Examples: KvCacheOptions{.n_slots = 4, .capacity = 2048} (backed in
  // full); {.n_slots = 16, .capacity = 2048, .block_tokens = 64,
  // .n_blocks = 256} (16 sequences sharing 16,384 tokens, 2,048 at most each).
};

// A K/V dtype by name, as --kv-dtype takes it: "bfloat16" (bf16),
// "float32" (f32), or "auto" = `compute` (the model's dtype). One parser
// for lede-model and the CLIs. Errors: kInvalidArgument naming `field` (the
// caller's flag) and the value.
StatusOr<c10::ScalarType> ParseKvDtype(const std::string& name, c10::ScalarType compute,
                                       const std::string& field = "kv_dtype");

class KvCache {
 public:
  // Allocates the pool (zero-filled).
  // Errors: kInvalidArgument for non-positive sizes, a capacity above the
  // model's max_seq_len, or fewer blocks than one sequence of C tokens needs;
  // kResourceExhausted if allocation fails.
  // With shared_memory_name, creates the segment (replacing a stale one of
  // that name) and removes the name when the last copy of this KvCache is
  // destroyed; the memory lives on while an attached process maps it.
  // Errors: kInvalidArgument for non-positive sizes, a capacity above the
  // model's max_seq_len, or a shared pool on a non-CPU device;
  // kResourceExhausted if allocation (or shm_open/ftruncate/fallocate/mmap)
  // fails. A shared segment's memory is reserved at creation (fallocate), so
  // a pool that /dev/shm cannot hold is refused here rather than faulting
  // (SIGBUS) when its pages are first written.
  static StatusOr<KvCache> Create(const checkpoint::ModelConfig& config,
                                  const KvCacheOptions& options);
  // Maps the pool another process created under options.shared_memory_name
  // (n_slots, capacity, block geometry and max_draft_len are read from its
  // header).
  // Errors: kNotFound if no such segment exists; kFailedPrecondition naming
  // the field if its magic, layout version, model fingerprint, dims or dtype
  // differ from `config` / options.dtype.
  static StatusOr<KvCache> Attach(const checkpoint::ModelConfig& config, const KvCacheOptions& options);

  // Bytes a pool of `options` takes (capacity 0 = the model's max_seq_len,
  // n_blocks 0 = backed in full): header, per-slot words, block table, free
  // stack, K and V of every layer and the exit scratch, as laid out in a
  // shared segment (a private pool takes no more). The KV memory budget of
  // the model service is checked against this.
  static int64_t PoolBytes(const checkpoint::ModelConfig& config, const KvCacheOptions& options);
  // The most blocks (options.block_tokens each, which must be > 0) for which
  // PoolBytes(options with that n_blocks) <= budget_bytes; 0 when not even
  // one fits. options.n_blocks is ignored.
  static int64_t BlocksWithin(const checkpoint::ModelConfig& config, const KvCacheOptions& options, int64_t budget_bytes);
  // Blocks of `block_tokens` that `tokens` positions occupy.
  static int64_t BlocksFor(int64_t tokens, int64_t block_tokens) { return (tokens + block_tokens - 1) / block_tokens; }

  // The pool's epoch (random at creation; 0 never occurs).
  uint64_t epoch() const { return epoch_; }
  const std::string& shared_memory_name() const { return options_.shared_memory_name; }
  // Slots in use.
  int64_t n_in_use() const;

  int64_t n_layers() const { return static_cast<int64_t>(k_.size()); }
  int64_t n_slots() const { return options_.n_slots; }
  int64_t capacity() const { return options_.capacity; }
  int64_t max_draft_len() const { return options_.max_draft_len; }
  int64_t block_tokens() const { return options_.block_tokens; }  // P
  int64_t n_blocks() const { return options_.n_blocks; }          // NB
  int64_t blocks_per_slot() const { return blocks_per_slot_; }    // ceil(C / P)
  // True when blocks are given as sequences need them (see above).
  bool paged() const { return options_.n_blocks < options_.n_slots * blocks_per_slot_; }
  // Blocks no slot holds (paged pools; 0 for a pool backed in full).
  int64_t n_free_blocks() const;
  // Blocks `slot` holds: its positions [0, n_slot_blocks * P) (capped at C)
  // have a block.
  int64_t n_slot_blocks(int64_t slot) const { return slot_blocks_[slot]; }
  // Positions of `slot` that have a block: min(C, n_slot_blocks * P).
  int64_t mapped_tokens(int64_t slot) const;

  // Per-layer K / V: [NB, n_kv_heads, P, head_dim].
  const at::Tensor& k(int64_t layer) const { return k_[layer]; }
  const at::Tensor& v(int64_t layer) const { return v_[layer]; }
  // [S, ceil(C / P)] int64 on the pool's device: the block of each slot's
  // position block, -1 where the slot has none. Read-only for callers.
  const at::Tensor& block_table() const { return block_table_; }
  // The block table on the host: row `slot`, ceil(C / P) entries.
  const int64_t* blocks_of(int64_t slot) const { return table_ + slot * blocks_per_slot_; }
  // Row offset of (slot, position, kv head) in k(l) / v(l) viewed as
  // [NB * n_kv_heads * P, head_dim]: ((block * Hkv + head) * P + position % P).
  // The position must have a block (TORCH_CHECK otherwise).
  int64_t RowOf(int64_t slot, int64_t position, int64_t kv_head) const;
  // [S, max_draft_len + 1, d].
  const at::Tensor& exit_hidden() const { return exit_hidden_; }

  // The session word of a free slot.
  static constexpr uint64_t kNoSession = 0;

  // Reserves a free slot for `session_id` (any value but kNoSession; the
  // default names an anonymous session) and returns its index (length 0).
  // A paged pool also gives it blocks for min(C, reserve_tokens +
  // max_draft_len + 1) positions (reserve_tokens 0: C), the sequence's
  // prompt and new tokens. A free slot with a draft of its previous session
  // still running is skipped. Errors (pool unchanged): kResourceExhausted
  // when no slot is free or too few blocks are; kInvalidArgument for
  // kNoSession or a negative reserve_tokens.
  StatusOr<int64_t> Allocate(uint64_t session_id = 1, int64_t reserve_tokens = 0);
  // The session holding `slot` (kNoSession when free). Atomic; callable
  // from any thread or process while others allocate and free.
  uint64_t session(int64_t slot) const;
  // Marks a draft on `slot` for `session_id` as running; false (nothing
  // marked) when the slot is out of range or not held by that session.
  // Pair every true with one EndDrafting(slot). Thread- and process-safe.
  bool BeginDrafting(int64_t slot, uint64_t session_id);
  void EndDrafting(int64_t slot);
  // Drafts running on `slot` now (BeginDrafting minus EndDrafting).
  int64_t n_drafting(int64_t slot) const;
  // Releases a slot and (paged) its blocks; blocks of a slot a draft is
  // still running on are returned when that draft ends, at a later
  // Allocate(). Errors: kInvalidArgument for an unknown/free slot.
  Status Free(int64_t slot);

  // Committed length of `slot` in tokens.
  int64_t length(int64_t slot) const { return length_[slot]; }
  // Adopts positions [length, new_length) (their K/V must be written at all
  // layers). A paged slot then gets blocks up to new_length +
  // max_draft_len + 1 positions (capped at C) if it has fewer.
  // Errors: kOutOfRange if new_length > capacity or < length;
  // kResourceExhausted (length unchanged) if the blocks for new_length are
  // not there and none are free.
  Status Commit(int64_t slot, int64_t new_length);
  // Rolls back to new_length <= length (rejection). Nothing is copied.
  // Errors: kOutOfRange if new_length < 0 or > length.
  Status Truncate(int64_t slot, int64_t new_length);

  // Bytes held by K, V and the scratch.
  int64_t bytes() const;
  // Bytes of K and V one block holds at all layers.
  static int64_t BlockBytes(const checkpoint::ModelConfig& config, const KvCacheOptions& options);

 private:
  struct Storage;  // private memory or a mapped segment; shared by copies
  // Create's two kinds of pool, once options_ (capacity resolved and
  // checked), epoch_ and storage_ are set: K/V in private memory (errors:
  // kResourceExhausted), or in a new shared segment named
  // options_.shared_memory_name (errors as Create's).
  Status AllocatePrivate(const checkpoint::ModelConfig& config);
  Status CreateSegment(const checkpoint::ModelConfig& config);
  // A new pool's block table and free stack: every slot's own blocks in
  // order (backed in full), or every block free (paged).
  void InitBlocks();
  // Gives `slot` blocks until it holds `n` (paged; caller holds the block
  // lock). False, with nothing given, if too few are free.
  bool GrowSlot(int64_t slot, int64_t n);
  // Returns the blocks of free slots no draft runs on (paged; caller holds
  // the block lock).
  void ReclaimBlocks();
  // Mirrors host table rows to a device block_table_ (CUDA pools).
  void SyncTable(int64_t slot);
  // Points the word pointers (length_ .. free_) into `words`, laid out in
  // that order; block_table_ becomes a view of table_ unless already set (a
  // device copy). n_slots and blocks_per_slot_ must be set.
  void BindWords(char* words);
  // Gives `slot`'s blocks back to the free stack (paged; block lock held).
  void ReleaseBlocks(int64_t slot);

  KvCacheOptions options_;
  std::shared_ptr<Storage> storage_;
  std::vector<at::Tensor> k_, v_;
  at::Tensor exit_hidden_;
  int64_t* length_ = nullptr;  // [S], in the storage (shared across processes)
  int64_t* in_use_ = nullptr;    // [S], the session word (kNoSession = free)
  int64_t* drafters_ = nullptr;  // [S], drafts running (BeginDrafting)
  int64_t* slot_blocks_ = nullptr;  // [S], blocks each slot holds
  int64_t* table_ = nullptr;        // [S, blocks_per_slot_], the block table
  int64_t* free_top_ = nullptr;     // free blocks: free_[0, *free_top_)
  int64_t* free_ = nullptr;         // [NB]
  at::Tensor block_table_;          // table_ as a tensor (a copy on CUDA)
  int64_t blocks_per_slot_ = 0;
  uint64_t epoch_ = 0;
};

}  // namespace lede::model

#endif  // LEDE_SHARED_MODEL_KV_CACHE_H_
