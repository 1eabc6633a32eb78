// File: shared/model/decoding.h
//
// Decoding on one model and one KV pool: the Verifier (prefill, autoregressive
// step, verification of a speculation round), the Drafter (shallow-layer
// drafting at an exit layer), and the in-process Engine that runs
// autoregressive and static self-speculative decoding (LayerSkip,
// arXiv 2404.16710 §4; docs/design.md §1 "speculation round", §4 "Shared KV cache").
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

#include "shared/speculation/exit_controller.h"
#include "shared/model/batch.h"
#include "shared/model/kv_cache.h"
#include "shared/model/llama.h"
#include "shared/model/sampling.h"
#include "shared/speculation/generation.h"
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

  // Verification of K = drafts.size() draft tokens at exit layer E in
  // [1, L] (protocol step 2). Returns logits [K+1, V] float32; commits nothing.
  // last_row_ready: the drafter already ran row K (d_K, or the pending token
  // when K == 0) through layers [0, E) into scratch row K (an adaptive round
  // that probed one more draft step and stopped, or that probed every
  // candidate layer and took no exit), so the verifier skips it.
  // K == 0 requires last_row_ready: a full-depth step resumed at layer E.
  // Errors: kInvalidArgument for E outside [1, L], K > max_draft_len, or
  // K == 0 without last_row_ready; kResourceExhausted if n + K >= capacity;
  // kInternal.
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
  // Runs one drafting step (model::DraftWork, batch.h) somewhere else: the
  // drafter service hands it to its batch scheduler, which runs the steps of
  // every session drafting at that moment in one RunDrafterBatch pass.
  // Must compute what RunDrafterBatch computes for the step alone.
  using StepRunner = std::function<StatusOr<DraftStepResult>(const DraftWork&)>;

  // Without a runner every step runs alone on the calling thread
  // (RunDraftStep: LlamaModel::Forward, the CUDA graphs of StepGraphs where
  // they are on).
  Drafter(const LlamaModel& model, KvCache& cache, StepRunner runner = nullptr)
      : model_(model), cache_(cache), runner_(std::move(runner)) {}

  // Draft step `row` (0-based) of a round: `token` at position
  // length(slot) + row through layers [0, exit_layer), hidden state saved in
  // scratch row `row`. Returns the exit logits [V] float32 (docs/design.md §1).
  // Errors: kInvalidArgument for exit_layer outside [1, L] or row outside
  // [0, max_draft_len); kResourceExhausted past capacity; kInternal.
  StatusOr<at::Tensor> DraftStep(int64_t slot, int64_t row, int32_t token,
                                 int64_t exit_layer);

  // Phase 1 of an adaptive round: the pending token's hidden state `hidden`
  // ([1, 1, d], after block `first`; its embedding for first = 0) on
  // through blocks [first, last) at position length(slot), saved in scratch
  // row 0 (the verifier resumes there); returns that state and its exit
  // logits. Errors: as DraftStep, and kInvalidArgument for blocks outside
  // 0 <= first < last <= L.
  StatusOr<DraftStepResult> ProbeLayers(int64_t slot, const at::Tensor& hidden, int64_t first, int64_t last);

 private:
  // The step through the runner, or alone (RunDraftStep).
  StatusOr<DraftStepResult> Run(const DraftWork& w);

  const LlamaModel& model_;
  KvCache& cache_;
  StepRunner runner_;
};

// The loop types live in the torch-free shared/speculation (the coordinator
// runs the same loop over gRPC); these aliases keep the engine's names.
using speculation::FinishReason;
using speculation::GenerationResult;
using speculation::GenerationStats;
using speculation::RoundRecord;
using speculation::SpeculationMode;

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
  speculation::ExitController* controller = nullptr;
  speculation::DecisionSpec decision_spec;
  bool record_traces = false;  // fill GenerationResult::traces (experience)
  // kAdaptive only: the cost profile the controller sees
  // (speculation::ExitState::cost): the features of the cost model the run
  // is priced by (shared/model/cost/cost_profiles.h CostFeaturesOf). All 0:
  // unknown (a cost-blind policy ignores them).
  speculation::CostFeatures cost_features;
  // Example: {.max_new_tokens = 64, .mode = SpeculationMode::kStatic,
  //           .exit_layer = 3, .draft_len = 4}
};

