#include "trainer/counterfactual.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "shared/model/exit_signals.h"
#include "shared/model/kv_cache.h"
#include "shared/model/sampling.h"
#include "shared/speculation/adaptive_round.h"
#include "shared/model/torch_boundary.h"
#include "shared/status/status_macros.h"

namespace lede::trainer {

using speculation::Draft;
using speculation::DraftRequest;
using speculation::Prefilled;
using speculation::SessionOptions;
using speculation::SpeculationMode;
using speculation::Verdict;

const speculation::ExitSignals& ShadowTrace::At(int32_t layer, int64_t t) const {
  const auto& row = probes.at(static_cast<size_t>(layer - 1));
  return row[static_cast<size_t>(std::clamp<int64_t>(t, 0, static_cast<int64_t>(row.size()) - 1))];
}

double ShadowTrace::AcceptProb(int32_t layer, int64_t t) const {
  if (!sampled()) return Accepts(layer, t) ? 1.0 : 0.0;
  const auto& row = accept_prob.at(static_cast<size_t>(layer - 1));
  return row[static_cast<size_t>(std::clamp<int64_t>(t, 0, static_cast<int64_t>(row.size()) - 1))];
}

bool ShadowTrace::Accepts(int32_t layer, int64_t t) const {
  if (!sampled()) return At(layer, t).top1 == target.at(t);
  return coupling.at(static_cast<size_t>(t)) < AcceptProb(layer, t);
}

double ExpectedAcceptance(const at::Tensor& target_probs, const at::Tensor& draft_probs) {
  at::Tensor p = target_probs.to(at::kCPU, at::kDouble).reshape({-1});
  at::Tensor q = draft_probs.to(at::kCPU, at::kDouble).reshape({-1});
  TORCH_CHECK(p.numel() == q.numel(), "ExpectedAcceptance: p has ", p.numel(), " entries, q ", q.numel());
  return std::clamp(at::minimum(p, q).sum().item<double>(), 0.0, 1.0);
}

double ExpectedAcceptanceOfLogits(const at::Tensor& target_logits, const at::Tensor& draft_logits,
                                  const speculation::SamplingParams& sampling) {
  return ExpectedAcceptance(model::WarpedProbs(target_logits, sampling), model::WarpedProbs(draft_logits, sampling));
}

double ExpectedAcceptedLength(const ShadowTrace& trace, int32_t layer, int64_t next, int64_t draft_len) {
  const int64_t T = static_cast<int64_t>(trace.target.size());
  double expected = 0, survive = 1;
  for (int64_t j = 0; j < draft_len && next + j < T; ++j) {
    survive *= trace.AcceptProb(layer, next + j);
    expected += survive;
  }
  return expected;
}

namespace {

// Stream of speculation::RoundSeed for the replay's coupling uniforms (the
// engine uses 1 and 2).
constexpr uint64_t kReplayStream = 3;

// The uniforms of a sampled replay, one per target position, in [0, 1).
std::vector<double> CouplingUniforms(uint64_t seed, int64_t n) {
  std::vector<double> u(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) {
    u[t] = static_cast<double>(speculation::RoundSeed(seed, t, kReplayStream) >> 11) * 0x1.0p-53;
  }
  return u;
}

}  // namespace

StatusOr<ShadowTrace> ComputeShadowTrace(const model::LlamaModel& model, const std::vector<int32_t>& prompt,
                                         const std::vector<int32_t>& output, bool ended_on_eos,
                                         int64_t max_new_tokens, int32_t top_k, std::string id,
                                         const speculation::SamplingParams& sampling,
                                         const std::vector<int32_t>& probe_layers) {
  const checkpoint::ModelConfig& c = model.config();
  if (!std::isfinite(sampling.temperature) || sampling.temperature < 0) {
    return InvalidArgumentError("temperature: must be finite and >= 0");
  }
  const bool sampled = !sampling.greedy();
  if (sampled && !(sampling.top_p > 0 && sampling.top_p <= 1)) return InvalidArgumentError("top_p: must be in (0, 1]");
  if (prompt.empty()) return InvalidArgumentError("prompt: is empty");
  if (output.empty() && !ended_on_eos) return InvalidArgumentError("output: is empty");
  const int64_t P = static_cast<int64_t>(prompt.size()), N = static_cast<int64_t>(output.size());
  if (P + N > c.max_seq_len) {
    return InvalidArgumentError("prompt + output: " + std::to_string(P + N) + " tokens, more than max_seq_len " +
                                std::to_string(c.max_seq_len));
  }
  std::vector<int64_t> ids(prompt.begin(), prompt.end());
  ids.insert(ids.end(), output.begin(), output.end());
  for (int64_t v : ids) {
    if (v < 0 || v >= c.vocab_size) {
      return InvalidArgumentError("token id " + std::to_string(v) + " outside [0, " + std::to_string(c.vocab_size) +
                                  ")");
    }
  }
  ShadowTrace trace;
  trace.id = std::move(id);
  trace.n_layers = static_cast<int32_t>(c.n_layers);
  trace.top_k = top_k;
  trace.max_new_tokens = max_new_tokens;
  trace.prompt = prompt;
  trace.target = output;
  trace.eos_ids = c.eos_ids;
  if (ended_on_eos) trace.target.push_back(c.eos_ids.empty() ? 0 : c.eos_ids.front());
  const int64_t T = static_cast<int64_t>(trace.target.size());
  // A one-slot KV cache of exactly P + N positions: the pass runs the
  // engine's (fused) prefill kernels, as a request's prefill does, instead
  // of the eager path, which on packed weights (bf16, q8_0, K-quants)
  // dequantizes every matrix to float32 first.
  model::KvCacheOptions ko;
  ko.capacity = P + N;
  ko.max_draft_len = 1;
  ko.device = model.options().device;
  ko.dtype = model.options().dtype;
  LEDE_ASSIGN_OR_RETURN(model::KvCache cache, model::KvCache::Create(c, ko));
  LEDE_RETURN_IF_ERROR(model::TorchBoundary("shadow trace", [&]() -> Status {
    c10::InferenceMode guard;
    at::Tensor h = model.Embed(at::tensor(ids, at::kLong).view({1, -1}).to(model.options().device));
    std::vector<at::Tensor> exit_hidden;  // sampled: [1, T, D] per layer, for the acceptance pass
    for (int64_t l = 1; l <= c.n_layers; ++l) {
      h = model.Forward(h, l - 1, l, 0, &cache, 0);
      if (sampled) exit_hidden.push_back(h.narrow(1, P - 1, T).clone());
      if (l < c.n_layers && !probe_layers.empty() &&
          std::find(probe_layers.begin(), probe_layers.end(), l) == probe_layers.end()) {
        speculation::ExitSignals none;
        none.top1 = -1;
        trace.probes.emplace_back(static_cast<size_t>(T), none);
        continue;
      }
      at::Tensor logits =
          model.ExitLogits(h.narrow(1, P - 1, T)).view({T, -1}).to(at::kCPU, at::kFloat).contiguous();
      const float* base = logits.data_ptr<float>();
      const int64_t V = logits.size(1);
      std::vector<speculation::ExitSignals> row(static_cast<size_t>(T));
      for (int64_t t = 0; t < T; ++t) row[t] = model::ProbeSignals(base + t * V, V, top_k);
      trace.probes.push_back(std::move(row));
    }
    if (!sampled) return OkStatus();
    // p_t once, then each exit's q_t against it.
    at::Tensor full = model.ExitLogits(exit_hidden.back()).view({T, -1}).to(at::kCPU, at::kFloat);
    std::vector<at::Tensor> p(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) p[t] = model::WarpedProbs(full[t], sampling);
    for (int64_t l = 1; l <= c.n_layers; ++l) {
      std::vector<float> row(static_cast<size_t>(T), 1.0f);
      if (l < c.n_layers) {
        at::Tensor q = model.ExitLogits(exit_hidden[l - 1]).view({T, -1}).to(at::kCPU, at::kFloat);
        for (int64_t t = 0; t < T; ++t) {
          row[t] = static_cast<float>(ExpectedAcceptance(p[t], model::WarpedProbs(q[t], sampling)));
        }
      }
      trace.accept_prob.push_back(std::move(row));
    }
    return OkStatus();
  }));
  if (sampled) {
    trace.sampling = sampling;
    trace.coupling = CouplingUniforms(sampling.seed, T);
  }
  return trace;
}

StatusOr<ShadowTrace> TraceGreedyRequest(model::Engine& engine, const std::vector<int32_t>& prompt,
                                         int64_t max_new_tokens, int32_t top_k, std::string id,
                                         const std::vector<int32_t>& probe_layers) {
  model::GenerateOptions o;
  o.max_new_tokens = max_new_tokens;
  LEDE_ASSIGN_OR_RETURN(model::GenerationResult r, engine.Generate(prompt, o));
  return ComputeShadowTrace(engine.model(), prompt, r.tokens, r.finish == model::FinishReason::kEos,
                            max_new_tokens, top_k, std::move(id), {}, probe_layers);
}

StatusOr<ShadowTrace> TraceRequest(model::Engine& engine, const std::vector<int32_t>& prompt,
                                   int64_t max_new_tokens, int32_t top_k, std::string id,
                                   const speculation::SamplingParams& sampling) {
  if (!std::isfinite(sampling.temperature) || sampling.temperature < 0) {
    return InvalidArgumentError("sampling.temperature: must be >= 0 and finite");
  }
  if (sampling.greedy()) return TraceGreedyRequest(engine, prompt, max_new_tokens, top_k, std::move(id));
  model::GenerateOptions o;
  o.max_new_tokens = max_new_tokens;
  o.sampling = sampling;
  LEDE_ASSIGN_OR_RETURN(model::GenerationResult r, engine.Generate(prompt, o));
  return ComputeShadowTrace(engine.model(), prompt, r.tokens, r.finish == model::FinishReason::kEos,
                            max_new_tokens, top_k, std::move(id), sampling);
}

namespace {

// The speculation backend of a simulated request (see the header).
class ShadowBackend : public speculation::SpeculationBackend {
 public:
  ShadowBackend(const ShadowTrace& trace, const SimulatedMethod& method) : trace_(trace), method_(method) {
    limits_.n_layers = trace.n_layers;
    limits_.vocab_size = std::numeric_limits<int32_t>::max();
    // The KV room never binds in a replay (it did not in the logged request).
    limits_.capacity = static_cast<int64_t>(trace.prompt.size()) + trace.max_new_tokens + 64;
    limits_.eos_ids = trace.eos_ids;
  }
  const speculation::ModelLimits& limits() const override { return limits_; }

