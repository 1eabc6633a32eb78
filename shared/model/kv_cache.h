// File: shared/model/kv_cache.h
//
// KvCache: the KV pool shared by drafting and verification (DESIGN.md §4).
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
// The layout is fixed so that the pool can later live in a shared-memory
// segment (CPU) or a CUDA IPC allocation without changing callers.
//
// Thread-safety: not thread-safe. Distinct slots may be used from distinct
// threads only if the caller serializes Allocate()/Free().
#ifndef LEDE_SHARED_MODEL_KV_CACHE_H_
#define LEDE_SHARED_MODEL_KV_CACHE_H_

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "shared/model/model_config.h"
#include "shared/status/status.h"

namespace lede::model {

struct KvCacheOptions {
  int64_t n_slots = 1;        // S: concurrent sequences
  int64_t capacity = 0;       // C in tokens; 0 = the model's max_seq_len
  int64_t max_draft_len = 16; // D_max: rows of the exit-hidden scratch - 1
  c10::Device device = c10::kCPU;
  c10::ScalarType dtype = c10::kFloat;
  // Example: KvCacheOptions{.n_slots = 4, .capacity = 2048}
};

class KvCache {
 public:
  // Allocates the pool (zero-filled).
  // Errors: kInvalidArgument for non-positive sizes or a capacity above the
  // model's max_seq_len; kResourceExhausted if allocation fails.
  static StatusOr<KvCache> Create(const ModelConfig& config,
                                  const KvCacheOptions& options);

  int64_t n_layers() const { return static_cast<int64_t>(k_.size()); }
  int64_t n_slots() const { return options_.n_slots; }
  int64_t capacity() const { return options_.capacity; }
  int64_t max_draft_len() const { return options_.max_draft_len; }

  // Per-layer K / V: [S, n_kv_heads, C, head_dim].
  const at::Tensor& k(int64_t layer) const { return k_[layer]; }
  const at::Tensor& v(int64_t layer) const { return v_[layer]; }
  // [S, max_draft_len + 1, d].
  const at::Tensor& exit_hidden() const { return exit_hidden_; }

  // Reserves a free slot and returns its index (length 0).
  // Errors: kResourceExhausted when all slots are in use (pool unchanged).
  StatusOr<int64_t> Allocate();
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
  KvCacheOptions options_;
  std::vector<at::Tensor> k_, v_;
  at::Tensor exit_hidden_;
  std::vector<int64_t> length_;
  std::vector<bool> in_use_;
};

}  // namespace lede::model

#endif  // LEDE_SHARED_MODEL_KV_CACHE_H_
