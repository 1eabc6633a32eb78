#include "shared/model/cpu/cpu_quant_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "shared/checkpoint/number_formats.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#endif

namespace lede::model::cpu {

// One implementation of the 16-bit formats (shared/checkpoint/number_formats.h).
float HalfToFloat(uint16_t h) { return checkpoint::HalfToFloat(h); }
uint16_t FloatToHalf(float f) { return checkpoint::FloatToHalf(f); }
uint16_t FloatToBf16(float f) { return checkpoint::FloatToBf16(f); }

namespace {

inline int8_t Negatable(int8_t q) { return q == -128 ? int8_t{-127} : q; }

// The writes of one block of 4 weight rows into Y: rows o..o+valid-1.
inline void StoreBlock(float* yr, int64_t o, int64_t valid, const float* s, bool accumulate) {
  for (int64_t k = 0; k < valid; ++k) yr[o + k] = accumulate ? yr[o + k] + s[k] : s[k];
}

// The quantized rows of X of the calling thread (MatMulRowsPackedQ8_0).
struct ActivationScratch {
  std::vector<int8_t> q;
  std::vector<float> d;
};

ActivationScratch& Scratch(int64_t n, int64_t in) {
  thread_local ActivationScratch s;
  if (static_cast<int64_t>(s.q.size()) < n * in) s.q.resize(static_cast<size_t>(n * in));
  if (static_cast<int64_t>(s.d.size()) < n * in / kQ8Block) s.d.resize(static_cast<size_t>(n * in / kQ8Block));
  return s;
}

}  // namespace

void QuantizeActivationQ8(const float* x, int64_t in, int8_t* q, float* d) {
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds |v| < 2^22 to nearest even
  for (int64_t j = 0; j < in / kQ8Block; ++j) {
    const float* xb = x + j * kQ8Block;
    float amax = 0.0f;
    for (int64_t i = 0; i < kQ8Block; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const float dj = amax / 127.0f;
    const float id = dj != 0.0f ? 1.0f / dj : 0.0f;
    d[j] = dj;
    for (int64_t i = 0; i < kQ8Block; ++i) {
      const float v = xb[i] * id;
      q[j * kQ8Block + i] = static_cast<int8_t>(static_cast<int>((v + kRound) - kRound));
    }
  }
}

void QuantizeRowsQ8_0(const float* w, int64_t rows, int64_t in, BlockQ8_0* blocks) {
  const int64_t nb = in / kQ8Block;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < nb; ++j) {
      const float* x = w + r * in + j * kQ8Block;
      BlockQ8_0& b = blocks[r * nb + j];
      float amax = 0.0f;
      for (int64_t i = 0; i < kQ8Block; ++i) amax = std::max(amax, std::fabs(x[i]));
      const float d = amax / 127.0f;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      b.d = FloatToHalf(d);
      for (int64_t i = 0; i < kQ8Block; ++i) b.qs[i] = static_cast<int8_t>(std::round(x[i] * id));
    }
  }
}

void DequantizeRowsQ8_0(const BlockQ8_0* blocks, int64_t rows, int64_t in, float* w) {
  const int64_t nb = in / kQ8Block;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < nb; ++j) {
      const BlockQ8_0& b = blocks[r * nb + j];
      const float d = HalfToFloat(b.d);
      for (int64_t i = 0; i < kQ8Block; ++i) w[r * in + j * kQ8Block + i] = d * Negatable(b.qs[i]);
    }
  }
}

void PackRowsBf16(const float* w, int64_t out, int64_t in, uint16_t* packed) {
  const int64_t padded = PackedRowsPadded(out);
  uint16_t* dst = packed;
  for (int64_t o = 0; o < padded; o += 4) {
    for (int64_t i = 0; i < in; i += 8) {
      for (int64_t k = 0; k < 4; ++k) {
        const int64_t row = o + k;
        for (int64_t c = 0; c < 8; ++c, ++dst) *dst = row < out ? FloatToBf16(w[row * in + i + c]) : 0;
      }
    }
  }
}

