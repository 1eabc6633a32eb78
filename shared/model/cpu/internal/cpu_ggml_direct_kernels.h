// File: shared/model/cpu/internal/cpu_ggml_direct_kernels.h
//
// The AVX2 direct products of cpu_ggml_kernels.h (one weight row straight
// from its llama.cpp blocks against up to 4 rows of X) and their kernel
// types for RowsDirect (cpu_ggml_rows_direct.h), included once by
// cpu_ggml_kernels.cc inside its anonymous namespace and its AVX2 target
// region. No include guard on purpose.
// Requires <immintrin.h>, <algorithm>, <cstring>, `Hsum(__m256)` and `kQK`.

// ---- direct dot products: one weight row straight from its blocks ----
// (no decoded copy: the nibbles are split in registers; each X row re-splits
// them from L1, where the row stays while the rows of X pass).

inline float Half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// The 6-bit scales and mins of a Q4_K / Q5_K block (KScaleMin's packing,
// the 12 bytes at `scales`) as 16 bytes [sc0..sc7, m0..m7], with shuffles
// and masks rather than scalar code. Reads 16 bytes from `scales` (the 4
// past the 12 are the block's own qh / qs, ignored).
inline __m128i KScaleMinBytes(const uint8_t* scales) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(scales));
  // [b0..3, b8..11, b4..7, b8..11]: the low bits of sc0-3, sc4-7, m0-3, m4-7.
  const __m128i a = _mm_shuffle_epi8(raw, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
  const __m128i lo = _mm_or_si128(
      _mm_and_si128(a, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0)),
      _mm_and_si128(_mm_srli_epi16(a, 4), _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15)));
  // The top two bits of b0..3 (for sc4-7) and b4..7 (for m4-7) as bits 4, 5.
  const __m128i h = _mm_shuffle_epi8(raw, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
  return _mm_or_si128(lo, _mm_and_si128(_mm_srli_epi16(h, 2), _mm_set1_epi8(0x30)));
}

// The per-block float part of Q4_K / Q5_K, shared by the AVX2 and the
// VNNI kernels: the block's mins as int16 for its 16 activation sums of 16
// (m0 m0 m1 m1 .. m3 m3 | m4 m4 .. m7 m7) and its d, -dmin as float32 lane
// pairs [d, d, -dmin, -dmin] x 2. K45Scales builds both from one block
// (the AVX2 kernels); the VNNI Q4_K kernel unpacks 4 blocks' headers at
// once and takes only K45Mins from here.
struct K45BlockScales {
  __m256i mins;
  __m256 dd;
};
// sm: the block's [sc0..7, m0..7] (KScaleMinBytes) in both 128-bit lanes.
inline __m256i K45Mins(__m256i sm) {
  const __m256i kMinPick = _mm256_setr_epi8(8, -1, 8, -1, 9, -1, 9, -1, 10, -1, 10, -1, 11, -1, 11, -1,
                                            12, -1, 12, -1, 13, -1, 13, -1, 14, -1, 14, -1, 15, -1, 15, -1);
  return _mm256_shuffle_epi8(sm, kMinPick);
}
inline K45BlockScales K45Scales(const uint8_t* blk, __m128i sm) {
  const __m128 kNegMin = _mm_castsi128_ps(_mm_setr_epi32(0, static_cast<int>(0x80000000u), 0, 0));
  const __m256i kPairs = _mm256_setr_epi32(0, 0, 1, 1, 0, 0, 1, 1);
  int32_t dm;
  std::memcpy(&dm, blk, 4);
  return {K45Mins(_mm256_broadcastsi128_si256(sm)),
          _mm256_permutevar8x32_ps(
              _mm256_castps128_ps256(_mm_xor_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(dm)), kNegMin)), kPairs)};
}
// acc + one block of one row of X: its scaled integer sums ia (8 int32
// lanes, all to be multiplied by d) paired with its min x activation sums
// by one vphaddd, scaled by [d, d, -dmin, -dmin] and by the activation
// scale *dx in one FMA. bs: the row's 16 activation sums of the block.
inline __m256 K45Accumulate(__m256i ia, const int16_t* bs, const K45BlockScales& k, const float* dx, __m256 acc) {
  const __m256i off = _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bs)), k.mins);
  const __m256 f = _mm256_cvtepi32_ps(_mm256_hadd_epi32(ia, off));
  return _mm256_fmadd_ps(_mm256_mul_ps(f, k.dd), _mm256_broadcast_ss(dx), acc);
}

