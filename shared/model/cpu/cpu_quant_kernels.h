// File: shared/model/cpu/cpu_quant_kernels.h
//
// The few-row products of the fused CPU path over weights stored in fewer
// bytes than float32 (weight_format.h): bfloat16 and llama.cpp's
// Q8_0. Torch-free, raw buffers owned by the caller, as cpu_kernels.h.
//
// Both packed layouts keep cpu::PackRows' idea: a block of 4 weight rows is
// one sequential stream (the hardware prefetcher follows one stream where it
// does not ramp up on four short ones), every block of X rows reads each
// weight block once from memory. Unlike PackRows, out % 4 tail rows are
// padded with zero rows into a last full block (the kernels write only the
// real rows), so every matrix is whole blocks; a split of the output rows at
// a multiple of 4 is the packed layout of those rows (the threaded product
// splits them so; PackedBf16Offset / PackedQ8_0Offset locate it).
//
// Arithmetic: activations and accumulation float32.
//  - bf16: each weight is widened to float32 exactly and multiplied by the
//    float32 activation (fused multiply-add), so the product is that of
//    the float32 kernels over the rounded weights up to summation order.
//  - q8_0: as llama.cpp's Q8_0 x Q8_0 dot product, each X row is quantized
//    per step to int8 blocks of 32 (one float32 scale each, amax / 127), the
//    32-term integer dot products are exact (int32), and each is scaled by
//    weight scale x activation scale into float32 accumulators. The error
//    against float32 activations is that of the activation rounding (about
//    0.4% of a block's largest |x| per element, unbiased).
//
// Instruction sets, chosen at run time (cpu::QuantIsa, BestQuantIsa): the
// portable C++ loop; AVX2 (+FMA, F16C; int8 products by vpmaddubsw); and
// AVX-512 (F/BW/VL with VNNI: vpdpbusd on 512-bit registers, two weight
// rows per register). LEDE_CPU_KERNELS=avx2 or =portable caps the choice
// (A/B measurements). The ISAs agree to float rounding, not bitwise.
//
// Threading: pure functions. The q8_0 product quantizes X into a scratch of
// the calling thread (grown to the largest shape seen, then reused: no
// allocation per step after warm-up).
#ifndef LEDE_SHARED_MODEL_CPU_CPU_QUANT_KERNELS_H_
#define LEDE_SHARED_MODEL_CPU_CPU_QUANT_KERNELS_H_

#include <cstddef>
#include <cstdint>

namespace lede::model::cpu {

enum class QuantIsa { kPortable, kAvx2, kAvx512 };

// The best instruction set this CPU runs (capped by LEDE_CPU_KERNELS).
QuantIsa BestQuantIsa();
const char* QuantIsaName(QuantIsa isa);

// IEEE float16 <-> float32 (round to nearest even; F16C's conversions).
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
// bfloat16 <-> float32 (round to nearest even, NaN kept a NaN).
inline float Bf16ToFloat(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
uint16_t FloatToBf16(float f);

// ---- bfloat16 ----
// Packed bf16 [PackedRowsPadded(out) * in]: PackRows' layout (block b at
// element 4 b in, row k's columns [i, i + 8) at 4 i + 8 k inside it) with
// the tail rows padded. Requires in % 8 == 0. Values rounded to nearest.
inline int64_t PackedRowsPadded(int64_t out) { return (out + 3) / 4 * 4; }
void PackRowsBf16(const float* w, int64_t out, int64_t in, uint16_t* packed);
inline int64_t PackedBf16Offset(int64_t o, int64_t in) { return o * in; }  // elements; o % 4 == 0
// The same layout from bfloat16 values (a checkpoint's own storage, copied
// bit for bit: no rounding). Rows of a split at o % 4 == 0 may be packed on
// their own at PackedBf16Offset(o, in), as for PackRowsBf16.
void PackRowsBf16FromBf16(const uint16_t* w, int64_t out, int64_t in, uint16_t* packed);
// Rows [r0, r1) of a packed bf16 matrix back to row-major float32 w
// [(r1 - r0) * in] (exact: the values the products multiply by).
void UnpackRowsBf16(const uint16_t* packed, int64_t in, int64_t r0, int64_t r1, float* w);

// Y[r, o] (+)= sum_i X[r, i] W[o, i] over packed bf16 W; Y row stride ldy.
void MatMulRowsPackedBf16(const float* x, int64_t n, int64_t in, const uint16_t* packed, int64_t out,
                          float* y, int64_t ldy, bool accumulate, QuantIsa isa = BestQuantIsa());

// ---- Q8_0 ----
// llama.cpp's block (ggml block_q8_0): float16 scale d, then 32 int8 values;
// value = d * q. 34 bytes, no padding.
constexpr int64_t kQ8Block = 32;
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQ8Block];
};
static_assert(sizeof(BlockQ8_0) == 34, "ggml's block_q8_0 is 34 bytes");
inline bool Q8Packable(int64_t in) { return in % kQ8Block == 0; }

// W [rows, in] (in % 32 == 0) -> rows * in / 32 blocks, row-major, as
// llama.cpp quantizes: d = amax / 127 (stored as float16), q = round(w / d).
void QuantizeRowsQ8_0(const float* w, int64_t rows, int64_t in, BlockQ8_0* blocks);
// Blocks -> float32 values d * q (the eager reference's weights).
void DequantizeRowsQ8_0(const BlockQ8_0* blocks, int64_t rows, int64_t in, float* w);

// The packed Q8_0 layout: per block of 4 weight rows (tail padded with zero
// rows), per 32 columns j: the 4 rows' float16 scales (8 bytes), then the 4
// rows' 32 int8 values (128 bytes): 136 bytes for 128 weights, 34 / 32
// bytes per weight as llama.cpp's. Values of -128 (which llama.cpp's
// quantizer never writes) are stored as -127, as the int8 products need a
// negatable weight: DequantizeRowsQ8_0 does the same, so the reference
// agrees.
constexpr int64_t kQ8PackedGroup = 8 + 4 * kQ8Block;  // bytes per 4 rows x 32 columns
inline size_t PackedQ8_0Bytes(int64_t out, int64_t in) {
  return static_cast<size_t>(PackedRowsPadded(out) / 4 * (in / kQ8Block) * kQ8PackedGroup);
}
inline int64_t PackedQ8_0Offset(int64_t o, int64_t in) { return o / 4 * (in / kQ8Block) * kQ8PackedGroup; }
void PackRowsQ8_0(const BlockQ8_0* blocks, int64_t out, int64_t in, uint8_t* packed);
// Rows [r0, r1) of a packed Q8_0 matrix as float32 values d * q, row-major
// w [(r1 - r0) * in]: bitwise DequantizeRowsQ8_0 of the blocks packed.
void UnpackRowsQ8_0(const uint8_t* packed, int64_t in, int64_t r0, int64_t r1, float* w);

// Y (+)= X W^T over packed Q8_0 W (X quantized per row as described above).
void MatMulRowsPackedQ8_0(const float* x, int64_t n, int64_t in, const uint8_t* packed, int64_t out,
                          float* y, int64_t ldy, bool accumulate, QuantIsa isa = BestQuantIsa());

// The activation quantization of MatMulRowsPackedQ8_0, one row: x [in] ->
// q [in] int8, d [in / 32] float32 (for tests and the scalar reference).
void QuantizeActivationQ8(const float* x, int64_t in, int8_t* q, float* d);

}  // namespace lede::model::cpu

#endif  // LEDE_SHARED_MODEL_CPU_CPU_QUANT_KERNELS_H_
