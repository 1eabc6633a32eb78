#include "shared/model/cpu_kernels.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

namespace lede::model::cpu {
namespace {

typedef float F8 __attribute__((vector_size(32)));

}  // namespace

// The portable copy (x86-64 baseline: SSE2; the vector type splits in two).
#define LEDE_KERNEL_NS portable
#include "shared/model/internal/cpu_kernels_impl.h"
#undef LEDE_KERNEL_NS

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define LEDE_HAVE_AVX2_KERNELS 1
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define LEDE_KERNEL_NS avx2
#include "shared/model/internal/cpu_kernels_impl.h"
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

// X's 8 columns in both halves. (GCC 12 warns that the broadcast's own
// undefined upper half "may be used uninitialized"; it is not used.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
inline __m512 Broadcast8(const float* p) { return _mm512_broadcast_f32x8(_mm256_loadu_ps(p)); }
#pragma GCC diagnostic pop

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
    const __m512 w01 = _mm512_loadu_ps(chunk), w23 = _mm512_loadu_ps(chunk + 16);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 xv = Broadcast8(x + r * in + i);
      lo[r] = _mm512_fmadd_ps(w01, xv, lo[r]);
      hi[r] = _mm512_fmadd_ps(w23, xv, hi[r]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    alignas(64) float v[32];
    _mm512_store_ps(v, lo[r]);
    _mm512_store_ps(v + 16, hi[r]);
    float* yr = y + r * ldy + o;
    for (int k = 0; k < 4; ++k) {  // each half summed by the AVX2 copy's own Sum8
      const float sum = avx2::Sum8(avx2::Load8(v + 8 * k));
      yr[k] = accumulate ? yr[k] + sum : sum;
    }
  }
}

template <int R>
void PackedRows(const float* x, int64_t in, const float* w, int64_t blocks, float* y, int64_t ldy,
                bool accumulate) {
  for (int64_t blk = 0; blk < blocks; ++blk) {
    PackedBlockRows<R>(x, in, w + blk * 4 * in, y, ldy, blk * 4, accumulate);
  }
}

void MatMulRowsPacked(const float* x, int64_t n, int64_t in, const float* w, int64_t out, float* y,
                      bool accumulate, int64_t ldy) {
  constexpr int kRows = 12;
  using Fn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, bool);
  static constexpr Fn kByRows[kRows + 1] = {nullptr,        PackedRows<1>, PackedRows<2>,  PackedRows<3>,
                                            PackedRows<4>,  PackedRows<5>, PackedRows<6>,  PackedRows<7>,
                                            PackedRows<8>,  PackedRows<9>, PackedRows<10>, PackedRows<11>,
                                            PackedRows<12>};
  const int64_t blocks = out / 4;
  for (int64_t r = 0; r < n; r += kRows) {
    const int64_t rows = std::min<int64_t>(kRows, n - r);
    kByRows[rows](x + r * in, in, w, blocks, y + r * ldy, ldy, accumulate);
  }
  // The out % 4 tail rows are row-major (PackRows): as the AVX2 copy.
  if (blocks * 4 < out) {
    avx2::MatMulRows(x, n, in, w + blocks * 4 * in, out - blocks * 4, y + blocks * 4, accumulate, ldy);
  }
}

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
  LEDE_DISPATCH(AttendOne(q, keys, values, n_keys, hd, scores, out));
}

}  // namespace lede::model::cpu
