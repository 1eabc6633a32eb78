#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include "shared/file/file.h"
#include "shared/model/batch.h"
#include "shared/model/cost/cost_model.h"
#include "shared/model/cost/internal/median.h"
#include "shared/model/exit_signals.h"
#include "shared/model/torch_boundary.h"
#include "shared/speculation/cost_features.h"
#include "shared/status/status_macros.h"

// Calibrate, CalibrateBatches and the calibration file (cost_model.h): the
// measurements the measured cost models price rounds with.
namespace lede::model::cost {
namespace {

using internal::Median;

constexpr int64_t kMaxCalibratedPositions = 16;

// Batch sizes as the batch tables hold them: distinct, ascending, from 1.
bool AscendingFromOne(const std::vector<int64_t>& sizes) {
  return !sizes.empty() && sizes.front() == 1 && std::is_sorted(sizes.begin(), sizes.end()) &&
         std::adjacent_find(sizes.begin(), sizes.end()) == sizes.end();
}

// The KV pool of a calibration's own engine or steps: `n_slots` slots of
// `capacity` positions on the model's device and dtype.
KvCacheOptions ScratchKvOptions(const LlamaModel& model, int64_t n_slots, int64_t capacity, int64_t max_draft_len) {
  KvCacheOptions ko;
  ko.n_slots = n_slots;
  ko.capacity = capacity;
  ko.max_draft_len = max_draft_len;
  ko.device = model.options().device;
  ko.dtype = model.options().dtype;
  return ko;
}

// Times several measurements interleaved: each repetition runs every one of
// them once, in order, so that a change of load on the machine (other
// processes, frequency) during calibration shifts all of them alike instead
// of distorting their ratios, which is what the cost model uses. Returns
// each measurement's median in microseconds.
std::vector<double> InterleavedMedianMicros(int repeats, const std::vector<std::function<void()>>& fns) {
  std::vector<std::vector<double>> us(fns.size());
  for (const auto& fn : fns) fn();  // warm-up
  for (int i = 0; i < repeats; ++i) {
    for (size_t j = 0; j < fns.size(); ++j) {
      auto t0 = std::chrono::steady_clock::now();
      fns[j]();
      us[j].push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  std::vector<double> out;
  for (auto& v : us) out.push_back(Median(std::move(v)));
  return out;
}

}  // namespace

namespace {

// The kernel tables of Calibrate (blocks, head, step, decision).
StatusOr<Calibration> CalibrateKernels(const LlamaModel& model, int repeats, const std::function<void()>& decide) {
  return TorchBoundary("calibrate", [&]() -> StatusOr<Calibration> {
    c10::InferenceMode guard;
    const checkpoint::ModelConfig& c = model.config();
    // One slot; the block and head tables time up to kMaxCalibratedPositions rows at once.
    const KvCacheOptions ko =
        ScratchKvOptions(model, 1, std::min<int64_t>(c.max_seq_len, 256), kMaxCalibratedPositions);
    LEDE_ASSIGN_OR_RETURN(KvCache cache, KvCache::Create(c, ko));
    const int64_t start = std::min<int64_t>(64, ko.capacity - kMaxCalibratedPositions - 1);
    auto opts = at::TensorOptions().device(ko.device).dtype(ko.dtype);
    const bool cuda = ko.device.is_cuda();
    auto sync = [&]() {
      if (cuda) at::zeros({1}, opts).cpu();  // waits for queued kernels
    };
    Calibration cal;
    cal.model_fingerprint = c.ArchitectureFingerprint();
    cal.device = ko.device.str();
    cal.n_layers = c.n_layers;
    cal.threads = at::get_num_threads();
    // A block is timed as a pass through all L blocks divided by L, so that
    // each block's weights come from where they live during decoding (a
    // single block timed in a loop would keep its weights in L2 and look
    // cheaper than it is).
    std::vector<at::Tensor> hidden;
    for (int64_t t = 1; t <= kMaxCalibratedPositions; ++t) hidden.push_back(at::randn({1, t, c.dim}, opts));
    at::Tensor token = at::full({1, 1}, c.bos_id, at::TensorOptions().dtype(at::kLong).device(ko.device));
    volatile float sink = 0;
    std::vector<std::function<void()>> fns;
    for (const at::Tensor& h : hidden) {
      fns.push_back([&, h] {
        model.Forward(h, 0, c.n_layers, start, &cache, 0);
        sync();
      });
      fns.push_back([&, h] {
        model.ExitLogits(h);
        sync();
      });
    }
    // The signals and the decision, each timed right after a full step, as
    // the decoding loop runs them: the signals over the logits that step
    // just wrote, the decision after the step's weights have gone through
    // the caches. (On lede-tiny, signals over logits left from before
    // the step measured 7-8 us here, over the step's own logits 6 us here
    // and 2-4 us in a loop of steps and probes.)
    at::Tensor step_logits;  // set by every step before the signals read it
    auto step = [&] {
      at::Tensor h = model.Forward(model.Embed(token), 0, c.n_layers, start, &cache, 0);
      step_logits = model.ExitLogits(h).view({-1});
      step_logits.argmax().item<int64_t>();
    };
    fns.push_back(step);  // the autoregressive step (step_us)
    fns.push_back([&] { sink = sink + ComputeExitSignals(step_logits, 4).entropy; });
    fns.push_back(step);
    fns.push_back([&] {
      if (decide) decide();
    });
    const std::vector<double> us = InterleavedMedianMicros(repeats, fns);
    for (int64_t t = 0; t < kMaxCalibratedPositions; ++t) {
      cal.block_us.push_back(us[2 * t] / c.n_layers);
      cal.head_us.push_back(us[2 * t + 1]);
    }
    cal.step_us = us[2 * kMaxCalibratedPositions];
    cal.signals_us = us[2 * kMaxCalibratedPositions + 1];
    cal.decision_us = decide ? us[2 * kMaxCalibratedPositions + 3] : 0.0;
    return cal;
  });
}

Status CalibrateRoundsOnPrompts(const LlamaModel& model, int passes, int64_t max_k,
                                const std::vector<std::vector<int32_t>>& prompts, int64_t new_tokens,
                                Calibration* cal);

// round_us[E-1][K-1] = the median of ratios[E-1][K-1] (round time over the
// autoregressive step of the same pass) times ar_step_us.
Status FillRoundTable(const std::vector<std::vector<std::vector<double>>>& ratios, double ar_step_us,
                      Calibration* cal) {
  cal->ar_step_us = ar_step_us;
  cal->round_us.assign(ratios.size(), std::vector<double>());
  for (size_t e = 0; e < ratios.size(); ++e) {
    for (const std::vector<double>& r : ratios[e]) {
      if (r.empty()) return InternalError("calibrate: no round of K drafts was timed");
      cal->round_us[e].push_back(Median(r) * ar_step_us);
    }
  }
  return OkStatus();
}

// A fixed prompt of 97 tokens (BOS and 96 spread over the vocabulary), or
// half of a smaller context `capacity`.
std::vector<int32_t> SyntheticPrompt(const checkpoint::ModelConfig& c, int64_t capacity) {
  std::vector<int32_t> prompt = {static_cast<int32_t>(c.bos_id)};
  const int64_t n_prompt = std::min<int64_t>(96, capacity / 2 - 1);
  for (int64_t i = 0; i < n_prompt; ++i) prompt.push_back(static_cast<int32_t>((7 + 131 * i) % c.vocab_size));
  return prompt;
}

// The round table of Calibrate (see the header): interleaved passes over
// every (E, K), each timed against the autoregressive steps just before it.
Status CalibrateRounds(const LlamaModel& model, int passes, int64_t max_k,
                       const std::vector<std::vector<int32_t>>& prompts, int64_t new_tokens, Calibration* cal) {
  const checkpoint::ModelConfig& c = model.config();
  const int64_t L = c.n_layers;
  if (L < 2 || max_k < 1) return OkStatus();
  if (!prompts.empty()) return CalibrateRoundsOnPrompts(model, passes, max_k, prompts, new_tokens, cal);
  const KvCacheOptions ko = ScratchKvOptions(model, 1, std::min<int64_t>(c.max_seq_len, 256), max_k);
  // The engine shares the caller's model for this call only.
  std::shared_ptr<const LlamaModel> shared(&model, [](const LlamaModel*) {});
  LEDE_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(shared, ko));
  // A fixed prompt of 97 tokens, or half the context. Its content does not
  // change the cost of a round, only how many tokens it emits; its length
  // does (attention over the context is a larger share of a many-position
  // verification than of a step): with a 25-token prompt the rounds were
  // priced 12% below what they cost on the benchmark's 32-192-token prompts.
  const std::vector<int32_t> prompt = SyntheticPrompt(c, ko.capacity);
  const int64_t rounds_per_config = 6;
  // The first rounds after a prefill are slower than the rest (measured on
  // lede-tiny: autoregressive steps of 795, 765, 675, 648 us after a
  // 97-token prefill against about 500 us warm, and the first static round
  // 1.2-1.4x the later ones): the rounds generations are made of are the
  // warm ones, so the first kWarmupRounds of every timed generation are
  // left out, for the autoregressive reference and the rounds alike.
  constexpr int64_t kWarmupRounds = 4;
  // A small context leaves room for shorter drafts only (at least three
  // rounds of K + 1 tokens after the prompt and the warm-up rounds); none:
  // no round table.
  const int64_t room = ko.capacity - 1 - static_cast<int64_t>(prompt.size());
  max_k = std::min(max_k, room / (kWarmupRounds + 3) - 1);
  if (max_k < 1) return OkStatus();
  // The speed of this machine drifts by 10% and more within seconds (shared
  // cores, frequency): each configuration is timed right after a short
  // autoregressive generation and recorded as a ratio to its steps, and the
  // table is those ratios' medians times the median step.
  std::vector<std::vector<std::vector<double>>> ratios(L - 1, std::vector<std::vector<double>>(max_k));
  std::vector<double> ar_all;
  GenerateOptions ar;
  ar.stop_at_eos = false;
  ar.max_new_tokens = kWarmupRounds + rounds_per_config;
  auto ar_step = [&]() -> StatusOr<double> {
    LEDE_ASSIGN_OR_RETURN(GenerationResult r, engine->Generate(prompt, ar));
    std::vector<double> us;
    for (size_t i = kWarmupRounds; i < r.stats.rounds.size(); ++i) {
      us.push_back(r.stats.rounds[i].latency_s * 1e6);
    }
    ar_all.insert(ar_all.end(), us.begin(), us.end());
    const double m = Median(us);
    if (!(m > 0)) return InternalError("calibrate: no autoregressive round was timed");
    return m;
  };
  for (int pass = 0; pass < passes; ++pass) {
    for (int64_t e = 1; e < L; ++e) {
      for (int64_t k = 1; k <= max_k; ++k) {
        LEDE_ASSIGN_OR_RETURN(const double step, ar_step());
        GenerateOptions o;
        o.stop_at_eos = false;
        o.mode = speculation::SpeculationMode::kStatic;
        o.exit_layer = static_cast<int32_t>(e);
        o.draft_len = static_cast<int32_t>(k);
        // At least rounds_per_config rounds after the warm-up ones, most of
        // them of exactly K drafts.
        o.max_new_tokens = std::min<int64_t>((kWarmupRounds + rounds_per_config) * (k + 1),
                                             ko.capacity - 1 - static_cast<int64_t>(prompt.size()) - k);
        LEDE_ASSIGN_OR_RETURN(GenerationResult r, engine->Generate(prompt, o));
        std::vector<double> us;
        for (size_t i = kWarmupRounds; i < r.stats.rounds.size(); ++i) {
          const RoundRecord& rr = r.stats.rounds[i];
          if (rr.exit_layer == e && rr.n_drafted == k) us.push_back(rr.latency_s * 1e6);
        }
        if (!us.empty()) ratios[e - 1][k - 1].push_back(Median(us) / step);
      }
    }
  }
  return FillRoundTable(ratios, Median(ar_all), cal);
}

double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / static_cast<double>(v.size());
}


// The round table from whole generations of the workload's own prompts (see
// the header): each (E, K) of a pass on the next prompt, against an
// autoregressive generation of the same length on the same prompt, every
// round counted (those right after the prefill too).
Status CalibrateRoundsOnPrompts(const LlamaModel& model, int passes, int64_t max_k,
                                const std::vector<std::vector<int32_t>>& prompts, int64_t new_tokens,
                                Calibration* cal) {
  const checkpoint::ModelConfig& c = model.config();
  const int64_t L = c.n_layers;
  if (new_tokens < 2) return InvalidArgumentError("calibrate: round_new_tokens must be >= 2");
  const KvCacheOptions ko = ScratchKvOptions(model, 1, c.max_seq_len, max_k);
  // Prompts that leave no room for the generation and one round of drafts
  // are not used; none usable is an error naming the flag's field.
  std::vector<std::vector<int32_t>> usable;
  for (const auto& p : prompts) {
    const bool ids_ok = std::all_of(p.begin(), p.end(), [&](int32_t id) { return id >= 0 && id < c.vocab_size; });
    if (!p.empty() && ids_ok && static_cast<int64_t>(p.size()) + new_tokens + max_k + 1 < ko.capacity) {
      usable.push_back(p);
    }
  }
  if (usable.empty()) {
    return InvalidArgumentError("calibrate: no round_prompts prompt fits the context window of " +
                                std::to_string(ko.capacity) + " with " + std::to_string(new_tokens) +
                                " new tokens (or every one has a token id outside the vocabulary)");
  }
  std::shared_ptr<const LlamaModel> shared(&model, [](const LlamaModel*) {});
  LEDE_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(shared, ko));
  std::vector<std::vector<std::vector<double>>> ratios(L - 1, std::vector<std::vector<double>>(max_k));
  std::vector<double> ar_all;
  RoundStepTimings steps(L);
  size_t next = 0;
  for (int pass = 0; pass < passes; ++pass) {
    for (int64_t e = 1; e < L; ++e) {
      for (int64_t k = 1; k <= max_k; ++k) {
        const std::vector<int32_t>& prompt = usable[next++ % usable.size()];
        GenerateOptions ar;
        ar.stop_at_eos = false;
        ar.max_new_tokens = new_tokens;
        LEDE_ASSIGN_OR_RETURN(GenerationResult a, engine->Generate(prompt, ar));
        std::vector<double> ar_us;
        for (const RoundRecord& rr : a.stats.rounds) {
          ar_us.push_back(rr.latency_s * 1e6);
          steps.Add(rr);
        }
        const double step = Mean(ar_us);
        if (!(step > 0)) return InternalError("calibrate: no autoregressive round was timed");
        ar_all.insert(ar_all.end(), ar_us.begin(), ar_us.end());
        GenerateOptions o = ar;
        o.mode = speculation::SpeculationMode::kStatic;
        o.exit_layer = static_cast<int32_t>(e);
        o.draft_len = static_cast<int32_t>(k);
        LEDE_ASSIGN_OR_RETURN(GenerationResult r, engine->Generate(prompt, o));
        std::vector<double> us;
        for (const RoundRecord& rr : r.stats.rounds) {
          if (rr.exit_layer == e && rr.n_drafted == k) us.push_back(rr.latency_s * 1e6);
          steps.Add(rr);
        }
        if (!us.empty()) ratios[e - 1][k - 1].push_back(Mean(us) / step);
      }
    }
  }
  cal->context_steps = steps.Costs(HeadLayerEquivalents(c));
  return FillRoundTable(ratios, Mean(ar_all), cal);
}

}  // namespace

