// File: shared/model/cpu/internal/cpu_kernels_impl.h
//
// The bodies of the vectorized kernels of cpu_kernels.h, included by
// cpu_kernels.cc once per instruction-set target inside its own namespace
// (LEDE_KERNEL_NS): the portable baseline, and on x86-64 with GCC an
// AVX2+FMA copy (#pragma GCC target). No include guard on purpose.
// Requires <cmath>, <cstdint>, <cstring> and `F8` (8 x float vector type).

namespace LEDE_KERNEL_NS {

inline F8 Load8(const float* p) {
  F8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline float Sum8(const F8& v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

// Eight bfloat16 values widened to float32 (exact: the high half of the
// float's bits), and one.
inline F8 Load8(const uint16_t* p) {
  typedef uint16_t U16x8 __attribute__((vector_size(16)));
  typedef uint32_t U32x8 __attribute__((vector_size(32)));
  U16x8 h;
  std::memcpy(&h, p, sizeof(h));
  const U32x8 u = __builtin_convertvector(h, U32x8) << 16;
  F8 v;
  std::memcpy(&v, &u, sizeof(v));
  return v;
}
inline float Widen(float x) { return x; }
inline float Widen(uint16_t b) { return Bf16ToFloat(b); }  // cpu_quant_kernels.h

// sum_i a[i] b[i] with b float32 (Dot) or bfloat16 (the K/V of a bfloat16
// pool), in one order of operations.
template <typename T>
float DotKv(const float* a, const T* b, int64_t n) {
  F8 acc0 = {}, acc1 = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 += Load8(a + i) * Load8(b + i);
    acc1 += Load8(a + i + 8) * Load8(b + i + 8);
  }
  for (; i + 8 <= n; i += 8) acc0 += Load8(a + i) * Load8(b + i);
  float s = Sum8(acc0 + acc1);
  for (; i < n; ++i) s += a[i] * Widen(b[i]);
  return s;
}

float Dot(const float* a, const float* b, int64_t n) { return DotKv(a, b, n); }

// Y[n, out] (+)= X[n, in] W[out, in]^T for small n: each block of 4 rows
// of W is read from memory once and applied to every row of X while it
// sits in L1 (the weights are the traffic; X is small).
void MatMulRows(const float* x, int64_t n, int64_t in, const float* w, int64_t out, float* y,
                bool accumulate, int64_t ldy) {
  int64_t o = 0;
  for (; o + 4 <= out; o += 4) {
    const float* w0 = w + o * in;
    const float* w1 = w0 + in;
    const float* w2 = w1 + in;
    const float* w3 = w2 + in;
    int64_t r = 0;
    // Two rows of X at a time (8 accumulators in registers): each element
    // sums the same products in the same order as the one-row loop below,
    // so results do not depend on n (bitwise). Only without a scalar tail
    // (in % 8 == 0, every model dimension here): the compiler vectorizes the
    // tails of the two loops differently, which changes the rounding.
    const int64_t paired = in % 8 == 0 ? n : 0;
    for (; r + 2 <= paired; r += 2) {
      const float* xr = x + r * in;
      const float* xs = xr + in;
      float* yr = y + r * ldy;
      float* ys = yr + ldy;
      F8 a0 = {}, a1 = {}, a2 = {}, a3 = {}, b0 = {}, b1 = {}, b2 = {}, b3 = {};
      int64_t i = 0;
      for (; i + 8 <= in; i += 8) {
        const F8 xv = Load8(xr + i), xu = Load8(xs + i);
        const F8 v0 = Load8(w0 + i), v1 = Load8(w1 + i), v2 = Load8(w2 + i), v3 = Load8(w3 + i);
        a0 += v0 * xv;
        a1 += v1 * xv;
        a2 += v2 * xv;
        a3 += v3 * xv;
        b0 += v0 * xu;
        b1 += v1 * xu;
        b2 += v2 * xu;
        b3 += v3 * xu;
      }
      float s0 = Sum8(a0), s1 = Sum8(a1), s2 = Sum8(a2), s3 = Sum8(a3);
      float t0 = Sum8(b0), t1 = Sum8(b1), t2 = Sum8(b2), t3 = Sum8(b3);
      // The tails one row at a time, in the one-row loop's shape.
      for (int64_t j = i; j < in; ++j) {
        s0 += w0[j] * xr[j];
        s1 += w1[j] * xr[j];
        s2 += w2[j] * xr[j];
        s3 += w3[j] * xr[j];
      }
      for (int64_t j = i; j < in; ++j) {
        t0 += w0[j] * xs[j];
        t1 += w1[j] * xs[j];
        t2 += w2[j] * xs[j];
        t3 += w3[j] * xs[j];
      }
      if (accumulate) {
        yr[o] += s0, yr[o + 1] += s1, yr[o + 2] += s2, yr[o + 3] += s3;
        ys[o] += t0, ys[o + 1] += t1, ys[o + 2] += t2, ys[o + 3] += t3;
      } else {
        yr[o] = s0, yr[o + 1] = s1, yr[o + 2] = s2, yr[o + 3] = s3;
        ys[o] = t0, ys[o + 1] = t1, ys[o + 2] = t2, ys[o + 3] = t3;
      }
    }
    for (; r < n; ++r) {
      const float* xr = x + r * in;
      float* yr = y + r * ldy;
      F8 a0 = {}, a1 = {}, a2 = {}, a3 = {};
      int64_t i = 0;
      for (; i + 8 <= in; i += 8) {
        const F8 xv = Load8(xr + i);
        a0 += Load8(w0 + i) * xv;
        a1 += Load8(w1 + i) * xv;
        a2 += Load8(w2 + i) * xv;
        a3 += Load8(w3 + i) * xv;
      }
      float s0 = Sum8(a0), s1 = Sum8(a1), s2 = Sum8(a2), s3 = Sum8(a3);
      for (; i < in; ++i) {
        s0 += w0[i] * xr[i];
        s1 += w1[i] * xr[i];
        s2 += w2[i] * xr[i];
        s3 += w3[i] * xr[i];
      }
      if (accumulate) {
        yr[o] += s0, yr[o + 1] += s1, yr[o + 2] += s2, yr[o + 3] += s3;
      } else {
        yr[o] = s0, yr[o + 1] = s1, yr[o + 2] = s2, yr[o + 3] = s3;
      }
    }
  }
  for (; o < out; ++o) {
    for (int64_t r = 0; r < n; ++r) {
      const float s = Dot(w + o * in, x + r * in, in);
      y[r * ldy + o] = accumulate ? y[r * ldy + o] + s : s;
    }
  }
}

// MatMulRows over W in the PackRows layout (cpu_kernels.h; in % 8 == 0):
// each block of 4 rows is one sequential stream, row k's columns [i, i + 8)
// at b + 4 i + 8 k. Rows of X three at a time (12 accumulators: enough
// independent chains to keep both FMA ports busy), then two, then one. Each
// output element sums the same products in the same order as MatMulRows's
// one-row loop (lane-wise over i, then Sum8), so the result is bitwise the
// row-major one and does not depend on n. The three loops are written out:
// one template over the row count (accumulators acc[R][4], GCC unroll
// pragmas) computed the same bits but ran the 2- to 9-row products 25-45%
// slower (lede_engine_bench, n rows x [1024 x 192], A/B twice).
void MatMulRowsPacked(const float* x, int64_t n, int64_t in, const float* w, int64_t out, float* y,
                      bool accumulate, int64_t ldy) {
  auto store = [&](float* yr, int64_t o, const F8* a) {
    for (int k = 0; k < 4; ++k) yr[o + k] = accumulate ? yr[o + k] + Sum8(a[k]) : Sum8(a[k]);
  };
  int64_t o = 0;
  for (; o + 4 <= out; o += 4) {
    const float* b = w + o * in;
    int64_t r = 0;
    for (; r + 3 <= n; r += 3) {
      const float* x0 = x + r * in;
      const float* x1 = x0 + in;
      const float* x2 = x1 + in;
      F8 a[4] = {}, c[4] = {}, e[4] = {};
      for (int64_t i = 0; i < in; i += 8) {
        const float* chunk = b + 4 * i;
        __builtin_prefetch(chunk + kPrefetchAhead);
        __builtin_prefetch(chunk + kPrefetchAhead + 16);
        const F8 u0 = Load8(x0 + i), u1 = Load8(x1 + i), u2 = Load8(x2 + i);
        // One W chunk in a register at a time: 12 + 3 + 1 = 16 registers.
        for (int k = 0; k < 4; ++k) {
          const F8 v = Load8(chunk + 8 * k);
          a[k] += v * u0;
          c[k] += v * u1;
          e[k] += v * u2;
        }
      }
      store(y + r * ldy, o, a);
      store(y + (r + 1) * ldy, o, c);
      store(y + (r + 2) * ldy, o, e);
    }
    for (; r + 2 <= n; r += 2) {
      const float* x0 = x + r * in;
      const float* x1 = x0 + in;
      F8 a[4] = {}, c[4] = {};
      for (int64_t i = 0; i < in; i += 8) {
        const float* chunk = b + 4 * i;
        __builtin_prefetch(chunk + kPrefetchAhead);
        __builtin_prefetch(chunk + kPrefetchAhead + 16);
        const F8 u0 = Load8(x0 + i), u1 = Load8(x1 + i);
        for (int k = 0; k < 4; ++k) {
          const F8 v = Load8(chunk + 8 * k);
          a[k] += v * u0;
          c[k] += v * u1;
        }
      }
      store(y + r * ldy, o, a);
      store(y + (r + 1) * ldy, o, c);
    }
    for (; r < n; ++r) {
      const float* xr = x + r * in;
      F8 a[4] = {};
      for (int64_t i = 0; i < in; i += 8) {
        const float* chunk = b + 4 * i;
        __builtin_prefetch(chunk + kPrefetchAhead);
        __builtin_prefetch(chunk + kPrefetchAhead + 16);
        const F8 xv = Load8(xr + i);
        a[0] += Load8(chunk) * xv;
        a[1] += Load8(chunk + 8) * xv;
        a[2] += Load8(chunk + 16) * xv;
        a[3] += Load8(chunk + 24) * xv;
      }
      store(y + r * ldy, o, a);
    }
  }
  for (; o < out; ++o) {  // the out % 4 tail rows, row-major
    for (int64_t r = 0; r < n; ++r) {
      const float s = Dot(w + o * in, x + r * in, in);
      y[r * ldy + o] = accumulate ? y[r * ldy + o] + s : s;
    }
  }
}

// exp(d) for d in [-87, 0] (clamped below): d = k ln2 + r, |r| <= ln2 / 2,
// exp(r) by its Taylor-fitted polynomial, 2^k built in the exponent bits.
inline F8 Exp8(F8 d) {
  typedef int32_t I8 __attribute__((vector_size(32)));
  const F8 lo = F8{} - 87.0f;
  d = d < lo ? lo : d;
  const F8 magic = F8{} + 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const F8 k = (d * 1.44269504088896341f + magic) - magic;
  const F8 r = (d - k * 0.693359375f) + k * 2.12194440e-4f;
  F8 p = F8{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const I8 bits = (__builtin_convertvector(k, I8) + 127) << 23;
  F8 scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

void ExpSums(const float* x, int64_t n, float shift, double* sum_exp, double* sum_exp_d) {
  F8 z0 = {}, z1 = {}, zx0 = {}, zx1 = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const F8 d0 = Load8(x + i) - shift, d1 = Load8(x + i + 8) - shift;
    const F8 e0 = Exp8(d0), e1 = Exp8(d1);
    z0 += e0;
    z1 += e1;
    zx0 += e0 * d0;
    zx1 += e1 * d1;
  }
  double z = Sum8(z0 + z1), zx = Sum8(zx0 + zx1);
  for (; i < n; ++i) {
    const float d = x[i] - shift;
    const float e = std::exp(d);
    z += e;
    zx += static_cast<double>(e) * d;
  }
  *sum_exp = z;
  *sum_exp_d = zx;
}

void RmsNorm(const float* x, const float* weight, int64_t n, int64_t d, float eps, float* y) {
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x + r * d;
    float* yr = y + r * d;
    const float scale = 1.0f / std::sqrt(Dot(xr, xr, d) / static_cast<float>(d) + eps);
    for (int64_t i = 0; i < d; ++i) yr[i] = xr[i] * scale * weight[i];
  }
}

// Calls row_fn(j, row) for the rows j = 0 .. n_keys - 1 of one KV head of a
// paged slot (cpu_kernels.h AttendPaged): row j at base + blocks[j / P] *
// block_stride + (j % P) * hd, in order.
template <typename T, typename RowFn>
inline void ForEachRow(const T* base, const int64_t* blocks, int64_t block_stride, int64_t P, int64_t n_keys,
                       int64_t hd, RowFn&& row_fn) {
  for (int64_t j0 = 0, b = 0; j0 < n_keys; j0 += P, ++b) {
    const T* block = base + blocks[b] * block_stride;
    const int64_t n = std::min(P, n_keys - j0);
    for (int64_t j = 0; j < n; ++j) row_fn(j0 + j, block + j * hd);
  }
}

// softmax(q K^T) V with the output row in registers: kChunks = hd / 8
// vectors, so each value row is read once and nothing is stored per key.
template <int kChunks, typename T>
void WeightedValues(const float* scores, const T* values, const int64_t* blocks, int64_t block_stride, int64_t P,
                    int64_t n_keys, float inv, float* out) {
  constexpr int64_t hd = kChunks * 8;
  F8 acc[kChunks] = {};
  ForEachRow(values, blocks, block_stride, P, n_keys, hd, [&](int64_t j, const T* v) {
    const F8 p = F8{} + scores[j] * inv;
#pragma GCC unroll 16
    for (int c = 0; c < kChunks; ++c) acc[c] += p * Load8(v + 8 * c);
  });
  std::memcpy(out, acc, sizeof(acc));
}

// scores[j] = exp(scores[j] - m) (<= 1) for j < n, eight at a time (Exp8)
// with the sum in lanes; returns 1 / the sum (softmax's normalizer).
inline float ExpAndNormalizer(float* scores, int64_t n, float m) {
  F8 z8 = {};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const F8 e = Exp8(Load8(scores + j) - m);
    std::memcpy(scores + j, &e, sizeof(e));
    z8 += e;
  }
  float z = Sum8(z8);
  for (; j < n; ++j) {
    scores[j] = std::exp(scores[j] - m);
    z += scores[j];
  }
  return 1.0f / z;
}

// cpu_kernels.h AttendPaged (T = float) and AttendPagedBf16 (T = uint16_t).
template <typename T>
void AttendPaged(const float* q, const T* keys, const T* values, const int64_t* blocks, int64_t block_stride,
                 int64_t P, int64_t n_keys, int64_t hd, float* scores, float* out) {
  float m = -INFINITY;
  ForEachRow(keys, blocks, block_stride, P, n_keys, hd, [&](int64_t j, const T* k) {
    scores[j] = DotKv(q, k, hd);
    m = scores[j] > m ? scores[j] : m;
  });
  const float inv = ExpAndNormalizer(scores, n_keys, m);
  switch (hd) {  // the head dimensions of Llama-family models
    case 32: return WeightedValues<4>(scores, values, blocks, block_stride, P, n_keys, inv, out);
    case 64: return WeightedValues<8>(scores, values, blocks, block_stride, P, n_keys, inv, out);
    case 128: return WeightedValues<16>(scores, values, blocks, block_stride, P, n_keys, inv, out);
    default: break;
  }
  for (int64_t i = 0; i < hd; ++i) out[i] = 0.0f;
  ForEachRow(values, blocks, block_stride, P, n_keys, hd, [&](int64_t j, const T* v) {
    const float p = scores[j] * inv;
    for (int64_t i = 0; i < hd; ++i) out[i] += p * Widen(v[i]);
  });
}

// Lane j of the result is Sum8(v[j]), bitwise: the same additions in the
// same tree ((v0 + v4) + (v1 + v5)) + ((v2 + v6) + (v3 + v7)), done for
// eight vectors at once by shuffles (no horizontal sum per vector).
inline F8 Sum8Each(const F8* v) {
  F8 a[4], b[2];
  for (int p = 0; p < 4; ++p) {  // [v_2p[m] + v_2p[m + 4], v_2p+1[m] + v_2p+1[m + 4]], m < 4
    a[p] = __builtin_shufflevector(v[2 * p], v[2 * p + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
           __builtin_shufflevector(v[2 * p], v[2 * p + 1], 4, 5, 6, 7, 12, 13, 14, 15);
  }
  for (int h = 0; h < 2; ++h) {  // per vector: (a0 + a1), (a2 + a3)
    b[h] = __builtin_shufflevector(a[2 * h], a[2 * h + 1], 0, 2, 4, 6, 8, 10, 12, 14) +
           __builtin_shufflevector(a[2 * h], a[2 * h + 1], 1, 3, 5, 7, 9, 11, 13, 15);
  }
  return __builtin_shufflevector(b[0], b[1], 0, 2, 4, 6, 8, 10, 12, 14) +
         __builtin_shufflevector(b[0], b[1], 1, 3, 5, 7, 9, 11, 13, 15);
}

// q against the eight contiguous float32 rows k [8, hd] (hd % 8 == 0): lane
// j is bitwise DotKv(q, k + j hd, hd). kHd > 0: hd == kHd at compile time
// (the loops unrolled, the eight keys' products interleaved).
template <int kHd>
inline F8 Dot8Rows(const float* q, const float* k, int64_t hd) {
  if (kHd > 0) hd = kHd;
  F8 v[8];
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) {
    const float* b = k + j * hd;
    F8 acc0 = {}, acc1 = {};
    int64_t i = 0;
#pragma GCC unroll 8
    for (; i + 16 <= hd; i += 16) {
      acc0 += Load8(q + i) * Load8(b + i);
      acc1 += Load8(q + i + 8) * Load8(b + i + 8);
    }
    for (; i + 8 <= hd; i += 8) acc0 += Load8(q + i) * Load8(b + i);
    v[j] = acc0 + acc1;
  }
  return Sum8Each(v);
}

// Rows [j0, j1) of one KV head of a paged slot as float32 rows dst
// [j1 - j0, hd] (bfloat16 widened: exact), zero rows after them up to a
// multiple of 8.
template <typename T>
void GatherRows(const T* base, const int64_t* blocks, int64_t block_stride, int64_t P, int64_t j0, int64_t j1,
                int64_t hd, float* dst) {
  for (int64_t j = j0; j < j1; ++j, dst += hd) {
    const T* row = base + blocks[j / P] * block_stride + (j % P) * hd;
    for (int64_t i = 0; i < hd; i += 8) {
      const F8 v = Load8(row + i);
      std::memcpy(dst + i, &v, sizeof(v));
    }
  }
  for (int64_t j = j1; (j - j0) % 8 != 0; ++j, dst += hd) std::memset(dst, 0, hd * sizeof(float));
}

// For each of kHeads output rows h: out[h] += p_hj v_j for j in [j0, j1),
// p_hj = scores[h][j] inv[h], v_j row j - j0 of tile, each out[h] kChunks =
// hd / 8 vectors kept in registers across the keys (several heads at once:
// independent chains of multiply-adds), or kChunks = 0: hd / 8 vectors
// added in memory (other head dimensions). Each output lane sums its terms
// in key order, as AttendPaged.
template <int kChunks, int kHeads>
void AccumulateValues(const float* const* scores, const float* inv, const float* tile, int64_t j0, int64_t j1,
                      int64_t hd, bool first, float* const* out) {
  if (kChunks == 0) {
    for (int h = 0; h < kHeads; ++h) {
      if (first) std::memset(out[h], 0, hd * sizeof(float));
      for (int64_t j = j0; j < j1; ++j) {
        const F8 p = F8{} + scores[h][j] * inv[h];
        const float* v = tile + (j - j0) * hd;
        for (int64_t c = 0; c < hd; c += 8) {
          const F8 acc = Load8(out[h] + c) + p * Load8(v + c);
          std::memcpy(out[h] + c, &acc, sizeof(acc));
        }
      }
    }
    return;
  }
  constexpr int kC = kChunks > 0 ? kChunks : 1;
  F8 acc[kHeads][kC] = {};
  if (!first) {
    for (int h = 0; h < kHeads; ++h) std::memcpy(acc[h], out[h], sizeof(acc[h]));
  }
  for (int64_t j = j0; j < j1; ++j) {
    const float* v = tile + (j - j0) * hd;
#pragma GCC unroll 4
    for (int h = 0; h < kHeads; ++h) {
      const F8 p = F8{} + scores[h][j] * inv[h];
#pragma GCC unroll 16
      for (int c = 0; c < kC; ++c) acc[h][c] += p * Load8(v + 8 * c);
    }
  }
  for (int h = 0; h < kHeads; ++h) std::memcpy(out[h], acc[h], sizeof(acc[h]));
}

// The scratch of AttendPagedRows on the calling thread: one tile of K or V
// rows as float32, the scores of every (row, head) and their softmax
// normalizers. Grown, then reused.
struct AttendScratch {
  std::vector<float> tile, scores, inv;
};

inline AttendScratch& AttendScratchOfThread() {
  thread_local AttendScratch scratch;
  return scratch;
}

// cpu_kernels.h AttendPagedRows: AttendPaged's three passes (scores, exp
// and sum, weighted values) for R rows x G query heads, over tiles of the
// slot's keys (each K and V row read, and widened, once per call); every
// score, exponential and output lane is computed by AttendPaged's
// operations in its order, so a row's output does not depend on R.
template <typename T>
void AttendPagedRows(const float* q, int64_t q_stride, int64_t R, int64_t G, const T* keys, const T* values,
                     const int64_t* blocks, int64_t block_stride, int64_t P, int64_t n_keys0, int64_t hd,
                     float* out, int64_t out_stride) {
  if (R <= 0 || G <= 0) return;
  AttendScratch& s = AttendScratchOfThread();
  const int64_t n_max = n_keys0 + R - 1, n_pad = (n_max + 7) / 8 * 8;
  if (hd % 8 != 0) {  // not a vector head dimension: each head alone
    if (static_cast<int64_t>(s.scores.size()) < n_max) s.scores.resize(n_max);
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t g = 0; g < G; ++g) {
        AttendPaged(q + r * q_stride + g * hd, keys, values, blocks, block_stride, P, n_keys0 + r, hd,
                    s.scores.data(), out + r * out_stride + g * hd);
      }
    }
    return;
  }
  // Keys per tile: 16 KB of float32 rows (L1), a multiple of 8.
  const int64_t tile_keys = std::max<int64_t>(8, 4096 / hd / 8 * 8);
  if (static_cast<int64_t>(s.tile.size()) < tile_keys * hd) s.tile.resize(tile_keys * hd);
  if (static_cast<int64_t>(s.scores.size()) < R * G * n_pad) s.scores.resize(R * G * n_pad);
  float* tile = s.tile.data();
  float* scores = s.scores.data();  // row r, head g: scores + (r G + g) n_pad
  // Scores, eight keys at a time (lanes past a row's keys are never read).
  for (int64_t j0 = 0; j0 < n_max; j0 += tile_keys) {
    const int64_t j1 = std::min(n_max, j0 + tile_keys);
    GatherRows(keys, blocks, block_stride, P, j0, j1, hd, tile);
    for (int64_t r = 0; r < R; ++r) {
      const int64_t end = std::min(j1, n_keys0 + r);
      for (int64_t g = 0; g < G; ++g) {
        const float* qg = q + r * q_stride + g * hd;
        float* sc = scores + (r * G + g) * n_pad;
        for (int64_t j = j0; j < end; j += 8) {
          F8 v;
          switch (hd) {
            case 32: v = Dot8Rows<32>(qg, tile + (j - j0) * hd, hd); break;
            case 64: v = Dot8Rows<64>(qg, tile + (j - j0) * hd, hd); break;
            case 128: v = Dot8Rows<128>(qg, tile + (j - j0) * hd, hd); break;
            default: v = Dot8Rows<0>(qg, tile + (j - j0) * hd, hd); break;
          }
          std::memcpy(sc + j, &v, sizeof(v));
        }
      }
    }
  }
  // Softmax of each (row, head) over its own keys (the max is exact in any
  // order).
  if (static_cast<int64_t>(s.inv.size()) < R * G) s.inv.resize(R * G);
  float* inv = s.inv.data();
  for (int64_t r = 0; r < R; ++r) {
    const int64_t n = n_keys0 + r;
    for (int64_t g = 0; g < G; ++g) {
      float* sc = scores + (r * G + g) * n_pad;
      F8 m8 = F8{} - INFINITY;
      int64_t j = 0;
      for (; j + 8 <= n; j += 8) {
        const F8 v = Load8(sc + j);
        m8 = v > m8 ? v : m8;
      }
      float m = -INFINITY;
      for (int i = 0; i < 8; ++i) m = m8[i] > m ? m8[i] : m;
      for (; j < n; ++j) m = sc[j] > m ? sc[j] : m;
      inv[r * G + g] = ExpAndNormalizer(sc, n, m);
    }
  }
  // Weighted values, tile by tile, each output row carried across tiles;
  // hd 32 takes three heads at a time (four chains of multiply-adds alone
  // would wait on their latency).
  for (int64_t j0 = 0; j0 < n_max; j0 += tile_keys) {
    const int64_t j1 = std::min(n_max, j0 + tile_keys);
    GatherRows(values, blocks, block_stride, P, j0, j1, hd, tile);
    for (int64_t r = 0; r < R; ++r) {
      const int64_t end = std::min(j1, n_keys0 + r);
      if (end <= j0) continue;
      for (int64_t g = 0; g < G;) {
        const float* sc[3];
        float* o[3];
        const int64_t heads = hd == 32 ? std::min<int64_t>(3, G - g) : 1;
        for (int64_t h = 0; h < heads; ++h) {
          sc[h] = scores + (r * G + g + h) * n_pad;
          o[h] = out + r * out_stride + (g + h) * hd;
        }
        const float* iv = inv + r * G + g;
        const bool first = j0 == 0;
        switch (hd * 4 + heads) {  // the head dimensions of Llama-family models
          case 32 * 4 + 3: AccumulateValues<4, 3>(sc, iv, tile, j0, end, hd, first, o); break;
          case 32 * 4 + 2: AccumulateValues<4, 2>(sc, iv, tile, j0, end, hd, first, o); break;
          case 32 * 4 + 1: AccumulateValues<4, 1>(sc, iv, tile, j0, end, hd, first, o); break;
          case 64 * 4 + 1: AccumulateValues<8, 1>(sc, iv, tile, j0, end, hd, first, o); break;
          case 128 * 4 + 1: AccumulateValues<16, 1>(sc, iv, tile, j0, end, hd, first, o); break;
          default: AccumulateValues<0, 1>(sc, iv, tile, j0, end, hd, first, o); break;
        }
        g += heads;
      }
    }
  }
}

// SwiGLU (cpu_kernels.h SiluMul) eight columns at a time: with
// e = exp(-|g|) (Exp8, in (0, 1]: no overflow), silu(g) = g / (1 + e) for
// g >= 0 and g e / (1 + e) for g < 0. Relative error of e below 2e-7 (the
// scalar loop with std::exp cost 11 us per 2560 columns, ~5% of a q8_0
// decode step of the 122M shape).
void SiluMul(const float* h13, int64_t n, int64_t F, float* out) {
  for (int64_t r = 0; r < n; ++r) {
    const float* gate = h13 + r * 2 * F;
    const float* up = gate + F;
    float* o = out + r * F;
    int64_t f = 0;
    for (; f + 8 <= F; f += 8) {
      const F8 g = Load8(gate + f);
      const F8 neg_abs = g < 0 ? g : -g;
      const F8 e = Exp8(neg_abs);
      const F8 num = g < 0 ? g * e : g;
      const F8 v = num / (1.0f + e) * Load8(up + f);
      std::memcpy(o + f, &v, sizeof(v));
    }
    for (; f < F; ++f) o[f] = gate[f] / (1.0f + std::exp(-gate[f])) * up[f];
  }
}

}  // namespace LEDE_KERNEL_NS