  StatusOr<Prefilled> Open(const std::vector<int32_t>&, const SessionOptions& options) override {
    options_ = options;
    if (trace_.target.empty()) return InvalidArgumentError("trace: empty target");
    Prefilled p;
    p.token = trace_.target[0];
    p.nll = Full(0).top1_nll;
    p.margin = Full(0).margin;
    next_ = 1;
    return p;
  }

  StatusOr<Draft> DraftRound(int64_t, const DraftRequest& request) override {
    Draft d;
    const int64_t i = next_;  // the round drafts for target[i], target[i + 1], ...
    if (method_.mode == SpeculationMode::kStatic) {
      const int64_t K = std::min<int64_t>(method_.draft_len, request.budget);
      for (int64_t j = 0; j < K; ++j) d.tokens.push_back(trace_.At(method_.exit_layer, i + j).top1);
      d.exit_layer = K > 0 ? method_.exit_layer : 0;
      return d;
    }
    if (method_.mode != SpeculationMode::kAdaptive) return d;
    class Probes : public speculation::DraftProbes {
     public:
      Probes(const ShadowTrace& t, int64_t i) : t_(t), i_(i) {}
      StatusOr<speculation::ExitSignals> ProbeLayer(int32_t layer) override {
        layer_ = layer;
        last_ = t_.At(layer, i_);
        return last_;
      }
      StatusOr<speculation::ExitSignals> ProbeDraft(int32_t row, int32_t) override {
        last_ = t_.At(layer_, i_ + row);  // the committed path's signals (see the header)
        return last_;
      }
      StatusOr<int32_t> DraftFromProbe() override { return last_.top1; }

     private:
      const ShadowTrace& t_;
      int64_t i_;
      int32_t layer_ = 0;
      speculation::ExitSignals last_;
    } probes(trace_, i);
    const int64_t d_cap = std::min<int64_t>(request.budget, method_.spec.max_draft_len);
    LEDE_RETURN_IF_ERROR(speculation::RunAdaptiveRound(*method_.controller, method_.spec, trace_.n_layers, request,
                                                       d_cap, probes, d));
    return d;
  }

