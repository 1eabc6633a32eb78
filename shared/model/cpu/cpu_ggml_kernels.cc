#include "shared/model/cpu/cpu_ggml_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "shared/checkpoint/number_formats.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define LEDE_HAVE_X86_GGML_KERNELS 1
#else
#define LEDE_HAVE_X86_GGML_KERNELS 0
#endif

namespace lede::model::cpu {

using checkpoint::GgmlBlockBytes;
using checkpoint::GgmlBlockValues;
using checkpoint::GgmlType;

bool GgmlPackable(GgmlType type, int64_t in) {
  switch (type) {
    case GgmlType::kQ4_0: case GgmlType::kQ5_0: case GgmlType::kQ8_0:
    case GgmlType::kQ4_K: case GgmlType::kQ5_K: case GgmlType::kQ6_K:
      return in > 0 && in % GgmlBlockValues(type) == 0;
    default:
      return false;
  }
}

GgmlMatrix::Run* GgmlMatrix::Extend(GgmlType type, int64_t rows) {
  if (!GgmlPackable(type, in_) || rows < 0) return nullptr;
  const size_t row_bytes = static_cast<size_t>(in_ / GgmlBlockValues(type)) * GgmlBlockBytes(type);
  if (runs_.empty() || runs_.back().type != type) {
    Run run;
    run.row_begin = run.row_end = rows_;
    run.type = type;
    run.offset = bytes_.size();
    run.row_bytes = row_bytes;
    runs_.push_back(run);
  }
  bytes_.resize(bytes_.size() + static_cast<size_t>(rows) * row_bytes);
  runs_.back().row_end += rows;
  rows_ += rows;
  return &runs_.back();
}

bool GgmlMatrix::AppendBlocks(GgmlType type, const uint8_t* blocks, int64_t rows) {
  Run* run = Extend(type, rows);
  if (run == nullptr) return false;
  const size_t n = static_cast<size_t>(rows) * run->row_bytes;
  std::memcpy(bytes_.data() + bytes_.size() - n, blocks, n);
  return true;
}

bool GgmlMatrix::AppendQuantized(GgmlType type, const float* w, int64_t rows) {
  Run* run = Extend(type, rows);
  if (run == nullptr) return false;
  uint8_t* dst = bytes_.data() + bytes_.size() - static_cast<size_t>(rows) * run->row_bytes;
  for (int64_t r = 0; r < rows; ++r) checkpoint::QuantizeGgmlRow(type, w + r * in_, in_, dst + r * run->row_bytes);
  return true;
}

const uint8_t* GgmlMatrix::row(int64_t r) const {
  for (const Run& run : runs_) {
    if (r < run.row_end) return bytes_.data() + run.offset + static_cast<size_t>(r - run.row_begin) * run.row_bytes;
  }
  return nullptr;
}

GgmlType GgmlMatrix::type_of(int64_t r) const {
  for (const Run& run : runs_) {
    if (r < run.row_end) return run.type;
  }
  return GgmlType::kF32;
}

void UnpackRowsGgml(const GgmlMatrix& w, int64_t r0, int64_t r1, float* out) {
  for (int64_t r = r0; r < r1; ++r) {
    checkpoint::DequantizeGgmlRow(w.type_of(r), w.row(r), w.in(), out + (r - r0) * w.in());
  }
}

namespace {

constexpr int64_t kQK = 256;

float LoadHalf(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return checkpoint::HalfToFloat(h);
}

bool IsKType(GgmlType t) { return GgmlBlockValues(t) == kQK; }

// One decoded K block (Q4_K, Q5_K, Q6_K): value i = d * sc16[i / 16] * q[i]
// - dmin * mn[i / 16], q unsigned. sc[j] holds the int16 scales of the 32
// values of chunk j as vpmaddwd reads them (lanes 0-7: values 0-15, lanes
// 8-15: values 16-31).
struct KDecoded {
  alignas(32) uint8_t q[kQK];
  alignas(32) int16_t sc[8][16];
  alignas(32) int16_t mn[16];
  float d, dmin;
};

// One decoded 32-value block: value i = d * (q[i] - offset) (Q4_0: 8,
// Q5_0: 16), or d * int8(q[i]) for Q8_0.
struct Decoded32 {
  alignas(32) uint8_t q[32];
  float d;
};

void SetScales(KDecoded* k, const int* sc16, const int* mn16) {
  for (int j = 0; j < 8; ++j) {
    for (int l = 0; l < 16; ++l) k->sc[j][l] = static_cast<int16_t>(sc16[2 * j + l / 8]);
  }
  for (int s = 0; s < 16; ++s) k->mn[s] = static_cast<int16_t>(mn16[s]);
}

void DecodeK45Scales(const uint8_t* b, KDecoded* k) {
  k->d = LoadHalf(b);
  k->dmin = LoadHalf(b + 2);
  int sc16[16], mn16[16];
  for (int s = 0; s < 8; ++s) {
    uint8_t sc, m;
    checkpoint::KScaleMin(b + 4, s, &sc, &m);
    sc16[2 * s] = sc16[2 * s + 1] = sc;
    mn16[2 * s] = mn16[2 * s + 1] = m;
  }
  SetScales(k, sc16, mn16);
}

void DecodeQ6Scales(const uint8_t* b, KDecoded* k) {
  k->d = LoadHalf(b + 208);
  k->dmin = k->d;
  const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
  int sc16[16], mn16[16];
  for (int s = 0; s < 16; ++s) sc16[s] = sc[s], mn16[s] = 32 * sc[s];
  SetScales(k, sc16, mn16);
}

// ---- portable decoding and products ----

void DecodeKPortable(GgmlType type, const uint8_t* b, KDecoded* k) {
  if (type == GgmlType::kQ6_K) {
    DecodeQ6Scales(b, k);
    const uint8_t* ql = b;
    const uint8_t* qh = b + 128;
    for (int h = 0; h < 2; ++h) {
      for (int kk = 0; kk < 4; ++kk) {
        for (int l = 0; l < 32; ++l) {
          const uint8_t low = ql[64 * h + l + 32 * (kk & 1)];
          const int lo4 = kk < 2 ? (low & 15) : (low >> 4);
          const int hi2 = (qh[32 * h + l] >> (2 * kk)) & 3;
          k->q[128 * h + 32 * kk + l] = static_cast<uint8_t>(lo4 | (hi2 << 4));
        }
      }
    }
    return;
  }
  DecodeK45Scales(b, k);
  const bool five = type == GgmlType::kQ5_K;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = five ? b + 48 : b + 16;
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      int lo = qs[32 * c + l] & 15, hi = qs[32 * c + l] >> 4;
      if (five) {
        lo |= ((qh[l] >> (2 * c)) & 1) << 4;
        hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
      }
      k->q[64 * c + l] = static_cast<uint8_t>(lo);
      k->q[64 * c + 32 + l] = static_cast<uint8_t>(hi);
    }
  }
}