// Q4_K (five = false) and Q5_K: value = d sc q - dmin m per sub-block of 32.
// R rows of X (row r at xq + r in, xd + r nb, bs + r in / 16) against one
// weight row: the nibbles and scales are split once for the R rows. Per
// block and row, the sums of weight x activation integers and of min x
// activation sums are paired by one vphaddd and scaled by one FMA into a
// float32 accumulator ([d, d, -dmin, -dmin] x dx per lane pair), reduced
// once per row.
template <bool kFive, int R>
void DotK45Direct(const uint8_t* row, int64_t nb, int64_t in, const int8_t* xq, const float* xd, const int16_t* bs,
                  float* out) {
  const size_t bb = kFive ? 176 : 144;
  const __m256i m4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
  // Byte j of [sc0..7, m0..7] as int16 in every lane (scale of sub-block j).
  alignas(32) static const int8_t kPick[8][32] = {
#define LEDE_PICK(j) {j, -1, j, -1, j, -1, j, -1, j, -1, j, -1, j, -1, j, -1, \
                      j, -1, j, -1, j, -1, j, -1, j, -1, j, -1, j, -1, j, -1}
      LEDE_PICK(0), LEDE_PICK(1), LEDE_PICK(2), LEDE_PICK(3), LEDE_PICK(4), LEDE_PICK(5), LEDE_PICK(6), LEDE_PICK(7)};
#undef LEDE_PICK
  __m256 acc[R];
  #pragma GCC unroll 4
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = row + static_cast<size_t>(b) * bb;
    const __m128i sm128 = KScaleMinBytes(blk + 4);
    const __m256i sm = _mm256_broadcastsi128_si256(sm128);
    const K45BlockScales k = K45Scales(blk, sm128);
    const uint8_t* qs = blk + (kFive ? 48 : 16);
    __m256i hv = kFive ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16)) : _mm256_setzero_si256();
    __m256i ia[R];
    #pragma GCC unroll 4
    for (int r = 0; r < R; ++r) ia[r] = _mm256_setzero_si256();
    #pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * c));
      __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
      if (kFive) {
        lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(hv, one), 4));
        hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hv, 1), one), 4));
        hv = _mm256_srli_epi16(hv, 2);
      }
      const __m256i s0 = _mm256_shuffle_epi8(sm, _mm256_load_si256(reinterpret_cast<const __m256i*>(kPick[2 * c])));
      const __m256i s1 =
          _mm256_shuffle_epi8(sm, _mm256_load_si256(reinterpret_cast<const __m256i*>(kPick[2 * c + 1])));
      #pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const int8_t* x = xq + r * in + b * kQK + 64 * c;
        const __m256i p0 = _mm256_maddubs_epi16(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
        const __m256i p1 = _mm256_maddubs_epi16(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 32)));
        ia[r] = _mm256_add_epi32(ia[r], _mm256_add_epi32(_mm256_madd_epi16(p0, s0), _mm256_madd_epi16(p1, s1)));
      }
    }
    #pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[r] = K45Accumulate(ia[r], bs + r * (in / 16) + 16 * b, k, xd + r * nb + b, acc[r]);
  }
  #pragma GCC unroll 4
  for (int r = 0; r < R; ++r) out[r] = Hsum(acc[r]);
}

// Q6_K: value = d sc (q - 32) per sub-block of 16; the -32 leaves through
// the activation sums (32 sum sc bsum). R rows of X as DotK45Direct's.
template <int R>
void DotQ6KDirect(const uint8_t* row, int64_t nb, int64_t in, const int8_t* xq, const float* xd, const int16_t* bs,
                  float* out) {
  const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3), m2b = _mm256_set1_epi8(12),
                m2c = _mm256_set1_epi8(48), m2d = _mm256_set1_epi8(static_cast<char>(192));
  // Chunk k of a half: int16 element 2k in the low lane, 2k + 1 in the high.
  alignas(32) static const int8_t kPick[4][32] = {
#define LEDE_PICK2(a, b) {2 * a, 2 * a + 1, 2 * a, 2 * a + 1, 2 * a, 2 * a + 1, 2 * a, 2 * a + 1, \
                          2 * a, 2 * a + 1, 2 * a, 2 * a + 1, 2 * a, 2 * a + 1, 2 * a, 2 * a + 1, \
                          2 * b, 2 * b + 1, 2 * b, 2 * b + 1, 2 * b, 2 * b + 1, 2 * b, 2 * b + 1, \
                          2 * b, 2 * b + 1, 2 * b, 2 * b + 1, 2 * b, 2 * b + 1, 2 * b, 2 * b + 1}
      LEDE_PICK2(0, 1), LEDE_PICK2(2, 3), LEDE_PICK2(4, 5), LEDE_PICK2(6, 7)};
#undef LEDE_PICK2
  __m256 acc[R];
  #pragma GCC unroll 4
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = row + static_cast<size_t>(b) * 210;
    const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192));
    const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
    __m256i ia[R];
    #pragma GCC unroll 4
    for (int r = 0; r < R; ++r) ia[r] = _mm256_setzero_si256();
    #pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m256i scales = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_srli_si128(sc8, 8 * h)));
      const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h));
      const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h + 32));
      const __m256i hv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h));
      const __m256i q[4] = {
          _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(hv, m2), 4)),
          _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_slli_epi16(_mm256_and_si256(hv, m2b), 2)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(hv, m2c)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                          _mm256_srli_epi16(_mm256_and_si256(hv, m2d), 2))};
      #pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        const __m256i s = _mm256_shuffle_epi8(scales, _mm256_load_si256(reinterpret_cast<const __m256i*>(kPick[k])));
        #pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          const __m256i p = _mm256_maddubs_epi16(
              q[k], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + r * in + b * kQK + 128 * h + 32 * k)));
          ia[r] = _mm256_add_epi32(ia[r], _mm256_madd_epi16(p, s));
        }
      }
    }
    const float d = Half(blk + 208);
    #pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256i off =
          _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bs + r * (in / 16) + 16 * b)), sc16);
      const __m256i t = _mm256_sub_epi32(ia[r], _mm256_slli_epi32(off, 5));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_set1_ps(d * xd[r * nb + b]), acc[r]);
    }
  }
  #pragma GCC unroll 4
  for (int r = 0; r < R; ++r) out[r] = Hsum(acc[r]);
}