Status CalibrateBatches(const LlamaModel& model, int repeats, const std::vector<int64_t>& batch_sizes,
                        int64_t exit_layer, int64_t max_draft_len, int64_t context, Calibration* cal) {
  const checkpoint::ModelConfig& c = model.config();
  if (!AscendingFromOne(batch_sizes) || batch_sizes.back() > 64) {
    return InvalidArgumentError("batch_sizes: want distinct ascending sizes starting at 1, at most 64");
  }
  if (exit_layer < 1 || exit_layer >= c.n_layers) {
    return InvalidArgumentError("exit_layer: " + std::to_string(exit_layer) + " is outside [1, " +
                                std::to_string(c.n_layers) + ")");
  }
  if (max_draft_len < 1 || max_draft_len > 16) return InvalidArgumentError("max_draft_len: must be in [1, 16]");
  if (context < 1 || context + max_draft_len + 2 > c.max_seq_len) {
    return InvalidArgumentError("context: " + std::to_string(context) + " plus the steps must fit max_seq_len " +
                                std::to_string(c.max_seq_len));
  }
  if (repeats < 1) return InvalidArgumentError("repeats: must be >= 1");
  return TorchBoundary("calibrate batches", [&]() -> Status {
    c10::InferenceMode guard;
    const int64_t max_b = batch_sizes.back();
    const KvCacheOptions ko =
        ScratchKvOptions(model, max_b, std::min<int64_t>(c.max_seq_len, context + max_draft_len + 2), max_draft_len);
    LEDE_ASSIGN_OR_RETURN(KvCache cache, KvCache::Create(c, ko));
    Verifier verifier(model, cache);
    Drafter drafter(model, cache);
    std::vector<int32_t> prompt(static_cast<size_t>(context));
    for (int64_t i = 0; i < context; ++i) prompt[i] = static_cast<int32_t>(1 + (i * 37) % (c.vocab_size - 1));
    const int32_t token = static_cast<int32_t>(std::min<int64_t>(5, c.vocab_size - 1));
    for (int64_t s = 0; s < max_b; ++s) {
      LEDE_RETURN_IF_ERROR(verifier.Prefill(s, prompt).status());
      // Scratch rows for the verifications: K drafts at the exit layer (the
      // values do not matter to the timing, only that the rows exist).
      for (int64_t k = 0; k < max_draft_len; ++k) {
        LEDE_RETURN_IF_ERROR(drafter.DraftStep(s, k, token, exit_layer).status());
      }
    }
    auto reset = [&](int64_t b) {
      for (int64_t s = 0; s < b; ++s) (void)cache.Truncate(s, context);
    };
    std::vector<std::function<void()>> fns;
    for (int64_t b : batch_sizes) {
      std::vector<VerifierWork> steps(b);
      std::vector<std::vector<VerifierWork>> verifies(max_draft_len, std::vector<VerifierWork>(b));
      std::vector<DraftWork> drafts(b);
      for (int64_t s = 0; s < b; ++s) {
        steps[s].slot = s;
        steps[s].tokens = {token};
        for (int64_t k = 1; k <= max_draft_len; ++k) {
          VerifierWork& w = verifies[k - 1][s];
          w.kind = VerifierWork::Kind::kVerify;
          w.slot = s;
          w.exit_layer = exit_layer;
          w.tokens.assign(static_cast<size_t>(k), token);
        }
        drafts[s].slot = s;
        drafts[s].token = token;
        drafts[s].last = exit_layer;
      }
      fns.push_back([&, b, steps] {
        (void)RunVerifierBatch(model, cache, steps);
        reset(b);
      });
      for (int64_t k = 1; k <= max_draft_len; ++k) {
        fns.push_back([&, w = verifies[k - 1]] { (void)RunVerifierBatch(model, cache, w); });
      }
      fns.push_back([&, drafts] { (void)RunDrafterBatch(model, cache, drafts); });
    }
    const std::vector<double> us = InterleavedMedianMicros(repeats, fns);
    cal->batch_sizes = batch_sizes;
    cal->batch_exit_layer = exit_layer;
    cal->batch_context = context;
    cal->batch_step_us.clear();
    cal->batch_verify_us.clear();
    cal->batch_draft_us.clear();
    size_t i = 0;
    for (size_t b = 0; b < batch_sizes.size(); ++b) {
      cal->batch_step_us.push_back(us[i++]);
      cal->batch_verify_us.emplace_back(us.begin() + static_cast<std::ptrdiff_t>(i),
                                        us.begin() + static_cast<std::ptrdiff_t>(i + max_draft_len));
      i += static_cast<size_t>(max_draft_len);
      cal->batch_draft_us.push_back(us[i++]);
    }
    return OkStatus();
  });
}

