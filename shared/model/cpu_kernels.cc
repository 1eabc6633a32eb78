#include "shared/model/cpu_kernels.h"

#include <cblas.h>

#include <cmath>
#include <cstdint>
#include <cstring>

namespace lede::model::cpu {
namespace {

typedef float F8 __attribute__((vector_size(32)));

}  // namespace

// The portable copy (x86-64 baseline: SSE2; the vector type splits in two).
#define LEDE_KERNEL_NS portable
#include "shared/model/internal/cpu_kernels_impl.h"
#undef LEDE_KERNEL_NS

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
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

namespace {

bool UseAvx2() {
#if LEDE_HAVE_AVX2_KERNELS
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
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
  for (int64_t r = 0; r < n; ++r) {
    const float* gate = h13 + r * 2 * F;
    const float* up = gate + F;
    float* o = out + r * F;
    for (int64_t f = 0; f < F; ++f) o[f] = gate[f] / (1.0f + std::exp(-gate[f])) * up[f];
  }
}

void AttendOne(const float* q, const float* keys, const float* values, int64_t n_keys, int64_t hd,
               float* scores, float* out) {
  LEDE_DISPATCH(AttendOne(q, keys, values, n_keys, hd, scores, out));
}

}  // namespace lede::model::cpu
