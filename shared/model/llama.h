// File: shared/model/llama.h
//
// LlamaModel: a Llama-architecture decoder (RMSNorm, RoPE, grouped-query
// attention, SwiGLU, tied or untied LM head) with early exits: any layer's
// hidden state can be turned into logits through the model's own final
// RMSNorm and LM head (LayerSkip's shared exit, arXiv 2404.16710; docs/design.md
// §1 "Exit at layer l"). Blocks can be run in ranges [first, last) so that a
// drafter runs the shallow blocks and a verifier the rest on one KV cache.
//
// Shapes (B batch, T new positions, d model dim, V vocab):
//   tokens  [B, T]  int64
//   hidden  [B, T, d]  compute dtype (float32 / float16 / bfloat16), model device
//   logits  [B, T, V]  float32
// With a KvCache, B must be 1 (one slot per call); without one, each call is
// a full causal pass over its T positions (training and reference paths).
//
// Device and dtype come from ModelOptions; the same code runs on CPU and CUDA.
// Kernels: on the CPU in float32, with a KvCache and outside
// autograd, Block/Forward/ExitLogits run the fused path (cpu_kernels.h: one
// RMSNorm, QKV GEMM, RoPE + KV write, attention over the pool, O GEMM with
// the residual, RMSNorm, gate/up GEMM, SwiGLU, down GEMM with the residual
// per block, on raw buffers, no allocation but the returned tensor) unless
// ModelOptions::kernels is kEager; everything else (CUDA, half precision,
// the cache-free training pass, autograd) runs the eager libtorch path,
// which stays the reference. The two agree to 1e-4 in the logits (tests).
// Weight storage (ModelOptions::weights, weight_format.h): the
// fused path reads every matrix packed as f32, bf16 or Q8_0
// (cpu_quant_kernels.h). With bf16 / Q8_0 on the fused path the packed copy
// is the only one kept (see ModelOptions::weights): the eager path computes
// with its dequantized values (materialized on first use), so both compute
// with the same weights: bf16 agrees to 1e-4, q8_0 (whose kernels also
// round activations to int8 blocks) to about 2-4% of the largest |logit|
// (tests).
// Graphs (GraphMode, on by default on CUDA): single-slot cached steps of at
// most kMaxGraphPositions rows run StaticForward from recorded buffers,
// captured as CUDA graphs on a CUDA build (internal/step_graphs.h); that
// path takes precedence over both kernels.
// RoPE is computed in the rotate-half convention; checkpoints in the
// adjacent-pair convention (llama2.c, Meta) have wq/wk rows permuted at load.
//
// Thread-safety: const methods are safe to call concurrently on distinct KV
// slots. Weights are immutable after construction (the trainer mutates them
// through Parameters() under autograd, single-threaded).
// Errors: the tensor methods are the hot path and do not return Status; they
// throw c10::Error on inputs that violate the documented shapes. Callers at
// the torch boundary (decoding.cc, the trainer) catch once and convert.
#ifndef LEDE_SHARED_MODEL_LLAMA_H_
#define LEDE_SHARED_MODEL_LLAMA_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/core/TensorOptions.h>

#include "shared/checkpoint/model_config.h"
#include "shared/model/cpu/cpu_ggml_kernels.h"
#include "shared/model/kv_cache.h"
#include "shared/model/loaders/checkpoint.h"
#include "shared/model/loaders/weight_format.h"
#include "shared/status/status.h"