// Called with the tokens each step or round emits, in order.
using TokenCallback = std::function<void(const std::vector<int32_t>&)>;

// How a drafter drafts for one request: the mode and its parameters.
struct DraftConfig {
  SpeculationMode mode = SpeculationMode::kStatic;
  int64_t exit_layer = 0;  // kStatic: E in [1, L]
  int64_t draft_len = 0;   // kStatic: D in [1, max_draft_len]
  speculation::ExitController* controller = nullptr;  // kAdaptive (borrowed)
  speculation::DecisionSpec decision_spec;            // kAdaptive
  std::string policy_version;            // recorded in each Draft
};

// Checks a DraftConfig against the model and pool: kInvalidArgument naming
// the field (exit_layer, draft_len, controller, candidate_layers,
// max_draft_len, top_k, trace_window).
Status ValidateDraftConfig(const DraftConfig& config, const checkpoint::ModelConfig& model, const KvCache& cache);

// A drafted round and, when sampling, the draft distributions q_i
// [K, V] float32 on the CPU (undefined when greedy).
struct DraftOutput {
  speculation::Draft draft;
  at::Tensor probs;
};

// The first token of a session and the rounds after it on one model and one
// KV pool, as the drafter and verifier processes (and InProcessBackend) run
// them. Sampling draws from RoundSeed(seed, position, stream)
// (shared/speculation/generation.h), so the split and the in-process paths
// agree token for token.
//
// PrefillSession: Verifier::Prefill, then picks the first token.
StatusOr<speculation::Prefilled> PrefillSession(Verifier& verifier, int64_t slot,
                                                const std::vector<int32_t>& prompt,
                                                const speculation::SessionOptions& options);
// DraftRound: one round of drafting for the pending token at position
// request.position (must equal the slot's committed length): static (E, D)
// or controller-driven (round-start gate, phase 1 probes, phase 2), writing
// K/V below l* at the draft positions and hidden states into the scratch.
// Errors: kFailedPrecondition if request.position != the committed length;
// kInvalidArgument (config, budget < 1); kResourceExhausted; kInternal.
StatusOr<DraftOutput> DraftRound(const LlamaModel& model, KvCache& cache, Drafter& drafter,
                                 int64_t slot, const DraftConfig& config,
                                 const speculation::SamplingParams& sampling,
                                 const speculation::DraftRequest& request);
// VerifyRound: verifies `draft` (greedy acceptance, or speculative sampling
// with draft_probs [K, V]), commits the kept positions and returns the
// verdict. K == 0: a full-depth step of pending_token (resuming at
// draft.ready_layer when > 0). Errors: kInvalidArgument (draft shape, ids,
// probs size); kResourceExhausted; kInternal.
StatusOr<speculation::Verdict> VerifyRound(Verifier& verifier, KvCache& cache, int64_t slot,
                                           int32_t pending_token, const speculation::Draft& draft,
                                           const at::Tensor& draft_probs,
                                           const speculation::SessionOptions& options);

// The drafter and verifier in one address space, on one model and one pool:
// the backend of Engine::Generate and of co-located deployments. Sessions
// are KV slots. Thread-safety: not thread-safe.
class InProcessBackend : public speculation::SpeculationBackend {
 public:
  // Borrows all three; they must outlive the backend.
  InProcessBackend(const LlamaModel& model, KvCache& cache, const DraftConfig& config);
  const speculation::ModelLimits& limits() const override { return limits_; }
  StatusOr<speculation::Prefilled> Open(const std::vector<int32_t>& prompt,
                                        const speculation::SessionOptions& options) override;
  StatusOr<speculation::Draft> DraftRound(int64_t session,
                                          const speculation::DraftRequest& request) override;
  StatusOr<speculation::Verdict> VerifyRound(int64_t session, int32_t pending_token,
                                             const speculation::Draft& draft) override;
  void Close(int64_t session) override;

 private:
  const LlamaModel& model_;
  KvCache& cache_;
  DraftConfig config_;
  Verifier verifier_;
  Drafter drafter_;
  speculation::ModelLimits limits_;
  speculation::SessionOptions options_;
  at::Tensor draft_probs_;  // of the round in flight
};

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

  std::shared_ptr<const LlamaModel> model_;
  KvCache cache_;
};

}  // namespace lede::model

#endif  // LEDE_SHARED_MODEL_DECODING_H_
