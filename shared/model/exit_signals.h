// File: shared/model/exit_signals.h
//
// The confidence signals of an exit distribution that LEDE's state is built
// from (docs/design.md §2), all from one log-softmax over the vocabulary:
//   top1_prob = max_v p(v)
//   top_k_nll = C_k = -(1/k) sum_{v in top-k} log p(v)
//   entropy   = H   = -sum_v p(v) log p(v)            (nats)
//   top1_nll  = -log max_v p(v)
//   margin    = log p(top-1) - log p(top-2) (= the logit gap; >= 0)
//
// ProbeSignals is the decision machinery's hot path: one fused pass over a
// contiguous float32 buffer (max and top-k by insertion into a k-array,
// then one pass for the log-sum-exp and the entropy), no allocation, plain
// loops the compiler vectorizes. The tensor overload copies only when the
// logits are not a contiguous CPU float32 vector already.
#ifndef LEDE_SHARED_MODEL_EXIT_SIGNALS_H_
#define LEDE_SHARED_MODEL_EXIT_SIGNALS_H_

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "shared/speculation/exit_controller.h"  // ExitSignals

namespace lede::model {

// Largest top_k ProbeSignals accepts (C_k uses k = 4 by default).
inline constexpr int64_t kMaxProbeTopK = 32;

// logits [V] float32, V >= 2; top_k in [1, min(V, kMaxProbeTopK)] (clamped).
// Thread-safe (pure).
speculation::ExitSignals ProbeSignals(const float* logits, int64_t V, int64_t top_k);

// logits [V] float32 (any device; moved to the CPU if needed).
speculation::ExitSignals ComputeExitSignals(const at::Tensor& logits, int64_t top_k);

// Top1Nll(logits) = logsumexp(logits) - max(logits) = -log max_v p(v),
// without a full log-softmax. logits [V] float32.
float Top1Nll(const at::Tensor& logits);

}  // namespace lede::model

#endif  // LEDE_SHARED_MODEL_EXIT_SIGNALS_H_
