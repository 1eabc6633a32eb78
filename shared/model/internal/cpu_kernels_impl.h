// File: shared/model/internal/cpu_kernels_impl.h
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

float Dot(const float* a, const float* b, int64_t n) {
  F8 acc0 = {}, acc1 = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 += Load8(a + i) * Load8(b + i);
    acc1 += Load8(a + i + 8) * Load8(b + i + 8);
  }
  for (; i + 8 <= n; i += 8) acc0 += Load8(a + i) * Load8(b + i);
  float s = Sum8(acc0 + acc1);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Blocks of 4 rows of W that MatMulRows prefetches ahead of the one it
// reads. Four row streams of a few cache lines each (768 bytes for
// lede-tiny's d = 192) are too short for the hardware prefetcher to ramp
// up; prefetching the block 4 ahead, two cache lines per 8 columns so that
// a block's lines are all requested while the current one is read, tripled
// the read bandwidth from L3 on lede-tiny's weights (14-24 -> 47-54 GB/s,
// measured on this machine's EPYC; 1 and 2 blocks ahead: 35-38 and 44-49).
constexpr int64_t kPrefetchBlocks = 4;

// R rows of X (x, row stride in) times the block of 4 rows of W at b (row
// stride in), into rows of y (stride ldy) at columns [o, o + 4). Each
// element is summed lane-wise over the chunks of 8 columns in order, then
// Sum8, then the scalar tail in order: the same for every R, so a row's
// result does not depend on the rows computed beside it. pf, when not
// null, is where the prefetch stream of this block starts (pf_end: past the
// end of W, not prefetched).
template <int R>
inline void RowsTimesBlock(const float* x, int64_t in, const float* b, const char* pf,
                           const char* pf_end, float* y, int64_t ldy, int64_t o, bool accumulate) {
  F8 acc[R][4] = {};
  int64_t i = 0;
  for (; i + 8 <= in; i += 8) {
    if (pf != nullptr) {
      // 4 in floats per block over in / 8 chunks: 16 bytes per column.
      const char* p = pf + i * 16;
      if (p < pf_end) __builtin_prefetch(p, 0, 3);
      if (p + 64 < pf_end) __builtin_prefetch(p + 64, 0, 3);
    }
    F8 u[R];
    for (int q = 0; q < R; ++q) u[q] = Load8(x + q * in + i);
    for (int k = 0; k < 4; ++k) {  // one W chunk in a register at a time
      const F8 v = Load8(b + k * in + i);
      for (int q = 0; q < R; ++q) acc[q][k] += v * u[q];
    }
  }
  for (int q = 0; q < R; ++q) {
    const float* xq = x + q * in;
    float* yq = y + q * ldy + o;
    for (int k = 0; k < 4; ++k) {
      const float* wk = b + k * in;
      float s = Sum8(acc[q][k]);
      for (int64_t j = i; j < in; ++j) s += wk[j] * xq[j];
      yq[k] = accumulate ? yq[k] + s : s;
    }
  }
}

// Y[n, out] (+)= X[n, in] W[out, in]^T for small n: each block of 4 rows
// of W is read from memory once (prefetched kPrefetchBlocks ahead) and
// applied to every row of X while it sits in L1 (the weights are the
// traffic; X is small): rows of X three at a time (12 accumulators, enough
// independent chains for both FMA ports), then two, then one. Results do
// not depend on n (bitwise; RowsTimesBlock). Groups of rows only without a
// scalar tail (in % 8 == 0, every model dimension here): the compiler may
// contract the tails of differently shaped loops differently, which would
// change the rounding.
void MatMulRows(const float* x, int64_t n, int64_t in, const float* w, int64_t out, float* y,
                bool accumulate, int64_t ldy) {
  const char* w_end = reinterpret_cast<const char*>(w + out * in);
  const bool grouped = in % 8 == 0;
  int64_t o = 0;
  for (; o + 4 <= out; o += 4) {
    const float* b = w + o * in;
    const char* pf = reinterpret_cast<const char*>(b + kPrefetchBlocks * 4 * in);
    int64_t r = 0;
    // The first group of rows streams the block in and prefetches; the
    // others find it in L1.
    for (; grouped && r + 3 <= n; r += 3, pf = nullptr) {
      RowsTimesBlock<3>(x + r * in, in, b, pf, w_end, y + r * ldy, ldy, o, accumulate);
    }
    for (; grouped && r + 2 <= n; r += 2, pf = nullptr) {
      RowsTimesBlock<2>(x + r * in, in, b, pf, w_end, y + r * ldy, ldy, o, accumulate);
    }
    for (; r < n; ++r, pf = nullptr) {
      RowsTimesBlock<1>(x + r * in, in, b, pf, w_end, y + r * ldy, ldy, o, accumulate);
    }
  }
  for (; o < out; ++o) {  // the out % 4 tail rows of W
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

void AttendOne(const float* q, const float* keys, const float* values, int64_t n_keys, int64_t hd,
               float* scores, float* out) {
  float m = -INFINITY;
  for (int64_t j = 0; j < n_keys; ++j) {
    scores[j] = Dot(q, keys + j * hd, hd);
    m = scores[j] > m ? scores[j] : m;
  }
  float z = 0.0f;
  for (int64_t j = 0; j < n_keys; ++j) {
    scores[j] = std::exp(scores[j] - m);
    z += scores[j];
  }
  const float inv = 1.0f / z;
  for (int64_t i = 0; i < hd; ++i) out[i] = 0.0f;
  for (int64_t j = 0; j < n_keys; ++j) {
    const float p = scores[j] * inv;
    const float* v = values + j * hd;
    for (int64_t i = 0; i < hd; ++i) out[i] += p * v[i];
  }
}

}  // namespace LEDE_KERNEL_NS