  StatusOr<Verdict> VerifyRound(int64_t, int32_t, const Draft& d) override {
    const int64_t i = next_, T = static_cast<int64_t>(trace_.target.size());
    int64_t a = 0;
    if (trace_.sampled()) {  // coupled draws (see the header)
      while (a < static_cast<int64_t>(d.tokens.size()) && i + a < T && trace_.Accepts(d.exit_layer, i + a)) ++a;
    } else {
      while (a < static_cast<int64_t>(d.tokens.size()) && i + a < T && d.tokens[a] == trace_.target[i + a]) ++a;
    }
    if (i >= T) {
      return InternalError("shadow replay ran past the logged trajectory of " + trace_.id + " (" +
                           std::to_string(T) + " tokens)");
    }
    Verdict v;
    v.n_accepted = static_cast<int32_t>(a);
    for (int64_t j = 0; j <= a; ++j) {
      // A round that drafts the request's final EOS has its bonus token past
      // the trajectory; the loop stops at the EOS before emitting it.
      v.tokens.push_back(i + j < T ? trace_.target[i + j] : trace_.target.back());
      if (options_.record_nll) v.nll.push_back(Full(i + j).top1_nll);
      if (options_.record_margins) v.margins.push_back(Full(i + j).margin);
    }
    next_ = i + a + 1;
    return v;
  }