// The value offset of the unsigned 32-value types (0: Q8_0, signed).
int Offset32(GgmlType type) { return type == GgmlType::kQ4_0 ? 8 : type == GgmlType::kQ5_0 ? 16 : 0; }

void Decode32(GgmlType type, const uint8_t* b, Decoded32* o) {
  o->d = LoadHalf(b);
  if (type == GgmlType::kQ8_0) {
    std::memcpy(o->q, b + 2, 32);
    return;
  }
  uint32_t h = 0;
  const uint8_t* qs = b + 2;
  if (type == GgmlType::kQ5_0) std::memcpy(&h, b + 2, 4), qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    o->q[j] = static_cast<uint8_t>((qs[j] & 15) | (((h >> j) & 1) << 4));
    o->q[j + 16] = static_cast<uint8_t>((qs[j] >> 4) | (((h >> (j + 16)) & 1) << 4));
  }
}

// The quantized X rows of the calling thread: K form (blocks of 256: q,
// scale, sums of 16) and 32 form (q, scale, sum of 32).
struct XScratch {
  std::vector<int8_t> qk, q32;
  std::vector<int8_t> qk_nibbles;   // qk in the order of Q4_K's nibbles (Q4KNibbleOrder), for the VNNI Q4_K kernel
  std::vector<int8_t> q32_nibbles;  // q32 in the order of Q4_0's nibbles (Q40NibbleOrder), for the VNNI Q4_0 kernel
  std::vector<float> dk, d32;
  std::vector<int16_t> bsk;
  std::vector<int32_t> bs32;
  std::vector<KDecoded> kd;
  std::vector<Decoded32> d32w;
  std::vector<float> c32;  // Q4_0: 8 x sum of q x scale per block of 32 (the -8 offsets' share)
};