namespace lede::model {

namespace internal {
class StepGraphs;
}  // namespace internal

// Which implementation runs the decode path (see the file comment).
enum class Kernels {
  kEager,  // libtorch operators (about 30 per block); the reference
  kFused,  // cpu_kernels.h on CPU float32; falls back to kEager elsewhere
};

// Whether single-slot cached decode steps run as captured graphs (internal/step_graphs.h).
// kOn: every Forward with a KvCache of at most kMaxGraphPositions rows (the
// AR step, a draft step, a verification of D_max + 1 positions) runs the
// static-shape path (LlamaModel::StaticForward) from one set of static
// buffers per (first, last, rows, context bucket): on a CUDA build of
// libtorch the first call of a bucket captures it as a CUDA graph
// (at::cuda::CUDAGraph) and later calls replay it, so a step is one graph
// launch instead of ~30 kernel launches per block; on the CPU (and on
// builds without CUDA) the same static-shape operators run eagerly, which is
// how the tests here check the path the GPU replays. kAuto: kOn on CUDA,
// kOff elsewhere (the CPU's fused path is faster). Prefill chunks longer
// than kMaxGraphPositions and ragged batches stay eager.
enum class GraphMode { kAuto, kOn, kOff };
constexpr int64_t kMaxGraphPositions = 17;  // D_max + 1 for D_max = 16 (KvCacheOptions default)

// "auto" / "on" / "off" <-> GraphMode (the --graphs flag). Errors:
// kInvalidArgument naming the value.
StatusOr<GraphMode> ParseGraphMode(const std::string& name);
const char* GraphModeName(GraphMode mode);

// "eager" / "fused" <-> Kernels (the --kernels flag of the CLI, the model
// service and the benchmarks). Errors: kInvalidArgument naming the value.
StatusOr<Kernels> ParseKernels(const std::string& name);
const char* KernelsName(Kernels kernels);

// "cpu", "cuda", "cuda:N" -> a device, and "float32" / "bfloat16" /
// "float16" -> a compute dtype (the --device and --dtype flags of the CLI
// and the model service). A CUDA device on a CPU-only libtorch parses; the
// model load then fails with kInternal naming the missing CUDA support.
// Errors: kInvalidArgument naming the value.
StatusOr<c10::Device> ParseDevice(const std::string& name);
StatusOr<c10::ScalarType> ParseDtype(const std::string& name);

// Threads of the fused kernels in calls from the calling thread (a
// thread-local setting; default 1): the matrix products split their output
// columns across them (whole blocks of 4 weight rows, so every element of
// the row kernel is computed as on one thread) and attention its rows, on
// the process's one worker team (cpu::ParallelFor: a call while another
// thread's loop holds the team runs its parts on the calling thread); the sgemm of a segment
// longer than cpu::kMaxRowsWithoutBlas over a matrix that is not packed
// (cpu::Packable) follows OpenBLAS's threading (the calling thread's
// at::set_num_threads), whose rounding may differ by thread count (float32
// rounding, within the 1e-4 of the tests).
// The verifier sets it on the threads that run batched steps
// (--batch-threads, default 1). n_threads < 1 is taken as 1.
void SetFusedThreads(int n_threads);

// The threads the fused kernels' products split across in a call from the
// calling thread now: SetFusedThreads(), or 1 while another thread's loop
// holds the worker team (cpu::ParallelForThreads). The model service warns
// at startup when --threads asks for more than this gives. Runs one
// parallel loop whose parts wait (up to 2 s) for the threads to join;
// thread-safe.
int FusedThreadsInUse();

// The calling thread's intra-op threads for both decode paths: libtorch's
// (at::set_num_threads: the eager path and OpenBLAS) and the fused kernels'
// (SetFusedThreads). What the CLI's and the benchmarks' --threads N > 0 set,
// so that one flag moves every kernel. n_threads < 1 is taken as 1.
void SetDecodeThreads(int n_threads);

// One sequence of a ragged batch (LlamaModel::ForwardRagged): n_positions
// rows of the stacked activation hold positions
// [start_pos, start_pos + n_positions) of KV slot `slot`.
struct RaggedSegment {
  int64_t slot = 0;
  int64_t start_pos = 0;    // position of the segment's first row, in tokens
  int64_t n_positions = 0;  // rows of the segment, >= 1
};

struct ModelOptions {
  c10::Device device = c10::kCPU;      // where weights and activations live
  c10::ScalarType dtype = c10::kFloat; // compute dtype of weights and K/V
  // Copy every weight into memory the model owns. Off, float32 CPU weights
  // may alias the checkpoint's read-only file mapping (zero copy); training
  // updates weights in place and must turn this on.
  bool writable_weights = false;
  // The decode-path implementation; the fused kernels are several times
  // faster on small models and engage only where they exist (CPU float32).
  Kernels kernels = Kernels::kFused;
  // Captured decode graphs (see GraphMode).
  GraphMode graphs = GraphMode::kAuto;
  // How the matrices are stored (weight_format.h; the --weights flag):
  // kAuto keeps the checkpoint's storage. A matrix whose input dimension
  // the format's packing cannot take (bf16: in % 8, q8_0: in % 32) stays
  // float32. With bf16 / q8_0:
  //  - fused path, read-only weights (!writable_weights): each matrix is
  //    converted at load straight from the checkpoint's storage (chunks of
  //    rows, the file's pages released behind) into its packed form, and no
  //    float32 copy is kept: a tied LM head is also the embedding table
  //    (Embed reads its rows), an untied bf16 / f16 embedding stays in the
  //    file's dtype (wrapped in the mapping). The eager path (cache-free
  //    passes, StaticForward, autograd), Parameters() and NamedTensors()
  //    read the packed values dequantized to float32; the eager path and
  //    Parameters() keep that copy once made (resident_weight_bytes()).
  //  - otherwise (eager kernels, another device or dtype, writable weights):
  //    every matrix's tensor is rounded at load to the values the format
  //    holds (bf16, or Q8_0 quantized and dequantized), the reference
  //    weights, and the fused path (if on) reads a packed copy beside it.
  loaders::WeightFormat weights = loaders::WeightFormat::kAuto;
  // Example: ModelOptions{c10::Device("cuda:0"), c10::kBFloat16}
};

class LlamaModel {
 public:
  // Builds the model from loaded tensors (copied to options.device/dtype;
  // on CPU float32 they may alias the checkpoint's mapping).
  // Errors: kInvalidArgument if the config is invalid or a tensor is missing
  // or mis-shaped; kInternal on a libtorch failure.
  static StatusOr<std::unique_ptr<LlamaModel>> FromCheckpoint(
      const loaders::Checkpoint& checkpoint, const ModelOptions& options);

