// File: shared/model/exit_signals.h
//
// The confidence signals of an exit distribution that LEDE's state is built
// from (DESIGN.md §2): with p = softmax(logits) computed by ONE log-softmax
// over the vocabulary,
//   top1_prob = max_v p(v)
//   top_k_nll = C_k = -(1/k) sum_{v in top-k} log p(v)
//   entropy   = H   = -sum_v p(v) log p(v)            (nats)
//   top1_nll  = -log max_v p(v)
#ifndef LEDE_SHARED_MODEL_EXIT_SIGNALS_H_
#define LEDE_SHARED_MODEL_EXIT_SIGNALS_H_

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace lede::model {

struct ExitSignals {
  float top1_prob = 0;
  float top_k_nll = 0;
  float entropy = 0;
  float top1_nll = 0;
};

// logits [V] float32 (any device). top_k in [1, V].
ExitSignals ComputeExitSignals(const at::Tensor& logits, int64_t top_k);

// Top1Nll(logits) = logsumexp(logits) - max(logits) = -log max_v p(v),
// without a full log-softmax. logits [V] float32.
float Top1Nll(const at::Tensor& logits);

}  // namespace lede::model

#endif  // LEDE_SHARED_MODEL_EXIT_SIGNALS_H_
