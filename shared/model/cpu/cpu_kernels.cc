#include "shared/model/cpu/cpu_kernels.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "shared/model/cpu/cpu_quant_kernels.h"  // Bf16ToFloat

namespace lede::model::cpu {
namespace {

typedef float F8 __attribute__((vector_size(32)));

// How far ahead (floats) the packed kernels prefetch their weight stream.
// The hardware prefetcher alone kept one row's product near the DRAM
// bandwidth (37 GB/s on this VM) but fell behind as soon as each line took
// longer to consume: a [5120 x 960] f32 product from DRAM took 1.9 ms at 8
// rows and 2.6 ms at 16 (41-60 GFLOP/s, against ~200 from L1), 0.94 and
// 1.4-1.5 ms with a prefetch 4-8 KB ahead (thread CPU time, medians; 1 KB
// ahead gained half of that, 16 KB no more). A distance past the end of the
// matrix prefetches an address that is never read (prefetches do not fault).
constexpr int64_t kPrefetchAhead = 2048;

}  // namespace

// The portable copy (x86-64 baseline: SSE2; the vector type splits in two).
#define LEDE_KERNEL_NS portable
#include "shared/model/cpu/internal/cpu_kernels_impl.h"
#undef LEDE_KERNEL_NS

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define LEDE_HAVE_AVX2_KERNELS 1
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define LEDE_KERNEL_NS avx2
#include "shared/model/cpu/internal/cpu_kernels_impl.h"
#undef LEDE_KERNEL_NS
#pragma GCC pop_options
#else
#define LEDE_HAVE_AVX2_KERNELS 0
#endif

#if LEDE_HAVE_AVX2_KERNELS
// The packed few-row product with 512-bit registers (AVX-512F/VL/DQ): one
// load covers the 8-column chunks of two W rows of a block, multiplied by
// the X chunk broadcast to both halves, so that each register lane does the
// same fused multiply-adds in the same order as a lane of the AVX2 copy
// (and of MatMulRows), and each half is summed by its Sum8: the results
// are bitwise the AVX2 ones. 32 registers hold 12 rows of X per pass over W
// (24 accumulators), where the AVX2 copy holds 3.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512dq,avx2,fma")
namespace avx512 {

// GCC 12 warns that the undefined halves of its own intrinsics (the
// broadcast's upper half, the extract's merge source) "may be used
// uninitialized"; they are not used.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// X's 8 columns in both halves.
inline __m512 Broadcast8(const float* p) { return _mm512_broadcast_f32x8(_mm256_loadu_ps(p)); }

// Rows [0, R) of X against the W block at `b` (4 rows, packed), into
// columns o..o+3 of Y.
template <int R>
inline void PackedBlockRows(const float* x, int64_t in, const float* b, float* y, int64_t ldy, int64_t o,
                            bool accumulate) {
  __m512 lo[R], hi[R];  // W rows 0-1 and 2-3 of the block
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) lo[r] = _mm512_setzero_ps(), hi[r] = _mm512_setzero_ps();
  for (int64_t i = 0; i < in; i += 8) {
    const float* chunk = b + 4 * i;
    // W's stream kPrefetchAhead floats ahead (into the next blocks): see
    // kPrefetchAhead.
    _mm_prefetch(reinterpret_cast<const char*>(chunk + kPrefetchAhead), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(chunk + kPrefetchAhead + 16), _MM_HINT_T0);
    const __m512 w01 = _mm512_loadu_ps(chunk), w23 = _mm512_loadu_ps(chunk + 16);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 xv = Broadcast8(x + r * in + i);
      lo[r] = _mm512_fmadd_ps(w01, xv, lo[r]);
      hi[r] = _mm512_fmadd_ps(w23, xv, hi[r]);
    }
  }
  // Each half summed by the AVX2 copy's own Sum8, from registers (through
  // a stored copy, the 256-bit reloads of the 512-bit stores missed the
  // store-to-load forwarding on every row of every block).
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    const float s[4] = {avx2::Sum8(_mm512_castps512_ps256(lo[r])), avx2::Sum8(_mm512_extractf32x8_ps(lo[r], 1)),
                        avx2::Sum8(_mm512_castps512_ps256(hi[r])), avx2::Sum8(_mm512_extractf32x8_ps(hi[r], 1))};
    float* yr = y + r * ldy + o;
    for (int k = 0; k < 4; ++k) yr[k] = accumulate ? yr[k] + s[k] : s[k];
  }
}