  // loaders::LoadCheckpoint(path) + FromCheckpoint. Errors as both.
  static StatusOr<std::unique_ptr<LlamaModel>> Load(const std::string& path,
                                                    const ModelOptions& options);

  // Random initialization for training and tests: linear weights
  // ~ N(0, init_std^2) (output projections scaled by 1/sqrt(2L)), norms 1.
  // Deterministic for a seed. Errors: kInvalidArgument for a bad config.
  static StatusOr<std::unique_ptr<LlamaModel>> RandomInit(
      const checkpoint::ModelConfig& config, uint64_t seed, const ModelOptions& options,
      double init_std = 0.02);

  const checkpoint::ModelConfig& config() const { return config_; }
  const ModelOptions& options() const { return options_; }
  int64_t n_layers() const { return config_.n_layers; }
  // True when the fused CPU kernels serve cached decoding (kernels ==
  // kFused, CPU, float32).
  bool fused() const { return fused_; }
  // The matrices' storage (ModelOptions::weights resolved: never kAuto).
  loaders::WeightFormat weight_format() const { return weights_; }
  // Bytes of the matrices one full decode step reads on the fused path
  // (every block and the LM head, in their packed formats).
  int64_t packed_weight_bytes() const;
  // Bytes of weights this model holds now: every weight tensor it keeps
  // (owned or wrapped in a checkpoint's mapping; a tensor shared by the
  // embedding and a tied head counted once), every packed matrix, and the
  // float32 matrices the eager path materialized from packed ones.
  // On the fused path with bf16 / q8_0 read-only weights this is
  // packed_weight_bytes() + the float32 norms (+ an untied embedding table)
  // until an eager call materializes matrices. Thread-safe.
  int64_t resident_weight_bytes() const;

  // Token embedding: tokens [B, T] int64 -> hidden [B, T, d].
  at::Tensor Embed(const at::Tensor& tokens) const;

  // Runs block `layer` on hidden [B, T, d] holding positions
  // [start_pos, start_pos + T).
  // With cache != nullptr (B == 1): writes this layer's K/V of the new
  // positions into `slot` at those positions and attends to positions
  // [0, start_pos + T) of the slot. With cache == nullptr: causal
  // self-attention over the T positions only (start_pos sets RoPE offsets).
  at::Tensor Block(int64_t layer, const at::Tensor& hidden, int64_t start_pos,
                   KvCache* cache, int64_t slot) const;

  // Blocks [first, last) in order; first == last returns hidden unchanged.
  at::Tensor Forward(at::Tensor hidden, int64_t first, int64_t last,
                     int64_t start_pos, KvCache* cache, int64_t slot) const;