void PackRowsBf16FromBf16(const uint16_t* w, int64_t out, int64_t in, uint16_t* packed) {
  const int64_t padded = PackedRowsPadded(out);
  uint16_t* dst = packed;
  for (int64_t o = 0; o < padded; o += 4) {
    for (int64_t i = 0; i < in; i += 8) {
      for (int64_t k = 0; k < 4; ++k, dst += 8) {
        const int64_t row = o + k;
        if (row < out) {
          std::memcpy(dst, w + row * in + i, 8 * sizeof(uint16_t));
        } else {
          std::memset(dst, 0, 8 * sizeof(uint16_t));
        }
      }
    }
  }
}

void UnpackRowsBf16(const uint16_t* packed, int64_t in, int64_t r0, int64_t r1, float* w) {
  for (int64_t r = r0; r < r1; ++r) {
    const uint16_t* block = packed + (r / 4) * 4 * in + (r % 4) * 8;
    float* dst = w + (r - r0) * in;
    for (int64_t i = 0; i < in; i += 8) {
      const uint16_t* src = block + 4 * i;
      for (int64_t c = 0; c < 8; ++c) dst[i + c] = Bf16ToFloat(src[c]);
    }
  }
}

void UnpackRowsQ8_0(const uint8_t* packed, int64_t in, int64_t r0, int64_t r1, float* w) {
  const int64_t nb = in / kQ8Block;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* g = packed + PackedQ8_0Offset(r, in);
    const int64_t k = r % 4;
    float* dst = w + (r - r0) * in;
    for (int64_t j = 0; j < nb; ++j, g += kQ8PackedGroup) {
      uint16_t h;
      std::memcpy(&h, g + 2 * k, 2);
      const float d = HalfToFloat(h);
      const int8_t* q = reinterpret_cast<const int8_t*>(g + 8 + kQ8Block * k);
      for (int64_t i = 0; i < kQ8Block; ++i) dst[j * kQ8Block + i] = d * q[i];
    }
  }
}

void PackRowsQ8_0(const BlockQ8_0* blocks, int64_t out, int64_t in, uint8_t* packed) {
  const int64_t nb = in / kQ8Block, padded = PackedRowsPadded(out);
  uint8_t* g = packed;
  for (int64_t o = 0; o < padded; o += 4) {
    for (int64_t j = 0; j < nb; ++j, g += kQ8PackedGroup) {
      std::memset(g, 0, kQ8PackedGroup);
      for (int64_t k = 0; k < 4 && o + k < out; ++k) {
        const BlockQ8_0& b = blocks[(o + k) * nb + j];
        std::memcpy(g + 2 * k, &b.d, 2);
        int8_t* q = reinterpret_cast<int8_t*>(g + 8 + kQ8Block * k);
        for (int64_t i = 0; i < kQ8Block; ++i) q[i] = Negatable(b.qs[i]);
      }
    }
  }
}