  void Close(int64_t) override {}

  // Starts the replay at target[next] (target[next - 1] pending), for
  // single rounds.
  void Seek(int64_t next) { next_ = next; }

 private:
  const speculation::ExitSignals& Full(int64_t t) const { return trace_.At(trace_.n_layers, t); }

  const ShadowTrace& trace_;
  const SimulatedMethod& method_;
  speculation::ModelLimits limits_;
  SessionOptions options_;
  int64_t next_ = 1;
};

}  // namespace

StatusOr<speculation::GenerationResult> Simulate(const ShadowTrace& trace, const SimulatedMethod& method,
                                                 bool record_traces) {
  const int32_t L = trace.n_layers;
  if (method.mode == SpeculationMode::kStatic &&
      (method.exit_layer < 1 || method.exit_layer > L || method.draft_len < 1)) {
    return InvalidArgumentError("static method: exit_layer " + std::to_string(method.exit_layer) +
                                " outside [1, " + std::to_string(L) + "] or draft_len < 1");
  }
  if (method.mode == SpeculationMode::kAdaptive) {
    if (method.controller == nullptr) return InvalidArgumentError("controller: required in adaptive mode");
    for (int32_t l : method.spec.candidate_layers) {
      if (l < 1 || l > L) return InvalidArgumentError("candidate_layers: " + std::to_string(l) + " outside [1, L]");
    }
    if (method.spec.max_draft_len < 1) return InvalidArgumentError("max_draft_len: must be >= 1");
  }
  ShadowBackend backend(trace, method);
  speculation::LoopOptions loop;
  loop.max_new_tokens = trace.max_new_tokens;
  loop.mode = method.mode;
  loop.record_traces = record_traces;
  loop.trace_window = method.spec.trace_window;
  const int32_t load = trace.load;
  loop.current_load = [load] { return load; };
  const speculation::CostFeatures cost = trace.cost;
  loop.current_cost = [cost] { return cost; };
  loop.session.sampling = trace.sampling;  // the policy's temperature feature (the replay itself draws nothing)
  return speculation::RunGeneration(backend, trace.prompt, loop, nullptr);
}

std::vector<RoundContext> RoundContexts(const ShadowTrace& trace, const speculation::GenerationResult& result) {
  std::vector<RoundContext> out;
  int64_t next = 1;
  size_t k = 0;  // index into result.traces
  for (size_t r = 0; r < result.stats.rounds.size(); ++r) {
    const speculation::RoundRecord& rec = result.stats.rounds[r];
    if (k < result.traces.size() && result.traces[k].round_index == static_cast<int64_t>(r)) {
      const speculation::RoundTrace& rt = result.traces[k++];
      RoundContext c;
      c.next = next;
      c.round_index = static_cast<int64_t>(r);
      if (!rt.decisions.empty()) {
        c.trace_nll = rt.decisions.front().state.trace_nll;
        c.accept_ema = rt.decisions.front().state.accept_ema;
      }
      c.budget = trace.max_new_tokens - next - 1;
      out.push_back(c);
    }
    next += rec.n_accepted + 1;
  }
  return out;
}

StatusOr<SimulatedRound> SimulateRound(const ShadowTrace& trace, const speculation::DecisionSpec& spec,
                                       speculation::ExitController& controller, const RoundContext& c) {
  SimulatedMethod m;
  m.mode = SpeculationMode::kAdaptive;
  m.controller = &controller;
  m.spec = spec;
  ShadowBackend backend(trace, m);
  SessionOptions options;
  LEDE_RETURN_IF_ERROR(backend.Open(trace.prompt, options).status());
  backend.Seek(c.next);
  DraftRequest request;
  request.pending_token = trace.target.at(static_cast<size_t>(c.next - 1));
  request.position = static_cast<int64_t>(trace.prompt.size()) + c.next - 1;
  request.budget = c.budget;
  request.trace_nll = c.trace_nll;
  request.accept_ema = c.accept_ema;
  request.load = std::max<int32_t>(1, trace.load);
  request.cost = trace.cost;
  request.temperature = static_cast<float>(trace.sampling.temperature);
  request.round_index = c.round_index;
  request.record_trace = true;
  // The committed tokens as the generation loop passes them: the last
  // kNgramWindow of prompt + target[0, next).
  const int64_t P = static_cast<int64_t>(trace.prompt.size());
  const int64_t skip = std::max<int64_t>(0, P + c.next - speculation::kNgramWindow);
  request.context.assign(trace.prompt.begin() + std::min(skip, P), trace.prompt.end());
  request.context.insert(request.context.end(), trace.target.begin() + std::max<int64_t>(0, skip - P),
                         trace.target.begin() + c.next);
  LEDE_ASSIGN_OR_RETURN(Draft draft, backend.DraftRound(0, request));
  LEDE_ASSIGN_OR_RETURN(Verdict verdict, backend.VerifyRound(0, request.pending_token, draft));
  SimulatedRound out;
  out.trace = std::move(draft.trace);
  for (speculation::Decision& d : out.trace.decisions) d.accepted = d.draft_index >= 0 && d.draft_index < verdict.n_accepted;
  const int32_t K = static_cast<int32_t>(draft.tokens.size());
  out.trace.round_index = c.round_index;
  out.trace.exit_layer = K > 0 ? draft.exit_layer : 0;
  out.trace.n_drafted = K;
  out.trace.n_accepted = verdict.n_accepted;
  out.record.exit_layer = out.trace.exit_layer;
  out.record.n_drafted = K;
  out.record.n_accepted = verdict.n_accepted;
  out.record.n_emitted = verdict.n_accepted + 1;
  out.record.n_probes = draft.n_probes;
  out.record.n_decisions = draft.n_decisions;
  return out;
}

StatusOr<std::vector<speculation::RoundRecord>> SimulatedRounds(const std::vector<ShadowTrace>& traces,
                                                                const SimulatedMethod& method,
                                                                const ControllerMaker& make) {
  std::vector<speculation::RoundRecord> rounds;
  for (size_t i = 0; i < traces.size(); ++i) {
    SimulatedMethod m = method;
    std::unique_ptr<speculation::ExitController> controller;
    if (make) {
      controller = make(static_cast<int64_t>(i));
      m.controller = controller.get();
    }
    LEDE_ASSIGN_OR_RETURN(speculation::GenerationResult r, Simulate(traces[i], m));
    rounds.insert(rounds.end(), r.stats.rounds.begin(), r.stats.rounds.end());
  }
  return rounds;
}

StatusOr<double> SimulatedSpeedup(const std::vector<ShadowTrace>& traces, const speculation::DecisionSpec& spec,
                                  const ControllerMaker& make, const model::cost::CostModel& cost) {
  SimulatedMethod m;
  m.mode = SpeculationMode::kAdaptive;
  m.spec = spec;
  LEDE_ASSIGN_OR_RETURN(std::vector<speculation::RoundRecord> rounds, SimulatedRounds(traces, m, make));
  return cost.PredictedSpeedup(rounds);
}

double ExpectedAccepted(const ShadowTrace& trace, const speculation::GenerationResult& result) {
  double expected = 0;
  int64_t next = 1;
  for (const speculation::RoundRecord& r : result.stats.rounds) {
    if (r.n_drafted > 0) expected += ExpectedAcceptedLength(trace, r.exit_layer, next, r.n_drafted);
    next += r.n_accepted + 1;
  }
  return expected;
}

StatusOr<ReplayAcceptanceByKind> ReplayAcceptanceOf(const std::vector<ShadowTrace>& traces,
                                                    const speculation::DecisionSpec& spec, const ControllerMaker& make) {
  ReplayAcceptanceByKind out;
  for (size_t i = 0; i < traces.size(); ++i) {
    std::unique_ptr<speculation::ExitController> controller = make(static_cast<int64_t>(i));
    SimulatedMethod m;
    m.mode = SpeculationMode::kAdaptive;
    m.controller = controller.get();
    m.spec = spec;
    LEDE_ASSIGN_OR_RETURN(speculation::GenerationResult r, Simulate(traces[i], m));
    ReplayAcceptance& kind = traces[i].sampled() ? out.sampled : out.greedy;
    ++kind.n_requests;
    kind.n_drafted += r.stats.n_drafted;
    kind.expected_accepted += ExpectedAccepted(traces[i], r);
  }
  return out;
}

StatusOr<std::vector<experience::Transition>> CounterfactualTransitions(
    const std::vector<ShadowTrace>& traces, const speculation::DecisionSpec& spec,
    const std::vector<ControllerMaker>& behaviours, const experience::RewardSpec& rewards,
    const std::string& model_fingerprint) {
  std::vector<experience::Transition> out;
  for (size_t b = 0; b < behaviours.size(); ++b) {
    for (size_t i = 0; i < traces.size(); ++i) {
      std::unique_ptr<speculation::ExitController> controller = behaviours[b](static_cast<int64_t>(i));
      SimulatedMethod m;
      m.mode = SpeculationMode::kAdaptive;
      m.controller = controller.get();
      m.spec = spec;
      LEDE_ASSIGN_OR_RETURN(speculation::GenerationResult r, Simulate(traces[i], m, /*record_traces=*/true));
      const std::string request_id = traces[i].id + "#" + std::to_string(b);
      const std::string version = controller->name();
      for (const speculation::RoundTrace& rt : r.traces) {
        std::vector<experience::Transition> ts = experience::ToTransitions(rt, rewards, request_id, version,
                                                                   model_fingerprint);
        out.insert(out.end(), std::make_move_iterator(ts.begin()), std::make_move_iterator(ts.end()));
      }
    }
  }
  return out;
}

experience::RewardSpec DinkelbachRewards(const model::cost::CostModel& cost, int32_t n_layers, int32_t max_draft_len,
                                     double rho) {
  std::vector<double> draft_cost;
  for (int32_t l = 0; l <= n_layers; ++l) draft_cost.push_back(l == 0 ? 0.0 : cost.ControlledDraftToken(l));
  std::vector<std::vector<double>> verify(n_layers + 1);
  for (int32_t e = 0; e <= n_layers; ++e) {
    for (int32_t k = 0; k <= max_draft_len; ++k) verify[e].push_back(e == 0 ? 0.0 : cost.Verify(e, k));
  }
  return experience::RewardSpec::Throughput(cost.name(), draft_cost, verify, cost.ControlledProbe(), cost.Decision(),
                                        rho);
}

}  // namespace lede::trainer
