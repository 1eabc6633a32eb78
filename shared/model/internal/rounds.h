// File: shared/model/internal/rounds.h
//
// What a prefill and a verification round do with their logits, shared by
// the solo path (decoding.cc: PrefillSession, VerifyRound) and the batched
// step (batch.cc: RunBatch), so that both pick tokens by one code path.
// Internal to lede::model.
#ifndef LEDE_SHARED_MODEL_INTERNAL_ROUNDS_H_
#define LEDE_SHARED_MODEL_INTERNAL_ROUNDS_H_

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "shared/model/kv_cache.h"
#include "shared/speculation/generation.h"
#include "shared/status/status.h"

namespace lede::model::internal {

// The first token of a session from the last prompt position's logits [V]
// (prompt of n_prompt tokens; seed RoundSeed(seed, n_prompt, verify)).
StatusOr<speculation::Prefilled> FirstToken(const at::Tensor& logits, int64_t slot, int64_t n_prompt,
                                            const speculation::SessionOptions& options);

// Checks of a round with K > 0 or a ready row before its forward:
// ready_layer 0 or l* when drafting, draft_probs [K, V] when sampling.
// Errors: kInvalidArgument naming the field.
Status CheckRound(const speculation::Draft& draft, const at::Tensor& draft_probs,
                  const speculation::SessionOptions& options);

// The verdict of a round whose forward ran: `logits` is [V] for a plain
// step (K == 0, ready_layer == 0; Verifier::Step already committed it) or
// [K + 1, V] otherwise, whose acceptance commits the kept positions. `n` is
// the committed length before the round (the sampler's seed position).
StatusOr<speculation::Verdict> FinishRound(KvCache& cache, int64_t slot, int64_t n,
                                           const speculation::Draft& draft, const at::Tensor& draft_probs,
                                           const speculation::SessionOptions& options,
                                           const at::Tensor& logits);

}  // namespace lede::model::internal

#endif  // LEDE_SHARED_MODEL_INTERNAL_ROUNDS_H_