// ---- portable kernels -------------------------------------------------------
namespace portable {

void Bf16Rows(const float* x, int64_t n, int64_t in, const uint16_t* packed, int64_t out, float* y,
              int64_t ldy, bool accumulate) {
  for (int64_t o = 0; o < out; o += 4) {
    const uint16_t* b = packed + o * in;
    for (int64_t r = 0; r < n; ++r) {
      const float* xr = x + r * in;
      float a[4][8] = {};
      for (int64_t i = 0; i < in; i += 8) {
        for (int k = 0; k < 4; ++k) {
          for (int c = 0; c < 8; ++c) a[k][c] += Bf16ToFloat(b[4 * i + 8 * k + c]) * xr[i + c];
        }
      }
      float s[4];
      for (int k = 0; k < 4; ++k) {
        s[k] = ((a[k][0] + a[k][4]) + (a[k][1] + a[k][5])) + ((a[k][2] + a[k][6]) + (a[k][3] + a[k][7]));
      }
      StoreBlock(y + r * ldy, o, std::min<int64_t>(4, out - o), s, accumulate);
    }
  }
}

void Q8Rows(const int8_t* xq, const float* xd, int64_t n, int64_t in, const uint8_t* packed, int64_t out,
            float* y, int64_t ldy, bool accumulate) {
  const int64_t nb = in / kQ8Block;
  for (int64_t o = 0; o < out; o += 4) {
    const uint8_t* block = packed + PackedQ8_0Offset(o, in);
    for (int64_t r = 0; r < n; ++r) {
      float s[4] = {};
      const uint8_t* g = block;
      for (int64_t j = 0; j < nb; ++j, g += kQ8PackedGroup) {
        const int8_t* xb = xq + r * in + j * kQ8Block;
        for (int k = 0; k < 4; ++k) {
          uint16_t h;
          std::memcpy(&h, g + 2 * k, 2);
          const int8_t* wb = reinterpret_cast<const int8_t*>(g + 8 + kQ8Block * k);
          int32_t dot = 0;
          for (int64_t i = 0; i < kQ8Block; ++i) dot += int32_t{wb[i]} * xb[i];
          s[k] += static_cast<float>(dot) * (HalfToFloat(h) * xd[r * nb + j]);
        }
      }
      StoreBlock(y + r * ldy, o, std::min<int64_t>(4, out - o), s, accumulate);
    }
  }
}

}  // namespace portable

// ---- x86-64 kernels ---------------------------------------------------------
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define LEDE_HAVE_X86_QUANT_KERNELS 1

// How far ahead (bytes) the packed kernels prefetch the weight stream, as
// the float32 kernel (cpu_kernels.cc kPrefetchAhead): the hardware
// prefetcher alone falls behind once several rows share each line (and,
// on one Emerald Rapids core, when one row of X is decoding).
constexpr int64_t kPrefetchAheadBytes = 8192;

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace avx2 {

inline float Hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

inline __m256 Bf16x8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// Rows [0, R) of X against one packed bf16 block of 4 rows. Two
// accumulators per (row of X, row of W) (even and odd 8-column chunks), the
// same order for every R: rows do not depend on n.
template <int R>
void Bf16Block(const float* x, int64_t in, const uint16_t* b, float* y, int64_t ldy, int64_t o, int64_t valid,
               bool accumulate) {
  __m256 a[R][4], c[R][4];
  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    #pragma GCC unroll 8
    for (int k = 0; k < 4; ++k) a[r][k] = _mm256_setzero_ps(), c[r][k] = _mm256_setzero_ps();
  }
  int64_t i = 0;
  for (; i + 16 <= in; i += 16) {
    const uint16_t* chunk = b + 4 * i;
    _mm_prefetch(reinterpret_cast<const char*>(chunk) + kPrefetchAheadBytes, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(chunk) + kPrefetchAheadBytes + 64, _MM_HINT_T0);
    #pragma GCC unroll 8
    for (int k = 0; k < 4; ++k) {
      const __m256 w0 = Bf16x8(chunk + 8 * k), w1 = Bf16x8(chunk + 32 + 8 * k);
      #pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        a[r][k] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * in + i), a[r][k]);
        c[r][k] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + r * in + i + 8), c[r][k]);
      }
    }
  }
  if (i < in) {  // in % 16 == 8
    const uint16_t* chunk = b + 4 * i;
    #pragma GCC unroll 8
    for (int k = 0; k < 4; ++k) {
      const __m256 w0 = Bf16x8(chunk + 8 * k);
      #pragma GCC unroll 8
      for (int r = 0; r < R; ++r) a[r][k] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * in + i), a[r][k]);
    }
  }
  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    float s[4];
    #pragma GCC unroll 8
    for (int k = 0; k < 4; ++k) s[k] = Hsum(_mm256_add_ps(a[r][k], c[r][k]));
    StoreBlock(y + r * ldy, o, valid, s, accumulate);
  }
}