  // A ragged batch through blocks [first, last): several sequences' rows
  // stacked into one activation, so that the QKV, O and FFN products run
  // once over all rows of all sequences (on the fused path the packed
  // few-row kernel, cpu::MatMulRowsPacked) while attention runs per segment
  // over its own slot's K/V with its own causal mask. The single-slot
  // Forward(..., cache, slot) is the one-segment case. Continuous batching
  // builds on this.
  //
  //   hidden    [N_total, d]  (or [1, N_total, d]) compute dtype, model device;
  //             rows in segment order, N_total = sum of n_positions
  //   segments  distinct slots; each writes its rows' K/V at positions
  //             [start_pos, start_pos + n_positions) of its slot and attends
  //             to [0, start_pos + t] for its row t
  //   returns   [N_total, d] (same leading shape as hidden)
  //
  // Fused path when fused() (and no autograd); otherwise each segment runs
  // through the eager blocks on its own (same result, the reference). On the
  // fused path every segment's rows are bitwise those of a one-segment call
  // of its own: the packed kernel computes each row alone (and, for a matrix
  // that is not packed, short segments of <= cpu::kMaxRowsWithoutBlas rows go
  // together through the row kernel and a longer one through sgemm on its
  // own rows, the choice a solo call of that segment makes).
  // Throws c10::Error for a bad range, overlapping slots, positions past the
  // capacity or rows that do not add up (hot path; callers convert).
  // Thread-safety: as Forward (concurrent calls on disjoint slots are safe;
  // the fused scratch is thread-local).
  at::Tensor ForwardRagged(const at::Tensor& hidden, int64_t first, int64_t last,
                           const std::vector<RaggedSegment>& segments, KvCache& cache) const;

  // The static-shape (graph-safe) form of Forward with a KvCache for one
  // slot: no operator reads a position, a slot or a length on the host, so
  // a CUDA graph captured from it replays correctly for any start_pos and
  // slot written into its input buffers.
  //   hidden     [1, T, d] compute dtype, model device
  //   start_pos  [1] int64 on the model device: position of row 0
  //   slot       [1] int64 on the model device
  //   context    host constant: attention reads positions [0, context) of
  //              the slot and masks those after each row's own position;
  //              requires start_pos + T <= context <= cache.capacity()
  //              (not checkable inside a graph: the caller, StepGraphs,
  //              picks context from the host positions it knows)
  // Writes the rows' K/V with index_copy_ into the pool (which must be
  // contiguous, as KvCache makes it). Same result as the eager Forward to
  // float rounding (tests: logits within 1e-4, greedy ids identical).
  // Runs the eager libtorch operators on every device (never the fused path).
  at::Tensor StaticForward(const at::Tensor& hidden, int64_t first, int64_t last,
                           const at::Tensor& start_pos, const at::Tensor& slot, int64_t context,
                           KvCache& cache) const;

  // Graphs recorded so far (one per (first, last, rows, context) bucket);
  // 0 when graphs are off.
  int64_t n_graphs() const;
  // Whether cached single-slot steps go through the graphs (GraphMode
  // resolved for this model's device).
  bool graphs() const { return graphs_ != nullptr; }

  // Final RMSNorm + LM head: hidden [B, T, d] -> logits [B, T, V] float32.
  // Applied to the output of block l-1 this is the exit at layer l.
  // Fused path (when fused() and no autograd): one RMSNorm and one pass of
  // the packed head into a new contiguous CPU float32 tensor, which
  // ComputeExitSignals / ProbeSignals read in place (the exit probe).
  at::Tensor ExitLogits(const at::Tensor& hidden) const;

  // ExitLogits over the rows of several sequences at once (the LM-head pass
  // of a batched step): hidden [M, d] holds groups of row_counts[i] >= 1
  // consecutive rows (sum = M); returns logits [M, V] float32 on the CPU
  // path, each group's rows bitwise equal to ExitLogits of that group alone
  // (the fused path reads the packed head once for all groups). Throws
  // c10::Error when the counts do not
  // add up. Thread-safety: as ExitLogits.
  at::Tensor ExitLogitsRagged(const at::Tensor& hidden, const std::vector<int64_t>& row_counts) const;

  // Final RMSNorm only: [B, T, d] -> [B, T, d].
  at::Tensor FinalNorm(const at::Tensor& hidden) const;

  // The trainable tensors (fused layouts: wqkv [(H+2Hkv)*hd, d],
  // w13 [2*hidden, d]); the trainer sets requires_grad on them. On a model
  // whose bf16 / q8_0 matrices are packed only (ModelOptions::weights) the
  // matrices are float32 copies dequantized from the packed ones (made once,
  // then kept): updating them does not change what the fused path reads;
  // load with writable_weights to train.
  std::vector<at::Tensor> Parameters() const;