StatusOr<Calibration> Calibrate(const LlamaModel& model, int repeats, const std::function<void()>& decide,
                                int round_passes, int64_t round_max_draft_len,
                                const std::vector<std::vector<int32_t>>& round_prompts, int64_t round_new_tokens) {
  LEDE_ASSIGN_OR_RETURN(Calibration cal, CalibrateKernels(model, repeats, decide));
  if (round_passes > 0) {
    LEDE_RETURN_IF_ERROR(
        CalibrateRounds(model, round_passes, round_max_draft_len, round_prompts, round_new_tokens, &cal));
  }
  return cal;
}

StatusOr<ServedStepCosts> TimeStepsInContext(const LlamaModel& model, const std::vector<int64_t>& exit_layers,
                                             int64_t draft_len, int64_t new_tokens, int passes) {
  const checkpoint::ModelConfig& c = model.config();
  const int64_t L = c.n_layers;
  if (exit_layers.empty()) return InvalidArgumentError("exit_layers: want at least one");
  for (int64_t e : exit_layers) {
    if (e < 1 || e >= L) {
      return InvalidArgumentError("exit_layers: " + std::to_string(e) + " is outside [1, " + std::to_string(L) + ")");
    }
  }
  if (draft_len < 1 || draft_len > 16) return InvalidArgumentError("draft_len: must be in [1, 16]");
  if (passes < 1) return InvalidArgumentError("passes: must be >= 1");
  const KvCacheOptions ko = ScratchKvOptions(model, 1, std::min<int64_t>(c.max_seq_len, 256), draft_len);
  const std::vector<int32_t> prompt = SyntheticPrompt(c, ko.capacity);
  if (new_tokens < 2 || static_cast<int64_t>(prompt.size()) + new_tokens + draft_len + 1 > ko.capacity) {
    return InvalidArgumentError("new_tokens: " + std::to_string(new_tokens) + " must be >= 2 and fit the context of " +
                                std::to_string(ko.capacity) + " after a " + std::to_string(prompt.size()) +
                                "-token prompt");
  }
  return TorchBoundary("time steps in context", [&]() -> StatusOr<ServedStepCosts> {
    c10::InferenceMode guard;
    std::shared_ptr<const LlamaModel> shared(&model, [](const LlamaModel*) {});
    LEDE_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(shared, ko));
    RoundStepTimings steps(L);
    GenerateOptions ar;
    ar.stop_at_eos = false;
    ar.max_new_tokens = new_tokens;
    for (int pass = 0; pass < passes; ++pass) {
      LEDE_ASSIGN_OR_RETURN(GenerationResult a, engine->Generate(prompt, ar));
      for (const RoundRecord& rr : a.stats.rounds) steps.Add(rr);
      for (int64_t e : exit_layers) {
        GenerateOptions o = ar;
        o.mode = speculation::SpeculationMode::kStatic;
        o.exit_layer = static_cast<int32_t>(e);
        o.draft_len = static_cast<int32_t>(draft_len);
        LEDE_ASSIGN_OR_RETURN(GenerationResult r, engine->Generate(prompt, o));
        for (const RoundRecord& rr : r.stats.rounds) steps.Add(rr);
      }
    }
    return steps.Costs(HeadLayerEquivalents(c));
  });
}