XScratch& Scratch() {
  thread_local XScratch s;
  return s;
}

template <typename T>
void Grow(std::vector<T>* v, int64_t n) {
  if (static_cast<int64_t>(v->size()) < n) v->resize(static_cast<size_t>(n));
}

// Block-wise int8 quantization of x [in]: q = round(x / d), d = amax / 127
// per `block` values, and the sums of q per `sum_block` values.
template <typename S>
void QuantizeX(const float* x, int64_t in, int64_t block, int64_t sum_block, int8_t* q, float* d, S* sums) {
  for (int64_t b = 0; b < in / block; ++b) {
    const float* xb = x + b * block;
    float amax = 0.0f;
    for (int64_t i = 0; i < block; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const float db = amax / 127.0f;
    const float id = db != 0.0f ? 1.0f / db : 0.0f;
    d[b] = db;
    constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds |v| < 2^22 to nearest even
    for (int64_t i = 0; i < block; ++i) {
      q[b * block + i] = static_cast<int8_t>(static_cast<int>((xb[i] * id + kRound) - kRound));
    }
  }
  for (int64_t s = 0; s < in / sum_block; ++s) {
    int32_t t = 0;
    for (int64_t i = 0; i < sum_block; ++i) t += q[s * sum_block + i];
    sums[s] = static_cast<S>(t);
  }
}

float DotKPortable(const KDecoded* kd, int64_t nb, const int8_t* xq, const float* xd, const int16_t* bs) {
  float acc = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const KDecoded& k = kd[b];
    const int8_t* x = xq + b * kQK;
    int32_t dot = 0, off = 0;
    for (int s = 0; s < 16; ++s) {
      int32_t part = 0;
      for (int i = 0; i < 16; ++i) part += int32_t{k.q[16 * s + i]} * x[16 * s + i];
      dot += part * k.sc[s / 2][(s % 2) * 8];
      off += int32_t{k.mn[s]} * bs[b * 16 + s];
    }
    acc += k.d * xd[b] * static_cast<float>(dot) - k.dmin * xd[b] * static_cast<float>(off);
  }
  return acc;
}

float Dot32Portable(const Decoded32* w, int64_t nb, int offset, bool is_signed, const int8_t* xq, const float* xd,
                    const int32_t* bs) {
  float acc = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const int8_t* x = xq + b * 32;
    int32_t dot = 0;
    for (int i = 0; i < 32; ++i) {
      const int32_t wi = is_signed ? int32_t{static_cast<int8_t>(w[b].q[i])} : int32_t{w[b].q[i]};
      dot += wi * x[i];
    }
    acc += w[b].d * xd[b] * static_cast<float>(dot - offset * bs[b]);
  }
  return acc;
}

#if LEDE_HAVE_X86_GGML_KERNELS
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

inline float Hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

