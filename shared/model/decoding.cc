#include "shared/model/decoding.h"

#include <algorithm>
#include <functional>
#include <string>
#include <utility>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "shared/model/exit_signals.h"
#include "shared/model/internal/rounds.h"
#include "shared/model/torch_boundary.h"
#include "shared/speculation/adaptive_round.h"
#include "shared/status/status_macros.h"

namespace lede::model {
namespace {

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
  if (K > cache_.max_draft_len()) {
    return InvalidArgumentError("draft length " + std::to_string(K) + " outside [0, " +
                                std::to_string(cache_.max_draft_len()) + "]");
  }
  if (K == 0 && !last_row_ready) {
    return InvalidArgumentError("draft length 0 needs the pending token's hidden state in the scratch");
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
  DraftWork w;
  w.slot = slot;
  w.row = row;
  w.token = token;
  w.last = exit_layer;
  LEDE_ASSIGN_OR_RETURN(DraftStepResult r, Run(w));
  return std::move(r.exit_logits);
}

StatusOr<DraftStepResult> Drafter::ProbeLayers(int64_t slot, const at::Tensor& hidden, int64_t first,
                                               int64_t last) {
  DraftWork w;
  w.slot = slot;
  w.hidden = hidden;
  w.first = first;
  w.last = last;
  return Run(w);
}

StatusOr<DraftStepResult> Drafter::Run(const DraftWork& w) {
  if (!runner_) return RunDraftStep(model_, cache_, w);
  LEDE_RETURN_IF_ERROR(ValidateDraftWork(model_, cache_, w));  // a bad step never reaches the runner
  return runner_(w);
}

// ---------------------------------------------------------- rounds

namespace {

using speculation::Draft;
using speculation::DraftRequest;
using speculation::Prefilled;
using speculation::SessionOptions;
using speculation::Verdict;

// Appends the per-token records a session asked for.
void RecordToken(const at::Tensor& logits, const SessionOptions& o, Verdict& v) {
  if (o.record_nll) v.nll.push_back(Top1Nll(logits));
  if (o.record_margins) v.margins.push_back(Top2Margin(logits));
}

int32_t Choose(const at::Tensor& logits, const SamplingOptions& s, Sampler& sampler) {
  return s.greedy() ? Argmax(logits) : sampler.Sample(WarpedProbs(logits, s));
}

}  // namespace

Status ValidateDraftConfig(const DraftConfig& d, const checkpoint::ModelConfig& c, const KvCache& cache) {
  if (d.mode == SpeculationMode::kStatic) {
    if (d.exit_layer < 1 || d.exit_layer > c.n_layers) {
      return InvalidArgumentError("exit_layer: " + std::to_string(d.exit_layer) + " outside [1, " +
                                  std::to_string(c.n_layers) + "]");
    }
    if (d.draft_len < 1 || d.draft_len > cache.max_draft_len()) {
      return InvalidArgumentError("draft_len: " + std::to_string(d.draft_len) + " outside [1, " +
                                  std::to_string(cache.max_draft_len()) + "]");
    }
  }
  if (d.mode == SpeculationMode::kAdaptive) {
    const speculation::DecisionSpec& s = d.decision_spec;
    if (d.controller == nullptr) return InvalidArgumentError("controller: required in adaptive mode");
    if (s.candidate_layers.empty()) return InvalidArgumentError("candidate_layers: empty");
    int32_t prev = 0;
    for (int32_t l : s.candidate_layers) {
      if (l <= prev || l > c.n_layers) {
        return InvalidArgumentError("candidate_layers: must ascend within [1, " +
                                    std::to_string(c.n_layers) + "], got " + std::to_string(l));
      }
      prev = l;
    }
    if (s.max_draft_len < 1 || s.max_draft_len > cache.max_draft_len()) {
      return InvalidArgumentError("max_draft_len: " + std::to_string(s.max_draft_len) +
                                  " outside [1, " + std::to_string(cache.max_draft_len()) + "]");
    }
    if (s.top_k < 1 || s.top_k > c.vocab_size) return InvalidArgumentError("top_k: outside [1, V]");
    if (s.trace_window < 1) return InvalidArgumentError("trace_window: must be >= 1");
  }
  return OkStatus();
}

StatusOr<Prefilled> PrefillSession(Verifier& verifier, int64_t slot,
                                   const std::vector<int32_t>& prompt, const SessionOptions& o) {
  c10::InferenceMode inference_mode;
  LEDE_ASSIGN_OR_RETURN(at::Tensor logits, verifier.Prefill(slot, prompt));
  return internal::FirstToken(logits, slot, static_cast<int64_t>(prompt.size()), o);
}

namespace internal {

StatusOr<Prefilled> FirstToken(const at::Tensor& logits, int64_t slot, int64_t n_prompt,
                               const SessionOptions& o) {
  return TorchBoundary("prefill", [&]() -> StatusOr<Prefilled> {
    Sampler sampler(speculation::RoundSeed(o.sampling.seed, n_prompt, speculation::kVerifyStream));
    Prefilled p;
    p.session = slot;
    p.token = Choose(logits, o.sampling, sampler);
    if (o.record_nll) p.nll = Top1Nll(logits);
    if (o.record_margins) p.margin = Top2Margin(logits);
    return p;
  });
}

Status CheckRound(const Draft& d, const at::Tensor& draft_probs, const SessionOptions& o) {
  const int64_t K = static_cast<int64_t>(d.tokens.size());
  if (K > 0 && d.ready_layer != 0 && d.ready_layer != d.exit_layer) {
    return InvalidArgumentError("ready_layer: must be 0 or the exit layer when drafting");
  }
  if (!o.sampling.greedy() && K > 0 &&
      (!draft_probs.defined() || draft_probs.dim() != 2 || draft_probs.size(0) != K)) {
    return InvalidArgumentError("draft_probs: sampling needs [K, V] draft distributions");
  }
  return OkStatus();
}

StatusOr<Verdict> FinishRound(KvCache& cache, int64_t slot, int64_t n, const Draft& d,
                              const at::Tensor& draft_probs, const SessionOptions& o,
                              const at::Tensor& logits) {
  const SamplingOptions& s = o.sampling;
  const int64_t K = static_cast<int64_t>(d.tokens.size());
  Sampler sampler(speculation::RoundSeed(s.seed, n, speculation::kVerifyStream));
  Verdict v;
  if (K == 0 && d.ready_layer == 0) {  // a plain autoregressive step, committed by Step
    return TorchBoundary("step", [&]() -> StatusOr<Verdict> {
      v.tokens.push_back(Choose(logits, s, sampler));
      RecordToken(logits, o, v);
      return std::move(v);
    });
  }
  const at::Tensor& target = logits;
  return TorchBoundary("verify", [&]() -> StatusOr<Verdict> {
    AcceptResult accept;
    if (K == 0) {
      accept.n_accepted = 0;
      accept.next_token = Choose(target[0], s, sampler);
    } else if (s.greedy()) {
      accept = AcceptGreedy(d.tokens, target);
    } else {
      std::vector<at::Tensor> target_probs;
      for (int64_t i = 0; i <= K; ++i) target_probs.push_back(WarpedProbs(target[i], s));
      accept = AcceptSpeculative(d.tokens, draft_probs, at::stack(target_probs), sampler);
    }
    LEDE_RETURN_IF_ERROR(cache.Commit(slot, cache.length(slot) + accept.n_accepted + 1));
    v.n_accepted = static_cast<int32_t>(accept.n_accepted);
    for (int64_t i = 0; i < accept.n_accepted; ++i) {
      v.tokens.push_back(d.tokens[i]);
      RecordToken(target[i], o, v);
    }
    v.tokens.push_back(accept.next_token);
    RecordToken(target[accept.n_accepted], o, v);
    return std::move(v);
  });
}

}  // namespace internal

StatusOr<DraftOutput> DraftRound(const LlamaModel& model, KvCache& cache, Drafter& drafter,
                                 int64_t slot, const DraftConfig& config,
                                 const SamplingOptions& s, const DraftRequest& request) {
  const int64_t n = cache.length(slot);
  if (request.position != n) {
    return FailedPreconditionError("position: round at " + std::to_string(request.position) +
                                   " but the KV slot holds " + std::to_string(n) + " tokens");
  }
  if (request.budget < 1) return InvalidArgumentError("budget: must be >= 1");
  const int64_t L = model.n_layers();
  c10::InferenceMode inference_mode;
  Sampler sampler(speculation::RoundSeed(s.seed, n, speculation::kDraftStream));
  DraftOutput out;
  Draft& d = out.draft;
  d.policy_version = config.policy_version;
  std::vector<at::Tensor> probs;
  // Draws a draft token from exit logits: argmax, or a sample from the
  // warped distribution (kept for speculative sampling).
  auto draft_token = [&](const at::Tensor& exit_logits) {
    if (s.greedy()) return Argmax(exit_logits);
    probs.push_back(WarpedProbs(exit_logits, s));
    return sampler.Sample(probs.back());
  };
  auto finish = [&]() {
    if (!probs.empty()) out.probs = at::stack(probs).to(at::kCPU).contiguous();
    return std::move(out);
  };

  if (config.mode == SpeculationMode::kStatic) {
    const int64_t K = std::min<int64_t>({config.draft_len, request.budget, cache.capacity() - n - 1});
    d.exit_layer = static_cast<int32_t>(config.exit_layer);
    int32_t token = request.pending_token;
    for (int64_t i = 0; i < K; ++i) {
      LEDE_ASSIGN_OR_RETURN(at::Tensor exit_logits, drafter.DraftStep(slot, i, token, config.exit_layer));
      LEDE_RETURN_IF_ERROR(TorchBoundary("draft", [&]() -> Status {
        token = draft_token(exit_logits);
        return OkStatus();
      }));
      d.tokens.push_back(token);
    }
    if (d.tokens.empty()) d.exit_layer = 0;
    return finish();
  }
  if (config.mode != SpeculationMode::kAdaptive) return finish();  // autoregressive: no drafts

  // One controller-driven round (docs/design.md §2): the decisions are
  // speculation::RunAdaptiveRound's; the probes run the model here.
  const speculation::DecisionSpec& spec = config.decision_spec;
  const int64_t d_cap = std::min<int64_t>({request.budget, spec.max_draft_len, cache.max_draft_len(),
                                           cache.capacity() - n - 1});
  class EngineProbes : public speculation::DraftProbes {
   public:
    EngineProbes(const LlamaModel& model, Drafter& drafter, int64_t slot, const speculation::DecisionSpec& spec,
                 const DraftRequest& request, const std::function<int32_t(const at::Tensor&)>& draft_token)
        : drafter_(drafter), slot_(slot), spec_(spec), draft_token_(draft_token) {
      h_ = model.Embed(TokenTensor({request.pending_token}, model.options().device));
    }
    StatusOr<speculation::ExitSignals> ProbeLayer(int32_t layer) override {
      // Row 0 of the scratch holds the pending token's hidden state at the
      // deepest probed layer (the verifier resumes there or at l*).
      LEDE_ASSIGN_OR_RETURN(DraftStepResult r, drafter_.ProbeLayers(slot_, h_, done_layers_, layer));
      h_ = std::move(r.hidden);
      last_ = std::move(r.exit_logits);
      done_layers_ = layer;
      return TorchBoundary("draft", [&]() -> StatusOr<speculation::ExitSignals> {
        return ComputeExitSignals(last_, spec_.top_k);
      });
    }
    StatusOr<speculation::ExitSignals> ProbeDraft(int32_t row, int32_t token) override {
      LEDE_ASSIGN_OR_RETURN(last_, drafter_.DraftStep(slot_, row, token, done_layers_));
      return TorchBoundary("draft", [&]() -> StatusOr<speculation::ExitSignals> {
        return ComputeExitSignals(last_, spec_.top_k);
      });
    }
    StatusOr<int32_t> DraftFromProbe() override {
      return TorchBoundary("draft", [&]() -> StatusOr<int32_t> { return draft_token_(last_); });
    }

   private:
    Drafter& drafter_;
    int64_t slot_;
    const speculation::DecisionSpec& spec_;
    const std::function<int32_t(const at::Tensor&)>& draft_token_;
    at::Tensor h_, last_;
    int32_t done_layers_ = 0;
  };
  const std::function<int32_t(const at::Tensor&)> draft_fn = draft_token;
  Status status = TorchBoundary("draft", [&]() -> Status {
    EngineProbes probes(model, drafter, slot, spec, request, draft_fn);
    return speculation::RunAdaptiveRound(*config.controller, spec, static_cast<int32_t>(L), request, d_cap, probes,
                                         d);
  });
  LEDE_RETURN_IF_ERROR(status);
  return finish();
}

StatusOr<Verdict> VerifyRound(Verifier& verifier, KvCache& cache, int64_t slot,
                              int32_t pending_token, const Draft& d, const at::Tensor& draft_probs,
                              const SessionOptions& o) {
  const int64_t K = static_cast<int64_t>(d.tokens.size());
  const int64_t n = cache.length(slot);
  c10::InferenceMode inference_mode;
  if (K == 0 && d.ready_layer == 0) {  // a plain autoregressive step
    LEDE_ASSIGN_OR_RETURN(at::Tensor logits, verifier.Step(slot, pending_token));
    return internal::FinishRound(cache, slot, n, d, draft_probs, o, logits);
  }
  const int64_t e = K == 0 ? d.ready_layer : d.exit_layer;
  LEDE_RETURN_IF_ERROR(internal::CheckRound(d, draft_probs, o));
  LEDE_ASSIGN_OR_RETURN(at::Tensor target, verifier.Verify(slot, e, d.tokens, d.ready_layer != 0));
  return internal::FinishRound(cache, slot, n, d, draft_probs, o, target);
}

// ---------------------------------------------------------- InProcessBackend

InProcessBackend::InProcessBackend(const LlamaModel& model, KvCache& cache, const DraftConfig& config)
    : model_(model), cache_(cache), config_(config), verifier_(model, cache), drafter_(model, cache) {
  limits_.n_layers = static_cast<int32_t>(model.n_layers());
  limits_.vocab_size = static_cast<int32_t>(model.config().vocab_size);
  limits_.capacity = cache.capacity();
  limits_.eos_ids = model.config().eos_ids;
}

StatusOr<Prefilled> InProcessBackend::Open(const std::vector<int32_t>& prompt,
                                           const SessionOptions& options) {
  LEDE_ASSIGN_OR_RETURN(int64_t slot, cache_.Allocate());
  options_ = options;
  StatusOr<Prefilled> p = PrefillSession(verifier_, slot, prompt, options);
  if (!p.ok()) (void)cache_.Free(slot);
  return p;
}

StatusOr<Draft> InProcessBackend::DraftRound(int64_t session, const DraftRequest& request) {
  LEDE_ASSIGN_OR_RETURN(DraftOutput out, model::DraftRound(model_, cache_, drafter_, session, config_,
                                                           options_.sampling, request));
  draft_probs_ = out.probs;
  return std::move(out.draft);
}

StatusOr<Verdict> InProcessBackend::VerifyRound(int64_t session, int32_t pending_token,
                                                const Draft& draft) {
  at::Tensor probs = std::move(draft_probs_);
  draft_probs_ = at::Tensor();
  return model::VerifyRound(verifier_, cache_, session, pending_token, draft, probs, options_);
}

void InProcessBackend::Close(int64_t session) { (void)cache_.Free(session); }

// ------------------------------------------------------------------ Engine

Engine::Engine(std::shared_ptr<const LlamaModel> model, KvCache cache)
    : model_(std::move(model)), cache_(std::move(cache)) {}

StatusOr<std::unique_ptr<Engine>> Engine::Create(std::shared_ptr<const LlamaModel> model,
                                                 const KvCacheOptions& cache_options) {
  KvCacheOptions o = cache_options;
  o.device = model->options().device;
  o.dtype = model->options().dtype;
  LEDE_ASSIGN_OR_RETURN(KvCache cache, KvCache::Create(model->config(), o));
  return std::unique_ptr<Engine>(new Engine(std::move(model), std::move(cache)));
}

StatusOr<GenerationResult> Engine::Generate(const std::vector<int32_t>& prompt,
                                            const GenerateOptions& o,
                                            const TokenCallback& on_tokens) {
  DraftConfig config;
  config.mode = o.mode;
  config.exit_layer = o.exit_layer;
  config.draft_len = o.draft_len;
  config.controller = o.controller;
  config.decision_spec = o.decision_spec;
  if (o.controller != nullptr) config.policy_version = o.controller->name();
  if (o.mode != SpeculationMode::kAutoregressive) {
    LEDE_RETURN_IF_ERROR(ValidateDraftConfig(config, model_->config(), cache_));
  }
  InProcessBackend backend(*model_, cache_, config);
  speculation::LoopOptions loop;
  loop.max_new_tokens = o.max_new_tokens;
  loop.mode = o.mode;
  loop.session.sampling = o.sampling;
  loop.session.record_margins = o.record_margins;
  loop.stop_at_eos = o.stop_at_eos;
  loop.record_traces = o.record_traces;
  loop.trace_window = o.decision_spec.trace_window;
  const speculation::CostFeatures cost = o.cost_features;
  loop.current_cost = [cost] { return cost; };
  speculation::TokenSink sink;
  if (on_tokens) {
    sink = [&](const std::vector<int32_t>& tokens) {
      on_tokens(tokens);
      return true;
    };
  }
  return speculation::RunGeneration(backend, prompt, loop, sink);
}

}  // namespace lede::model