std::string CalibrationToJson(const Calibration& c) {
  nlohmann::json j;
  j["model_fingerprint"] = c.model_fingerprint;
  j["device"] = c.device;
  j["n_layers"] = c.n_layers;
  j["threads"] = c.threads;
  j["block_us"] = c.block_us;
  j["head_us"] = c.head_us;
  j["step_us"] = c.step_us;
  j["decision_us"] = c.decision_us;
  j["signals_us"] = c.signals_us;
  if (!c.round_us.empty()) {
    j["round_us"] = c.round_us;
    j["ar_step_us"] = c.ar_step_us;
  }
  if (!c.context_steps.draft_step_s.empty()) {
    const ServedStepCosts& st = c.context_steps;
    j["context_steps"] = {{"draft_step_s", st.draft_step_s},
                          {"verify_s", st.verify_s},
                          {"verify_intercept_s", st.verify_intercept_s},
                          {"verify_slope_s", st.verify_slope_s}};
  }
  if (!c.batch_sizes.empty()) {
    j["batch_sizes"] = c.batch_sizes;
    j["batch_exit_layer"] = c.batch_exit_layer;
    j["batch_context"] = c.batch_context;
    j["batch_step_us"] = c.batch_step_us;
    j["batch_verify_us"] = c.batch_verify_us;
    j["batch_draft_us"] = c.batch_draft_us;
  }
  j["units"] = "microseconds; block_us[i] and head_us[i] are for i+1 positions; round_us[E-1][K-1] is a round "
               "of K drafts at exit layer E, ar_step_us an autoregressive round, both timed in the decoding loop; "
               "context_steps in seconds, the steps of those rounds as a model service times its served steps";
  return j.dump(2) + "\n";
}

