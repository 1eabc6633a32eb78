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
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "shared/model/cost_model.h"
#include "shared/model/llama.h"
#include "shared/status/status.h"

namespace lede::trainer {

// Per-layer perplexity and top-1 agreement with the last layer over up to
// max_tokens tokens of `stream`, in windows of seq_len (no KV cache).
// Returns {"tokens", "perplexity": [L], "top1_agreement_with_last": [L]}.
nlohmann::json EvaluateLayers(const model::LlamaModel& model, const std::vector<int32_t>& stream,
                              int64_t seq_len, int64_t max_tokens);

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
                                            const model::CostModel& accelerator,
                                            const model::CostModel& measured);

}  // namespace lede::trainer

#endif  // LEDE_TRAINER_EXIT_EVAL_H_
