#include "shared/checkpoint/ggml_quants.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "shared/checkpoint/number_formats.h"

namespace lede::checkpoint {
namespace {

constexpr int64_t kQK = 256;  // values per K block

float LoadHalf(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return HalfToFloat(h);
}
void StoreHalf(uint8_t* p, float f) {
  const uint16_t h = FloatToHalf(f);
  std::memcpy(p, &h, 2);
}
// A float rounded to the float16 the block will store (so the quantizer
// rounds q against the scale a reader sees).
float FloatToHalfRounded(float f) { return HalfToFloat(FloatToHalf(f)); }
int Nearest(float v) { return static_cast<int>(std::lround(v)); }

// The value of largest magnitude, with its sign.
float SignedMax(const float* x, int64_t n) {
  float v = 0.0f, amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), v = x[i];
  }
  return v;
}

// ---- dequantization (one block) ----

void DequantQ4_0(const uint8_t* b, float* y) {
  const float d = LoadHalf(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>((qs[j] & 15) - 8);
    y[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
  }
}

void DequantQ5_0(const uint8_t* b, float* y) {
  const float d = LoadHalf(b);
  uint32_t h;
  std::memcpy(&h, b + 2, 4);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 15) | static_cast<int>(((h >> j) & 1) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((h >> (j + 16)) & 1) << 4);
    y[j] = d * static_cast<float>(lo - 16);
    y[j + 16] = d * static_cast<float>(hi - 16);
  }
}

void DequantQ8_0(const uint8_t* b, float* y) {
  const float d = LoadHalf(b);
  const auto* q = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(q[j]);
}

// Q4_K (high == nullptr) and Q5_K.
void DequantK45(const uint8_t* b, bool five, float* y) {
  const float d = LoadHalf(b), dmin = LoadHalf(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = five ? b + 16 : nullptr;
  const uint8_t* qs = five ? b + 48 : b + 16;
  for (int c = 0; c < 4; ++c) {
    for (int half = 0; half < 2; ++half) {
      const int s = 2 * c + half;
      uint8_t sc, m;
      KScaleMin(scales, s, &sc, &m);
      const float scale = d * sc, offset = dmin * m;
      for (int l = 0; l < 32; ++l) {
        int q = half == 0 ? (qs[32 * c + l] & 15) : (qs[32 * c + l] >> 4);
        if (five && ((qh[l] >> s) & 1)) q += 16;
        y[64 * c + 32 * half + l] = scale * static_cast<float>(q) - offset;
      }
    }
  }
}

void DequantQ6_K(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = LoadHalf(b + 208);
  for (int h = 0; h < 2; ++h) {
    for (int k = 0; k < 4; ++k) {
      for (int l = 0; l < 32; ++l) {
        const uint8_t low = ql[64 * h + l + 32 * (k & 1)];
        const int lo4 = k < 2 ? (low & 15) : (low >> 4);
        const int hi2 = (qh[32 * h + l] >> (2 * k)) & 3;
        const int idx = 128 * h + 32 * k + l;
        y[idx] = d * static_cast<float>(sc[idx / 16]) * static_cast<float>((lo4 | (hi2 << 4)) - 32);
      }
    }
  }
}

// ---- quantization (one block) ----

void QuantQ8_0(const float* x, uint8_t* b) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  StoreHalf(b, d);
  for (int j = 0; j < 32; ++j) {
    b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::clamp(Nearest(x[j] * id), -127, 127)));
  }
}

// Q4_0 (levels 16) and Q5_0 (levels 32): d = -v / (levels / 2).
void QuantQx_0(const float* x, int levels, uint8_t* b) {
  const float v = SignedMax(x, 32);
  const float d = -v / static_cast<float>(levels / 2);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  StoreHalf(b, d);
  int q[32];
  for (int j = 0; j < 32; ++j) q[j] = std::clamp(Nearest(x[j] * id) + levels / 2, 0, levels - 1);
  uint8_t* qs = levels == 16 ? b + 2 : b + 6;
  uint32_t h = 0;
  for (int j = 0; j < 16; ++j) {
    qs[j] = static_cast<uint8_t>((q[j] & 15) | ((q[j + 16] & 15) << 4));
    h |= static_cast<uint32_t>((q[j] >> 4) & 1) << j;
    h |= static_cast<uint32_t>((q[j + 16] >> 4) & 1) << (j + 16);
  }
  if (levels == 32) std::memcpy(b + 2, &h, 4);
}

