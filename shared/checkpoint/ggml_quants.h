// File: shared/checkpoint/ggml_quants.h
//
// ggml's tensor types as stored in GGUF files (llama.cpp's block layouts),
// torch-free: the type table (block size in values and bytes), the
// reference dequantization of each block type to float32 (the eager path's
// weights and the fused kernels' reference), and quantizers that write
// those layouts from float32.
//
// Block layouts (all little-endian, no padding; "f16" is an IEEE half):
//   Q4_0  32 values, 18 bytes: f16 d | u8 qs[16]
//         value j (< 16) = d * ((qs[j] & 15) - 8), value j + 16 =
//         d * ((qs[j] >> 4) - 8)
//   Q5_0  32 values, 22 bytes: f16 d | u8 qh[4] (a uint32 h) | u8 qs[16]
//         value j = d * (((qs[j] & 15) | bit j of h << 4) - 16),
//         value j + 16 = d * (((qs[j] >> 4) | bit (j + 16) of h << 4) - 16)
//   Q8_0  32 values, 34 bytes: f16 d | i8 qs[32]; value j = d * qs[j]
//   Q4_K  256 values, 144 bytes: f16 d | f16 dmin | u8 scales[12] | u8 qs[128]
//         8 sub-blocks of 32, each a 6-bit scale sc and 6-bit min m packed
//         in `scales` (KScaleMin); value = d * sc * q - dmin * m, q 4 bits:
//         chunk c (64 values, qs[32 c .. 32 c + 32)) holds sub-block 2c in
//         the low nibbles and 2c + 1 in the high nibbles
//   Q5_K  256 values, 176 bytes: f16 d | f16 dmin | u8 scales[12] | u8 qh[32]
//         | u8 qs[128]; as Q4_K with a fifth bit: value l of sub-block s
//         (l < 32) adds 16 when bit s of qh[l] is set
//   Q6_K  256 values, 210 bytes: u8 ql[128] | u8 qh[64] | i8 scales[16] | f16 d
//         16 sub-blocks of 16, value = d * scales[s] * (q - 32), q 6 bits:
//         half h (128 values) uses ql[64 h ..], qh[32 h ..]; its value
//         l + 32 k (l < 32, k < 4) has low 4 bits from ql[l + 32 (k & 1)]
//         (low nibble for k < 2, high for k >= 2) and high 2 bits
//         (qh[l] >> 2k) & 3
// Source: the format's definition in ggml (ggml/src/ggml-common.h block
// structs, ggml-quants.c dequantize_row_*); implemented here from that
// description.
//
// Thread-safety: pure functions.
#ifndef LEDE_SHARED_CHECKPOINT_GGML_QUANTS_H_
#define LEDE_SHARED_CHECKPOINT_GGML_QUANTS_H_

#include <cstddef>
#include <cstdint>

namespace lede::checkpoint {

// ggml tensor types this project reads and writes (values as in the file).
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ5_0 = 6,
  kQ8_0 = 8,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kBF16 = 30,
};

// Whether `raw` (a GGUF tensor type number) is one of GgmlType.
bool IsKnownGgmlType(uint32_t raw);
// Whether `type` is block-quantized (Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K).
bool IsQuantizedGgmlType(GgmlType type);

// Values per block (1 for F32 / F16 / BF16; 32 for Q4_0, Q5_0, Q8_0; 256
// for the K types) and bytes per block (4, 2, 2; 18, 22, 34; 144, 176, 210).
int64_t GgmlBlockValues(GgmlType type);
size_t GgmlBlockBytes(GgmlType type);

// The 6-bit scale and min of sub-block j (< 8) of a Q4_K / Q5_K block's
// 12 `scales` bytes: j < 4: sc = s[j] & 63, m = s[j + 4] & 63; j >= 4: the
// low 4 bits from s[j + 4] (sc low nibble, m high nibble) and the high 2
// bits from the top bits of s[j - 4] (sc) and s[j] (m).
void KScaleMin(const uint8_t* scales, int j, uint8_t* sc, uint8_t* m);
// The inverse: packs 8 scales and 8 mins (each < 64) into 12 bytes.
void PackKScaleMin(const uint8_t* sc, const uint8_t* m, uint8_t* scales);

// Dequantizes `n` values (a multiple of GgmlBlockValues(type)) of a
// quantized `type` from `blocks` into out[0, n). Returns false (and writes
// nothing) for a type that is not block-quantized or a bad n.
bool DequantizeGgmlRow(GgmlType type, const uint8_t* blocks, int64_t n, float* out);

// Quantizes `n` values (a multiple of GgmlBlockValues(type)) of x into
// n / GgmlBlockValues(type) blocks of `type` at `blocks`. Returns false for
// a type that is not block-quantized or a bad n. The quantizers:
//  Q8_0  d = max|x| / 127, q = round(x / d)
//  Q4_0 / Q5_0  d = -v / 8 (16), v the value of largest magnitude,
//        q = clamp(round(x / d) + 8 (16), 0, 15 (31))
//  Q4_K / Q5_K  per sub-block of 32 an offset min(0, min x) and a step
//        (max - offset) / 15 (31), refined by a few least-squares passes
//        over the rounded q; the 8 steps and offsets then quantized to
//        6 bits against d = max step / 63 and dmin = max offset / 63, and q
//        rounded against the stored (6-bit) scale and min
//  Q6_K  per sub-block of 16 a step -v / 32 (v of largest magnitude), the
//        16 steps quantized to int8 against d = max |step| / 127, q
//        rounded against the stored scale, clamped to [-32, 31]
// (simpler than llama.cpp's importance-weighted searches; the layouts, not
// the rounding choices, are what another reader needs).
bool QuantizeGgmlRow(GgmlType type, const float* x, int64_t n, uint8_t* blocks);

}  // namespace lede::checkpoint

#endif  // LEDE_SHARED_CHECKPOINT_GGML_QUANTS_H_
