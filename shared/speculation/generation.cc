#include "shared/speculation/generation.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <numeric>
#include <string>
#include <utility>

#include "shared/status/status_macros.h"

namespace lede::speculation {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// C_trace: mean of the last W values pushed.
class TraceWindow {
 public:
  explicit TraceWindow(int32_t window) : window_(std::max(1, window)) {}
  void Push(double v) {
    values_.push_back(v);
    sum_ += v;
    if (static_cast<int32_t>(values_.size()) > window_) {
      sum_ -= values_.front();
      values_.pop_front();
    }
  }
  double Mean() const { return values_.empty() ? 0.0 : sum_ / values_.size(); }

 private:
  int32_t window_;
  std::deque<double> values_;
  double sum_ = 0;
};

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t RoundSeed(uint64_t seed, int64_t position, uint64_t stream) {
  return SplitMix64(SplitMix64(SplitMix64(seed) ^ static_cast<uint64_t>(position)) ^ stream);
}

double GenerationStats::acceptance_rate() const {
  return n_drafted > 0 ? static_cast<double>(n_accepted) / n_drafted : 0.0;
}

double GenerationStats::tokens_per_round() const {
  if (rounds.empty()) return 0.0;
  int64_t emitted = 0;
  for (const RoundRecord& r : rounds) emitted += r.n_emitted;
  return static_cast<double>(emitted) / rounds.size();
}

double GenerationStats::decode_tokens_per_s() const {
  return decode_s > 0 && n_generated > 1 ? (n_generated - 1) / decode_s : 0.0;
}

double GenerationStats::mean_exit_layer() const {
  int64_t n = 0, sum = 0;
  for (const RoundRecord& r : rounds) {
    if (r.n_drafted > 0) ++n, sum += r.exit_layer;
  }
  return n > 0 ? static_cast<double>(sum) / n : 0.0;
}

double GenerationStats::mean_draft_len() const {
  int64_t n = 0, sum = 0;
  for (const RoundRecord& r : rounds) {
    if (r.n_drafted > 0) ++n, sum += r.n_drafted;
  }
  return n > 0 ? static_cast<double>(sum) / n : 0.0;
}

namespace {

// Checks the loop's inputs against the model; INVALID_ARGUMENT naming the field.
Status ValidateInputs(const ModelLimits& limits, const std::vector<int32_t>& prompt, const LoopOptions& o) {
  if (prompt.empty()) return InvalidArgumentError("prompt: is empty");
  if (o.max_new_tokens < 1) {
    return InvalidArgumentError("max_new_tokens: must be >= 1, got " + std::to_string(o.max_new_tokens));
  }
  const int64_t P = static_cast<int64_t>(prompt.size());
  if (P + o.max_new_tokens > limits.capacity && P + o.max_new_tokens <= limits.context_window) {
    return ResourceExhaustedError("prompt: " + std::to_string(P) + " tokens + max_new_tokens " +
                                  std::to_string(o.max_new_tokens) + " need more KV memory than one sequence may "
                                  "hold (" + std::to_string(limits.capacity) + " tokens, set by the server's KV "
                                  "memory budget; the model's context window is " +
                                  std::to_string(limits.context_window) + ")");
  }
  if (P + o.max_new_tokens > limits.capacity) {
    return InvalidArgumentError("prompt: " + std::to_string(P) + " tokens + max_new_tokens " +
                                std::to_string(o.max_new_tokens) + " exceed the context window of " +
                                std::to_string(limits.capacity) + " tokens");
  }
  const SamplingParams& s = o.session.sampling;
  if (!(s.temperature >= 0.0)) return InvalidArgumentError("temperature: must be >= 0");
  if (!(s.top_p > 0.0 && s.top_p <= 1.0)) return InvalidArgumentError("top_p: must be in (0, 1]");
  for (int32_t id : prompt) {
    if (id < 0 || id >= limits.vocab_size) {
      return InvalidArgumentError("prompt: token id " + std::to_string(id) + " outside [0, " +
                                  std::to_string(limits.vocab_size) + ")");
    }
  }
  return OkStatus();
}

// One request's loop after the prefill: the output so far, the stop
// conditions, and the per-request signals the drafter sees (C_trace, the
// acceptance EMA).
class Loop {
 public:
  Loop(SpeculationBackend& backend, int64_t session, const LoopOptions& o, const SessionOptions& session_options,
       const TokenSink& on_tokens, const std::vector<int32_t>& prompt)
      : backend_(backend),
        limits_(backend.limits()),
        session_(session),
        o_(o),
        session_options_(session_options),
        on_tokens_(on_tokens),
        prompt_len_(static_cast<int64_t>(prompt.size())),
        trace_(o.trace_window) {
    result_.stats.n_prompt_tokens = prompt_len_;
    if (o.mode == SpeculationMode::kAdaptive) {
      context_.assign(prompt.end() - std::min<int64_t>(prompt_len_, kNgramWindow), prompt.end());
    }
  }

