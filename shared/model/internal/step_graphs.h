// File: shared/model/internal/step_graphs.h
//
// StepGraphs: the recorded decode steps of one LlamaModel (CUDA
// graphs per (batch, positions) bucket; llama.h GraphMode). A bucket is
// (first, last, T rows, context): the block range of the step, its rows
// (1 for an AR or draft step, D + 1 for a verification) and the attention
// context rounded up to a power of two (at least kMinContext, at most the
// pool's capacity), so a sequence of 512 tokens moves through 4 context
// buckets rather than 512 shapes. Each bucket owns static buffers (hidden
// [1, T, d], start_pos [1], slot [1] int64, and the output) in which a call
// is copied, run, and copied out.
//
// On a CUDA build of libtorch (LEDE_WITH_CUDA) the first call of a
// bucket runs the step once on a side stream (warm-up: libraries pick their
// kernels; its K/V writes are the same the replay makes), captures
// LlamaModel::StaticForward into an at::cuda::CUDAGraph with its own memory
// pool, and every call replays it on the caller's current stream. Elsewhere
// the static-shape operators run eagerly from the same buffers, so the CPU
// tests exercise the data flow a replay depends on (inputs copied into the
// buffers, nothing read from the host).
//
// Thread-safety: Run is safe to call concurrently; calls are serialized
// (one set of buffers per bucket). Errors: throws c10::Error (hot path; the
// torch boundary converts), e.g. for T > kMaxGraphPositions.
#ifndef LEDE_SHARED_MODEL_INTERNAL_STEP_GRAPHS_H_
#define LEDE_SHARED_MODEL_INTERNAL_STEP_GRAPHS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include <ATen/core/Tensor.h>

#include "shared/model/kv_cache.h"

namespace lede::model {
class LlamaModel;
}  // namespace lede::model

namespace lede::model::internal {

class StepGraphs {
 public:
  static constexpr int64_t kMinContext = 64;

  explicit StepGraphs(const LlamaModel& model);
  ~StepGraphs();

  // The context bucket of a step ending at position end (exclusive): the
  // smallest power of two >= max(end, kMinContext), capped at capacity.
  static int64_t ContextBucket(int64_t end, int64_t capacity);

  // Blocks [first, last) on hidden [1, T, d] at positions
  // [start_pos, start_pos + T) of `slot` (LlamaModel::Forward's contract);
  // returns a new tensor [1, T, d].
  at::Tensor Run(const at::Tensor& hidden, int64_t first, int64_t last, int64_t start_pos,
                 KvCache& cache, int64_t slot);

  int64_t size() const;

 private:
  struct Graph;
  // first, last, T, context, and the pool: its K address, slots and
  // capacity (a graph bakes the pool's address and shape into its kernels).
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, const void*, int64_t, int64_t>;

  // Makes the bucket's buffers, loads the call into them and, on CUDA,
  // warms up and captures the step. Called with mu_ held.
  Graph& Record(const Key& key, const at::Tensor& hidden, int64_t first, int64_t last, int64_t start_pos,
                int64_t slot, int64_t context, KvCache& cache);

  const LlamaModel& model_;
  mutable std::mutex mu_;
  std::map<Key, std::unique_ptr<Graph>> graphs_;
};

}  // namespace lede::model::internal

#endif  // LEDE_SHARED_MODEL_INTERNAL_STEP_GRAPHS_H_
