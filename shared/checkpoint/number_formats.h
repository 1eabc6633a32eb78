// File: shared/checkpoint/number_formats.h
//
// The 16-bit number formats checkpoints store (safetensors F16/BF16, GGUF
// F16/BF16 and Q8_0's scale) and the fused CPU path packs (bf16 weights, the
// f16 scales of Q8_0 blocks): one implementation for the readers, the GGUF
// writer and the kernels (shared/model/cpu/cpu_quant_kernels.h forwards to it).
//
// IEEE 754 binary16 <-> binary32: widening is exact; narrowing rounds to
// nearest even (values past 65504 become infinity, NaN stays NaN), as F16C's
// conversions do. bfloat16 <-> binary32: widening is exact; narrowing rounds
// to nearest even and keeps a NaN a (quiet) NaN.
//
// Thread-safety: pure functions. Torch-free.
#ifndef LEDE_SHARED_CHECKPOINT_NUMBER_FORMATS_H_
#define LEDE_SHARED_CHECKPOINT_NUMBER_FORMATS_H_

#include <cstdint>
#include <cstring>

namespace lede::checkpoint {

float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);

inline float Bf16ToFloat(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t FloatToBf16(float f);

}  // namespace lede::checkpoint

#endif  // LEDE_SHARED_CHECKPOINT_NUMBER_FORMATS_H_