// Every row of X against W, block by block: each block of 4 W rows is
// read from memory once and applied to all n rows (12 at a time, from
// L1/L2) before the next block streams in. (Rows outermost, a whole pass
// over W per 12 rows, read a 13- to 24-row product's weights twice.) Each
// output element is computed by the same PackedBlockRows lane as before:
// the order of the loops does not change the bits.
void MatMulRowsPacked(const float* x, int64_t n, int64_t in, const float* w, int64_t out, float* y,
                      bool accumulate, int64_t ldy) {
  constexpr int kRows = 12;
  using Fn = void (*)(const float*, int64_t, const float*, float*, int64_t, int64_t, bool);
  static constexpr Fn kByRows[kRows + 1] = {
      nullptr,             PackedBlockRows<1>, PackedBlockRows<2>,  PackedBlockRows<3>,  PackedBlockRows<4>,
      PackedBlockRows<5>,  PackedBlockRows<6>, PackedBlockRows<7>,  PackedBlockRows<8>,  PackedBlockRows<9>,
      PackedBlockRows<10>, PackedBlockRows<11>, PackedBlockRows<12>};
  const int64_t blocks = out / 4;
  // Row groups as even as 12 at a time allows (16 rows: 8 + 8, not 12 + 4).
  const int64_t groups = (n + kRows - 1) / kRows;
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const float* b = w + blk * 4 * in;
    for (int64_t g = 0, r = 0; g < groups; ++g) {
      const int64_t r1 = n * (g + 1) / groups;
      kByRows[r1 - r](x + r * in, in, b, y + r * ldy, ldy, blk * 4, accumulate);
      r = r1;
    }
  }
  // The out % 4 tail rows are row-major (PackRows): as the AVX2 copy.
  if (blocks * 4 < out) {
    avx2::MatMulRows(x, n, in, w + blocks * 4 * in, out - blocks * 4, y + blocks * 4, accumulate, ldy);
  }
}

#pragma GCC diagnostic pop
}  // namespace avx512
#pragma GCC pop_options
#endif

namespace {

bool UseAvx2() {
#if LEDE_HAVE_AVX2_KERNELS
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
#else
  return false;
#endif
}

// The 512-bit packed product (above): where the CPU has AVX-512F/VL/DQ,
// unless LEDE_CPU_KERNELS=avx2 (A/B measurements).
bool UseAvx512() {
#if LEDE_HAVE_AVX2_KERNELS
  static const bool yes = [] {
    const char* force = std::getenv("LEDE_CPU_KERNELS");
    if (force != nullptr && std::string(force) == "avx2") return false;
    return UseAvx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512dq");
  }();
  return yes;
#else
  return false;
#endif
}

#if LEDE_HAVE_AVX2_KERNELS
#define LEDE_DISPATCH(call) (UseAvx2() ? avx2::call : portable::call)
#else
#define LEDE_DISPATCH(call) (portable::call)
#endif

}  // namespace

float Dot(const float* a, const float* b, int64_t n) { return LEDE_DISPATCH(Dot(a, b, n)); }

void MatVec(const float* w, int64_t out, int64_t in, const float* x, float* y, bool accumulate) {
  LEDE_DISPATCH(MatMulRows(x, 1, in, w, out, y, accumulate, out));
}

void MatMulRows(const float* x, int64_t n, int64_t in, const float* w, int64_t out, float* y,
                bool accumulate) {
  LEDE_DISPATCH(MatMulRows(x, n, in, w, out, y, accumulate, out));
}

void MatMulRowsStrided(const float* x, int64_t n, int64_t in, const float* w, int64_t out, float* y,
                       int64_t ldy, bool accumulate) {
  LEDE_DISPATCH(MatMulRows(x, n, in, w, out, y, accumulate, ldy));
}

void PackRows(const float* w, int64_t out, int64_t in, float* packed) {
  const int64_t blocks = out / 4;
  for (int64_t b = 0; b < blocks; ++b) {
    const float* rows = w + b * 4 * in;
    float* dst = packed + b * 4 * in;
    for (int64_t i = 0; i < in; i += 8) {
      for (int64_t k = 0; k < 4; ++k, dst += 8) std::memcpy(dst, rows + k * in + i, 8 * sizeof(float));
    }
  }
  const int64_t tail = blocks * 4 * in;
  std::memcpy(packed + tail, w + tail, static_cast<size_t>((out - blocks * 4) * in) * sizeof(float));
}