StatusOr<Calibration> CalibrationFromJson(const std::string& text) {
  try {
    nlohmann::json j = nlohmann::json::parse(text);
    Calibration c;
    c.model_fingerprint = j.at("model_fingerprint").get<std::string>();
    c.device = j.at("device").get<std::string>();
    c.n_layers = j.at("n_layers").get<int64_t>();
    c.threads = j.value("threads", int64_t{0});
    c.block_us = j.at("block_us").get<std::vector<double>>();
    c.head_us = j.at("head_us").get<std::vector<double>>();
    c.step_us = j.at("step_us").get<double>();
    c.decision_us = j.value("decision_us", 0.0);
    c.signals_us = j.value("signals_us", 0.0);
    if (c.block_us.empty() || c.head_us.empty() || c.step_us <= 0 || c.n_layers <= 0) {
      return InvalidArgumentError("calibration: empty tables or non-positive step_us/n_layers");
    }
    if (j.contains("round_us")) {
      c.round_us = j.at("round_us").get<std::vector<std::vector<double>>>();
      c.ar_step_us = j.at("ar_step_us").get<double>();
      if (static_cast<int64_t>(c.round_us.size()) != c.n_layers - 1 || c.ar_step_us <= 0) {
        return InvalidArgumentError("calibration: round_us must have n_layers - 1 rows and ar_step_us be positive");
      }
      for (const auto& row : c.round_us) {
        if (row.empty() || row.size() != c.round_us[0].size() ||
            std::any_of(row.begin(), row.end(), [](double v) { return !(v > 0); })) {
          return InvalidArgumentError("calibration: round_us rows must be equally long and positive");
        }
      }
    }
    if (j.contains("context_steps")) {
      const nlohmann::json& st = j.at("context_steps");
      ServedStepCosts& cs = c.context_steps;
      cs.draft_step_s = st.at("draft_step_s").get<std::vector<double>>();
      cs.verify_s = st.at("verify_s").get<std::vector<double>>();
      cs.verify_intercept_s = st.at("verify_intercept_s").get<double>();
      cs.verify_slope_s = st.at("verify_slope_s").get<double>();
      auto finite_non_negative = [](const std::vector<double>& v) {
        return std::all_of(v.begin(), v.end(), [](double x) { return std::isfinite(x) && x >= 0; });
      };
      if (static_cast<int64_t>(cs.draft_step_s.size()) != c.n_layers + 1 || !finite_non_negative(cs.draft_step_s) ||
          !finite_non_negative(cs.verify_s) || !std::isfinite(cs.verify_intercept_s) ||
          !std::isfinite(cs.verify_slope_s)) {
        return InvalidArgumentError(
            "calibration: context_steps needs n_layers + 1 entries in draft_step_s, and finite seconds >= 0 in "
            "draft_step_s and verify_s (a finite verify line)");
      }
    }
    if (j.contains("batch_sizes")) {
      c.batch_sizes = j.at("batch_sizes").get<std::vector<int64_t>>();
      c.batch_exit_layer = j.at("batch_exit_layer").get<int64_t>();
      c.batch_context = j.value("batch_context", int64_t{0});
      c.batch_step_us = j.at("batch_step_us").get<std::vector<double>>();
      c.batch_verify_us = j.at("batch_verify_us").get<std::vector<std::vector<double>>>();
      c.batch_draft_us = j.at("batch_draft_us").get<std::vector<double>>();
      const size_t n = c.batch_sizes.size();
      auto positive = [](const std::vector<double>& v) {
        return !v.empty() && std::all_of(v.begin(), v.end(), [](double x) { return x > 0; });
      };
      bool ok = AscendingFromOne(c.batch_sizes) && c.batch_step_us.size() == n && c.batch_draft_us.size() == n &&
                c.batch_verify_us.size() == n && positive(c.batch_step_us) && positive(c.batch_draft_us);
      for (size_t b = 0; ok && b < n; ++b) {
        ok = positive(c.batch_verify_us[b]) && c.batch_verify_us[b].size() == c.batch_verify_us[0].size();
      }
      if (!ok) {
        return InvalidArgumentError(
            "calibration: batch_sizes must ascend from 1, and batch_step_us, batch_verify_us (equally long rows) "
            "and batch_draft_us hold one positive entry per size");
      }
    }
    return c;
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError(std::string("calibration JSON: ") + e.what());
  }
}

StatusOr<Calibration> ReadCalibrationFile(const std::string& path) {
  LEDE_ASSIGN_OR_RETURN(std::string text, file::ReadFile(path));
  return CalibrationFromJson(text);
}


}  // namespace lede::model::cost
