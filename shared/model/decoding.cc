#include "shared/model/decoding.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "shared/model/exit_signals.h"
#include "shared/status/status_macros.h"

namespace lede::model {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Runs `fn` at the torch boundary: libtorch exceptions become kInternal.
template <typename Fn>
auto TorchBoundary(const char* what, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const c10::Error& e) {
    return InternalError(std::string(what) + ": " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return InternalError(std::string(what) + ": " + e.what());
  }
}

at::Tensor TokenTensor(const std::vector<int32_t>& ids, const c10::Device& device) {
  std::vector<int64_t> wide(ids.begin(), ids.end());
  return at::tensor(wide, at::TensorOptions().dtype(at::kLong)).view({1, -1}).to(device);
}

int32_t Argmax(const at::Tensor& logits) {
  return static_cast<int32_t>(logits.argmax().item<int64_t>());
}

}  // namespace

// ---------------------------------------------------------------- Verifier

StatusOr<at::Tensor> Verifier::Prefill(int64_t slot, const std::vector<int32_t>& prompt) {
  const int64_t P = static_cast<int64_t>(prompt.size());
  if (P == 0) return InvalidArgumentError("prompt is empty");
  if (P > cache_.capacity()) {
    return InvalidArgumentError("prompt has " + std::to_string(P) +
                                " tokens, more than the context window of " +
                                std::to_string(cache_.capacity()));
  }
  for (int32_t id : prompt) {
    if (id < 0 || id >= model_.config().vocab_size) {
      return InvalidArgumentError("prompt token id " + std::to_string(id) + " outside [0, " +
                                  std::to_string(model_.config().vocab_size) + ")");
    }
  }
  LEDE_RETURN_IF_ERROR(cache_.Truncate(slot, 0));
  return TorchBoundary("prefill", [&]() -> StatusOr<at::Tensor> {
    at::Tensor h = model_.Embed(TokenTensor(prompt, model_.options().device));
    h = model_.Forward(h, 0, model_.n_layers(), 0, &cache_, slot);
    LEDE_RETURN_IF_ERROR(cache_.Commit(slot, P));
    return model_.ExitLogits(h.narrow(1, P - 1, 1)).view({-1});
  });
}

StatusOr<at::Tensor> Verifier::Step(int64_t slot, int32_t token) {
  const int64_t n = cache_.length(slot);
  if (n >= cache_.capacity()) return ResourceExhaustedError("KV slot is full");
  return TorchBoundary("step", [&]() -> StatusOr<at::Tensor> {
    at::Tensor h = model_.Embed(TokenTensor({token}, model_.options().device));
    h = model_.Forward(h, 0, model_.n_layers(), n, &cache_, slot);
    LEDE_RETURN_IF_ERROR(cache_.Commit(slot, n + 1));
    return model_.ExitLogits(h).view({-1});
  });
}

StatusOr<at::Tensor> Verifier::Verify(int64_t slot, int64_t exit_layer,
                                      const std::vector<int32_t>& drafts, bool last_row_ready) {
  const int64_t K = static_cast<int64_t>(drafts.size());
  const int64_t L = model_.n_layers();
  if (exit_layer < 1 || exit_layer > L) {
    return InvalidArgumentError("exit_layer " + std::to_string(exit_layer) + " outside [1, " +
                                std::to_string(L) + "]");
  }
  if (K < 1 || K > cache_.max_draft_len()) {
    return InvalidArgumentError("draft length " + std::to_string(K) + " outside [1, " +
                                std::to_string(cache_.max_draft_len()) + "]");
  }
  const int64_t n = cache_.length(slot);
  if (n + K >= cache_.capacity()) return ResourceExhaustedError("KV slot is full");
  return TorchBoundary("verify", [&]() -> StatusOr<at::Tensor> {
    at::Tensor scratch = cache_.exit_hidden().select(0, slot);  // [D_max+1, d]
    if (!last_row_ready) {  // the last draft token has not been through the shallow blocks yet
      at::Tensor last = model_.Embed(TokenTensor({drafts.back()}, model_.options().device));
      last = model_.Forward(last, 0, exit_layer, n + K, &cache_, slot);
      scratch.narrow(0, K, 1).copy_(last.view({1, -1}));
    }
    at::Tensor h = scratch.narrow(0, 0, K + 1).unsqueeze(0);  // [1, K+1, d]
    h = model_.Forward(h, exit_layer, L, n, &cache_, slot);
    return model_.ExitLogits(h).view({K + 1, -1});
  });
}