void DecodeKAvx2(GgmlType type, const uint8_t* b, KDecoded* k) {
  const __m256i m4 = _mm256_set1_epi8(15);
  if (type == GgmlType::kQ6_K) {
    DecodeQ6Scales(b, k);
    const __m256i m2 = _mm256_set1_epi8(3), m2b = _mm256_set1_epi8(12), m2c = _mm256_set1_epi8(48),
                  m2d = _mm256_set1_epi8(static_cast<char>(192));
    for (int h = 0; h < 2; ++h) {
      const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h));
      const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32));
      const __m256i hv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
      const __m256i q0 = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(hv, m2), 4));
      const __m256i q1 = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_slli_epi16(_mm256_and_si256(hv, m2b), 2));
      const __m256i q2 =
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(hv, m2c));
      const __m256i q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                         _mm256_srli_epi16(_mm256_and_si256(hv, m2d), 2));
      uint8_t* dst = k->q + 128 * h;
      _mm256_store_si256(reinterpret_cast<__m256i*>(dst), q0);
      _mm256_store_si256(reinterpret_cast<__m256i*>(dst + 32), q1);
      _mm256_store_si256(reinterpret_cast<__m256i*>(dst + 64), q2);
      _mm256_store_si256(reinterpret_cast<__m256i*>(dst + 96), q3);
    }
    return;
  }
  DecodeK45Scales(b, k);
  const bool five = type == GgmlType::kQ5_K;
  const uint8_t* qs = five ? b + 48 : b + 16;
  const __m256i hv = five ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16)) : _mm256_setzero_si256();
  const __m256i sixteen = _mm256_set1_epi8(16);
  for (int c = 0; c < 4; ++c) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * c));
    __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    if (five) {
      const __m256i blo = _mm256_set1_epi8(static_cast<char>(1 << (2 * c)));
      const __m256i bhi = _mm256_set1_epi8(static_cast<char>(1 << (2 * c + 1)));
      lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hv, blo), blo), sixteen));
      hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hv, bhi), bhi), sixteen));
    }
    _mm256_store_si256(reinterpret_cast<__m256i*>(k->q + 64 * c), lo);
    _mm256_store_si256(reinterpret_cast<__m256i*>(k->q + 64 * c + 32), hi);
  }
}

float DotKAvx2(const KDecoded* kd, int64_t nb, const int8_t* xq, const float* xd, const int16_t* bs) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const KDecoded& k = kd[b];
    const int8_t* x = xq + b * kQK;
    __m256i ia = _mm256_setzero_si256();
    #pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(k.q + 32 * j));
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 32 * j));
      const __m256i p = _mm256_maddubs_epi16(w, xv);
      ia = _mm256_add_epi32(ia, _mm256_madd_epi16(p, _mm256_load_si256(reinterpret_cast<const __m256i*>(k.sc[j]))));
    }
    const __m256i off = _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bs + 16 * b)),
                                          _mm256_load_si256(reinterpret_cast<const __m256i*>(k.mn)));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia), _mm256_set1_ps(k.d * xd[b]), acc);
    acc = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(off), _mm256_set1_ps(k.dmin * xd[b]), acc);
  }
  return Hsum(acc);
}

float Dot32Avx2(const Decoded32* w, int64_t nb, int offset, bool is_signed, const int8_t* xq, const float* xd,
                const int32_t* bs) {
  __m256 acc = _mm256_setzero_ps();
  float corr = 0.0f;
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < nb; ++b) {
    const __m256i wv = _mm256_load_si256(reinterpret_cast<const __m256i*>(w[b].q));
    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32 * b));
    const __m256i p = is_signed ? _mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(xv, wv))
                                : _mm256_maddubs_epi16(wv, xv);
    const float s = w[b].d * xd[b];
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)), _mm256_set1_ps(s), acc);
    corr += s * static_cast<float>(offset * bs[b]);
  }
  return Hsum(acc) - corr;
}

