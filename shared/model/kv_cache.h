// File: shared/model/kv_cache.h
//
// KvCache: the KV pool shared by drafting and verification (docs/design.md §4).
// S slots x capacity C tokens; per layer l:
//   k(l), v(l)      [S, n_kv_heads, C, head_dim]   compute dtype, model device
// plus the exit-hidden-state scratch (LayerSkip's exit query cache):
//   exit_hidden()   [S, max_draft_len + 1, d]      compute dtype
// and, per slot, the committed length n (positions [0, n) hold K/V at every
// layer: the invariant after every verification).
//
// Ownership rule: only Commit()/Truncate() move a slot's committed length;
// LlamaModel::Forward writes K/V at explicit positions (drafts land beyond
// the committed length and are adopted by Commit() or discarded by leaving
// the length where it is, so rejection is a truncation, never a copy).
// On the CPU the pool can live in a named POSIX shared-memory segment that
// the verifier process creates (Create with shared_memory_name) and the
// drafter process maps (Attach), docs/design.md §4. The segment starts with a
// header (magic "LEDEKV01", layout version, model fingerprint, dims, dtype,
// epoch) that Attach validates, then the per-slot committed lengths, session
// words and drafter counts, then K, V of every layer and the scratch,
// 64-byte aligned.
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
// Thread-safety: not thread-safe. Distinct slots may be used from distinct
// threads only if the caller serializes Allocate()/Free().
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
  int64_t capacity = 0;       // C in tokens; 0 = the model's max_seq_len
  int64_t max_draft_len = 16; // D_max: rows of the exit-hidden scratch - 1
  c10::Device device = c10::kCPU;
  c10::ScalarType dtype = c10::kFloat;
  // CPU only: "" keeps the pool in private memory; a POSIX shared-memory
  // name ("/lede-kv-main") puts it in that segment so another process can
  // Attach() it.
  std::string shared_memory_name;
  // Example: KvCacheOptions{.n_slots = 4, .capacity = 2048}
};

class KvCache {
 public:
  // Allocates the pool (zero-filled).
  // Errors: kInvalidArgument for non-positive sizes or a capacity above the
  // model's max_seq_len; kResourceExhausted if allocation fails.
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
  // (n_slots, capacity and max_draft_len are read from its header).
  // Errors: kNotFound if no such segment exists; kFailedPrecondition naming
  // the field if its magic, layout version, model fingerprint, dims or dtype
  // differ from `config` / options.dtype.
  static StatusOr<KvCache> Attach(const checkpoint::ModelConfig& config, const KvCacheOptions& options);

  // Bytes a pool of `options` takes (capacity 0 = the model's max_seq_len):
  // header, per-slot words, K and V of every layer and the exit scratch, as
  // laid out in a shared segment (a private pool takes no more). The KV
  // memory budget of the model service is checked against this.
  static int64_t PoolBytes(const checkpoint::ModelConfig& config, const KvCacheOptions& options);
  // The largest capacity (tokens per slot, at most the model's max_seq_len)
  // for which PoolBytes(options with that capacity) <= budget_bytes; 0 when
  // not even one token per slot fits. options.capacity is ignored.
  static int64_t CapacityWithin(const checkpoint::ModelConfig& config, const KvCacheOptions& options, int64_t budget_bytes);

  // The pool's epoch (random at creation; 0 never occurs).
  uint64_t epoch() const { return epoch_; }
  const std::string& shared_memory_name() const { return options_.shared_memory_name; }
  // Slots in use.
  int64_t n_in_use() const;

  int64_t n_layers() const { return static_cast<int64_t>(k_.size()); }
  int64_t n_slots() const { return options_.n_slots; }
  int64_t capacity() const { return options_.capacity; }
  int64_t max_draft_len() const { return options_.max_draft_len; }

  // Per-layer K / V: [S, n_kv_heads, C, head_dim].
  const at::Tensor& k(int64_t layer) const { return k_[layer]; }
  const at::Tensor& v(int64_t layer) const { return v_[layer]; }
  // [S, max_draft_len + 1, d].
  const at::Tensor& exit_hidden() const { return exit_hidden_; }

  // The session word of a free slot.
  static constexpr uint64_t kNoSession = 0;

  // Reserves a free slot for `session_id` (any value but kNoSession; the
  // default names an anonymous session) and returns its index (length 0).
  // A free slot with a draft of its previous session still running is
  // skipped. Errors: kResourceExhausted when no slot is free (pool
  // unchanged); kInvalidArgument for kNoSession.
  StatusOr<int64_t> Allocate(uint64_t session_id = 1);
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
  // Releases a slot. Errors: kInvalidArgument for an unknown/free slot.
  Status Free(int64_t slot);

  // Committed length of `slot` in tokens.
  int64_t length(int64_t slot) const { return length_[slot]; }
  // Adopts positions [length, new_length) (their K/V must be written at all
  // layers). Errors: kOutOfRange if new_length > capacity or < length.
  Status Commit(int64_t slot, int64_t new_length);
  // Rolls back to new_length <= length (rejection). Nothing is copied.
  // Errors: kOutOfRange if new_length < 0 or > length.
  Status Truncate(int64_t slot, int64_t new_length);

  // Bytes held by K, V and the scratch.
  int64_t bytes() const;

 private:
  struct Storage;  // private memory or a mapped segment; shared by copies
  // Create's two kinds of pool, once options_ (capacity resolved and
  // checked), epoch_ and storage_ are set: K/V in private memory (errors:
  // kResourceExhausted), or in a new shared segment named
  // options_.shared_memory_name (errors as Create's).
  Status AllocatePrivate(const checkpoint::ModelConfig& config);
  Status CreateSegment(const checkpoint::ModelConfig& config);

  KvCacheOptions options_;
  std::shared_ptr<Storage> storage_;
  std::vector<at::Tensor> k_, v_;
  at::Tensor exit_hidden_;
  int64_t* length_ = nullptr;  // [S], in the storage (shared across processes)
  int64_t* in_use_ = nullptr;    // [S], the session word (kNoSession = free)
  int64_t* drafters_ = nullptr;  // [S], drafts running (BeginDrafting)
  uint64_t epoch_ = 0;
};

}  // namespace lede::model

#endif  // LEDE_SHARED_MODEL_KV_CACHE_H_