Status Verifier::Accept(int64_t slot, int64_t n_accepted) {
  return cache_.Commit(slot, cache_.length(slot) + n_accepted + 1);
}

// ----------------------------------------------------------------- Drafter

StatusOr<at::Tensor> Drafter::DraftStep(int64_t slot, int64_t row, int32_t token,
                                        int64_t exit_layer) {
  const int64_t L = model_.n_layers();
  if (exit_layer < 1 || exit_layer > L) {
    return InvalidArgumentError("exit_layer " + std::to_string(exit_layer) + " outside [1, " +
                                std::to_string(L) + "]");
  }
  if (row < 0 || row >= cache_.max_draft_len()) {
    return InvalidArgumentError("draft row " + std::to_string(row) + " outside [0, " +
                                std::to_string(cache_.max_draft_len()) + ")");
  }
  const int64_t pos = cache_.length(slot) + row;
  if (pos >= cache_.capacity()) return ResourceExhaustedError("KV slot is full");
  return TorchBoundary("draft", [&]() -> StatusOr<at::Tensor> {
    at::Tensor h = model_.Embed(TokenTensor({token}, model_.options().device));
    h = model_.Forward(h, 0, exit_layer, pos, &cache_, slot);
    cache_.exit_hidden().select(0, slot).narrow(0, row, 1).copy_(h.view({1, -1}));
    return model_.ExitLogits(h).view({-1});
  });
}

// ------------------------------------------------------------------ Engine

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

Engine::Engine(std::shared_ptr<const LlamaModel> model, KvCache cache)
    : model_(std::move(model)),
      cache_(std::move(cache)),
      verifier_(*model_, cache_),
      drafter_(*model_, cache_) {}

StatusOr<std::unique_ptr<Engine>> Engine::Create(std::shared_ptr<const LlamaModel> model,
                                                 const KvCacheOptions& cache_options) {
  KvCacheOptions o = cache_options;
  o.device = model->options().device;
  o.dtype = model->options().dtype;
  LEDE_ASSIGN_OR_RETURN(KvCache cache, KvCache::Create(model->config(), o));
  return std::unique_ptr<Engine>(new Engine(std::move(model), std::move(cache)));
}

Status Engine::Validate(const std::vector<int32_t>& prompt, const GenerateOptions& o) const {
  const ModelConfig& c = model_->config();
  if (prompt.empty()) return InvalidArgumentError("prompt: is empty");
  if (o.max_new_tokens < 1) {
    return InvalidArgumentError("max_new_tokens: must be >= 1, got " +
                                std::to_string(o.max_new_tokens));
  }
  const int64_t P = static_cast<int64_t>(prompt.size());
  if (P + o.max_new_tokens > cache_.capacity()) {
    return InvalidArgumentError("prompt: " + std::to_string(P) + " tokens + max_new_tokens " +
                                std::to_string(o.max_new_tokens) +
                                " exceed the context window of " +
                                std::to_string(cache_.capacity()) + " tokens");
  }
  if (!(o.sampling.temperature >= 0.0)) {
    return InvalidArgumentError("temperature: must be >= 0");
  }
  if (!(o.sampling.top_p > 0.0 && o.sampling.top_p <= 1.0)) {
    return InvalidArgumentError("top_p: must be in (0, 1]");
  }
  if (o.mode == SpeculationMode::kStatic) {
    if (o.exit_layer < 1 || o.exit_layer > c.n_layers) {
      return InvalidArgumentError("exit_layer: " + std::to_string(o.exit_layer) +
                                  " outside [1, " + std::to_string(c.n_layers) + "]");
    }
    if (o.draft_len < 1 || o.draft_len > cache_.max_draft_len()) {
      return InvalidArgumentError("draft_len: " + std::to_string(o.draft_len) +
                                  " outside [1, " + std::to_string(cache_.max_draft_len()) + "]");
    }
  }
  if (o.mode == SpeculationMode::kAdaptive) {
    const DecisionSpec& d = o.decision_spec;
    if (o.controller == nullptr) return InvalidArgumentError("controller: required in adaptive mode");
    if (d.candidate_layers.empty()) return InvalidArgumentError("candidate_layers: empty");
    int32_t prev = 0;
    for (int32_t l : d.candidate_layers) {
      if (l <= prev || l > c.n_layers) {
        return InvalidArgumentError("candidate_layers: must ascend within [1, " +
                                    std::to_string(c.n_layers) + "], got " + std::to_string(l));
      }
      prev = l;
    }
    if (d.max_draft_len < 1 || d.max_draft_len > cache_.max_draft_len()) {
      return InvalidArgumentError("max_draft_len: " + std::to_string(d.max_draft_len) + " outside [1, " +
                                  std::to_string(cache_.max_draft_len()) + "]");
    }
    if (d.top_k < 1 || d.top_k > c.vocab_size) return InvalidArgumentError("top_k: outside [1, V]");
    if (d.trace_window < 1) return InvalidArgumentError("trace_window: must be >= 1");
  }
  for (int32_t id : prompt) {
    if (id < 0 || id >= c.vocab_size) {
      return InvalidArgumentError("prompt: token id " + std::to_string(id) + " outside [0, " +
                                  std::to_string(c.vocab_size) + ")");
    }
  }
  return OkStatus();
}

