// File: shared/model/internal/paged_kv.h
//
// How the engine's three paths reach the paged KV pool (kv_cache.h,
// docs/design.md §4): PagedKv for the fused CPU path (a layer's K/V of
// float32 or bfloat16 blocks, written a position at a time and attended
// block by block), and KvRows for the eager path (row indices of the pool's
// K/V viewed as [NB * Hkv * P, hd]). Internal to lede::model.
#ifndef LEDE_SHARED_MODEL_INTERNAL_PAGED_KV_H_
#define LEDE_SHARED_MODEL_INTERNAL_PAGED_KV_H_

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "shared/model/kv_cache.h"

namespace lede::model::internal {

// One layer's K and V in the paged pool (kv_cache.h) as the fused path
// writes and reads them: position p of slot s is row p % P of block
// table[s][p / P], a block [Hkv, P, hd] of float32 or bfloat16.
class PagedKv {
 public:
  PagedKv(KvCache& cache, int64_t layer)
      : k_(cache.k(layer).data_ptr()),
        v_(cache.v(layer).data_ptr()),
        bf16_(cache.k(layer).scalar_type() == at::kBFloat16),
        Hkv_(cache.k(layer).size(1)),
        P_(cache.block_tokens()),
        hd_(cache.k(layer).size(3)),
        MB_(cache.blocks_per_slot()),
        table_(cache.blocks_of(0)) {}

  // K and V of all kv heads of one position ([Hkv, hd] each, float32) into
  // the slot's block (rounded to bfloat16 for a bfloat16 pool).
  void Store(int64_t slot, int64_t pos, const float* k, const float* v) const;

  // Attention of R consecutive query rows of the slot (row r at position
  // n_keys0 - 1 + r, its G query heads of kv head kvh at q + r q_stride,
  // [G, hd]) over the slot's positions [0, n_keys0 + r)
  // (cpu::AttendPagedRows); row r's output at out + r out_stride, [G, hd].
  void AttendRows(const float* q, int64_t q_stride, int64_t R, int64_t G, int64_t slot, int64_t kvh,
                  int64_t n_keys0, float* out, int64_t out_stride) const;

 private:
  void* k_;
  void* v_;
  bool bf16_;
  int64_t Hkv_, P_, hd_, MB_;
  const int64_t* table_;
};

// Rows of positions [first, first + n) of `slot` in the pool's K/V viewed as
// [NB * Hkv * P, hd] (KvCache::RowOf): [Hkv, n] int64 on `device`, built
// from the host's block table.
at::Tensor KvRows(const KvCache& cache, int64_t slot, int64_t first, int64_t n, const c10::Device& device);

}  // namespace lede::model::internal

#endif  // LEDE_SHARED_MODEL_INTERNAL_PAGED_KV_H_