  // Weights under Hugging Face names, rotate-half convention, float32 CPU
  // (see checkpoint.h for the names and shapes).
  std::map<std::string, at::Tensor> NamedTensors() const;

  // Writes the model in Hugging Face layout (config.json + model.safetensors).
  Status SaveHf(const std::string& dir) const;

 private:
  // A weight matrix in the cpu::PackRows layout, read by the fused path's
  // few-row products, with the version of the tensor it was packed from
  // (at::Tensor::_version()): an in-place update of the tensor (an optimizer
  // step) makes it stale, and the fused path then reads the tensor itself.
  // Weights loaded under c10::InferenceMode are inference tensors, which
  // have no version counter: an in-place update of those (possible only
  // inside InferenceMode; they cannot be trained) is not seen.
  // Empty when the fused path is off or the matrix is not cpu::Packable.
  // Costs one more copy of the matrices in memory on the fused path, except
  // for a packed-only matrix (ModelOptions::weights: the tensor is
  // undefined and this is the weight; never stale).
  // format says which of data (cpu::PackRows), bf16 (cpu::PackRowsBf16),
  // q8 (cpu::PackRowsQ8_0) or gg (ggml blocks: kQ4_0, kQ4_K_M, kGguf;
  // cpu_ggml_kernels.h) holds it.
  struct PackedWeight {
    loaders::WeightFormat format = loaders::WeightFormat::kF32;
    std::vector<float> data;
    std::vector<uint16_t> bf16;
    std::vector<uint8_t> q8;
    cpu::GgmlMatrix gg;
    int64_t version = -1;
    int64_t rows = 0, in = 0;  // the matrix's shape [rows, in]
    // Packed-only matrices: the float32 values the eager path materialized
    // (Dense), under dense_mu_; undefined until then.
    mutable at::Tensor dense;
    int64_t bytes() const {
      return static_cast<int64_t>(data.size() * 4 + bf16.size() * 2 + q8.size() + gg.nbytes());
    }
  };
  struct Layer {
    at::Tensor attn_norm;  // [d]
    at::Tensor wqkv;       // [(H + 2*Hkv) * hd, d]
    at::Tensor wo;         // [d, H*hd]
    at::Tensor ffn_norm;   // [d]
    at::Tensor w13;        // [2*hidden, d]: gate (w1) rows, then up (w3) rows
    at::Tensor w2;         // [d, hidden]
    PackedWeight wqkv_packed, wo_packed, w13_packed, w2_packed;
  };

