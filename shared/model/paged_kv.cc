#include "shared/model/internal/paged_kv.h"

#include <cstring>

#include <ATen/ATen.h>

#include "shared/model/cpu/cpu_kernels.h"
#include "shared/model/cpu/cpu_quant_kernels.h"

namespace lede::model::internal {

void PagedKv::Store(int64_t slot, int64_t pos, const float* k, const float* v) const {
  const int64_t block = table_[slot * MB_ + pos / P_];
  for (int64_t h = 0; h < Hkv_; ++h) {
    const int64_t at = ((block * Hkv_ + h) * P_ + pos % P_) * hd_;
    if (bf16_) {
      for (int64_t i = 0; i < hd_; ++i) {
        static_cast<uint16_t*>(k_)[at + i] = cpu::FloatToBf16(k[h * hd_ + i]);
        static_cast<uint16_t*>(v_)[at + i] = cpu::FloatToBf16(v[h * hd_ + i]);
      }
    } else {
      std::memcpy(static_cast<float*>(k_) + at, k + h * hd_, hd_ * sizeof(float));
      std::memcpy(static_cast<float*>(v_) + at, v + h * hd_, hd_ * sizeof(float));
    }
  }
}

void PagedKv::AttendRows(const float* q, int64_t q_stride, int64_t R, int64_t G, int64_t slot, int64_t kvh,
                         int64_t n_keys0, float* out, int64_t out_stride) const {
  const int64_t* blocks = table_ + slot * MB_;
  const int64_t head = kvh * P_ * hd_, stride = Hkv_ * P_ * hd_;
  if (bf16_) {
    cpu::AttendPagedRowsBf16(q, q_stride, R, G, static_cast<const uint16_t*>(k_) + head,
                             static_cast<const uint16_t*>(v_) + head, blocks, stride, P_, n_keys0, hd_, out,
                             out_stride);
  } else {
    cpu::AttendPagedRows(q, q_stride, R, G, static_cast<const float*>(k_) + head, static_cast<const float*>(v_) + head,
                         blocks, stride, P_, n_keys0, hd_, out, out_stride);
  }
}

at::Tensor KvRows(const KvCache& cache, int64_t slot, int64_t first, int64_t n, const c10::Device& device) {
  const int64_t Hkv = cache.k(0).size(1);
  at::Tensor rows = at::empty({Hkv, n}, at::TensorOptions().dtype(at::kLong));
  int64_t* r = rows.data_ptr<int64_t>();
  for (int64_t h = 0; h < Hkv; ++h) {
    for (int64_t t = 0; t < n; ++t) r[h * n + t] = cache.RowOf(slot, first + t, h);
  }
  return rows.to(device);
}

}  // namespace lede::model::internal