StatusOr<GenerationResult> Engine::Generate(const std::vector<int32_t>& prompt,
                                            const GenerateOptions& o,
                                            const TokenCallback& on_tokens) {
  LEDE_RETURN_IF_ERROR(Validate(prompt, o));
  c10::InferenceMode inference_mode;
  LEDE_ASSIGN_OR_RETURN(int64_t slot, cache_.Allocate());
  struct SlotGuard {
    KvCache& cache;
    int64_t slot;
    ~SlotGuard() { (void)cache.Free(slot); }
  } guard{cache_, slot};

  const ModelConfig& c = model_->config();
  const SamplingOptions& s = o.sampling;
  Sampler sampler(s.seed);
  ConfidenceTrace trace(std::max(1, o.decision_spec.trace_window));
  GenerationResult result;
  GenerationStats& stats = result.stats;
  stats.n_prompt_tokens = static_cast<int64_t>(prompt.size());
  bool done = false;
  bool stopped_on_eos = false;  // the EOS the model generated counts as its step's output
  std::vector<int32_t> emitted_now;

  // Appends one token unless a stop condition holds; returns false once done.
  auto emit = [&](int32_t token, const at::Tensor& decision_logits) {
    if (done) return false;
    if (o.stop_at_eos &&
        std::find(c.eos_ids.begin(), c.eos_ids.end(), token) != c.eos_ids.end()) {
      result.finish = FinishReason::kEos;
      done = true;
      stopped_on_eos = true;
      return false;
    }
    result.tokens.push_back(token);
    emitted_now.push_back(token);
    if (o.mode == SpeculationMode::kAdaptive) trace.Push(Top1Nll(decision_logits));
    if (o.record_margins) result.margins.push_back(Top2Margin(decision_logits));
    if (static_cast<int64_t>(result.tokens.size()) >= o.max_new_tokens) {
      result.finish = FinishReason::kLength;
      done = true;
    }
    return true;
  };
  auto flush = [&]() {
    if (on_tokens && !emitted_now.empty()) on_tokens(emitted_now);
    emitted_now.clear();
  };
  auto choose = [&](const at::Tensor& logits) {
    return s.greedy() ? Argmax(logits) : sampler.Sample(WarpedProbs(logits, s));
  };

  // Draws a draft token from exit logits: argmax, or a sample from the
  // warped distribution (kept in draft_probs for speculative sampling).
  std::vector<at::Tensor> draft_probs;
  auto draft_token = [&](const at::Tensor& exit_logits) {
    if (s.greedy()) return Argmax(exit_logits);
    draft_probs.push_back(WarpedProbs(exit_logits, s));
    return sampler.Sample(draft_probs.back());
  };
  // Verifies `drafts` at exit layer e, commits the accepted prefix and emits
  // it plus the correction / bonus token. Returns the number accepted.
  auto verify_and_emit = [&](int64_t e, const std::vector<int32_t>& drafts, bool last_row_ready,
                             RoundRecord& round) -> StatusOr<int64_t> {
    const int64_t K = static_cast<int64_t>(drafts.size());
    LEDE_ASSIGN_OR_RETURN(at::Tensor target, verifier_.Verify(slot, e, drafts, last_row_ready));
    AcceptResult accept;
    if (s.greedy()) {
      accept = AcceptGreedy(drafts, target);
    } else {
      std::vector<at::Tensor> target_probs;
      for (int64_t i = 0; i <= K; ++i) target_probs.push_back(WarpedProbs(target[i], s));
      accept = AcceptSpeculative(drafts, at::stack(draft_probs), at::stack(target_probs), sampler);
    }
    draft_probs.clear();
    LEDE_RETURN_IF_ERROR(verifier_.Accept(slot, accept.n_accepted));
    round.exit_layer = static_cast<int32_t>(e);
    round.n_drafted = static_cast<int32_t>(K);
    round.n_accepted = static_cast<int32_t>(accept.n_accepted);
    stats.n_drafted += K;
    stats.n_accepted += accept.n_accepted;
    for (int64_t i = 0; i < accept.n_accepted; ++i) emit(drafts[i], target[i]);
    emit(accept.next_token, target[accept.n_accepted]);
    return accept.n_accepted;
  };
  // One controller-driven round (DESIGN.md §2): phase 1 probes the candidate
  // layers for the first draft token; phase 2 decides after each drafted
  // token whether to keep drafting. `budget` caps the drafts (tokens left
  // minus the verifier's own, and KV room).
  auto adaptive_round = [&](int32_t pending, int64_t budget, RoundRecord& round) -> Status {
    const DecisionSpec& spec = o.decision_spec;
    const int64_t L = c.n_layers;
    const int64_t n = cache_.length(slot);
    const int64_t d_cap = std::min<int64_t>({budget, spec.max_draft_len, cache_.max_draft_len()});
    RoundTrace rt;
    rt.round_index = static_cast<int64_t>(stats.rounds.size());
    auto state_of = [&](const at::Tensor& exit_logits, Phase phase, int64_t layer, int64_t drafted) {
      ExitSignals sig = ComputeExitSignals(exit_logits, spec.top_k);
      ExitState st;
      st.phase = phase;
      st.layer = static_cast<int32_t>(layer);
      st.n_layers = static_cast<int32_t>(L);
      st.draft_pos = static_cast<int32_t>(drafted);
      st.max_draft_len = spec.max_draft_len;
      st.top1_prob = sig.top1_prob;
      st.top_k_nll = sig.top_k_nll;
      st.entropy = sig.entropy;
      st.trace_nll = trace.Mean();
      return st;
    };
    auto finish_trace = [&](int64_t n_accepted) {
      for (Decision& d : rt.decisions) d.accepted = d.draft_index >= 0 && d.draft_index < n_accepted;
      rt.exit_layer = round.exit_layer;
      rt.n_drafted = round.n_drafted;
      rt.n_accepted = round.n_accepted;
      if (o.record_traces && !rt.decisions.empty()) result.traces.push_back(std::move(rt));
    };
    at::Tensor h = model_->Embed(TokenTensor({pending}, model_->options().device));
    int64_t done_layers = 0, exit_layer = 0;
    at::Tensor exit_logits;
    bool speculate = d_cap > 0;
    if (speculate) {  // round start: speculate at all? (no probe paid yet)
      ExitState st;
      st.phase = Phase::kRoundStart;
      st.n_layers = static_cast<int32_t>(L);
      st.max_draft_len = spec.max_draft_len;
      st.trace_nll = trace.Mean();
      const Action a = o.controller->Decide(st);
      rt.decisions.push_back(Decision{st, a, -1, false});
      speculate = a == Action::kExit;
    }
    if (speculate) {
      for (int32_t cand : spec.candidate_layers) {
        if (cand >= L) break;  // the last layer is the full model, not an exit
        h = model_->Forward(h, done_layers, cand, n, &cache_, slot);
        done_layers = cand;
        at::Tensor probe = model_->ExitLogits(h).view({-1});
        ExitState st = state_of(probe, Phase::kExitLayer, cand, 0);
        const Action a = o.controller->Decide(st);
        rt.decisions.push_back(Decision{st, a, a == Action::kExit ? 0 : -1, false});
        if (a == Action::kExit) {
          exit_layer = cand;
          exit_logits = probe;
          break;
        }
        ++round.n_probes;
      }
    }
    if (exit_layer == 0) {  // no exit: a plain full-depth step
      h = model_->Forward(h, done_layers, L, n, &cache_, slot);
      LEDE_RETURN_IF_ERROR(cache_.Commit(slot, n + 1));
      at::Tensor step_logits = model_->ExitLogits(h).view({-1});
      emit(choose(step_logits), step_logits);
      finish_trace(0);
      return OkStatus();
    }
    cache_.exit_hidden().select(0, slot).narrow(0, 0, 1).copy_(h.view({1, -1}));
    std::vector<int32_t> drafts = {draft_token(exit_logits)};
    bool last_row_ready = false;
    while (static_cast<int64_t>(drafts.size()) < d_cap) {
      const int64_t row = static_cast<int64_t>(drafts.size());
      LEDE_ASSIGN_OR_RETURN(at::Tensor next, drafter_.DraftStep(slot, row, drafts.back(), exit_layer));
      ExitState st = state_of(next, Phase::kDraftLength, exit_layer, row);
      const Action a = o.controller->Decide(st);
      rt.decisions.push_back(Decision{st, a, a == Action::kExit ? static_cast<int32_t>(row) : -1, false});
      if (a != Action::kExit) {
        last_row_ready = true;  // row `row` holds d_K's hidden state at l*
        ++round.n_probes;
        break;
      }
      drafts.push_back(draft_token(next));
    }
    LEDE_ASSIGN_OR_RETURN(int64_t n_accepted, verify_and_emit(exit_layer, drafts, last_row_ready, round));
    finish_trace(n_accepted);
    return OkStatus();
  };

  auto t0 = Clock::now();
  LEDE_ASSIGN_OR_RETURN(at::Tensor logits, verifier_.Prefill(slot, prompt));
  Status status = TorchBoundary("generate", [&]() -> Status {
    emit(choose(logits), logits);
    flush();
    stats.prefill_s = SecondsSince(t0);
    auto t1 = Clock::now();
    while (!done) {
      const int32_t pending = result.tokens.back();
      const int64_t remaining = o.max_new_tokens - static_cast<int64_t>(result.tokens.size());
      const int64_t room = cache_.capacity() - cache_.length(slot) - 1;
      const int64_t K = o.mode == SpeculationMode::kStatic
                            ? std::min({o.draft_len, remaining - 1, room})
                            : 0;
      RoundRecord round;
      const size_t before = result.tokens.size();
      if (o.mode == SpeculationMode::kAdaptive) {
        LEDE_RETURN_IF_ERROR(adaptive_round(pending, std::min(remaining - 1, room), round));
      } else if (K <= 0) {
        LEDE_ASSIGN_OR_RETURN(at::Tensor step_logits, verifier_.Step(slot, pending));
        emit(choose(step_logits), step_logits);
      } else {
        std::vector<int32_t> drafts;
        int32_t token = pending;
        for (int64_t i = 0; i < K; ++i) {
          LEDE_ASSIGN_OR_RETURN(at::Tensor exit_logits, drafter_.DraftStep(slot, i, token, o.exit_layer));
          token = draft_token(exit_logits);
          drafts.push_back(token);
        }
        LEDE_ASSIGN_OR_RETURN(int64_t n_accepted, verify_and_emit(o.exit_layer, drafts, false, round));
        (void)n_accepted;
      }
      round.n_emitted = static_cast<int32_t>(result.tokens.size() - before) + (stopped_on_eos ? 1 : 0);
      stats.rounds.push_back(round);
      flush();
    }
    stats.decode_s = SecondsSince(t1);
    return OkStatus();
  });
  LEDE_RETURN_IF_ERROR(status);
  stats.n_generated = static_cast<int64_t>(result.tokens.size());
  return result;
}

}  // namespace lede::model