// One sub-block of 32 as scale * q + offset (q in [0, qmax], offset <= 0):
// min/max start, then least-squares refits of (scale, offset) to the
// rounded q.
void FitAffine(const float* x, int qmax, float* scale, float* offset) {
  float lo = 0.0f, hi = x[0];
  for (int i = 0; i < 32; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
  float a = (hi - lo) / static_cast<float>(qmax), b = lo;
  if (a <= 0.0f) {
    *scale = 0.0f, *offset = b;
    return;
  }
  for (int pass = 0; pass < 3; ++pass) {
    double sq = 0, sqq = 0, sx = 0, sqx = 0;
    for (int i = 0; i < 32; ++i) {
      const int q = std::clamp(Nearest((x[i] - b) / a), 0, qmax);
      sq += q, sqq += static_cast<double>(q) * q, sx += x[i], sqx += static_cast<double>(q) * x[i];
    }
    const double det = 32 * sqq - sq * sq;
    if (det <= 0) break;
    double na = (32 * sqx - sq * sx) / det, nb = (sx - na * sq) / 32;
    if (nb > 0) nb = 0, na = sqq > 0 ? sqx / sqq : 0;
    if (na <= 0) break;
    a = static_cast<float>(na), b = static_cast<float>(nb);
  }
  *scale = a, *offset = b;
}

void QuantK45(const float* x, bool five, uint8_t* b) {
  const int qmax = five ? 31 : 15;
  float scale[8], offset[8];
  for (int s = 0; s < 8; ++s) FitAffine(x + 32 * s, qmax, &scale[s], &offset[s]);
  float max_scale = 0.0f, max_min = 0.0f;
  for (int s = 0; s < 8; ++s) max_scale = std::max(max_scale, scale[s]), max_min = std::max(max_min, -offset[s]);
  const float d = FloatToHalfRounded(max_scale / 63.0f), dmin = FloatToHalfRounded(max_min / 63.0f);
  uint8_t sc[8], m[8];
  for (int s = 0; s < 8; ++s) {
    sc[s] = static_cast<uint8_t>(d > 0.0f ? std::clamp(Nearest(scale[s] / d), 0, 63) : 0);
    m[s] = static_cast<uint8_t>(dmin > 0.0f ? std::clamp(Nearest(-offset[s] / dmin), 0, 63) : 0);
  }
  StoreHalf(b, d);
  StoreHalf(b + 2, dmin);
  PackKScaleMin(sc, m, b + 4);
  uint8_t* qh = five ? b + 16 : nullptr;
  uint8_t* qs = five ? b + 48 : b + 16;
  if (five) std::memset(qh, 0, 32);
  std::memset(qs, 0, 128);
  for (int s = 0; s < 8; ++s) {
    const float step = d * sc[s], off = dmin * m[s];
    for (int l = 0; l < 32; ++l) {
      const int q = step > 0.0f ? std::clamp(Nearest((x[32 * s + l] + off) / step), 0, qmax) : 0;
      const int c = s / 2;
      qs[32 * c + l] |= static_cast<uint8_t>((q & 15) << (4 * (s & 1)));
      if (five && q > 15) qh[l] |= static_cast<uint8_t>(1u << s);
    }
  }
}

void QuantQ6_K(const float* x, uint8_t* b) {
  float step[16];
  float max_step = 0.0f;
  for (int s = 0; s < 16; ++s) {
    step[s] = -SignedMax(x + 16 * s, 16) / 32.0f;
    max_step = std::max(max_step, std::fabs(step[s]));
  }
  const float d = FloatToHalfRounded(max_step / 127.0f);
  auto* sc = reinterpret_cast<int8_t*>(b + 192);
  for (int s = 0; s < 16; ++s) {
    sc[s] = static_cast<int8_t>(d > 0.0f ? std::clamp(Nearest(step[s] / d), -127, 127) : 0);
  }
  StoreHalf(b + 208, d);
  uint8_t* ql = b;
  uint8_t* qh = b + 128;
  std::memset(ql, 0, 192);
  for (int i = 0; i < kQK; ++i) {
    const float st = d * sc[i / 16];
    const int q = (st != 0.0f ? std::clamp(Nearest(x[i] / st), -32, 31) : 0) + 32;
    const int h = i / 128, k = (i % 128) / 32, l = i % 32;
    ql[64 * h + l + 32 * (k & 1)] |= static_cast<uint8_t>((q & 15) << (k < 2 ? 0 : 4));
    qh[32 * h + l] |= static_cast<uint8_t>((q >> 4) << (2 * k));
  }
}

}  // namespace

