// File: shared/model/decoding.h
//
// Decoding on one model and one KV pool: the Verifier (prefill, autoregressive
// step, verification of a speculation round), the Drafter (shallow-layer
// drafting at an exit layer), and the in-process Engine that runs
// autoregressive and static self-speculative decoding (LayerSkip,
// arXiv 2404.16710 §4; DESIGN.md §1 "speculation round", §4 "Shared KV cache").
//
// KV protocol of a round for a slot with committed length n and a pending
// token t (the last emitted token, not yet run through the model):
//   1. Drafter::DraftStep(row i) runs (t, d_1, ..., d_{K-1})[i] at position
//      n + i through layers [0, E), writing their K/V for layers < E and the
//      hidden state at E into exit-hidden scratch row i; its exit logits give
//      d_{i+1}.
//   2. Verifier::Verify runs d_K through layers [0, E) (scratch row K), then
//      layers [E, L) for rows 0..K at positions n..n+K in one pass, and
//      returns logits [K+1, V].
//   3. Verifier::Accept(a) commits positions n..n+a; the rest is rolled back
//      by leaving the committed length there (a truncation, never a copy).
//
// Thread-safety: an Engine serves one Generate() at a time (it owns a
// Sampler per call but shares the KV pool); use one Engine per thread.
#ifndef LEDE_SHARED_MODEL_DECODING_H_
#define LEDE_SHARED_MODEL_DECODING_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "shared/model/exit_controller.h"
#include "shared/model/kv_cache.h"
#include "shared/model/llama.h"
#include "shared/model/sampling.h"
#include "shared/status/status.h"

namespace lede::model {

class Verifier {
 public:
  // Borrows both; they must outlive the Verifier.
  Verifier(const LlamaModel& model, KvCache& cache) : model_(model), cache_(cache) {}

  // Runs `prompt` (P >= 1 ids) through all layers at positions [0, P) of an
  // empty slot and commits them. Returns the last position's logits [V]
  // float32. Errors: kInvalidArgument for an empty prompt, ids outside
  // [0, V), or P > capacity; kInternal on a libtorch failure.
  StatusOr<at::Tensor> Prefill(int64_t slot, const std::vector<int32_t>& prompt);

  // One autoregressive step: `token` at position n = length(slot) through all
  // layers, committed. Returns logits [V] float32.
  // Errors: kResourceExhausted if the slot is full; kInternal.
  StatusOr<at::Tensor> Step(int64_t slot, int32_t token);

  // Verification of K = drafts.size() >= 1 draft tokens at exit layer E in
  // [1, L] (protocol step 2). Returns logits [K+1, V] float32; commits nothing.
  // last_row_ready: the drafter already ran d_K through layers [0, E) into
  // scratch row K (an adaptive round that probed one more draft step and
  // stopped), so the verifier skips it.
  // Errors: kInvalidArgument for E outside [1, L] or K > max_draft_len;
  // kResourceExhausted if n + K >= capacity; kInternal.
  StatusOr<at::Tensor> Verify(int64_t slot, int64_t exit_layer,
                              const std::vector<int32_t>& drafts, bool last_row_ready = false);

  // Commits the pending token and the first n_accepted drafts (step 3).
  Status Accept(int64_t slot, int64_t n_accepted);

 private:
  const LlamaModel& model_;
  KvCache& cache_;
};

class Drafter {
 public:
  Drafter(const LlamaModel& model, KvCache& cache) : model_(model), cache_(cache) {}

  // Draft step `row` (0-based) of a round: `token` at position
  // length(slot) + row through layers [0, exit_layer), hidden state saved in
  // scratch row `row`. Returns the exit logits [V] float32 (DESIGN.md §1).
  // Errors: kInvalidArgument for exit_layer outside [1, L] or row outside
  // [0, max_draft_len); kResourceExhausted past capacity; kInternal.
  StatusOr<at::Tensor> DraftStep(int64_t slot, int64_t row, int32_t token,
                                 int64_t exit_layer);