void MatMulRowsPacked(const float* x, int64_t n, int64_t in, const float* packed, int64_t out,
                      float* y, int64_t ldy, bool accumulate) {
#if LEDE_HAVE_AVX2_KERNELS
  if (UseAvx512()) {
    avx512::MatMulRowsPacked(x, n, in, packed, out, y, accumulate, ldy);
    return;
  }
#endif
  LEDE_DISPATCH(MatMulRowsPacked(x, n, in, packed, out, y, accumulate, ldy));
}

void MatVecBlas(const float* w, int64_t out, int64_t in, const float* x, float* y, bool accumulate) {
  cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(out), static_cast<int>(in), 1.0f, w,
              static_cast<int>(in), x, 1, accumulate ? 1.0f : 0.0f, y, 1);
}

void MatMulNT(const float* x, int64_t n, int64_t in, const float* w, int64_t out, float* y,
              bool accumulate) {
  if (n <= kMaxRowsWithoutBlas) {
    MatMulRows(x, n, in, w, out, y, accumulate);
    return;
  }
  MatMulBlas(x, n, in, w, out, y, accumulate);
}

void MatMulBlas(const float* x, int64_t n, int64_t in, const float* w, int64_t out, float* y,
                bool accumulate) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n), static_cast<int>(out),
              static_cast<int>(in), 1.0f, x, static_cast<int>(in), w, static_cast<int>(in),
              accumulate ? 1.0f : 0.0f, y, static_cast<int>(out));
}

void ExpSums(const float* x, int64_t n, float shift, double* sum_exp, double* sum_exp_d) {
  LEDE_DISPATCH(ExpSums(x, n, shift, sum_exp, sum_exp_d));
}

void RmsNorm(const float* x, const float* weight, int64_t n, int64_t d, float eps, float* y) {
  LEDE_DISPATCH(RmsNorm(x, weight, n, d, eps, y));
}

void RopeRotateHalf(float* x, int64_t n_heads, int64_t hd, const float* cos, const float* sin) {
  const int64_t half = hd / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    float* x1 = x + h * hd;
    float* x2 = x1 + half;
    for (int64_t i = 0; i < half; ++i) {
      const float a = x1[i], b = x2[i];
      x1[i] = a * cos[i] - b * sin[i];
      x2[i] = b * cos[half + i] + a * sin[half + i];
    }
  }
}

void SiluMul(const float* h13, int64_t n, int64_t F, float* out) {
  LEDE_DISPATCH(SiluMul(h13, n, F, out));
}

void AttendOne(const float* q, const float* keys, const float* values, int64_t n_keys, int64_t hd,
               float* scores, float* out) {
  const int64_t one_block = 0;  // every key in block 0
  AttendPaged(q, keys, values, &one_block, 0, std::max<int64_t>(n_keys, 1), n_keys, hd, scores, out);
}

void AttendPaged(const float* q, const float* keys, const float* values, const int64_t* blocks,
                 int64_t block_stride, int64_t block_tokens, int64_t n_keys, int64_t hd, float* scores, float* out) {
  LEDE_DISPATCH(AttendPaged(q, keys, values, blocks, block_stride, block_tokens, n_keys, hd, scores, out));
}

void AttendPagedBf16(const float* q, const uint16_t* keys, const uint16_t* values, const int64_t* blocks,
                     int64_t block_stride, int64_t block_tokens, int64_t n_keys, int64_t hd, float* scores,
                     float* out) {
  LEDE_DISPATCH(AttendPaged(q, keys, values, blocks, block_stride, block_tokens, n_keys, hd, scores, out));
}

void AttendPagedRows(const float* q, int64_t q_stride, int64_t R, int64_t G, const float* keys,
                     const float* values, const int64_t* blocks, int64_t block_stride, int64_t block_tokens,
                     int64_t n_keys0, int64_t hd, float* out, int64_t out_stride) {
  LEDE_DISPATCH(AttendPagedRows(q, q_stride, R, G, keys, values, blocks, block_stride, block_tokens, n_keys0, hd,
                                out, out_stride));
}

void AttendPagedRowsBf16(const float* q, int64_t q_stride, int64_t R, int64_t G, const uint16_t* keys,
                         const uint16_t* values, const int64_t* blocks, int64_t block_stride, int64_t block_tokens,
                         int64_t n_keys0, int64_t hd, float* out, int64_t out_stride) {
  LEDE_DISPATCH(AttendPagedRows(q, q_stride, R, G, keys, values, blocks, block_stride, block_tokens, n_keys0, hd,
                                out, out_stride));
}

}  // namespace lede::model::cpu
