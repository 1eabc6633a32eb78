// File: shared/model/cpu/cpu_kernels.h
//
// The fused CPU kernels of the decode path: plain float32 loops
// the compiler vectorizes, plus CBLAS (OpenBLAS at run time: Debian's
// libblas.so.3 alternative) for matrix-matrix products. Torch-free: every
// argument is a raw row-major float32 buffer owned by the caller; nothing
// here allocates. LlamaModel's fused block (llama.h, Kernels::kFused) is
// built from these; they are public so that tests and bench/ can check and
// time them one by one.
//
// Vectorization: the hot loops use GCC/Clang vector extensions (8 floats)
// and are compiled twice on x86-64 (function multiversioning: an AVX2+FMA
// clone picked at load time by the CPU, and the portable x86-64 baseline),
// so the default build needs no -march and runs on any x86-64.
//
// Threading: every function is pure (reads its inputs, writes its outputs)
// and safe to call concurrently on distinct outputs. MatVec runs on the
// calling thread only; MatMulNT with n > 1 calls cblas_sgemm, which uses
// OpenBLAS's threads (the OpenMP build follows omp_set_num_threads, i.e.
// at::set_num_threads of the calling thread), the same as the eager path.
#ifndef LEDE_SHARED_MODEL_CPU_CPU_KERNELS_H_
#define LEDE_SHARED_MODEL_CPU_CPU_KERNELS_H_

#include <cstdint>

