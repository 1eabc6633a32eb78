#include "shared/model/internal/step_graphs.h"

#include <algorithm>

#include <ATen/ATen.h>

#if LEDE_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "shared/model/llama.h"

namespace lede::model::internal {

struct StepGraphs::Graph {
  at::Tensor hidden;     // [1, T, d] input
  at::Tensor start_pos;  // [1] int64
  at::Tensor slot;       // [1] int64
  at::Tensor out;        // [1, T, d]; written by the captured step
  int64_t first = 0, last = 0, context = 0;
  // Copies a call's inputs into the buffers.
  void Load(const at::Tensor& h, int64_t pos, int64_t s);
#if LEDE_WITH_CUDA
  std::unique_ptr<at::cuda::CUDAGraph> graph;
#endif
};

StepGraphs::StepGraphs(const LlamaModel& model) : model_(model) {}
StepGraphs::~StepGraphs() = default;

int64_t StepGraphs::ContextBucket(int64_t end, int64_t capacity) {
  int64_t c = kMinContext;
  while (c < end) c *= 2;
  return std::min(c, capacity);
}

int64_t StepGraphs::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(graphs_.size());
}

void StepGraphs::Graph::Load(const at::Tensor& h, int64_t pos, int64_t s) {
  hidden.copy_(h);
  start_pos.fill_(pos);
  slot.fill_(s);
}

StepGraphs::Graph& StepGraphs::Record(const Key& key, const at::Tensor& hidden, int64_t first,
                                      int64_t last, int64_t start_pos, int64_t slot, int64_t context,
                                      KvCache& cache) {
  auto g = std::make_unique<Graph>();
  auto iopts = at::TensorOptions().dtype(at::kLong).device(hidden.device());
  g->hidden = at::empty_like(hidden, at::MemoryFormat::Contiguous);
  g->start_pos = at::zeros({1}, iopts);
  g->slot = at::zeros({1}, iopts);
  g->first = first;
  g->last = last;
  g->context = context;
  // The call's own inputs go in first: the CUDA warm-up below really runs
  // and writes K/V at these positions of this slot (the values the replay
  // writes again), never at another session's.
  g->Load(hidden, start_pos, slot);
#if LEDE_WITH_CUDA
  if (hidden.is_cuda()) {
    g->graph = std::make_unique<at::cuda::CUDAGraph>();
    c10::cuda::getCurrentCUDAStream().synchronize();
    c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
    {
      c10::cuda::CUDAStreamGuard guard(side);
      model_.StaticForward(g->hidden, first, last, g->start_pos, g->slot, context, cache);
      side.synchronize();
      g->graph->capture_begin();  // a private memory pool per graph
      g->out = model_.StaticForward(g->hidden, first, last, g->start_pos, g->slot, context, cache);
      g->graph->capture_end();
    }
  }
#endif
  return *(graphs_[key] = std::move(g));
}

at::Tensor StepGraphs::Run(const at::Tensor& hidden, int64_t first, int64_t last, int64_t start_pos,
                           KvCache& cache, int64_t slot) {
  TORCH_CHECK(hidden.dim() == 3 && hidden.size(0) == 1, "graph step: hidden [1, T, d]");
  const int64_t T = hidden.size(1);
  TORCH_CHECK(1 <= T && T <= kMaxGraphPositions, "graph step: 1 to kMaxGraphPositions rows");
  TORCH_CHECK(0 <= start_pos && start_pos + T <= cache.capacity(), "graph step: positions past KV capacity");
  TORCH_CHECK(0 <= slot && slot < cache.n_slots(), "graph step: bad slot");
  const int64_t context = ContextBucket(start_pos + T, cache.capacity());
  const Key key{first, last, T, context, cache.k(0).data_ptr(), cache.n_slots(), cache.capacity()};
  std::lock_guard<std::mutex> lock(mu_);
  auto it = graphs_.find(key);
  Graph* g = nullptr;
  if (it == graphs_.end()) {
    g = &Record(key, hidden, first, last, start_pos, slot, context, cache);
  } else {
    g = it->second.get();
    g->Load(hidden, start_pos, slot);
  }
#if LEDE_WITH_CUDA
  if (g->graph != nullptr) {
    g->graph->replay();
    return g->out.clone();  // the buffer is the next replay's output
  }
#endif
  return model_.StaticForward(g->hidden, first, last, g->start_pos, g->slot, context, cache);
}

}  // namespace lede::model::internal
