// File: shared/model/cpu/internal/cpu_ggml_vnni_kernels.h
//
// The AVX-512 VNNI direct products of cpu_ggml_kernels.h for Q4_K and
// Q6_K (the types of a Q4_K_M file) and Q4_0: one weight row straight from
// its llama.cpp blocks against up to 4 rows of X, as the AVX2 kernels of
// cpu_ggml_direct_kernels.h, with their kernel types for RowsDirect.
// Included once by cpu_ggml_kernels.cc inside its anonymous namespace, its
// AVX-512 target region and namespace avx512. No include guard on purpose.
// Requires <immintrin.h>, <algorithm>, <cstring>, `Hsum(__m256)`, `Half`,
// `K45BlockScales`, `K45Mins`, `K45Accumulate`, `kQK` and the AVX2 kernel types
// (cpu_ggml_direct_kernels.h).
//
// The integer products (docs/models.md, K-quant and 4-bit GGUF files):
// vpdpbusd multiplies
// 64 unsigned weight values (Q4_K: 0..15, Q6_K: 0..63) by 64 int8
// activations and sums each 4 into an int32 lane from zero, so a lane holds
// at most 4 x 63 x 127 = 32,004 and two such vectors pack to int16 without
// saturation (vpackssdw). Every 128-bit lane of a packed vector holds the
// partial sums of two sub-blocks, and one vpdpwssd multiplies them by the
// sub-blocks' scales (int16) into the int32 accumulator. Against the AVX2
// kernels (vpmaddubsw, vpmaddwd by the scales, vpaddd per 32 values and
// row of X) this is 2 instructions per 64 values and row of X rather than
// 6. The float part (the min or -32 terms, the super-block scales, one FMA
// per block and row) is the AVX2 kernels' for Q4_K and Q6_K; Q4_0 (last)
// scales four blocks per FMA. The integer sums are the same, their order
// into float32 lanes differs, so the ISAs agree to float rounding. Each row
// of X goes through the same operations in the same order for every R
// (rows do not depend on the rows beside them).

inline __m256i Fold(__m512i v) {
  return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

// The scale bytes of up to 4 Q4_K blocks at once: hdr holds block i's
// 16-byte header [d, dmin (float16), 12 bytes of 6-bit scales and mins] in
// its 128-bit lane i; lane i of the result is [sc0..7, m0..7] of block i
// (KScaleMinBytes of each lane, with the header's 4-byte offset).
inline __m512i ScaleMinBytes4(__m512i hdr) {
  // [b0..3, b8..11, b4..7, b8..11] of the scales: the low bits of sc0-3, sc4-7, m0-3, m4-7.
  const __m512i a = _mm512_shuffle_epi8(
      hdr, _mm512_broadcast_i32x4(_mm_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15)));
  const __m512i lo = _mm512_or_si512(
      _mm512_and_si512(a, _mm512_broadcast_i32x4(_mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0,
                                                               0, 0, 0))),
      _mm512_and_si512(_mm512_srli_epi16(a, 4),
                       _mm512_broadcast_i32x4(_mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15))));
  // The top two bits of b0..3 (for sc4-7) and b4..7 (for m4-7) as bits 4, 5.
  const __m512i h = _mm512_shuffle_epi8(
      hdr, _mm512_broadcast_i32x4(_mm_setr_epi8(-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11)));
  return _mm512_or_si512(lo, _mm512_and_si512(_mm512_srli_epi16(h, 2), _mm512_set1_epi8(0x30)));
}

