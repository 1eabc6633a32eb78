#include "bench/perplexity.h"

#include <algorithm>
#include <cmath>
#include <string>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "shared/model/kv_cache.h"
#include "shared/model/torch_boundary.h"
#include "shared/status/status_macros.h"

namespace lede::bench {

StatusOr<PerplexityResult> ComputePerplexity(const model::LlamaModel& model, const std::vector<int32_t>& stream,
                                             const PerplexityOptions& options) {
  const int64_t max_seq_len = model.config().max_seq_len;
  const int64_t vocab = model.config().vocab_size;
  const int64_t window = options.window == 0 ? max_seq_len : options.window;
  if (window < 2 || window > max_seq_len) {
    return InvalidArgumentError("window: " + std::to_string(window) + " outside [2, " + std::to_string(max_seq_len) +
                                "] (the model's context)");
  }
  const int64_t stride = options.stride == 0 ? std::max<int64_t>(1, window / 2) : options.stride;
  if (stride < 1 || stride > window - 1) {
    return InvalidArgumentError("stride: " + std::to_string(stride) + " outside [1, window - 1 = " +
                                std::to_string(window - 1) + "]");
  }
  if (options.chunk < 1) return InvalidArgumentError("chunk: " + std::to_string(options.chunk) + " < 1");
  if (options.max_tokens < 0) return InvalidArgumentError("max_tokens: " + std::to_string(options.max_tokens) + " < 0");
  int64_t n = static_cast<int64_t>(stream.size());
  if (options.max_tokens > 0) n = std::min(n, options.max_tokens + 1);
  if (n < 2) return InvalidArgumentError("stream: " + std::to_string(n) + " tokens, fewer than 2 (nothing to predict)");
  for (int64_t i = 0; i < n; ++i) {
    if (stream[i] < 0 || stream[i] >= vocab) {
      return InvalidArgumentError("stream: token " + std::to_string(i) + " is id " + std::to_string(stream[i]) +
                                  ", outside [0, " + std::to_string(vocab) + ")");
    }
  }

  model::KvCacheOptions kv;
  kv.n_slots = 1;
  kv.capacity = window;
  kv.max_draft_len = 1;
  kv.device = model.options().device;
  kv.dtype = model.options().dtype;
  LEDE_ASSIGN_OR_RETURN(model::KvCache cache, model::KvCache::Create(model.config(), kv));

  return model::TorchBoundary("perplexity", [&]() -> StatusOr<PerplexityResult> {
    c10::InferenceMode guard;
    PerplexityResult r;
    int64_t prev_end = 0;
    for (int64_t begin = 0;; begin += stride) {
      const int64_t end = std::min(begin + window, n);
      const int64_t score_from = std::max(prev_end, begin + 1);  // first target index scored here
      LEDE_RETURN_IF_ERROR(cache.Truncate(0, 0));
      ++r.windows;
      for (int64_t c0 = begin; c0 < end; c0 += options.chunk) {
        const int64_t c1 = std::min(c0 + options.chunk, end);
        const int64_t rows = c1 - c0;
        std::vector<int64_t> ids(stream.begin() + c0, stream.begin() + c1);
        at::Tensor h = model.Embed(at::tensor(ids, at::kLong).view({1, rows}).to(model.options().device));
        h = model.Forward(h, 0, model.n_layers(), c0 - begin, &cache, 0);
        LEDE_RETURN_IF_ERROR(cache.Commit(0, c1 - begin));
        r.positions += rows;
        // Row j of this chunk (stream index c0 + j) predicts target c0 + j + 1.
        const int64_t first_row = std::max<int64_t>(0, score_from - 1 - c0);
        const int64_t last_row = std::min<int64_t>(rows, end - 1 - c0);  // exclusive: target < end
        if (first_row >= last_row) continue;
        at::Tensor scored = h.narrow(1, first_row, last_row - first_row);
        at::Tensor logits = model.ExitLogits(scored).view({-1, vocab}).to(at::kCPU, at::kDouble);
        std::vector<int64_t> targets(stream.begin() + c0 + first_row + 1, stream.begin() + c0 + last_row + 1);
        at::Tensor tgt = at::tensor(targets, at::kLong).view({-1, 1});
        at::Tensor logp = at::log_softmax(logits, -1).gather(1, tgt);
        r.nll -= logp.sum().item<double>();
        r.top1_correct += at::eq(logits.argmax(-1), tgt.view({-1})).sum().item<int64_t>();
        r.tokens += last_row - first_row;
      }
      prev_end = end;
      if (end == n) break;
    }
    r.perplexity = std::exp(r.nll / static_cast<double>(r.tokens));
    return r;
  });
}

}  // namespace lede::bench