// One row of X at a time over each block (the block stays in L1 for the
// next row). Widening each chunk once for 2 or 4 rows of X (the W rows of a
// block split between passes to keep the accumulators in registers) took
// 25-30% longer per row (bench/ggml_kernel_bench.cc packed_bf16): each FMA
// needs its own load of X, and those loads, not the widening, bound it.
void Bf16Rows(const float* x, int64_t n, int64_t in, const uint16_t* packed, int64_t out, float* y,
              int64_t ldy, bool accumulate) {
  for (int64_t o = 0; o < out; o += 4) {
    const uint16_t* b = packed + o * in;
    const int64_t valid = std::min<int64_t>(4, out - o);
    for (int64_t r = 0; r < n; ++r) Bf16Block<1>(x + r * in, in, b, y + r * ldy, ldy, o, valid, accumulate);
  }
}

// R rows of X (quantized, R = 1 or 2) against one packed Q8_0 block of 4
// rows: |x| (u8) times w with x's sign (s8) by vpmaddubsw (pairs summed to
// int16, at most 2 * 127 * 127: no saturation), pairs of those by vpmaddwd
// into 8 int32 lanes, scaled into float32 lanes. Two rows share each load
// of the weights (a prefill or a verification); each row's operations and
// their order are the one-row kernel's, so a row's output does not depend
// on R (bitwise).
template <int R>
void Q8Block(const int8_t* xq, int64_t in, const float* xd, int64_t nb, const uint8_t* g, float* y, int64_t ldy,
             int64_t o, int64_t valid, bool accumulate) {
  __m256 a[R][4];
  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    #pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) a[r][k] = _mm256_setzero_ps();
  }
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t j = 0; j < nb; ++j, g += kQ8PackedGroup) {
    // 136 bytes a group: three lines ahead cover every line of the stream.
    _mm_prefetch(reinterpret_cast<const char*>(g) + kPrefetchAheadBytes, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(g) + kPrefetchAheadBytes + 64, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(g) + kPrefetchAheadBytes + 128, _MM_HINT_T0);
    __m256i xv[R], ax[R];
    alignas(16) float sc[R][4];
    const __m128 dw = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(g)));
    #pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      xv[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + r * in + j * kQ8Block));
      ax[r] = _mm256_abs_epi8(xv[r]);
      _mm_store_ps(sc[r], _mm_mul_ps(dw, _mm_set1_ps(xd[r * nb + j])));
    }
    #pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + 8 + kQ8Block * k));
      #pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(ax[r], _mm256_sign_epi8(w, xv[r])), ones);
        a[r][k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(sc[r][k]), a[r][k]);
      }
    }
  }
  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    float s[4];
    #pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) s[k] = Hsum(a[r][k]);
    StoreBlock(y + r * ldy, o, valid, s, accumulate);
  }
}

// The packed groups of weight rows [t0, t1) against rows [r, r + R) of X
// (Q8Rows's inner pass).
template <int R>
void Q8Pass(const int8_t* xq, const float* xd, int64_t nb, int64_t in, const uint8_t* packed, int64_t out,
            int64_t t0, int64_t t1, int64_t r, float* y, int64_t ldy, bool accumulate) {
  for (int64_t o = t0; o < t1; o += 4) {
    Q8Block<R>(xq + r * in, in, xd + r * nb, nb, packed + PackedQ8_0Offset(o, in), y + r * ldy, ldy, o,
               std::min<int64_t>(4, out - o), accumulate);
  }
}

