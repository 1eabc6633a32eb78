#include "shared/model/kv_cache.h"

#include <string>

#include <ATen/ATen.h>

namespace lede::model {

StatusOr<KvCache> KvCache::Create(const ModelConfig& config,
                                  const KvCacheOptions& options) {
  KvCache cache;
  cache.options_ = options;
  if (cache.options_.capacity == 0) cache.options_.capacity = config.max_seq_len;
  const KvCacheOptions& o = cache.options_;
  if (o.n_slots <= 0) return InvalidArgumentError("KvCacheOptions.n_slots must be > 0");
  if (o.capacity <= 0 || o.capacity > config.max_seq_len) {
    return InvalidArgumentError("KvCacheOptions.capacity must be in [1, max_seq_len=" +
                                std::to_string(config.max_seq_len) + "], got " +
                                std::to_string(o.capacity));
  }
  if (o.max_draft_len <= 0) {
    return InvalidArgumentError("KvCacheOptions.max_draft_len must be > 0");
  }
  try {
    auto opts = at::TensorOptions().device(o.device).dtype(o.dtype);
    for (int64_t l = 0; l < config.n_layers; ++l) {
      cache.k_.push_back(at::zeros({o.n_slots, config.n_kv_heads, o.capacity, config.head_dim()}, opts));
      cache.v_.push_back(at::zeros({o.n_slots, config.n_kv_heads, o.capacity, config.head_dim()}, opts));
    }
    cache.exit_hidden_ = at::zeros({o.n_slots, o.max_draft_len + 1, config.dim}, opts);
  } catch (const std::exception& e) {
    return ResourceExhaustedError(std::string("KV cache allocation failed: ") + e.what());
  }
  cache.length_.assign(o.n_slots, 0);
  cache.in_use_.assign(o.n_slots, false);
  return cache;
}

StatusOr<int64_t> KvCache::Allocate() {
  for (int64_t s = 0; s < n_slots(); ++s) {
    if (!in_use_[s]) {
      in_use_[s] = true;
      length_[s] = 0;
      return s;
    }
  }
  return ResourceExhaustedError("all " + std::to_string(n_slots()) + " KV slots are in use");
}

Status KvCache::Free(int64_t slot) {
  if (slot < 0 || slot >= n_slots() || !in_use_[slot]) {
    return InvalidArgumentError("KV slot " + std::to_string(slot) + " is not allocated");
  }
  in_use_[slot] = false;
  length_[slot] = 0;
  return OkStatus();
}

Status KvCache::Commit(int64_t slot, int64_t new_length) {
  if (new_length < length_[slot] || new_length > capacity()) {
    return OutOfRangeError("commit to " + std::to_string(new_length) + " outside [" +
                           std::to_string(length_[slot]) + ", " + std::to_string(capacity()) + "]");
  }
  length_[slot] = new_length;
  return OkStatus();
}

Status KvCache::Truncate(int64_t slot, int64_t new_length) {
  if (new_length < 0 || new_length > length_[slot]) {
    return OutOfRangeError("truncate to " + std::to_string(new_length) + " outside [0, " +
                           std::to_string(length_[slot]) + "]");
  }
  length_[slot] = new_length;
  return OkStatus();
}

int64_t KvCache::bytes() const {
  int64_t total = exit_hidden_.defined() ? exit_hidden_.nbytes() : 0;
  for (size_t l = 0; l < k_.size(); ++l) total += k_[l].nbytes() + v_[l].nbytes();
  return total;
}

}  // namespace lede::model
