// File: shared/model/batch.h
//
// The batched verification step of continuous batching: the
// verifier's work for several sessions at once, in as few passes over the
// weights as the work allows. Each session brings one item: a prefill chunk
// (positions of its prompt through all layers), an autoregressive step (one
// position through all layers), or a speculation round's verification
// (docs/design.md §4: d_K through layers [0, E_i) unless the drafter ran it, then
// the K_i + 1 rows of the exit-hidden scratch through [E_i, L)). Rows of a
// session enter at their own layer and leave at their own layer; the step
// runs the layers in spans where the set of active rows is constant, one
// LlamaModel::ForwardRagged call per span over the rows of every session
// active there, so each layer's weights are read once per step; then one
// LM-head pass (LlamaModel::ExitLogitsRagged) for every row that needs
// logits.
//
// Lossless: on the fused CPU path a session's logits are bitwise those of
// its solo Verifier call (ForwardRagged and ExitLogitsRagged compute every
// segment's rows as a solo call does), so greedy ids and seeded samples are
// the same batched or solo. A prefill that is chunked (positions in several
// steps) equals the unchunked prefill within float32 rounding (1e-4 in the
// logits), as docs/design.md §1 allows (with packed weights, cpu::Packable, the
// products no longer depend on the row count; the 1e-4 bound is what the
// tests hold).
//
// KV protocol: as decoding.h's Verifier methods, item by item (a prefill
// chunk and a step commit their positions; a verification commits nothing,
// the round's acceptance does). The caller guarantees that no other thread
// uses an item's slot during the step (the coordinator serializes a
// session's rounds; docs/design.md §4). Distinct items must name distinct slots.
//
// Thread-safety: RunVerifierBatch / RunBatch are safe to call concurrently on
// disjoint slots (as LlamaModel's const methods); the service runs up to
// --batch-workers of them at once on disjoint sessions.
#ifndef LEDE_SHARED_MODEL_BATCH_H_
#define LEDE_SHARED_MODEL_BATCH_H_

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "shared/model/kv_cache.h"
#include "shared/model/llama.h"
#include "shared/speculation/generation.h"
#include "shared/status/status.h"