void Q8Rows(const int8_t* xq, const float* xd, int64_t n, int64_t in, const uint8_t* packed, int64_t out,
            float* y, int64_t ldy, bool accumulate) {
  // Many rows of X (a prefill chunk) go through 16 weight rows at a time,
  // so each pair of X rows is read from the cache once per 16 weight rows
  // rather than once per 4; each product is the same call either way.
  constexpr int64_t kRowTile = 16;
  const int64_t nb = in / kQ8Block;
  for (int64_t t0 = 0; t0 < out; t0 += kRowTile) {
    const int64_t t1 = std::min(out, t0 + kRowTile);
    int64_t r = 0;
    for (; r + 2 <= n; r += 2) Q8Pass<2>(xq, xd, nb, in, packed, out, t0, t1, r, y, ldy, accumulate);
    if (r < n) Q8Pass<1>(xq, xd, nb, in, packed, out, t0, t1, r, y, ldy, accumulate);
  }
}

}  // namespace avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
// GCC 12's AVX-512 headers warn that the undefined upper halves of their
// own casts and broadcasts "may be used uninitialized"; they are not used.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
namespace avx512 {

inline float Hsum8(__m256 v) { return avx2::Hsum(v); }

inline __m512 Broadcast8(const float* p) { return _mm512_broadcast_f32x8(_mm256_loadu_ps(p)); }
inline __m512i Broadcast32(const int8_t* p) {
  return _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

inline __m512 Bf16x16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Rows [0, R) of X against one packed bf16 block: one register holds the
// 8-column chunks of two W rows (against X's chunk in both halves); two
// accumulators per pair of W rows (even and odd chunks), the same for
// every R.
template <int R>
void Bf16Block(const float* x, int64_t in, const uint16_t* b, float* y, int64_t ldy, int64_t o, int64_t valid,
               bool accumulate) {
  __m512 lo[R], hi[R], lo2[R], hi2[R];  // W rows 0-1 and 2-3; even and odd chunks
  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    lo[r] = _mm512_setzero_ps(), hi[r] = _mm512_setzero_ps();
    lo2[r] = _mm512_setzero_ps(), hi2[r] = _mm512_setzero_ps();
  }
  int64_t i = 0;
  for (; i + 16 <= in; i += 16) {
    const uint16_t* chunk = b + 4 * i;
    _mm_prefetch(reinterpret_cast<const char*>(chunk) + kPrefetchAheadBytes, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(chunk) + kPrefetchAheadBytes + 64, _MM_HINT_T0);
    const __m512 w01 = Bf16x16(chunk), w23 = Bf16x16(chunk + 16);
    const __m512 v01 = Bf16x16(chunk + 32), v23 = Bf16x16(chunk + 48);
    #pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 x0 = Broadcast8(x + r * in + i), x1 = Broadcast8(x + r * in + i + 8);
      lo[r] = _mm512_fmadd_ps(w01, x0, lo[r]);
      hi[r] = _mm512_fmadd_ps(w23, x0, hi[r]);
      lo2[r] = _mm512_fmadd_ps(v01, x1, lo2[r]);
      hi2[r] = _mm512_fmadd_ps(v23, x1, hi2[r]);
    }
  }
  if (i < in) {
    const uint16_t* chunk = b + 4 * i;
    const __m512 w01 = Bf16x16(chunk), w23 = Bf16x16(chunk + 16);
    #pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 x0 = Broadcast8(x + r * in + i);
      lo[r] = _mm512_fmadd_ps(w01, x0, lo[r]);
      hi[r] = _mm512_fmadd_ps(w23, x0, hi[r]);
    }
  }
  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const __m512 l = _mm512_add_ps(lo[r], lo2[r]), h = _mm512_add_ps(hi[r], hi2[r]);
    const float s[4] = {Hsum8(_mm512_castps512_ps256(l)), Hsum8(_mm512_extractf32x8_ps(l, 1)),
                        Hsum8(_mm512_castps512_ps256(h)), Hsum8(_mm512_extractf32x8_ps(h, 1))};
    StoreBlock(y + r * ldy, o, valid, s, accumulate);
  }
}

void Bf16Rows(const float* x, int64_t n, int64_t in, const uint16_t* packed, int64_t out, float* y,
              int64_t ldy, bool accumulate) {
  for (int64_t o = 0; o < out; o += 4) {
    const uint16_t* b = packed + o * in;
    const int64_t valid = std::min<int64_t>(4, out - o);
    int64_t r = 0;
    for (; r + 4 <= n; r += 4) Bf16Block<4>(x + r * in, in, b, y + r * ldy, ldy, o, valid, accumulate);
    for (; r + 2 <= n; r += 2) Bf16Block<2>(x + r * in, in, b, y + r * ldy, ldy, o, valid, accumulate);
    if (r < n) Bf16Block<1>(x + r * in, in, b, y + r * ldy, ldy, o, valid, accumulate);
  }
}