// Q4_K: value = d sc q - dmin m per sub-block of 32. X arrives in Q4_K's
// nibble order (cpu_ggml_kernels.cc Q4KNibbleOrder): the 64 quant bytes of
// chunks 2p, 2p + 1, masked to their low nibbles (sub-blocks 4p | 4p + 2)
// and shifted to their high ones (4p + 1 | 4p + 3), line up with
// x[128 p, 128 p + 64) and x[128 p + 64, 128 p + 128). The block headers
// (scales, mins, d, dmin) are unpacked 4 blocks at a time.
template <int R>
void DotQ4KVnni(const uint8_t* row, int64_t nb, int64_t in, const int8_t* xq, const float* xd, const int16_t* bs,
                float* out) {
  // vpshufb indices into [sc0..7, m0..7] (every 128-bit lane) giving the
  // int16 scales of packs(t_lo(p), t_hi(p)): lanes 0, 1 hold sub-blocks 4p
  // and 4p + 1, lanes 2, 3 sub-blocks 4p + 2 and 4p + 3, four sums each.
#define LEDE_Q4(a) a, -1, a, -1, a, -1, a, -1
#define LEDE_LANE(a, b) LEDE_Q4(a), LEDE_Q4(b)
  alignas(64) static const int8_t kScalePick[2][64] = {
      {LEDE_LANE(0, 1), LEDE_LANE(0, 1), LEDE_LANE(2, 3), LEDE_LANE(2, 3)},
      {LEDE_LANE(4, 5), LEDE_LANE(4, 5), LEDE_LANE(6, 7), LEDE_LANE(6, 7)}};
#undef LEDE_LANE
#undef LEDE_Q4
  // vpermd indices: 128-bit lane i of a group's scale bytes into every lane;
  // the group's [d, -dmin] pair i as [d, d, -dmin, -dmin] x 2 (K45Scales).
  alignas(64) static const int32_t kLane[4][16] = {{0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3},
                                                   {4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7},
                                                   {8, 9, 10, 11, 8, 9, 10, 11, 8, 9, 10, 11, 8, 9, 10, 11},
                                                   {12, 13, 14, 15, 12, 13, 14, 15, 12, 13, 14, 15, 12, 13, 14, 15}};
  alignas(32) static const int32_t kPair[4][8] = {{0, 0, 1, 1, 0, 0, 1, 1},
                                                  {2, 2, 3, 3, 2, 2, 3, 3},
                                                  {4, 4, 5, 5, 4, 4, 5, 5},
                                                  {6, 6, 7, 7, 6, 6, 7, 7}};
  const __m256 kNegMin = _mm256_castsi256_ps(_mm256_set1_epi64x(static_cast<int64_t>(0x8000000000000000ull)));
  const __m512i kDm = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i m4 = _mm512_set1_epi8(15), zero = _mm512_setzero_si512();
  const __m512i pick0 = _mm512_load_si512(kScalePick[0]), pick1 = _mm512_load_si512(kScalePick[1]);
  __m256 acc[R];
  #pragma GCC unroll 4
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b0 = 0; b0 < nb; b0 += 4) {
    const int g = static_cast<int>(std::min<int64_t>(4, nb - b0));
    const uint8_t* grp = row + static_cast<size_t>(b0) * 144;
    auto header = [grp](int i) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(grp + 144 * i)); };
    __m512i hdr = _mm512_zextsi128_si512(header(0));
    if (g > 1) hdr = _mm512_inserti32x4(hdr, header(1), 1);
    if (g > 2) hdr = _mm512_inserti32x4(hdr, header(2), 2);
    if (g > 3) hdr = _mm512_inserti32x4(hdr, header(3), 3);
    const __m512i sm4 = ScaleMinBytes4(hdr);
    // [d0, dmin0, .., d3, dmin3] as float32, each dmin negated.
    const __m256 dm4 = _mm256_xor_ps(_mm256_cvtph_ps(_mm512_castsi512_si128(_mm512_permutexvar_epi32(kDm, hdr))),
                                     kNegMin);
    for (int i = 0; i < g; ++i) {
      const int64_t b = b0 + i;
      const uint8_t* blk = grp + 144 * i;
      const __m512i sm = _mm512_permutexvar_epi32(_mm512_load_si512(kLane[i]), sm4);
      const __m512i s01 = _mm512_shuffle_epi8(sm, pick0), s23 = _mm512_shuffle_epi8(sm, pick1);
      const K45BlockScales k = {
          K45Mins(_mm512_castsi512_si256(sm)),
          _mm256_permutevar8x32_ps(dm4, _mm256_load_si256(reinterpret_cast<const __m256i*>(kPair[i])))};
      __m512i lo[2], hi[2];
      #pragma GCC unroll 2
      for (int p = 0; p < 2; ++p) {
        const __m512i v = _mm512_loadu_si512(blk + 16 + 64 * p);
        lo[p] = _mm512_and_si512(v, m4);
        hi[p] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
      }
      #pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const int8_t* x = xq + r * in + b * kQK;
        const __m512i t0 = _mm512_dpbusd_epi32(zero, lo[0], _mm512_loadu_si512(x));
        const __m512i t1 = _mm512_dpbusd_epi32(zero, hi[0], _mm512_loadu_si512(x + 64));
        const __m512i t2 = _mm512_dpbusd_epi32(zero, lo[1], _mm512_loadu_si512(x + 128));
        const __m512i t3 = _mm512_dpbusd_epi32(zero, hi[1], _mm512_loadu_si512(x + 192));
        const __m512i ia = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(zero, _mm512_packs_epi32(t0, t1), s01),
                                               _mm512_packs_epi32(t2, t3), s23);
        acc[r] = K45Accumulate(Fold(ia), bs + r * (in / 16) + 16 * b, k, xd + r * nb + b, acc[r]);
      }
    }
  }
  #pragma GCC unroll 4
  for (int r = 0; r < R; ++r) out[r] = Hsum(acc[r]);
}