#include "shared/model/cpu/internal/cpu_ggml_direct_kernels.h"
namespace avx2 {
#include "shared/model/cpu/internal/cpu_ggml_rows_direct.h"
}  // namespace avx2

#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
// GCC 12's AVX-512 intrinsics that take _mm512_undefined_*() as their
// masked source (inserti64x4, broadcast_i64x4, sllv / srlv, extracti64x4)
// warn that it is uninitialized (GCC bug 105593, fixed in GCC 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
namespace avx512 {
#include "shared/model/cpu/internal/cpu_ggml_vnni_kernels.h"
#include "shared/model/cpu/internal/cpu_ggml_rows_direct.h"
}  // namespace avx512
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif

// q (n x in int8, in a multiple of 256) in the order Q4_K stores its
// nibbles, into out: each 128 values [0, 32) [64, 96) [32, 64) [96, 128).
// Two 32-byte chunks of Q4_K quants hold sub-blocks 4p and 4p + 2 in their
// low nibbles and 4p + 1 and 4p + 3 in their high ones, so with X in this
// order one 64-byte load of quants, masked, lines up with 64 contiguous
// bytes of X without shuffling the weights (done once per X row, not once
// per weight block).
void Q4KNibbleOrder(const int8_t* q, int64_t n, int64_t in, int8_t* out) {
  for (int64_t h = 0; h < n * in; h += 128) {
    std::memcpy(out + h, q + h, 32);
    std::memcpy(out + h + 32, q + h + 64, 32);
    std::memcpy(out + h + 64, q + h + 32, 32);
    std::memcpy(out + h + 96, q + h + 96, 32);
  }
}

// q (n x in int8, in a multiple of 32) in the order Q4_0 stores its
// nibbles, into out: per group of 4 blocks of 32 (fewer at a row's end),
// the first 16 values of each block, then the last 16 of each. A Q4_0
// byte holds x[j] in its low nibble and x[j + 16] in its high one, so the
// low nibbles of 4 blocks line up with the group's first 64 bytes.
void Q40NibbleOrder(const int8_t* q, int64_t n, int64_t in, int8_t* out) {
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t g0 = 0; g0 < in; g0 += 128) {
      const int64_t g = std::min<int64_t>(4, (in - g0) / 32);
      const int8_t* src = q + r * in + g0;
      int8_t* dst = out + r * in + g0;
      for (int64_t k = 0; k < g; ++k) {
        std::memcpy(dst + 16 * k, src + 32 * k, 16);
        std::memcpy(dst + 16 * (g + k), src + 32 * k + 16, 16);
      }
    }
  }
}

// The activation forms the rows [o0, o1) of w need, into s: X quantized per
// row in 256-value super-blocks (K types) and / or in 32-value blocks with
// their sums (c32: the Q4_0 offset term); each also in the nibble order of
// Q4_K or Q4_0 where the AVX-512 VNNI kernel will read rows of that type.
void QuantizeActivations(const float* x, int64_t n, int64_t in, const GgmlMatrix& w, int64_t o0, int64_t o1,
                         QuantIsa isa, XScratch& s) {
  bool need_k = false, need_32 = false, need_k_nibbles = false, need_32_nibbles = false;
  for (const GgmlMatrix::Run& run : w.runs()) {
    if (run.row_end <= o0 || run.row_begin >= o1) continue;
    (IsKType(run.type) ? need_k : need_32) = true;
    need_k_nibbles = need_k_nibbles || (run.type == GgmlType::kQ4_K && isa == QuantIsa::kAvx512);
    need_32_nibbles = need_32_nibbles || (run.type == GgmlType::kQ4_0 && isa == QuantIsa::kAvx512);
  }
  if (need_k) {
    Grow(&s.qk, n * in), Grow(&s.dk, n * in / kQK), Grow(&s.bsk, n * in / 16), Grow(&s.kd, in / kQK);
    for (int64_t r = 0; r < n; ++r) {
      QuantizeX<int16_t>(x + r * in, in, kQK, 16, s.qk.data() + r * in, s.dk.data() + r * (in / kQK),
                         s.bsk.data() + r * (in / 16));
    }
  }
  if (need_k_nibbles) {
    Grow(&s.qk_nibbles, n * in);
    Q4KNibbleOrder(s.qk.data(), n, in, s.qk_nibbles.data());
  }
  if (need_32) {
    Grow(&s.q32, n * in), Grow(&s.d32, n * in / 32), Grow(&s.bs32, n * in / 32), Grow(&s.d32w, in / 32);
    Grow(&s.c32, n * in / 32);
    for (int64_t r = 0; r < n; ++r) {
      QuantizeX<int32_t>(x + r * in, in, 32, 32, s.q32.data() + r * in, s.d32.data() + r * (in / 32),
                         s.bs32.data() + r * (in / 32));
    }
    for (int64_t i = 0; i < n * in / 32; ++i) s.c32[i] = 8.0f * static_cast<float>(s.bs32[i]) * s.d32[i];
  }
  if (need_32_nibbles) {
    Grow(&s.q32_nibbles, n * in);
    Q40NibbleOrder(s.q32.data(), n, in, s.q32_nibbles.data());
  }
}