namespace lede::model {

// One item of a batched verifier forward: the work of one of
// Verifier::Prefill (a chunk of it), Verifier::Step or Verifier::Verify.
struct VerifierWork {
  enum class Kind {
    kPrefillChunk,  // tokens at positions [start_pos, start_pos + T) through all layers, committed
    kStep,          // tokens = {token} at the committed length through all layers, committed
    kVerify,        // tokens = the K drafts, verified at exit_layer (Verifier::Verify)
  };
  Kind kind = Kind::kStep;
  int64_t slot = 0;
  std::vector<int32_t> tokens;
  // kPrefillChunk: position of tokens[0]; must be the slot's committed
  // length (0 empties the slot first, as Prefill does).
  int64_t start_pos = 0;
  // kPrefillChunk: return the last row's logits (the chunk ending the prompt).
  bool want_logits = false;
  int64_t exit_layer = 0;       // kVerify: E in [1, L]
  bool last_row_ready = false;  // kVerify: as Verifier::Verify
};

// Runs every item in one batched step (see the file comment) and returns,
// per item in order, its logits float32 on the model device:
//   kPrefillChunk  [V] with want_logits, else an undefined tensor
//   kStep          [V]
//   kVerify        [K + 1, V]
// Each item is checked as its Verifier method checks it and fails on its
// own (the others still run): kInvalidArgument for ids outside [0, V), an
// empty chunk, a slot outside the pool or named twice, exit_layer outside
// [1, L], K > max_draft_len or K == 0 without last_row_ready;
// kFailedPrecondition for a chunk that does not start at the committed
// length; kResourceExhausted past the slot's capacity. A libtorch failure
// in the shared pass fails every item that was in it with kInternal.
std::vector<StatusOr<at::Tensor>> RunVerifierBatch(const LlamaModel& model, KvCache& cache,
                                                   const std::vector<VerifierWork>& work);

// One drafting step of one session (batched drafting): a row
// through blocks [first, last) at position length(slot) + row of its slot,
// writing its K/V there, its hidden state after block `last` into scratch
// row `row` of the slot (KvCache::exit_hidden(), where the verifier resumes),
// then the exit head. Drafter::DraftStep is the step with first = 0 (a
// draft token, embedded), Drafter::ProbeLayers the phase-1 probe that
// carries the pending token's hidden state on from block `first` (row 0).
// The rows of a batch leave it at their own `last` (their exit layer).
struct DraftWork {
  int64_t slot = 0;
  int64_t row = 0;           // scratch row, in [0, max_draft_len)
  int32_t token = 0;         // embedded when `hidden` is undefined
  at::Tensor hidden;         // [1, 1, d] or [1, d], compute dtype: the row after block `first`
  int64_t first = 0, last = 0;  // 0 <= first < last <= L
};

// What a drafting step computes: the row's hidden state after block `last`
// ([1, 1, d], compute dtype, model device) and its exit logits
// ([V] float32 on the model device: final norm + LM head of that state).
struct DraftStepResult {
  at::Tensor hidden;
  at::Tensor exit_logits;
};

// Runs every drafting step in one batched pass: the layers in spans where
// the set of rows is constant, one LlamaModel::ForwardRagged per span, then
// one LlamaModel::ExitLogitsRagged for every row. Lossless: on the fused
// CPU path each row's logits, K/V and scratch row are bitwise those of its
// solo Drafter call. Each step is checked on its own and fails alone:
// kInvalidArgument for a slot outside the pool or named twice, a token
// outside [0, V), blocks outside 0 <= first < last <= L, a hidden state
// that is not d wide, a row outside [0, max_draft_len);
// kResourceExhausted past the slot's capacity. A libtorch failure in the
// shared pass runs each step again alone (RunDraftStep), so that it fails
// only the steps that fail alone (kInternal), never the batch. A step's
// position and scratch row are fixed when the pass starts, and nothing in
// the pass reads the slot's committed length again: another process may
// free the slot meanwhile (KvCache::Free sets it to 0). Commits nothing
// (a round's acceptance does). Thread-safety: as RunVerifierBatch.
std::vector<StatusOr<DraftStepResult>> RunDrafterBatch(const LlamaModel& model, KvCache& cache,
                                                       const std::vector<DraftWork>& work);

// The checks of one drafting step (RunDrafterBatch's errors, a slot named
// twice aside).
Status ValidateDraftWork(const LlamaModel& model, const KvCache& cache, const DraftWork& work);

// One drafting step alone, with RunDrafterBatch's checks and errors: the
// Drafter's own path (LlamaModel::Forward, and so the CUDA graph of the
// step's shape where graphs are on), which a batch of one also takes.
StatusOr<DraftStepResult> RunDraftStep(const LlamaModel& model, KvCache& cache, const DraftWork& work);

// One session's work at round granularity (what the verifier service
// schedules): a prefill chunk of a session being opened, or the
// verification of a round (K >= 0 drafts; K == 0 and ready_layer == 0 is a
// plain autoregressive step), as PrefillSession and VerifyRound do.
struct BatchItem {
  enum class Kind { kPrefill, kRound };
  Kind kind = Kind::kRound;
  int64_t slot = 0;
  speculation::SessionOptions options;  // sampling and what to record
  // kPrefill: the whole prompt (borrowed; outlives the call); this step runs
  // prompt[chunk_start, chunk_start + chunk_len). The chunk that ends the
  // prompt picks the first token.
  const std::vector<int32_t>* prompt = nullptr;
  int64_t chunk_start = 0;
  int64_t chunk_len = 0;
  // kRound: as VerifyRound's arguments.
  int32_t pending_token = 0;
  speculation::Draft draft;
  at::Tensor draft_probs;  // [K, V] float32 when sampling with K > 0, else undefined
};

struct BatchResult {
  Status status;                  // this item's outcome; the fields below only when ok
  bool prefilled = false;         // kPrefill: the chunk ended the prompt
  speculation::Prefilled first;   // kPrefill with prefilled: the first token (session = slot)
  speculation::Verdict verdict;   // kRound: committed as VerifyRound commits it
};

// The batched step at round granularity: RunVerifierBatch over the items,
// then per item what PrefillSession (the first token, from the last chunk)
// or VerifyRound (greedy acceptance or speculative sampling, commit) does
// with the logits, with the same seeds (RoundSeed at the position), so every
// session gets the tokens of its solo run. Errors per item: those of
// PrefillSession / VerifyRound and RunVerifierBatch.
std::vector<BatchResult> RunBatch(const LlamaModel& model, KvCache& cache,
                                  const std::vector<BatchItem>& items);

}  // namespace lede::model

#endif  // LEDE_SHARED_MODEL_BATCH_H_