// Q6_K: value = d sc (q - 32) per sub-block of 16; the -32 leaves through
// the activation sums (32 sum sc bsum), as DotQ6KDirect. Half h of a block
// is qa = [q0 | q1] (x[128 h, 128 h + 64)) and qb = [q2 | q3] (the next
// 64), each 128-bit lane one sub-block.
template <int R>
void DotQ6KVnni(const uint8_t* row, int64_t nb, int64_t in, const int8_t* xq, const float* xd, const int16_t* bs,
                float* out) {
  // vpermw indices into the 16 int16 scales giving the scales of
  // packs(ta, tb) of half h: lane L holds sub-blocks 8h + L and 8h + 4 + L.
#define LEDE_W4(a) a, a, a, a
  alignas(64) static const int16_t kScalePick[2][32] = {
      {LEDE_W4(0), LEDE_W4(4), LEDE_W4(1), LEDE_W4(5), LEDE_W4(2), LEDE_W4(6), LEDE_W4(3), LEDE_W4(7)},
      {LEDE_W4(8), LEDE_W4(12), LEDE_W4(9), LEDE_W4(13), LEDE_W4(10), LEDE_W4(14), LEDE_W4(11), LEDE_W4(15)}};
#undef LEDE_W4
  const __m512i m4 = _mm512_set1_epi8(15), zero = _mm512_setzero_si512();
  // The 2 high bits of q0 | q1 (bits 0-1 | 2-3 of qh, to bits 4-5) and of
  // q2 | q3 (bits 4-5 | 6-7), per 256-bit half of [qh | qh].
  const __m512i mask_a = _mm512_inserti64x4(_mm512_set1_epi8(3), _mm256_set1_epi8(12), 1);
  const __m512i mask_b = _mm512_inserti64x4(_mm512_set1_epi8(48), _mm256_set1_epi8(static_cast<char>(192)), 1);
  const __m512i shift_a = _mm512_set_epi64(2, 2, 2, 2, 4, 4, 4, 4), shift_b = _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0);
  const __m512i pick0 = _mm512_load_si512(kScalePick[0]), pick1 = _mm512_load_si512(kScalePick[1]);
  __m256 acc[R];
  #pragma GCC unroll 4
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = row + static_cast<size_t>(b) * 210;
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192)));
    const __m512i s[2] = {_mm512_permutexvar_epi16(pick0, _mm512_castsi256_si512(sc16)),
                          _mm512_permutexvar_epi16(pick1, _mm512_castsi256_si512(sc16))};
    __m512i qa[2], qb[2];
    #pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m512i l = _mm512_loadu_si512(blk + 64 * h);
      const __m512i hv = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h)));
      qa[h] = _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_sllv_epi64(_mm512_and_si512(hv, mask_a), shift_a));
      qb[h] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                              _mm512_srlv_epi64(_mm512_and_si512(hv, mask_b), shift_b));
    }
    const float d = Half(blk + 208);
    #pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const int8_t* x = xq + r * in + b * kQK;
      __m512i ia = zero;
      #pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m512i ta = _mm512_dpbusd_epi32(zero, qa[h], _mm512_loadu_si512(x + 128 * h));
        const __m512i tb = _mm512_dpbusd_epi32(zero, qb[h], _mm512_loadu_si512(x + 128 * h + 64));
        ia = _mm512_dpwssd_epi32(ia, _mm512_packs_epi32(ta, tb), s[h]);
      }
      const __m256i off =
          _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bs + r * (in / 16) + 16 * b)), sc16);
      const __m256i t = _mm256_sub_epi32(Fold(ia), _mm256_slli_epi32(off, 5));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_set1_ps(d * xd[r * nb + b]), acc[r]);
    }
  }
  #pragma GCC unroll 4
  for (int r = 0; r < R; ++r) out[r] = Hsum(acc[r]);
}

