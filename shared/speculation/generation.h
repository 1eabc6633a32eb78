// File: shared/speculation/generation.h
//
// The speculation loop of one request, written once and torch-free
// (docs/design.md §1 "speculation round", §3 "coordinator"). It runs on any
// SpeculationBackend: the in-process engine (shared/model/decoding.h,
// drafter and verifier in one address space) and the coordinator's gRPC
// backend (drafter and verifier processes on a shared KV pool) drive the
// same RunGeneration(), so both emit the same tokens for the same request.
//
// A request is: open a session (allocate a KV slot, prefill the prompt, pick
// the first token), then rounds until a stop: each round the backend drafts
// (an exit layer l* and K >= 0 draft tokens, decided by the drafter's
// exit controller) and verifies (the full model accepts a prefix and adds
// one token), then the session is closed on every path.
//
// Sampling randomness is keyed by position, not by call order: the drafter
// of the round whose pending token sits at position n draws from
// RoundSeed(seed, n, kDraftStream) and the verifier from
// RoundSeed(seed, n, kVerifyStream). So a seeded request gives the same
// tokens whether drafter and verifier share a process or not.
#ifndef LEDE_SHARED_SPECULATION_GENERATION_H_
#define LEDE_SHARED_SPECULATION_GENERATION_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "shared/speculation/exit_controller.h"
#include "shared/status/status.h"