  bool done() const { return done_; }
  GenerationResult& result() { return result_; }

  // Appends one token unless a stop condition holds; returns false once done.
  bool Emit(int32_t token, double nll, double margin) {
    if (done_) return false;
    if (o_.stop_at_eos && std::find(limits_.eos_ids.begin(), limits_.eos_ids.end(), token) != limits_.eos_ids.end()) {
      result_.finish = FinishReason::kEos;
      done_ = true;
      stopped_on_eos_ = true;
      return false;
    }
    result_.tokens.push_back(token);
    emitted_now_.push_back(token);
    if (o_.mode == SpeculationMode::kAdaptive) {
      context_.push_back(token);
      // Keep at most twice the window, trimming in O(window) amortized.
      if (static_cast<int64_t>(context_.size()) >= 2 * kNgramWindow) {
        context_.erase(context_.begin(), context_.end() - kNgramWindow);
      }
    }
    if (session_options_.record_nll) trace_.Push(nll);
    if (session_options_.record_margins) result_.margins.push_back(margin);
    if (static_cast<int64_t>(result_.tokens.size()) >= o_.max_new_tokens) {
      result_.finish = FinishReason::kLength;
      done_ = true;
    }
    return true;
  }

  // Hands the tokens emitted since the last call to the sink; a sink that
  // returns false stops the request (kStop).
  void Flush() {
    if (on_tokens_ && !emitted_now_.empty() && !on_tokens_(emitted_now_) && !done_) {
      result_.finish = FinishReason::kStop;
      done_ = true;
    }
    emitted_now_.clear();
  }

  // One speculation round: draft (unless autoregressive or no budget is
  // left), verify, emit the verified tokens, record the round.
  Status Round() {
    const auto round_t0 = Clock::now();
    const int32_t pending = result_.tokens.back();
    const int64_t position = prompt_len_ + static_cast<int64_t>(result_.tokens.size()) - 1;  // committed length
    const int64_t remaining = o_.max_new_tokens - static_cast<int64_t>(result_.tokens.size());
    const int64_t room = limits_.capacity - position - 1;
    const int64_t budget = std::min(remaining - 1, room);
    Draft draft;
    double draft_s = 0;
    const bool may_draft = o_.mode != SpeculationMode::kAutoregressive && budget > 0;
    const int32_t load = may_draft && o_.current_load ? std::max<int32_t>(1, o_.current_load()) : 1;
    const bool over_max_load = may_draft && o_.speculation_max_load > 0 && load > o_.speculation_max_load;
    if (may_draft && !over_max_load) {
      DraftRequest request;
      request.pending_token = pending;
      request.position = position;
      request.budget = budget;
      request.trace_nll = trace_.Mean();
      request.accept_ema = accept_ema_;
      request.load = load;
      if (o_.current_cost) request.cost = o_.current_cost();
      request.temperature = static_cast<float>(session_options_.sampling.temperature);
      request.round_index = static_cast<int64_t>(result_.stats.rounds.size());
      request.record_trace = o_.record_traces;
      if (!context_.empty()) {
        const int64_t n = std::min<int64_t>(static_cast<int64_t>(context_.size()), kNgramWindow);
        request.context.assign(context_.end() - n, context_.end());
      }
      const auto draft_t0 = Clock::now();
      LEDE_ASSIGN_OR_RETURN(draft, backend_.DraftRound(session_, request));
      draft_s = SecondsSince(draft_t0);
    }
    const auto verify_t0 = Clock::now();
    LEDE_ASSIGN_OR_RETURN(Verdict verdict, backend_.VerifyRound(session_, pending, draft));
    const double verify_s = SecondsSince(verify_t0);
    const int32_t K = static_cast<int32_t>(draft.tokens.size());
    if (verdict.n_accepted < 0 || verdict.n_accepted > K ||
        verdict.tokens.size() != static_cast<size_t>(verdict.n_accepted) + 1) {
      return InternalError("verifier returned " + std::to_string(verdict.tokens.size()) + " tokens with n_accepted " +
                           std::to_string(verdict.n_accepted) + " for " + std::to_string(K) + " drafts");
    }
    RoundRecord round;
    round.exit_layer = K > 0 ? draft.exit_layer : 0;
    round.n_drafted = K;
    round.n_accepted = verdict.n_accepted;
    round.n_probes = draft.n_probes;
    round.n_decisions = draft.n_decisions;
    round.over_max_load = over_max_load;
    round.draft_s = draft_s;
    round.verify_s = verify_s;
    accept_ema_ = UpdateAcceptEma(accept_ema_, K, verdict.n_accepted);
    result_.stats.n_drafted += K;
    result_.stats.n_accepted += verdict.n_accepted;
    const size_t before = result_.tokens.size();
    for (size_t i = 0; i < verdict.tokens.size(); ++i) {
      Emit(verdict.tokens[i], i < verdict.nll.size() ? verdict.nll[i] : 0.0,
           i < verdict.margins.size() ? verdict.margins[i] : 0.0);
    }
    round.n_emitted = static_cast<int32_t>(result_.tokens.size() - before) + (stopped_on_eos_ ? 1 : 0);
    if (o_.record_traces && !draft.trace.decisions.empty()) RecordTrace(std::move(draft.trace), round);
    if (!draft.policy_version.empty()) result_.policy_version = draft.policy_version;
    round.latency_s = SecondsSince(round_t0);
    result_.stats.rounds.push_back(round);
    Flush();
    return OkStatus();
  }

