// File: shared/model/cpu/cpu_ggml_kernels.h
//
// Few-row products of the fused CPU path over matrices kept in llama.cpp's
// own block types (Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K; layouts in
// shared/checkpoint/ggml_quants.h): the weights of a Q4_0 / Q4_K_M /
// Q5_K_M / Q6_K GGUF file as they are, or a float32 matrix quantized to
// them at load (weight_format.h: q4_0, q4_k_m). Torch-free, raw buffers, as
// cpu_quant_kernels.h.
//
// Storage (GgmlMatrix): the rows row-major, each row its blocks as the file
// has them, in runs of rows of one type (a fused matrix concatenates
// projections that a Q4_K_M file stores in different types, e.g. Q4_K q/k
// and Q6_K v rows).
//
// Arithmetic (as llama.cpp's CPU dot products): each X row is quantized
// per step to int8, for the K types in blocks of 256 with one float32 scale
// (amax / 127) and the sums of each 16 values (llama.cpp's Q8_K), for the
// 32-value types in blocks of 32 with one float32 scale (Q8_0). The
// products of weight and activation integers are exact (int32), including
// the 6-bit sub-block scales; each block's sum is scaled by weight scale x
// activation scale into float32, less the block's min term (Q4_K / Q5_K:
// dmin * m * sum of x; the -32, -8, -16 offsets of Q6_K, Q4_0, Q5_0 are
// taken out the same way). The error against float32 activations is that
// of the activation rounding.
//
// The portable path decodes each weight row once per step (its nibbles and
// high bits into unsigned bytes, its scales into int16 lanes) into a
// scratch of the calling thread and multiplies it by every row of X. The
// AVX2 path reads Q4_0, Q4_K, Q5_K and Q6_K rows straight from their blocks
// (one weight row against up to 4 rows of X per pass, so a step reads each
// weight block once from memory for all its rows: decode, verification,
// ragged batches; a prefill chunk's many X rows go through 16 weight rows
// at a time, so X is read from the cache once per 16 weight rows): Q4_K /
// Q5_K scales and mins split with byte shuffles,
// each block's weight sum and min sum paired by one vphaddd and scaled by
// one FMA into a float32 accumulator reduced once per row; Q4_0 two blocks
// per step with the -8 offsets taken out through float sums of X.
// Where the CPU has AVX-512 VNNI (QuantIsa::kAvx512), Q4_K and Q6_K rows
// take vpdpbusd for the products and vpdpwssd for the sub-block scales
// (internal/cpu_ggml_vnni_kernels.h; the 400-token prefill of the 8x
// widening at Q4_K_M 1.27x faster than the AVX2 kernels on an Emerald
// Rapids core); Q4_0 and Q5_K keep the AVX2 kernels there.
// Instructions per weight are counted with bench/ggml_kernel_bench.cc
// under valgrind --tool=callgrind --toggle-collect='lede::model::cpu::MatMulRows*'.
//
// Threading: pure functions over a const GgmlMatrix; scratch is per thread
// (grown to the largest shape seen, then reused: no allocation per step
// after warm-up).
#ifndef LEDE_SHARED_MODEL_CPU_CPU_GGML_KERNELS_H_
#define LEDE_SHARED_MODEL_CPU_CPU_GGML_KERNELS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "shared/checkpoint/ggml_quants.h"
#include "shared/model/cpu/cpu_quant_kernels.h"

namespace lede::model::cpu {

// Whether `type` is one of the block types the kernels multiply by and
// `in` (a row's length) is whole blocks of it.
bool GgmlPackable(checkpoint::GgmlType type, int64_t in);

// A [rows, in] matrix in ggml blocks, row-major, in runs of one type.
// Filled by Append* in row order; read-only afterwards (share freely).
class GgmlMatrix {
 public:
  struct Run {
    int64_t row_begin = 0, row_end = 0;  // rows [row_begin, row_end)
    checkpoint::GgmlType type = checkpoint::GgmlType::kQ8_0;
    size_t offset = 0;     // bytes: where row_begin's blocks start
    size_t row_bytes = 0;  // in / GgmlBlockValues(type) * GgmlBlockBytes(type)
  };

  GgmlMatrix() = default;
  explicit GgmlMatrix(int64_t in) : in_(in) {}

  // Appends `rows` rows of `type` blocks (rows * row_bytes bytes, copied).
  // Returns false (nothing appended) unless GgmlPackable(type, in()).
  bool AppendBlocks(checkpoint::GgmlType type, const uint8_t* blocks, int64_t rows);
  // Appends `rows` float32 rows w [rows, in] quantized to `type`
  // (checkpoint::QuantizeGgmlRow). Returns false unless GgmlPackable.
  bool AppendQuantized(checkpoint::GgmlType type, const float* w, int64_t rows);

  int64_t rows() const { return rows_; }
  int64_t in() const { return in_; }
  const std::vector<Run>& runs() const { return runs_; }
  size_t nbytes() const { return bytes_.size(); }
  const uint8_t* data() const { return bytes_.data(); }
  const uint8_t* row(int64_t r) const;  // r's first block
  checkpoint::GgmlType type_of(int64_t r) const;

 private:
  Run* Extend(checkpoint::GgmlType type, int64_t rows);
  int64_t in_ = 0, rows_ = 0;
  std::vector<Run> runs_;
  std::vector<uint8_t> bytes_;
};

// Y[r, o - o0] (+)= sum_i X[r, i] W[o, i] for o in [o0, o1), r < n; X [n, in]
// float32 row-major (in == w.in()), Y row stride ldy (float32). X rows are
// quantized as the header says.
void MatMulRowsGgml(const float* x, int64_t n, int64_t in, const GgmlMatrix& w, int64_t o0, int64_t o1, float* y,
                    int64_t ldy, bool accumulate, QuantIsa isa = BestQuantIsa());

// Rows [r0, r1) of w as float32 values, row-major out [(r1 - r0) * in]
// (checkpoint::DequantizeGgmlRow; the eager reference's weights).
void UnpackRowsGgml(const GgmlMatrix& w, int64_t r0, int64_t r1, float* out);

}  // namespace lede::model::cpu

#endif  // LEDE_SHARED_MODEL_CPU_CPU_GGML_KERNELS_H_