// Q4_0: value = d (q - 8) per block of 32, q = the low nibble of byte j
// for x[j] and the high nibble for x[j + 16]; the -8 leaves through the
// activation sums (c: 8 x sum q x dx per block, as DotQ4_0Direct). Four
// blocks go through one 512-bit vector, block k in 128-bit lane k: X
// arrives in Q4_0's nibble order (cpu_ggml_kernels.cc Q40NibbleOrder: per
// 4 blocks the 4 first halves, then the 4 second halves), so the 4 blocks'
// low nibbles line up with 64 contiguous bytes of X and their high nibbles
// with the next 64. Two vpdpbusd give each block's integer sum in its lane,
// and one FMA by [d dx] per lane scales all four: per 128 weights and row of
// X, 2 integer and 5 float instructions (the scales, the -8 term), where the
// AVX2 kernel spends about 11 per 64. A last group of 1-3 blocks reads X
// with a mask.
template <int R>
void DotQ40Vnni(const uint8_t* row, int64_t nb, int64_t in, const int8_t* xq, const float* xd, const float* c,
                float* out) {
  alignas(64) static const int32_t kQuad[16] = {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3};
  const __m512i m4 = _mm512_set1_epi8(15), zero = _mm512_setzero_si512();
  const __m512i quad = _mm512_load_si512(kQuad);
  __m512 acc[R];
  __m128 corr[R];
  #pragma GCC unroll 4
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps(), corr[r] = _mm_setzero_ps();
  for (int64_t b0 = 0; b0 < nb; b0 += 4) {
    const int g = static_cast<int>(std::min<int64_t>(4, nb - b0));
    const uint8_t* grp = row + static_cast<size_t>(b0) * 18;
    auto quants = [grp](int k) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(grp + 18 * k + 2)); };
    uint64_t halves = 0;  // the blocks' d (float16), block k in bits [16 k, 16 k + 16)
    for (int k = 0; k < g; ++k) {
      uint16_t h;
      std::memcpy(&h, grp + 18 * k, 2);
      halves |= static_cast<uint64_t>(h) << (16 * k);
    }
    __m512i v = _mm512_zextsi128_si512(quants(0));  // lanes past the group's last block stay zero
    if (g > 1) v = _mm512_inserti32x4(v, quants(1), 1);
    if (g > 2) v = _mm512_inserti32x4(v, quants(2), 2);
    if (g > 3) v = _mm512_inserti32x4(v, quants(3), 3);
    const __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    const __m128 d = _mm_cvtph_ps(_mm_cvtsi64_si128(static_cast<int64_t>(halves)));
    const __mmask8 in_group = static_cast<__mmask8>((1u << g) - 1);
    const __mmask64 x_mask = (1ull << (16 * g)) - 1;  // a last group of g < 4 blocks
    #pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const int8_t* x = xq + r * in + 32 * b0;
      const __m512i xl = g == 4 ? _mm512_loadu_si512(x) : _mm512_maskz_loadu_epi8(x_mask, x);
      const __m512i xh = g == 4 ? _mm512_loadu_si512(x + 64) : _mm512_maskz_loadu_epi8(x_mask, x + 16 * g);
      const __m512i ia = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, lo, xl), hi, xh);
      const __m128 s = _mm_mul_ps(d, _mm_maskz_loadu_ps(in_group, xd + r * nb + b0));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia), _mm512_permutexvar_ps(quad, _mm512_castps128_ps512(s)), acc[r]);
      corr[r] = _mm_fmadd_ps(d, _mm_maskz_loadu_ps(in_group, c + r * nb + b0), corr[r]);
    }
  }
  #pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    const __m128 h = _mm_add_ps(corr[r], _mm_movehl_ps(corr[r], corr[r]));
    out[r] = _mm512_reduce_add_ps(acc[r]) - _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
  }
}

// The kernel types for RowsDirect: the AVX2 kernel types of
// cpu_ggml_direct_kernels.h (the activation sums they read, and how many a
// row) with the VNNI Dot in place of theirs.
struct Q4KKernel : ::lede::model::cpu::K45Kernel<false> {
  template <int R>
  static void Dot(const uint8_t* row, int64_t nb, int64_t in, const int8_t* xq, const float* xd, const int16_t* bs,
                  float* out) {
    DotQ4KVnni<R>(row, nb, in, xq, xd, bs, out);
  }
};
struct Q6KKernel : ::lede::model::cpu::Q6KKernel {
  template <int R>
  static void Dot(const uint8_t* row, int64_t nb, int64_t in, const int8_t* xq, const float* xd, const int16_t* bs,
                  float* out) {
    DotQ6KVnni<R>(row, nb, in, xq, xd, bs, out);
  }
};
struct Q40Kernel : ::lede::model::cpu::Q40Kernel {
  template <int R>
  static void Dot(const uint8_t* row, int64_t nb, int64_t in, const int8_t* xq, const float* xd, const float* c,
                  float* out) {
    DotQ40Vnni<R>(row, nb, in, xq, xd, c, out);
  }
};