 private:
  // The round's decisions, each marked accepted when its draft was.
  void RecordTrace(RoundTrace rt, const RoundRecord& round) {
    for (Decision& d : rt.decisions) d.accepted = d.draft_index >= 0 && d.draft_index < round.n_accepted;
    rt.round_index = static_cast<int64_t>(result_.stats.rounds.size());
    rt.exit_layer = round.exit_layer;
    rt.n_drafted = round.n_drafted;
    rt.n_accepted = round.n_accepted;
    result_.traces.push_back(std::move(rt));
  }

  SpeculationBackend& backend_;
  const ModelLimits& limits_;
  const int64_t session_;
  const LoopOptions& o_;
  const SessionOptions& session_options_;
  const TokenSink& on_tokens_;
  const int64_t prompt_len_;
  GenerationResult result_;
  TraceWindow trace_;
  float accept_ema_ = ExitState::kAcceptEmaPrior;
  bool done_ = false;
  bool stopped_on_eos_ = false;  // the EOS the model generated counts as its round's output
  std::vector<int32_t> emitted_now_;
  // Adaptive mode: the committed tokens (prompt + emitted), the last
  // kNgramWindow to 2 * kNgramWindow of them (DraftRequest::context).
  std::vector<int32_t> context_;
};

}  // namespace

StatusOr<GenerationResult> RunGeneration(SpeculationBackend& backend, const std::vector<int32_t>& prompt,
                                         const LoopOptions& o, const TokenSink& on_tokens) {
  LEDE_RETURN_IF_ERROR(ValidateInputs(backend.limits(), prompt, o));
  SessionOptions session_options = o.session;
  session_options.record_nll = session_options.record_nll || o.mode == SpeculationMode::kAdaptive;
  session_options.max_new_tokens = o.max_new_tokens;
  const auto t0 = Clock::now();
  LEDE_ASSIGN_OR_RETURN(Prefilled first, backend.Open(prompt, session_options));
  struct SessionGuard {
    SpeculationBackend& backend;
    int64_t session;
    ~SessionGuard() { backend.Close(session); }
  } guard{backend, first.session};

  Loop loop(backend, first.session, o, session_options, on_tokens, prompt);
  loop.Emit(first.token, first.nll, first.margin);
  loop.Flush();
  GenerationStats& stats = loop.result().stats;
  stats.prefill_s = SecondsSince(t0);
  const auto t1 = Clock::now();
  while (!loop.done()) LEDE_RETURN_IF_ERROR(loop.Round());
  stats.decode_s = SecondsSince(t1);
  stats.n_generated = static_cast<int64_t>(loop.result().tokens.size());
  return std::move(loop.result());
}

}  // namespace lede::speculation