#if LEDE_HAVE_X86_GGML_KERNELS
// Rows [a, e) of run (Q4_K, Q5_K, Q6_K or Q4_0) straight from their blocks
// (no decoded copy): each weight row against up to 4 rows of X at a time;
// Q4_K, Q6_K and Q4_0 with AVX-512 VNNI where `isa` allows it.
void DirectRunRows(const GgmlMatrix& w, const GgmlMatrix::Run& run, int64_t a, int64_t e, int64_t nb, int64_t in,
                   QuantIsa isa, const XScratch& s, int64_t n, float* ya, int64_t ldy, bool accumulate) {
  const uint8_t* blocks = w.data() + run.offset + static_cast<size_t>(a - run.row_begin) * run.row_bytes;
  auto rows = [&](auto rows_direct, const int8_t* xq) {
    rows_direct(blocks, run.row_bytes, e - a, nb, in, xq, s.dk.data(), s.bsk.data(), n, ya, ldy, accumulate);
  };
  const bool vnni = isa == QuantIsa::kAvx512;
  switch (run.type) {
    case GgmlType::kQ4_0:  // the VNNI kernel reads X in Q4_0's nibble order (Q40NibbleOrder)
      if (vnni) {
        avx512::RowsDirect<avx512::Q40Kernel>(blocks, run.row_bytes, e - a, nb, in, s.q32_nibbles.data(),
                                              s.d32.data(), s.c32.data(), n, ya, ldy, accumulate);
      } else {
        avx2::RowsDirect<Q40Kernel>(blocks, run.row_bytes, e - a, nb, in, s.q32.data(), s.d32.data(), s.c32.data(),
                                    n, ya, ldy, accumulate);
      }
      return;
    case GgmlType::kQ4_K:  // the VNNI kernel reads X in Q4_K's nibble order (Q4KNibbleOrder)
      return vnni ? rows(avx512::RowsDirect<avx512::Q4KKernel>, s.qk_nibbles.data())
                  : rows(avx2::RowsDirect<K45Kernel<false>>, s.qk.data());
    case GgmlType::kQ5_K:
      return rows(avx2::RowsDirect<K45Kernel<true>>, s.qk.data());
    default:  // kQ6_K: the caller passes only these four types
      return vnni ? rows(avx512::RowsDirect<avx512::Q6KKernel>, s.qk.data())
                  : rows(avx2::RowsDirect<Q6KKernel>, s.qk.data());
  }
}
#endif

