// File: trainer/exit_eval.h
//
// Offline evaluation of a model's early exits (issue: demo model):
//  - per layer l = 1..L: held-out perplexity of the exit at l and its top-1
//    agreement with the last layer, over windows of a token stream;
//  - a grid of static self-speculation settings (exit layer E x draft length
//    D) run through the engine on held-out prompts: acceptance rate, tokens
//    per round, measured tokens/s against autoregressive decoding, and the
//    speed-up predicted by the accelerator and measured cost models.
// Results are nlohmann::json values so that tools can print and save them.
#ifndef LEDE_TRAINER_EXIT_EVAL_H_
#define LEDE_TRAINER_EXIT_EVAL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "shared/model/cost/cost_model.h"
#include "shared/model/decoding.h"
#include "shared/speculation/exit_controller.h"
#include "shared/model/llama.h"
#include "shared/status/status.h"

namespace lede::trainer {

// Aggregates of one decoding method over a set of prompts (greedy or not).
struct PromptTotals {
  int64_t tokens = 0;  // decode tokens (the prefill's first token excluded)
  double decode_s = 0;
  int64_t drafted = 0, accepted = 0, exact = 0, prompts = 0;
  std::vector<model::RoundRecord> rounds;
  std::vector<std::vector<int32_t>> outputs;
  std::map<int32_t, int64_t> exit_counts;  // exit layer -> rounds with drafts

  double tokens_per_s() const { return tokens / std::max(1e-9, decode_s); }
  double acceptance() const { return drafted > 0 ? static_cast<double>(accepted) / drafted : 0.0; }
  double tokens_per_round() const {
    int64_t emitted = 0;
    for (const auto& r : rounds) emitted += r.n_emitted;
    return rounds.empty() ? 0.0 : static_cast<double>(emitted) / rounds.size();
  }
  double mean_exit() const {
    double s = 0, n = 0;
    for (const auto& r : rounds) {
      if (r.n_drafted > 0) s += r.exit_layer, n += 1;
    }
    return n > 0 ? s / n : 0.0;
  }
  double mean_draft() const {
    double s = 0, n = 0;
    for (const auto& r : rounds) {
      if (r.n_drafted > 0) s += r.n_drafted, n += 1;
    }
    return n > 0 ? s / n : 0.0;
  }
};

// Makes the exit controller for prompt i (one per request); empty for
// methods without one.
using ControllerFactory = std::function<std::unique_ptr<speculation::ExitController>(int64_t prompt_index)>;

// Generates every prompt with `base` (and a controller from make_controller
// when given) and sums the statistics; with `reference` (outputs of the same
// prompts, e.g. autoregressive), counts exact matches.
// Errors: those of Engine::Generate.
StatusOr<PromptTotals> RunPrompts(model::Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                  const model::GenerateOptions& base, const ControllerFactory& make_controller,
                                  const std::vector<std::vector<int32_t>>* reference);

// Per-layer perplexity and top-1 agreement with the last layer over up to
// max_tokens tokens of `stream`, in windows of seq_len (no KV cache).
// Returns {"tokens", "perplexity": [L], "top1_agreement_with_last": [L]}.
// Errors: kInternal / kResourceExhausted from libtorch (the torch boundary).
StatusOr<nlohmann::json> EvaluateLayers(const model::LlamaModel& model,
                                        const std::vector<int32_t>& stream, int64_t seq_len, int64_t max_tokens);

// Runs autoregressive decoding and every (E, D) of the grid on `prompts`
// (greedy, new_tokens each). Returns {"ar": {...}, "static": [{E, D,
// acceptance_rate, tokens_per_round, tokens_per_s, measured_speedup,
// predicted_speedup_accelerator, predicted_speedup_measured,
// exact_match_rate}], "best_accelerator": {...}, "best_measured": {...}}.
// Errors: those of the engine.
StatusOr<nlohmann::json> EvaluateStaticGrid(std::shared_ptr<const model::LlamaModel> model,
                                            const std::vector<std::vector<int32_t>>& prompts,
                                            const std::vector<int64_t>& exit_layers,
                                            const std::vector<int64_t>& draft_lens, int64_t new_tokens,
                                            const model::cost::CostModel& accelerator,
                                            const model::cost::CostModel& measured);

}  // namespace lede::trainer

#endif  // LEDE_TRAINER_EXIT_EVAL_H_
