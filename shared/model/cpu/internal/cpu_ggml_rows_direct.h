// File: shared/model/cpu/internal/cpu_ggml_rows_direct.h
//
// The driver of the direct products of cpu_ggml_kernels.h: RowsDirect runs
// one run of weight rows against the rows of X through a kernel type K
// (K::Dot<R>, K::Sums, K::SumsPerRow: cpu_ggml_direct_kernels.h for AVX2,
// cpu_ggml_vnni_kernels.h for AVX-512 VNNI). Included by
// cpu_ggml_kernels.cc once per instruction set, inside that set's target
// region and namespace, so that K::Dot inlines into the loop (a call per
// weight row across target regions cannot inline). No include guard on
// purpose. Requires <immintrin.h>, <algorithm> and <cstdint>.

inline void Store(float v, bool accumulate, float* y) { *y = accumulate ? *y + v : v; }

// Each pass asks for the weight row kPrefetchRows ahead (every 64-byte
// line of it) before it multiplies a row: decoding streams the weights
// from memory once per token, and without the requests the computing and
// the loads did not overlap (8x widening at Q4_K_M, one Emerald Rapids
// core: 44 -> 64 tok/s with the VNNI kernels, 38 -> 55 with AVX2; 2, 4, 8
// and 16 rows ahead measured alike). The last rows of a run ask for none.
// __builtin_prefetch, not _mm_prefetch: GCC 12 emitted no instruction for
// _mm_prefetch in this helper (checked with objdump for prefetcht0).
constexpr int64_t kPrefetchRows = 4;

inline void PrefetchRow(const uint8_t* row, size_t row_bytes) {
  for (size_t line = 0; line < row_bytes; line += 64) {
    __builtin_prefetch(row + line);
  }
}

// Weight rows [t0, t1) of a run of `rows` rows against rows [r, r + R) of X, into
// y[(r + j) ldy + o] (RowsDirect's inner pass; inlined: as a call, the
// 400-token prefill of the 8x widening at Q4_K_M took 3% longer).
template <typename K, int R>
inline __attribute__((always_inline)) void RowsPass(const uint8_t* blocks, size_t row_bytes, int64_t rows,
                                                    int64_t t0, int64_t t1, int64_t nb, int64_t in, const int8_t* xq, const float* xd,
                                                    const typename K::Sums* bs, int64_t bs_stride, int64_t r, float* y,
                                                    int64_t ldy, bool accumulate) {
  float v[R];
  for (int64_t o = t0; o < t1; ++o) {
    if (o + kPrefetchRows < rows) PrefetchRow(blocks + static_cast<size_t>(o + kPrefetchRows) * row_bytes, row_bytes);
    K::template Dot<R>(blocks + static_cast<size_t>(o) * row_bytes, nb, in, xq + r * in, xd + r * nb,
                       bs + r * bs_stride, v);
    for (int j = 0; j < R; ++j) Store(v[j], accumulate, y + (r + j) * ldy + o);
  }
}

// Weight rows [0, rows) of one run (row o at blocks + o row_bytes)
// against rows [0, n) of X (4 at a time, then the last 3 together, or 2
// then 1: a verification of 3 positions, a draft length of 2, costs one
// pass, not two), into y[r ldy + o]. One
// call per run, so the per-row cost is the kernel's own (no dispatch per
// weight row). Many rows of X (a prefill chunk) go through kRowTile weight
// rows at a time, so each group of 4 X rows is read from the cache once
// per tile rather than once per weight row (X of a 512-token chunk is
// larger than L2); each product is the same call either way.
template <typename K>
void RowsDirect(const uint8_t* blocks, size_t row_bytes, int64_t rows, int64_t nb, int64_t in, const int8_t* xq,
                const float* xd, const typename K::Sums* bs, int64_t n, float* y, int64_t ldy, bool accumulate) {
  constexpr int64_t kRowTile = 16;
  const int64_t bs_stride = K::SumsPerRow(in, nb);
  for (int64_t t0 = 0; t0 < rows; t0 += kRowTile) {
    const int64_t t1 = std::min(rows, t0 + kRowTile);
    int64_t r = 0;
    for (; r + 4 <= n; r += 4) {
      RowsPass<K, 4>(blocks, row_bytes, rows, t0, t1, nb, in, xq, xd, bs, bs_stride, r, y, ldy, accumulate);
    }
    if (n - r == 3) {
      RowsPass<K, 3>(blocks, row_bytes, rows, t0, t1, nb, in, xq, xd, bs, bs_stride, r, y, ldy, accumulate);
    } else {
      if (r + 2 <= n) {
        RowsPass<K, 2>(blocks, row_bytes, rows, t0, t1, nb, in, xq, xd, bs, bs_stride, r, y, ldy, accumulate);
        r += 2;
      }
      if (r < n) RowsPass<K, 1>(blocks, row_bytes, rows, t0, t1, nb, in, xq, xd, bs, bs_stride, r, y, ldy, accumulate);
    }
  }
}