// Rows [a, e) of run, each decoded once into s (kd or d32w), then every X
// row against it; y holds the columns [o0, ...).
void DecodedRunRows(const GgmlMatrix& w, const GgmlMatrix::Run& run, int64_t a, int64_t e, int64_t in, bool avx2,
                    XScratch& s, int64_t n, int64_t o0, float* y, int64_t ldy, bool accumulate) {
  const int64_t bv = GgmlBlockValues(run.type), nb = in / bv;
  const size_t bb = GgmlBlockBytes(run.type);
  const bool k_type = bv == kQK;
  const int offset = Offset32(run.type);
  const bool is_signed = run.type == GgmlType::kQ8_0;
  (void)avx2;  // read only where the x86 kernels are built
  for (int64_t o = a; o < e; ++o) {
    const uint8_t* blocks = w.data() + run.offset + static_cast<size_t>(o - run.row_begin) * run.row_bytes;
    // Decode the row once, then every X row against it.
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = blocks + static_cast<size_t>(b) * bb;
      if (k_type) {
#if LEDE_HAVE_X86_GGML_KERNELS
        if (avx2) {
          DecodeKAvx2(run.type, blk, &s.kd[b]);
          continue;
        }
#endif
        DecodeKPortable(run.type, blk, &s.kd[b]);
      } else {
        Decode32(run.type, blk, &s.d32w[b]);
      }
    }
    for (int64_t r = 0; r < n; ++r) {
      float v;
      if (k_type) {
        const int8_t* xq = s.qk.data() + r * in;
        const float* xd = s.dk.data() + r * nb;
        const int16_t* bs = s.bsk.data() + r * (in / 16);
#if LEDE_HAVE_X86_GGML_KERNELS
        v = avx2 ? DotKAvx2(s.kd.data(), nb, xq, xd, bs) : DotKPortable(s.kd.data(), nb, xq, xd, bs);
#else
        v = DotKPortable(s.kd.data(), nb, xq, xd, bs);
#endif
      } else {
        const int8_t* xq = s.q32.data() + r * in;
        const float* xd = s.d32.data() + r * nb;
        const int32_t* bs = s.bs32.data() + r * nb;
#if LEDE_HAVE_X86_GGML_KERNELS
        v = avx2 ? Dot32Avx2(s.d32w.data(), nb, offset, is_signed, xq, xd, bs)
                 : Dot32Portable(s.d32w.data(), nb, offset, is_signed, xq, xd, bs);
#else
        v = Dot32Portable(s.d32w.data(), nb, offset, is_signed, xq, xd, bs);
#endif
      }
      float& out = y[r * ldy + (o - o0)];
      out = accumulate ? out + v : v;
    }
  }
}

}  // namespace

void MatMulRowsGgml(const float* x, int64_t n, int64_t in, const GgmlMatrix& w, int64_t o0, int64_t o1, float* y,
                    int64_t ldy, bool accumulate, QuantIsa isa) {
  isa = std::min(isa, BestQuantIsa());
  const bool avx2 = LEDE_HAVE_X86_GGML_KERNELS && isa != QuantIsa::kPortable;
  XScratch& s = Scratch();
  QuantizeActivations(x, n, in, w, o0, o1, isa, s);
  for (const GgmlMatrix::Run& run : w.runs()) {
    const int64_t a = std::max(o0, run.row_begin), e = std::min(o1, run.row_end);
    if (a >= e) continue;
#if LEDE_HAVE_X86_GGML_KERNELS
    if (avx2 && (run.type == GgmlType::kQ4_K || run.type == GgmlType::kQ5_K || run.type == GgmlType::kQ6_K ||
                 run.type == GgmlType::kQ4_0)) {
      DirectRunRows(w, run, a, e, in / GgmlBlockValues(run.type), in, isa, s, n, y + (a - o0), ldy, accumulate);
      continue;
    }
#endif
    DecodedRunRows(w, run, a, e, in, avx2, s, n, o0, y, ldy, accumulate);
  }
}

}  // namespace lede::model::cpu