namespace lede::speculation {

// kAutoregressive: full-depth steps. kStatic: fixed exit layer E and draft
// length D. kAdaptive: an exit controller decides the exit layer (phase 1)
// and when to stop drafting (phase 2) token by token (docs/design.md §2).
enum class SpeculationMode { kAutoregressive, kStatic, kAdaptive };

struct SamplingParams {
  double temperature = 0.0;  // 0 = greedy (argmax); > 0 divides the logits
  double top_p = 1.0;        // nucleus mass in (0, 1]
  uint64_t seed = 0;         // sampling seed (ignored when greedy)
  bool greedy() const { return temperature <= 0.0; }
};

// Random streams of RoundSeed.
inline constexpr uint64_t kDraftStream = 1;
inline constexpr uint64_t kVerifyStream = 2;
// The seed of the sampler a round uses: a SplitMix64 mix of the request
// seed, the position n of the round's pending token (the committed length)
// and the stream.
uint64_t RoundSeed(uint64_t seed, int64_t position, uint64_t stream);

// What RunGeneration needs to know about the model behind a backend.
struct ModelLimits {
  int32_t n_layers = 0;          // L
  int32_t vocab_size = 0;        // V
  int64_t capacity = 0;          // KV capacity per session (its slot), tokens
  // The model's context window, tokens; 0 = capacity. A request that fits
  // the window but not the slot (whose size a KV memory budget set) is
  // kResourceExhausted rather than kInvalidArgument.
  int64_t context_window = 0;
  std::vector<int32_t> eos_ids;  // stop tokens (not emitted)
};

// What a session records besides the tokens.
struct SessionOptions {
  SamplingParams sampling;
  bool record_nll = false;      // fill Verdict::nll (C_trace of adaptive rounds)
  bool record_margins = false;  // fill Verdict::margins (tests, benchmarks)
  // The most tokens the session will emit (LoopOptions::max_new_tokens; set
  // by RunGeneration): a backend may reserve KV for prompt + this. 0 = unknown.
  int64_t max_new_tokens = 0;
};

// The first token, chosen from the prefill's last-position logits.
struct Prefilled {
  int64_t session = 0;  // backend's handle, passed back to Draft/Verify/Close
  int32_t token = 0;
  double nll = 0;       // -log p_L(token) at top-1 (with record_nll)
  double margin = 0;    // top1 - top2 logit (with record_margins)
};

// What the loop asks of the drafter each round.
struct DraftRequest {
  int32_t pending_token = 0;  // last emitted token, not yet run through the model
  int64_t position = 0;       // its position n = the session's committed length
  int64_t budget = 0;         // at most this many drafts (tokens left - 1, KV room); >= 1
  double trace_nll = 0;       // C_trace: mean top-1 NLL of the last W emitted tokens
  // The request's acceptance EMA over its earlier rounds (UpdateAcceptEma).
  double accept_ema = ExitState::kAcceptEmaPrior;
  int64_t round_index = 0;    // within the request
  // Sessions decoding at once, this one included (ExitState::load),
  // >= 1: LoopOptions::current_load when the round starts.
  int32_t load = 1;
  // The deployment's cost profile (ExitState::cost): LoopOptions::
  // current_cost when the round starts; all 0 when unknown.
  CostFeatures cost;
  // The session's sampling temperature (ExitState::temperature; 0 greedy):
  // SessionOptions::sampling of the session the round drafts for (a remote
  // drafter reads it from the wire's DraftRequest.sampling).
  float temperature = 0;
  bool record_trace = false;  // fill Draft::trace (experience)
  // The last kNgramWindow committed tokens (prompt + emitted), ending
  // with pending_token: what the context n-gram signals of the round's
  // probes look back over (ContextNgram). Empty: those signals are 0.
  std::vector<int32_t> context;
};

// A drafted round (docs/design.md §1): K = tokens.size() >= 0 draft tokens at exit
// layer l* = exit_layer. ready_layer > 0 means the last row (row K: d_K, or the
// pending token when K == 0) has already been run through layers
// [0, ready_layer) and its hidden state sits in exit-hidden scratch row K,
// so the verifier starts there: for K >= 1 ready_layer is 0 or l*; for K == 0
// it is the deepest layer probed (the round became a full-depth step that
// resumes at that layer) or 0 (a plain step).
struct Draft {
  int32_t exit_layer = 0;            // l* in [1, L], 0 when nothing was drafted
  std::vector<int32_t> tokens;       // [K] draft ids
  // [K, V] float32 row-major: the warped draft distributions q_i, only when
  // sampling (speculative sampling needs them); empty when greedy.
  std::vector<float> probs;
  int32_t ready_layer = 0;
  int32_t n_probes = 0;              // exit-head evaluations that drafted nothing
  int32_t n_decisions = 0;           // exit-controller decisions of the round
  RoundTrace trace;           // decisions (adaptive, with record_trace)
  std::string policy_version;        // the controller's version ("" for static)
};

// The verifier's verdict on a round (or an autoregressive step): the first
// n_accepted drafts are kept and `tokens` = accepted drafts + the correction
// or bonus token (n_accepted + 1 ids), all committed to the KV cache.
struct Verdict {
  int32_t n_accepted = 0;
  std::vector<int32_t> tokens;
  std::vector<double> nll;      // per token, with record_nll
  std::vector<double> margins;  // per token, with record_margins
};

// Drafting and verification for sessions on one model. Implementations:
// model::InProcessBackend (shared/model/decoding.h) and the coordinator's
// gRPC backend.
// Thread-safety: implementation-defined; RunGeneration calls one session's
// methods from one thread, in order.
class SpeculationBackend {
 public:
  virtual ~SpeculationBackend() = default;
  virtual const ModelLimits& limits() const = 0;
  // Allocates a KV slot, prefills `prompt` and picks the first token.
  // Errors: kInvalidArgument (prompt), kResourceExhausted (no free slot),
  // kUnavailable (a remote process), kInternal.
  virtual StatusOr<Prefilled> Open(const std::vector<int32_t>& prompt,
                                   const SessionOptions& options) = 0;
  // Drafts one round; never commits. Errors as Open.
  virtual StatusOr<Draft> DraftRound(int64_t session, const DraftRequest& request) = 0;
  // Verifies `draft` (K == 0 and ready_layer == 0: a plain full-depth step
  // of pending_token) and commits the kept positions.
  virtual StatusOr<Verdict> VerifyRound(int64_t session, int32_t pending_token,
                                        const Draft& draft) = 0;
  // Frees the session's KV slot. Idempotent.
  virtual void Close(int64_t session) = 0;
};

// One decoding step of the loop: an autoregressive step (n_drafted == 0) or
// a speculation round.
struct RoundRecord {
  int32_t exit_layer = 0;  // l*, 0 for an autoregressive step
  int32_t n_drafted = 0;   // K
  int32_t n_accepted = 0;  // accepted drafts, in [0, K]
  int32_t n_emitted = 0;   // tokens emitted (n_accepted + 1 unless a stop cut it; a generated EOS counts)
  int32_t n_probes = 0;    // exit-head evaluations that drafted nothing
  int32_t n_decisions = 0; // exit-controller decisions (each with its probe signals)
  double latency_s = 0;    // wall time of the round, seconds
  // The round's two steps as a model service times them (shared/experience/
  // served_costs.h): the draft (the backend's DraftRound: probes, decisions
  // and K drafts; 0 when it did not draft) and the verification (its
  // VerifyRound: K + 1 positions, or one autoregressive step), seconds,
  // each within latency_s.
  double draft_s = 0;
  double verify_s = 0;
  bool over_max_load = false;  // an autoregressive step because the load was above speculation_max_load
};

struct GenerationStats {
  int64_t n_prompt_tokens = 0;
  int64_t n_generated = 0;  // tokens emitted (the first comes from the prefill)
  int64_t n_drafted = 0;
  int64_t n_accepted = 0;
  double prefill_s = 0;     // seconds, prefill incl. first token (time to first token)
  double decode_s = 0;      // seconds, everything after the first token
  std::vector<RoundRecord> rounds;
  // acceptance_rate = n_accepted / n_drafted (0 when nothing was drafted)
  double acceptance_rate() const;
  // tokens_per_round = tokens emitted by the rounds / number of rounds
  double tokens_per_round() const;
  // decode tokens per second, excluding the prefill
  double decode_tokens_per_s() const;
  // mean l* and mean K over the rounds that drafted (0 when none did)
  double mean_exit_layer() const;
  double mean_draft_len() const;
};

enum class FinishReason { kLength, kEos, kStop };

struct GenerationResult {
  std::vector<int32_t> tokens;  // generated ids (EOS not included)
  FinishReason finish = FinishReason::kLength;
  GenerationStats stats;
  std::vector<double> margins;  // with record_margins: per token
  std::vector<RoundTrace> traces;  // with record_traces (adaptive rounds)
  std::string policy_version;   // the drafter's controller version of the last round
};

struct LoopOptions {
  int64_t max_new_tokens = 128;  // >= 1
  SpeculationMode mode = SpeculationMode::kAutoregressive;
  SessionOptions session;
  bool stop_at_eos = true;       // stop at any eos id (not emitted)
  bool record_traces = false;    // adaptive: keep each round's decisions
  int32_t trace_window = 8;      // W of C_trace, in emitted tokens
  // The load each round reports to the exit policy (DraftRequest::load):
  // called once per round from the generation's thread; null, or a value
  // below 1, is 1. The coordinator gives its requests in flight.
  std::function<int32_t()> current_load;
  // The cost profile each round reports to the exit policy
  // (DraftRequest::cost): called once per drafting round from the
  // generation's thread; null is all 0 (unknown). The coordinator gives the
  // model services' measured costs, an in-process run the cost model it is
  // priced by.
  std::function<CostFeatures()> current_cost;
  // The most load at which a round still speculates: a round that starts at
  // a load above it (current_load, as above) runs as an autoregressive step,
  // the load asked once for that round all the same (vLLM's
  // speculative_disable_by_batch_size, per round instead of per request;
  // TensorRT-LLM's batch-size schedule ending at draft length 0). 0: no
  // limit. For a cost model under which speculation loses from some load on
  // (`lede-bench load` prints where), whatever the policy decides.
  int32_t speculation_max_load = 0;
};

// Called with the tokens each step or round emits, in order. Returning false
// stops the generation (FinishReason::kStop; e.g. a stop string matched or
// the client went away) after the tokens already emitted.
using TokenSink = std::function<bool(const std::vector<int32_t>& tokens)>;

// Runs one request on `backend`. Validates max_new_tokens >= 1 and that the
// prompt plus max_new_tokens fits the capacity (kInvalidArgument naming the
// field); other errors come from the backend. The session is closed on
// every path.
StatusOr<GenerationResult> RunGeneration(SpeculationBackend& backend,
                                         const std::vector<int32_t>& prompt,
                                         const LoopOptions& options,
                                         const TokenSink& on_tokens = nullptr);

}  // namespace lede::speculation

#endif  // LEDE_SHARED_SPECULATION_GENERATION_H_