namespace lede::model::cpu {

// y[out] (+)= W[out, in] x[in] (W row-major, rows contiguous). With
// accumulate the product is added to y (a fused residual add), otherwise y
// is overwritten. Vectorized loop, 4 rows at a time. y must not alias x/W.
void MatVec(const float* w, int64_t out, int64_t in, const float* x, float* y, bool accumulate);

// The same product through cblas_sgemv (for comparison in bench/).
void MatVecBlas(const float* w, int64_t out, int64_t in, const float* x, float* y, bool accumulate);

// Y[n, out] (+)= X[n, in] W[out, in]^T for few rows: every block of 4 rows
// of W is read once and applied to all n rows of X from L1. MatVec is n = 1.
void MatMulRows(const float* x, int64_t n, int64_t in, const float* w, int64_t out, float* y,
                bool accumulate);

// MatMulRows into an output with row stride ldy >= out: Y[r, 0..out) at
// y + r * ldy. Each output element is computed as MatMulRows computes it as
// long as a call covers whole blocks of 4 rows of W (a split of W's rows at
// multiples of 4, the last part taking the tail): the threaded batched step
// splits a product's output columns across threads this way.
void MatMulRowsStrided(const float* x, int64_t n, int64_t in, const float* w, int64_t out, float* y,
                       int64_t ldy, bool accumulate);

// The packed layout of W [out, in] for the few-row kernels, built once at
// load: each block of 4 rows keeps
// its place (block b at offset 4 b in, as row-major), its columns interleaved
// in chunks of 8 by row, [w0[0:8] w1[0:8] w2[0:8] w3[0:8] w0[8:16] ...]; the
// out % 4 tail rows stay row-major. One block is one sequential stream, which
// the hardware prefetcher follows, where four row-major streams of a few
// cache lines each (768 bytes at d = 192) keep it from ramping up. Measured
// on this machine (EPYC, 32 MB L3), one row through all of lede-tiny's
// matrices: 41-53 GB/s packed against 9-24 GB/s row-major; row-major with
// software prefetch 4 blocks ahead matched packing in that loop but left the
// whole model's autoregressive step 1.5-1.8x slower than packing (A/B,
// lede_engine_bench), so the weights are packed. Requires in % 8 == 0
// (Packable). A split at a multiple of 4 rows is the packed layout of those
// rows, as MatMulRowsStrided needs.
inline bool Packable(int64_t in) { return in % 8 == 0; }

// Writes W [out, in] (row-major) into packed [out * in] in that layout.
// Requires Packable(in); packed must not alias w.
void PackRows(const float* w, int64_t out, int64_t in, float* packed);

// MatMulRowsStrided over a packed W: bitwise the same result as over the
// row-major W it was packed from (the same products in the same order).
void MatMulRowsPacked(const float* x, int64_t n, int64_t in, const float* packed, int64_t out,
                      float* y, int64_t ldy, bool accumulate);

// The same product through cblas_sgemm (for comparison in bench/).
void MatMulBlas(const float* x, int64_t n, int64_t in, const float* w, int64_t out, float* y,
                bool accumulate);

// Rows up to which MatMulNT uses MatMulRows rather than cblas_sgemm: a
// decode step, a draft step and a verification of up to D_max + 1 = 17
// positions. OpenBLAS sgemm repacks W on every call, which costs more than
// the product itself at these n (lede_engine_bench, verify rows).
inline constexpr int64_t kMaxRowsWithoutBlas = 12;

// Y[n, out] (+)= X[n, in] W[out, in]^T, X and Y row-major with row strides
// in and out, W row-major (the fused model's packed matrices go through
// MatMulRowsPacked for every n instead: shared/model/llama.cc RaggedMatMul): MatMulRows
// for n <= kMaxRowsWithoutBlas (the vectorized loop
// is also faster than OpenBLAS sgemv on the small matrices of the models
// here: lede_engine_bench), cblas_sgemm beyond (beta 1 when accumulating).
void MatMulNT(const float* x, int64_t n, int64_t in, const float* w, int64_t out, float* y,
              bool accumulate);

// The softmax sums of the exit probe (exit_signals.h ProbeSignals): with
// d_v = x[v] - shift (shift >= max_v x[v]), *sum_exp = sum_v exp(d_v) and
// *sum_exp_d = sum_v exp(d_v) * d_v. exp is a degree-6 polynomial on the
// range-reduced argument (relative error below 2e-7 for d_v in [-87, 0];
// smaller d_v count as exp(-87)), summed in 16 float lanes, so both sums
// carry about 1e-6 relative error for n up to 2^17.
void ExpSums(const float* x, int64_t n, float shift, double* sum_exp, double* sum_exp_d);

// RMSNorm of n rows of d: y = x * rsqrt(mean(x^2) + eps) * weight[d].
// y may equal x.
void RmsNorm(const float* x, const float* weight, int64_t n, int64_t d, float eps, float* y);

// RoPE in the rotate-half convention on one position's heads, in place:
// x [n_heads, hd] (heads contiguous); cos, sin [hd] (the halves repeated,
// as LlamaModel's tables). x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin.
void RopeRotateHalf(float* x, int64_t n_heads, int64_t hd, const float* cos, const float* sin);

// SwiGLU on n rows: out[i, f] = silu(h13[i, f]) * h13[i, F + f], h13 [n, 2F]
// (gate columns, then up columns), out [n, F]. Eight columns at a time
// with ExpSums' exp polynomial (relative error below 1e-6).
void SiluMul(const float* h13, int64_t n, int64_t F, float* out);

// Attention of one query row over n_keys cached positions of one KV head:
//   q [hd] (already scaled by 1/sqrt(hd)), keys / values [n_keys, hd]
//   (rows contiguous, as a KV-pool slot's head), out [hd] overwritten,
//   scores [n_keys] scratch. Softmax in float32 with the max subtracted,
//   exp eight keys at a time by ExpSums' polynomial (relative error below
//   2e-7), and for hd = 32, 64, 128 the output row kept in registers (each
//   value row read once). Attention was a quarter of lede-tiny's decode step
//   at a 150-token context with one scalar exp and a stored output per key.
void AttendOne(const float* q, const float* keys, const float* values, int64_t n_keys, int64_t hd,
               float* scores, float* out);

// AttendOne over a paged KV cache (kv_cache.h): the keys in blocks of
// block_tokens rows, key j at keys + blocks[j / block_tokens] * block_stride
// + (j % block_tokens) * hd, values likewise (block_stride in floats, e.g.
// Hkv * P * hd for the pool's [NB, Hkv, P, hd] with keys / values already
// offset to the KV head). Same arithmetic and order as AttendOne.
void AttendPaged(const float* q, const float* keys, const float* values, const int64_t* blocks,
                 int64_t block_stride, int64_t block_tokens, int64_t n_keys, int64_t hd, float* scores, float* out);
// AttendPaged over bfloat16 K/V (the pool's default storage): each key and
// value widened to float32 (exact) as it is read; the arithmetic is
// AttendPaged's on the widened values. The engine attends through
// AttendPagedRows(Bf16); these two are its per-head reference (tests).
void AttendPagedBf16(const float* q, const uint16_t* keys, const uint16_t* values, const int64_t* blocks,
                     int64_t block_stride, int64_t block_tokens, int64_t n_keys, int64_t hd, float* scores,
                     float* out);
// AttendPaged for R consecutive query rows of one slot and the G query
// heads of each that share one KV head (grouped-query attention, GQA): row
// r (q + r q_stride: [G, hd] float32) sits at position n_keys0 - 1 + r and
// sees keys [0, n_keys0 + r) (causal); its output goes to out + r
// out_stride ([G, hd] float32). A decode step is R = 1; a verification or
// a prefill chunk passes its rows together.
//
// The keys are read in tiles of 16 KB of float32 rows (widened once per
// call from bfloat16), so each K and V row is read once for all R x G
// heads; the scores are taken eight keys at a time. Every score, exponential
// and output lane is AttendPaged's, by the same operations in the same
// order, so each head's output is AttendPaged's for that head to float32
// rounding (bitwise on float32 blocks where the compiler contracts both
// alike) and a row's output never depends on R or on the other rows: a
// verification sees what one-position decoding sees. Requires n_keys0 >= 1.
// Any hd (a multiple of 8 takes the vector path; others go a head at a
// time through AttendPaged).
//
// Threading: scratch (the tile, R x G score rows) is the calling thread's,
// grown to the largest call and reused (no allocation per step after
// warm-up); concurrent calls on different threads are independent.
void AttendPagedRows(const float* q, int64_t q_stride, int64_t R, int64_t G, const float* keys,
                     const float* values, const int64_t* blocks, int64_t block_stride, int64_t block_tokens,
                     int64_t n_keys0, int64_t hd, float* out, int64_t out_stride);
void AttendPagedRowsBf16(const float* q, int64_t q_stride, int64_t R, int64_t G, const uint16_t* keys,
                         const uint16_t* values, const int64_t* blocks, int64_t block_stride, int64_t block_tokens,
                         int64_t n_keys0, int64_t hd, float* out, int64_t out_stride);

// sum_i a[i] b[i] (vectorized; for tests and the roofline loop).
float Dot(const float* a, const float* b, int64_t n);

}  // namespace lede::model::cpu

#endif  // LEDE_SHARED_MODEL_CPU_CPU_KERNELS_H_