// Q4_0: value = d (q - 8) per 32. Two blocks per step: each block's 16
// bytes in both 128-bit lanes, shifted by 0 and 4 (low and high nibbles),
// their vpmaddubsw products paired by vphaddw and summed by one vpmaddwd
// into [b0, b0, b1, b1 | b0, b0, b1, b1] lanes, one FMA by the scales. The
// -8 leaves through c (8 x sum of x q x x scale per block), dotted with
// the weight scales.
// R rows of X (row r at xq + r in, xd + r nb, c + r nb) share each
// block's nibbles and scales; each row's operations are the one-row
// kernel's, in its order.
template <int R>
void DotQ4_0Direct(const uint8_t* row, int64_t nb, int64_t in, const int8_t* xq, const float* xd, const float* c,
                   float* out) {
  const __m256i m4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
  const __m256i kShift = _mm256_setr_epi64x(0, 0, 4, 4);
  const __m256i kPairs = _mm256_setr_epi32(0, 0, 1, 1, 0, 0, 1, 1);
  auto nibbles = [&](const uint8_t* blk) {
    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2)));
    return _mm256_and_si256(_mm256_srlv_epi64(v, kShift), m4);
  };
  __m256 acc[R];
  __m128 corr[R];
  #pragma GCC unroll 4
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps(), corr[r] = _mm_setzero_ps();
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    const uint8_t* b0 = row + static_cast<size_t>(b) * 18;
    const uint8_t* b1 = b0 + 18;
    const __m256i n0 = nibbles(b0), n1 = nibbles(b1);
    uint16_t h0, h1;
    std::memcpy(&h0, b0, 2);
    std::memcpy(&h1, b1, 2);
    const __m128 d = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(h0 | (static_cast<uint32_t>(h1) << 16))));
    #pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const int8_t* x = xq + r * in + 32 * b;
      const __m256i p0 = _mm256_maddubs_epi16(n0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
      const __m256i p1 = _mm256_maddubs_epi16(n1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 32)));
      const __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_hadd_epi16(p0, p1), ones));
      const __m128 s =
          _mm_mul_ps(d, _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(xd + r * nb + b))));
      acc[r] = _mm256_fmadd_ps(f, _mm256_permutevar8x32_ps(_mm256_castps128_ps256(s), kPairs), acc[r]);
      corr[r] =
          _mm_fmadd_ps(d, _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c + r * nb + b))), corr[r]);
    }
  }
  #pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    float tail = 0.0f;
    if (b < nb) {  // an odd last block
      const uint8_t* b0 = row + static_cast<size_t>(b) * 18;
      const __m256i p = _mm256_madd_epi16(
          _mm256_maddubs_epi16(nibbles(b0), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + r * in + 32 * b))),
          ones);
      const float d = Half(b0);
      tail = d * xd[r * nb + b] * Hsum(_mm256_cvtepi32_ps(p)) - d * c[r * nb + b];
    }
    const __m128 cs = _mm_add_ps(corr[r], _mm_movehdup_ps(corr[r]));
    out[r] = Hsum(acc[r]) - _mm_cvtss_f32(cs) + tail;
  }
}

// The direct kernels as types, for RowsDirect: Sums is the type of the
// per-row activation sums a kernel reads (the K types' sums of 16, Q4_0's
// offset terms c), SumsPerRow their count per row of X.
template <bool kFive>
struct K45Kernel {
  using Sums = int16_t;
  static int64_t SumsPerRow(int64_t in, int64_t) { return in / 16; }
  template <int R>
  static void Dot(const uint8_t* row, int64_t nb, int64_t in, const int8_t* xq, const float* xd, const int16_t* bs,
                  float* out) {
    DotK45Direct<kFive, R>(row, nb, in, xq, xd, bs, out);
  }
};
struct Q6KKernel {
  using Sums = int16_t;
  static int64_t SumsPerRow(int64_t in, int64_t) { return in / 16; }
  template <int R>
  static void Dot(const uint8_t* row, int64_t nb, int64_t in, const int8_t* xq, const float* xd, const int16_t* bs,
                  float* out) {
    DotQ6KDirect<R>(row, nb, in, xq, xd, bs, out);
  }
};
struct Q40Kernel {
  using Sums = float;
  static int64_t SumsPerRow(int64_t, int64_t nb) { return nb; }
  template <int R>
  static void Dot(const uint8_t* row, int64_t nb, int64_t in, const int8_t* xq, const float* xd, const float* c,
                  float* out) {
    DotQ4_0Direct<R>(row, nb, in, xq, xd, c, out);
  }
};