bool IsKnownGgmlType(uint32_t raw) {
  switch (raw) {
    case 0: case 1: case 2: case 6: case 8: case 12: case 13: case 14: case 30: return true;
    default: return false;
  }
}

bool IsQuantizedGgmlType(GgmlType type) { return GgmlBlockValues(type) > 1; }

int64_t GgmlBlockValues(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0: case GgmlType::kQ5_0: case GgmlType::kQ8_0: return 32;
    case GgmlType::kQ4_K: case GgmlType::kQ5_K: case GgmlType::kQ6_K: return kQK;
    default: return 1;
  }
}

size_t GgmlBlockBytes(GgmlType type) {
  switch (type) {
    case GgmlType::kF32: return 4;
    case GgmlType::kF16: case GgmlType::kBF16: return 2;
    case GgmlType::kQ4_0: return 18;
    case GgmlType::kQ5_0: return 22;
    case GgmlType::kQ8_0: return 34;
    case GgmlType::kQ4_K: return 144;
    case GgmlType::kQ5_K: return 176;
    case GgmlType::kQ6_K: return 210;
  }
  return 0;
}

void KScaleMin(const uint8_t* s, int j, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

void PackKScaleMin(const uint8_t* sc, const uint8_t* m, uint8_t* s) {
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    s[j + 4] = static_cast<uint8_t>((m[j] & 63) | ((m[j + 4] >> 4) << 6));
    s[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
  }
}

bool DequantizeGgmlRow(GgmlType type, const uint8_t* blocks, int64_t n, float* out) {
  const int64_t bv = GgmlBlockValues(type);
  if (bv <= 1 || n < 0 || n % bv != 0) return false;
  const size_t bb = GgmlBlockBytes(type);
  for (int64_t i = 0; i < n / bv; ++i) {
    const uint8_t* b = blocks + static_cast<size_t>(i) * bb;
    float* y = out + i * bv;
    switch (type) {
      case GgmlType::kQ4_0: DequantQ4_0(b, y); break;
      case GgmlType::kQ5_0: DequantQ5_0(b, y); break;
      case GgmlType::kQ8_0: DequantQ8_0(b, y); break;
      case GgmlType::kQ4_K: DequantK45(b, false, y); break;
      case GgmlType::kQ5_K: DequantK45(b, true, y); break;
      case GgmlType::kQ6_K: DequantQ6_K(b, y); break;
      default: return false;
    }
  }
  return true;
}

bool QuantizeGgmlRow(GgmlType type, const float* x, int64_t n, uint8_t* blocks) {
  const int64_t bv = GgmlBlockValues(type);
  if (bv <= 1 || n < 0 || n % bv != 0) return false;
  const size_t bb = GgmlBlockBytes(type);
  for (int64_t i = 0; i < n / bv; ++i) {
    uint8_t* b = blocks + static_cast<size_t>(i) * bb;
    const float* v = x + i * bv;
    switch (type) {
      case GgmlType::kQ4_0: QuantQx_0(v, 16, b); break;
      case GgmlType::kQ5_0: QuantQx_0(v, 32, b); break;
      case GgmlType::kQ8_0: QuantQ8_0(v, b); break;
      case GgmlType::kQ4_K: QuantK45(v, false, b); break;
      case GgmlType::kQ5_K: QuantK45(v, true, b); break;
      case GgmlType::kQ6_K: QuantQ6_K(v, b); break;
      default: return false;
    }
  }
  return true;
}

}  // namespace lede::checkpoint