// Rows [0, R) of X (quantized) against one packed Q8_0 block: one register
// holds two W rows' 32 values; vpdpbusd multiplies |x| (u8) by w with x's
// sign (s8, negated under x's sign mask) and sums groups of 4 into 16 int32
// lanes (8 per W row), scaled into float32 lanes.
template <int R>
void Q8Block(const int8_t* xq, const float* xd, int64_t nb, int64_t in, const uint8_t* g, float* y,
             int64_t ldy, int64_t o, int64_t valid, bool accumulate) {
  const __m512i idx01 = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i idx23 = _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2);
  const __m512i zero = _mm512_setzero_si512();
  __m512 a01[R], a23[R];
  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r) a01[r] = _mm512_setzero_ps(), a23[r] = _mm512_setzero_ps();
  for (int64_t j = 0; j < nb; ++j, g += kQ8PackedGroup) {
    // 136 bytes a group: three lines ahead cover every line of the stream.
    _mm_prefetch(reinterpret_cast<const char*>(g) + kPrefetchAheadBytes, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(g) + kPrefetchAheadBytes + 64, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(g) + kPrefetchAheadBytes + 128, _MM_HINT_T0);
    const __m512 ws =
        _mm512_castps128_ps512(_mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(g))));
    const __m512 s01 = _mm512_permutexvar_ps(idx01, ws), s23 = _mm512_permutexvar_ps(idx23, ws);
    const __m512i w01 = _mm512_loadu_si512(g + 8), w23 = _mm512_loadu_si512(g + 8 + 2 * kQ8Block);
    #pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512i xv = Broadcast32(xq + r * in + j * kQ8Block);
      const __m512i ax = _mm512_abs_epi8(xv);
      const __mmask64 neg = _mm512_movepi8_mask(xv);
      const __m512i d01 = _mm512_dpbusd_epi32(zero, ax, _mm512_mask_sub_epi8(w01, neg, zero, w01));
      const __m512i d23 = _mm512_dpbusd_epi32(zero, ax, _mm512_mask_sub_epi8(w23, neg, zero, w23));
      const __m512 dx = _mm512_set1_ps(xd[r * nb + j]);
      a01[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d01), _mm512_mul_ps(s01, dx), a01[r]);
      a23[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d23), _mm512_mul_ps(s23, dx), a23[r]);
    }
  }
  #pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const float s[4] = {Hsum8(_mm512_castps512_ps256(a01[r])), Hsum8(_mm512_extractf32x8_ps(a01[r], 1)),
                        Hsum8(_mm512_castps512_ps256(a23[r])), Hsum8(_mm512_extractf32x8_ps(a23[r], 1))};
    StoreBlock(y + r * ldy, o, valid, s, accumulate);
  }
}

// QuantizeActivationQ8 with 512-bit registers: the same amax, d, 1 / d
// and products as the scalar loop, rounded to nearest even by vcvtps2dq
// (the scalar loop's rounding): bitwise the scalar result.
void QuantizeActivation(const float* x, int64_t in, int8_t* q, float* d) {
  for (int64_t j = 0; j < in / kQ8Block; ++j) {
    const __m512 a = _mm512_loadu_ps(x + j * kQ8Block), b = _mm512_loadu_ps(x + j * kQ8Block + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    const float dj = amax / 127.0f;
    const float id = dj != 0.0f ? 1.0f / dj : 0.0f;
    d[j] = dj;
    const __m512 v = _mm512_set1_ps(id);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + j * kQ8Block),
                     _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(a, v))));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + j * kQ8Block + 16),
                     _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(b, v))));
  }
}