  LlamaModel(checkpoint::ModelConfig config, ModelOptions options);
  at::Tensor StaticBlock(int64_t layer, const at::Tensor& hidden, const at::Tensor& positions,
                         const at::Tensor& slot, int64_t context, KvCache& cache) const;
  at::Tensor EagerBlock(int64_t layer, const at::Tensor& hidden, int64_t start_pos,
                        KvCache* cache, int64_t slot) const;
  // Whether a call may take the fused path: fused_, a float32 CPU hidden
  // state, a float32 CPU pool, and no gradient to record.
  bool UseFused(const at::Tensor& hidden, const KvCache* cache) const;
  // Blocks [first, last) in place on x [N, d] (rows of `segments`).
  void FusedForward(float* x, int64_t first, int64_t last, const RaggedSegment* segments,
                    int64_t n_segments, KvCache& cache) const;
  // RoPE tables for positions [0, n_positions): cos and sin, each
  // [n_positions, hd] (halves repeated), compute dtype, model device.
  // Immutable once built.
  struct RopeTables {
    at::Tensor cos, sin;
    int64_t n_positions = 0;
  };
  // Tables covering at least positions [0, n_positions) (n_positions <=
  // max_seq_len; c10::Error past it). They are sized by the context actually
  // served, never by max_seq_len up front: the cached paths ask for their
  // KV cache's capacity, cache-free passes for their own positions; a
  // larger need rebuilds them at least twice as long (capped at
  // max_seq_len). Thread-safe; the returned tables stay valid while the
  // model lives (captured graphs keep pointers into them).
  const RopeTables& Rope(int64_t n_positions) const;
  // Packs the float32 matrices the fused path reads (at load, when fused_;
  // matrices StoreMatrix packed in another format are left as they are).
  void PackWeights();
  // Rounds *w (a matrix on the model's device) to weights_ and, when
  // fused_, packs it into *p in that format (q8_0_blocks: the file's own
  // Q8_0 blocks of *w, [rows, in / 32 * 34] uint8, or undefined).
  void StoreMatrix(at::Tensor* w, const at::Tensor& q8_0_blocks, PackedWeight* p) const;
  // Whether a matrix of input dimension `in` is kept packed only (fused
  // path, read-only weights, bf16 / q8_0 that can pack `in`).
  bool PackedOnly(int64_t in) const;
  // Packs the matrix whose rows are those of `parts` (any float dtype, CPU,
  // [rows_i, in]) into *p in weights_, in chunks of rows (never a float32
  // copy of the whole matrix); q8_0_blocks as StoreMatrix's.
  void PackParts(const std::vector<at::Tensor>& parts, const at::Tensor& q8_0_blocks, PackedWeight* p) const;
  // The loading steps of FromCheckpoint (llama_weights.cc), in its order.
  // opts: the model's device and dtype; copy: options_.writable_weights.
  // StoreParts: the matrix whose rows are those of `parts` packed only
  // (PackParts), or as a tensor of opts that StoreMatrix rounds and packs.
  void StoreParts(const std::vector<at::Tensor>& parts, const at::Tensor& q8_0_blocks,
                  const at::TensorOptions& opts, bool copy, at::Tensor* w, PackedWeight* p) const;
  // StoreGgml: the ggml form g of a matrix into *p, and into *w its values
  // (the eager reference's weights) unless packed only.
  void StoreGgml(cpu::GgmlMatrix g, const at::TensorOptions& opts, at::Tensor* w, PackedWeight* p) const;
  // LoadEmbedding: final_norm_ and embed_ from the checkpoint (embed_ stays
  // undefined when the tied head is packed only).
  Status LoadEmbedding(const loaders::Checkpoint& checkpoint, const at::TensorOptions& opts, bool copy);
  // LoadLayer: layer `layer`'s norms and matrices (loaders::ReadLlamaLayer),
  // each matrix in ggml blocks or as StoreParts stores it, appended to layers_.
  Status LoadLayer(const loaders::Checkpoint& checkpoint, int64_t layer, const at::TensorOptions& opts,
                   bool copy);
  // LoadHead: the LM head (and a tied embedding's final form).
  Status LoadHead(const loaders::Checkpoint& checkpoint, const at::TensorOptions& opts, bool copy);
  // w, or (w undefined: a packed-only matrix) its values dequantized from
  // p as a float32 [rows, in] tensor, kept in p.dense when keep.
  at::Tensor Dense(const at::Tensor& w, const PackedWeight& p, bool keep = true) const;
  // p when it was packed from w as w is now, else nullptr.
  static const PackedWeight* PackedOrNull(const at::Tensor& w, const PackedWeight& p);
  at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight) const;
  at::Tensor ApplyRope(const at::Tensor& x, int64_t start_pos) const;

  checkpoint::ModelConfig config_;
  ModelOptions options_;
  at::Tensor embed_;      // [V, d]; undefined when the tied head is packed only
                          // (Embed reads its rows); bf16 / f16 when untied and
                          // the file stores it so (packed-only models)
  at::Tensor final_norm_; // [d]
  at::Tensor lm_head_;    // [V, d]; same storage as embed_ when tied; undefined
                          // when packed only
  PackedWeight lm_head_packed_;
  std::vector<Layer> layers_;
  // The newest RoPE tables (null until first needed) and every one built,
  // kept while the model lives: a caller may still read an older one.
  mutable std::atomic<const RopeTables*> rope_{nullptr};
  mutable std::mutex rope_mu_;  // guards building and rope_built_
  mutable std::vector<std::unique_ptr<const RopeTables>> rope_built_;
  bool fused_ = false;    // options_.kernels == kFused on CPU float32
  loaders::WeightFormat weights_ = loaders::WeightFormat::kF32;  // options_.weights resolved
  // Guards the PackedWeight::dense copies.
  mutable std::mutex dense_mu_;
  // The recorded decode graphs (shared/model/internal/step_graphs.h); null
  // when graphs are off. A shared_ptr, so that the implicit destructor
  // needs no complete type here.
  std::shared_ptr<internal::StepGraphs> graphs_;
};

// y = x W^T for x [..., in], W [out, in]. A single row uses a matrix-vector
// kernel (about 4x faster than linear() on one row on CPU).
at::Tensor Linear(const at::Tensor& x, const at::Tensor& w);

}  // namespace lede::model

#endif  // LEDE_SHARED_MODEL_LLAMA_H_