 private:
  const LlamaModel& model_;
  KvCache& cache_;
};

// kAutoregressive: full-depth steps. kStatic: fixed exit layer E and draft
// length D. kAdaptive: an ExitController decides the exit layer (phase 1)
// and when to stop drafting (phase 2) token by token (exit_controller.h).
enum class SpeculationMode { kAutoregressive, kStatic, kAdaptive };

struct GenerateOptions {
  int64_t max_new_tokens = 128;  // tokens to generate, >= 1
  SamplingOptions sampling;      // greedy by default
  SpeculationMode mode = SpeculationMode::kAutoregressive;
  int64_t exit_layer = 0;  // E in [1, L] for kStatic (L: drafting with the full model)
  int64_t draft_len = 0;   // D in [1, max_draft_len] for kStatic
  bool stop_at_eos = true; // stop at any of the config's eos ids (not emitted)
  bool record_margins = false;  // fill GenerationResult::margins (tests, benchmarks)
  // kAdaptive only: the controller (borrowed; one per request) and where it
  // is consulted. candidate_layers must be ascending in [1, L];
  // max_draft_len in [1, KV max_draft_len].
  ExitController* controller = nullptr;
  DecisionSpec decision_spec;
  bool record_traces = false;  // fill GenerationResult::traces (experience)
  // Example: {.max_new_tokens = 64, .mode = SpeculationMode::kStatic,
  //           .exit_layer = 3, .draft_len = 4}
};

// One decoding step of the loop: an autoregressive step (n_drafted == 0) or
// a speculation round.
struct RoundRecord {
  int32_t exit_layer = 0;  // E, 0 for an autoregressive step
  int32_t n_drafted = 0;   // K
  int32_t n_accepted = 0;  // accepted drafts, in [0, K]
  int32_t n_emitted = 0;   // tokens emitted (n_accepted + 1 unless a stop cut it; a generated EOS counts)
  // Exit-head evaluations that drafted nothing: phase-1 probes below l* (or
  // all of them when no exit was taken) and a phase-2 "stop" probe.
  int32_t n_probes = 0;
};

struct GenerationStats {
  int64_t n_prompt_tokens = 0;
  int64_t n_generated = 0;  // tokens emitted (the first comes from the prefill)
  int64_t n_drafted = 0;
  int64_t n_accepted = 0;
  double prefill_s = 0;     // seconds, prefill incl. first token
  double decode_s = 0;      // seconds, everything after the first token
  std::vector<RoundRecord> rounds;
  // acceptance_rate = n_accepted / n_drafted (0 when nothing was drafted)
  double acceptance_rate() const;
  // tokens_per_round = tokens emitted by the rounds / number of rounds
  double tokens_per_round() const;
  // decode tokens per second, excluding the prefill
  double decode_tokens_per_s() const;
};

enum class FinishReason { kLength, kEos };

struct GenerationResult {
  std::vector<int32_t> tokens;  // generated ids (EOS not included)
  FinishReason finish = FinishReason::kLength;
  GenerationStats stats;
  // With record_margins: for each token, top1 - top2 of the full model's
  // logits that decided it (numerical near-tie when <= 1e-4).
  std::vector<double> margins;
  // With record_traces (kAdaptive): the decisions of every round.
  std::vector<RoundTrace> traces;
};

// Called with the tokens each step or round emits, in order.
using TokenCallback = std::function<void(const std::vector<int32_t>&)>;

// The in-process engine: one model, one KV pool.
class Engine {
 public:
  // Errors: those of KvCache::Create.
  static StatusOr<std::unique_ptr<Engine>> Create(std::shared_ptr<const LlamaModel> model,
                                                  const KvCacheOptions& cache_options);

  const LlamaModel& model() const { return *model_; }
  KvCache& cache() { return cache_; }

  // Generates a continuation of `prompt` (token ids, BOS included if wanted).
  // Errors: kInvalidArgument naming the field for an empty prompt, ids out of
  // range, max_new_tokens < 1, prompt + max_new_tokens beyond the KV
  // capacity (the context window), temperature < 0, top_p outside (0, 1],
  // exit_layer outside [1, L] or draft_len outside [1, max_draft_len] in
  // static mode; kResourceExhausted if no KV slot is free; kInternal on a
  // libtorch failure. The slot is freed on every path.
  StatusOr<GenerationResult> Generate(const std::vector<int32_t>& prompt,
                                      const GenerateOptions& options,
                                      const TokenCallback& on_tokens = nullptr);

 private:
  Engine(std::shared_ptr<const LlamaModel> model, KvCache cache);
  Status Validate(const std::vector<int32_t>& prompt, const GenerateOptions& o) const;

  std::shared_ptr<const LlamaModel> model_;
  KvCache cache_;
  Verifier verifier_;
  Drafter drafter_;
};

}  // namespace lede::model

#endif  // LEDE_SHARED_MODEL_DECODING_H_