void Q8Rows(const int8_t* xq, const float* xd, int64_t n, int64_t in, const uint8_t* packed, int64_t out,
            float* y, int64_t ldy, bool accumulate) {
  const int64_t nb = in / kQ8Block;
  for (int64_t o = 0; o < out; o += 4) {
    const uint8_t* g = packed + PackedQ8_0Offset(o, in);
    const int64_t valid = std::min<int64_t>(4, out - o);
    int64_t r = 0;
    for (; r + 4 <= n; r += 4) {
      Q8Block<4>(xq + r * in, xd + r * nb, nb, in, g, y + r * ldy, ldy, o, valid, accumulate);
    }
    for (; r + 2 <= n; r += 2) {
      Q8Block<2>(xq + r * in, xd + r * nb, nb, in, g, y + r * ldy, ldy, o, valid, accumulate);
    }
    if (r < n) Q8Block<1>(xq + r * in, xd + r * nb, nb, in, g, y + r * ldy, ldy, o, valid, accumulate);
  }
}

}  // namespace avx512
#pragma GCC diagnostic pop
#pragma GCC pop_options
#else
#define LEDE_HAVE_X86_QUANT_KERNELS 0
#endif

QuantIsa BestQuantIsa() {
  static const QuantIsa best = [] {
    QuantIsa isa = QuantIsa::kPortable;
#if LEDE_HAVE_X86_QUANT_KERNELS
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
      isa = QuantIsa::kAvx2;
      if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
          __builtin_cpu_supports("avx512vnni")) {
        isa = QuantIsa::kAvx512;
      }
    }
#endif
    const char* force = std::getenv("LEDE_CPU_KERNELS");
    if (force != nullptr && std::string(force) == "avx2" && isa == QuantIsa::kAvx512) isa = QuantIsa::kAvx2;
    if (force != nullptr && std::string(force) == "portable") isa = QuantIsa::kPortable;
    return isa;
  }();
  return best;
}

const char* QuantIsaName(QuantIsa isa) {
  switch (isa) {
    case QuantIsa::kPortable: return "portable";
    case QuantIsa::kAvx2: return "avx2";
    case QuantIsa::kAvx512: return "avx512-vnni";
  }
  return "?";
}

void MatMulRowsPackedBf16(const float* x, int64_t n, int64_t in, const uint16_t* packed, int64_t out,
                          float* y, int64_t ldy, bool accumulate, QuantIsa isa) {
  isa = std::min(isa, BestQuantIsa());
#if LEDE_HAVE_X86_QUANT_KERNELS
  if (isa == QuantIsa::kAvx512) return avx512::Bf16Rows(x, n, in, packed, out, y, ldy, accumulate);
  if (isa == QuantIsa::kAvx2) return avx2::Bf16Rows(x, n, in, packed, out, y, ldy, accumulate);
#endif
  portable::Bf16Rows(x, n, in, packed, out, y, ldy, accumulate);
}

void MatMulRowsPackedQ8_0(const float* x, int64_t n, int64_t in, const uint8_t* packed, int64_t out,
                          float* y, int64_t ldy, bool accumulate, QuantIsa isa) {
  isa = std::min(isa, BestQuantIsa());
  ActivationScratch& s = Scratch(n, in);
  const int64_t nb = in / kQ8Block;
#if LEDE_HAVE_X86_QUANT_KERNELS
  if (isa == QuantIsa::kAvx512) {
    for (int64_t r = 0; r < n; ++r) avx512::QuantizeActivation(x + r * in, in, s.q.data() + r * in, s.d.data() + r * nb);
  } else {
    for (int64_t r = 0; r < n; ++r) QuantizeActivationQ8(x + r * in, in, s.q.data() + r * in, s.d.data() + r * nb);
  }
#else
  for (int64_t r = 0; r < n; ++r) QuantizeActivationQ8(x + r * in, in, s.q.data() + r * in, s.d.data() + r * nb);
#endif
#if LEDE_HAVE_X86_QUANT_KERNELS
  if (isa == QuantIsa::kAvx512) return avx512::Q8Rows(s.q.data(), s.d.data(), n, in, packed, out, y, ldy, accumulate);
  if (isa == QuantIsa::kAvx2) return avx2::Q8Rows(s.q.data(), s.d.data(), n, in, packed, out, y, ldy, accumulate);
#endif
  portable::Q8Rows(s.q.data(), s.d.data(), n, in, packed, out, y, ldy, accumulate);
}

}  // namespace lede::model::cpu
