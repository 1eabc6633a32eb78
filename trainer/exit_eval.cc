#include "trainer/exit_eval.h"

#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "shared/model/decoding.h"
#include "shared/model/torch_boundary.h"
#include "shared/status/status_macros.h"

namespace lede::trainer {

StatusOr<PromptTotals> RunPrompts(model::Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                  const model::GenerateOptions& base, const ControllerFactory& make_controller,
                                  const std::vector<std::vector<int32_t>>* reference) {
  PromptTotals t;
  for (size_t i = 0; i < prompts.size(); ++i) {
    model::GenerateOptions o = base;
    std::unique_ptr<speculation::ExitController> controller;
    if (make_controller) {
      controller = make_controller(static_cast<int64_t>(i));
      o.controller = controller.get();
    }
    LEDE_ASSIGN_OR_RETURN(model::GenerationResult r, engine.Generate(prompts[i], o));
    t.tokens += r.stats.n_generated - 1;
    t.decode_s += r.stats.decode_s;
    t.drafted += r.stats.n_drafted;
    t.accepted += r.stats.n_accepted;
    for (const auto& round : r.stats.rounds) {
      if (round.n_drafted > 0) ++t.exit_counts[round.exit_layer];
    }
    t.rounds.insert(t.rounds.end(), r.stats.rounds.begin(), r.stats.rounds.end());
    if (reference != nullptr) t.exact += r.tokens == (*reference)[i] ? 1 : 0;
    t.outputs.push_back(std::move(r.tokens));
    ++t.prompts;
  }
  return t;
}

StatusOr<nlohmann::json> EvaluateLayers(const model::LlamaModel& m, const std::vector<int32_t>& stream,
                                        int64_t seq_len, int64_t max_tokens) {
  return model::TorchBoundary("EvaluateLayers", [&]() -> StatusOr<nlohmann::json> {
    c10::InferenceMode guard;
    const int64_t L = m.n_layers();
    std::vector<double> nll(L, 0.0), agree(L, 0.0);
    int64_t n = 0;
    for (int64_t start = 0; start + seq_len + 1 <= static_cast<int64_t>(stream.size()) && n < max_tokens;
         start += seq_len) {
      std::vector<int64_t> ids(stream.begin() + start, stream.begin() + start + seq_len + 1);
      at::Tensor t = at::tensor(ids, at::kLong).view({1, -1});
      at::Tensor inp = t.narrow(1, 0, seq_len), tgt = t.narrow(1, 1, seq_len).reshape({-1});
      at::Tensor h = m.Embed(inp);
      std::vector<at::Tensor> exits;
      for (int64_t l = 0; l < L; ++l) {
        h = m.Block(l, h, 0, nullptr, 0);
        exits.push_back(m.ExitLogits(h).view({seq_len, -1}));
      }
      at::Tensor final_top = exits.back().argmax(-1);
      for (int64_t l = 0; l < L; ++l) {
        nll[l] += at::cross_entropy_loss(exits[l], tgt, {}, at::Reduction::Sum).item<double>();
        agree[l] += at::eq(exits[l].argmax(-1), final_top).sum().item<double>();
      }
      n += seq_len;
    }
    nlohmann::json j;
    j["tokens"] = n;
    for (int64_t l = 0; l < L && n > 0; ++l) {
      j["perplexity"].push_back(std::exp(nll[l] / n));
      j["top1_agreement_with_last"].push_back(agree[l] / n);
    }
    return j;
  });
}

StatusOr<nlohmann::json> EvaluateStaticGrid(std::shared_ptr<const model::LlamaModel> model,
                                            const std::vector<std::vector<int32_t>>& prompts,
                                            const std::vector<int64_t>& exit_layers,
                                            const std::vector<int64_t>& draft_lens, int64_t new_tokens,
                                            const model::cost::CostModel& accelerator,
                                            const model::cost::CostModel& measured) {
  model::KvCacheOptions ko;
  ko.max_draft_len = std::max<int64_t>(16, *std::max_element(draft_lens.begin(), draft_lens.end()));
  LEDE_ASSIGN_OR_RETURN(auto engine, model::Engine::Create(model, ko));

  model::GenerateOptions ar;
  ar.max_new_tokens = new_tokens;
  std::vector<std::vector<int32_t>> reference;
  LEDE_ASSIGN_OR_RETURN(PromptTotals ar_totals, RunPrompts(*engine, prompts, ar, nullptr, nullptr));
  reference = ar_totals.outputs;
  const double ar_tps = ar_totals.tokens_per_s();
  nlohmann::json out;
  out["prompts"] = prompts.size();
  out["new_tokens"] = new_tokens;
  out["ar"] = {{"tokens_per_s", ar_tps}};
  nlohmann::json best_acc, best_meas;
  for (int64_t e : exit_layers) {
    for (int64_t d : draft_lens) {
      model::GenerateOptions o = ar;
      o.mode = model::SpeculationMode::kStatic;
      o.exit_layer = e;
      o.draft_len = d;
      LEDE_ASSIGN_OR_RETURN(PromptTotals t, RunPrompts(*engine, prompts, o, nullptr, &reference));
      const double tps = t.tokens_per_s();
      nlohmann::json row = {
          {"exit_layer", e},
          {"draft_len", d},
          {"acceptance_rate", t.acceptance()},
          {"tokens_per_round", t.tokens_per_round()},
          {"tokens_per_s", tps},
          {"measured_speedup", tps / ar_tps},
          {"predicted_speedup_accelerator", accelerator.PredictedSpeedup(t.rounds)},
          {"predicted_speedup_measured", measured.PredictedSpeedup(t.rounds)},
          {"exact_match_rate", static_cast<double>(t.exact) / prompts.size()}};
      out["static"].push_back(row);
      if (best_acc.is_null() || row["predicted_speedup_accelerator"] > best_acc["predicted_speedup_accelerator"]) {
        best_acc = row;
      }
      if (best_meas.is_null() || row["measured_speedup"] > best_meas["measured_speedup"]) best_meas = row;
    }
  }
  out["best_accelerator"] = best_acc;
  out["best_measured"] = best_meas;
  return out;
}

}  // namespace lede::trainer
