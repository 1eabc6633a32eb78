#include "trainer/cold_start.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <utility>

#include "policy/dqn/q_network.h"
#include "shared/status/status_macros.h"
#include "trainer/dinkelbach.h"

namespace lede::trainer {

std::string ColdStartChoice::Describe() const {
  if (!speculate) return "autoregressive";
  return "E=" + std::to_string(exit_layer) + " D=" + std::to_string(draft_len);
}

ColdStartChoice DefaultColdStart(int32_t n_layers) {
  ColdStartChoice c;
  c.speculate = n_layers >= 2;
  c.exit_layer = std::clamp<int32_t>(static_cast<int32_t>(std::lround(n_layers / 4.0)), 1, std::max(1, n_layers - 1));
  c.draft_len = 3;
  c.how = "default";
  return c;
}

StatusOr<ColdStartChoice> ChooseColdStartFromTraces(const std::vector<ShadowTrace>& traces, int32_t max_draft_len,
                                                    const model::cost::CostModel& cost,
                                                    const std::vector<int32_t>& exit_layers) {
  if (traces.empty()) return InvalidArgumentError("cold start: no calibration requests");
  if (max_draft_len < 1) return InvalidArgumentError("cold start: max_draft_len must be >= 1");
  LEDE_ASSIGN_OR_RETURN(StaticChoice best, BestStatic(traces, max_draft_len, cost, exit_layers));
  ColdStartChoice c;
  c.how = "self-calibration";
  c.n_requests = static_cast<int64_t>(traces.size());
  for (const ShadowTrace& t : traces) c.n_tokens += static_cast<int64_t>(t.target.size());
  if (best.exit_layer >= 1 && best.speedup >= 1.0 + kMinColdStartGain) {
    c.speculate = true;
    c.exit_layer = best.exit_layer;
    c.draft_len = best.draft_len;
    c.speedup = best.speedup;
  }
  return c;
}

int64_t WeightsPerToken(const checkpoint::ModelConfig& c) {
  const int64_t attention = c.dim * (c.dim + 2 * c.kv_dim()) + c.dim * c.dim;  // Wqkv, Wo
  const int64_t ffn = 3 * c.dim * c.hidden_dim;                                 // gate, up, down
  return c.n_layers * (attention + ffn) + c.vocab_size * c.dim;                 // + LM head
}

ColdStartSizing SizeColdStart(int64_t weights_per_token, int32_t n_layers, int64_t max_prompts,
                              int64_t max_new_tokens) {
  const int64_t w = std::max<int64_t>(1, weights_per_token);
  const int64_t prompts_cap = std::max<int64_t>(1, max_prompts);
  const int64_t per_prompt_cap = std::max<int64_t>(1, max_new_tokens);
  const int64_t most = prompts_cap * per_prompt_cap;
  const double afford = std::floor(kColdStartWeightTokens / static_cast<double>(w));
  const int64_t total =
      std::min(most, std::max(kMinColdStartTokens, afford >= static_cast<double>(most) ? most
                                                                                       : static_cast<int64_t>(afford)));
  ColdStartSizing s;
  s.n_prompts = std::clamp<int64_t>((total + per_prompt_cap - 1) / per_prompt_cap, std::min<int64_t>(2, prompts_cap),
                                    prompts_cap);
  s.new_tokens = std::clamp<int64_t>(total / s.n_prompts, std::min(kMinColdStartTokensPerPrompt, per_prompt_cap),
                                     per_prompt_cap);
  if (total < most) {
    for (int32_t i = 1; i <= kMaxColdStartExits; ++i) {
      const int32_t e = std::clamp<int32_t>(static_cast<int32_t>(std::lround(n_layers * i / 8.0)), 1,
                                            std::max<int32_t>(1, n_layers - 1));
      if (s.exit_layers.empty() || s.exit_layers.back() < e) s.exit_layers.push_back(e);
    }
  }
  return s;
}

const std::vector<std::string>& ColdStartPrompts() {
  static const std::vector<std::string> prompts = {
      "Once upon a time, there was a little girl who",
      "The history of the city begins in the early",
      "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
      "Question: Why is the sky blue?\nAnswer:",
      "The following is a list of the largest rivers in the world:\n1.",
      "#include <stdio.h>\n\nint main(void) {\n",
  };
  return prompts;
}

StatusOr<ColdStartChoice> ChooseColdStart(model::Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                          int64_t new_tokens, int32_t max_draft_len, const model::cost::CostModel& cost,
                                          const std::function<bool()>& out_of_time,
                                          const std::vector<int32_t>& exit_layers) {
  std::vector<ShadowTrace> traces;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (!traces.empty() && out_of_time && out_of_time()) break;
    StatusOr<ShadowTrace> t =
        TraceGreedyRequest(engine, prompts[i], new_tokens, speculation::DecisionSpec{}.top_k,
                           "cold-start:" + std::to_string(i), exit_layers);
    // A prompt whose continuation is empty (EOS at once) has no trace: skip it.
    if (!t.ok() && t.status().code() == StatusCode::kInvalidArgument) continue;
    if (!t.ok()) return t.status();
    traces.push_back(*std::move(t));
  }
  return ChooseColdStartFromTraces(traces, max_draft_len, cost, exit_layers);
}

StatusOr<policy::dqn::Artifact> ColdStartArtifact(const ColdStartChoice& choice, int32_t n_layers,
                                                  const std::string& fingerprint, const std::string& version,
                                                  const std::string& cost_model) {
  if (n_layers < 2) return InvalidArgumentError("cold start: the model needs >= 2 layers");
  if (choice.speculate && (choice.exit_layer < 1 || choice.exit_layer >= n_layers || choice.draft_len < 1)) {
    return InvalidArgumentError("cold start: " + choice.Describe() + " outside E in [1, " +
                                std::to_string(n_layers - 1) + "], D >= 1");
  }
  LEDE_RETURN_IF_ERROR(policy::dqn::ValidateVersionName(version));
  policy::dqn::PolicyMetadata m;
  m.version = version;
  m.model_fingerprint = fingerprint;
  m.decision.candidate_layers = {choice.speculate ? choice.exit_layer : 1};
  m.decision.max_draft_len = choice.speculate ? choice.draft_len : 1;
  m.decision.probe_candidates = false;
  m.decision.lookahead_probe = false;
  m.reward_cost_model = cost_model;
  m.gamma = 0;
  m.n_step = 1;
  m.seed = 1;
  m.training_options["cold_start"] = 1;
  m.training_options["self_calibrated"] = choice.how == "self-calibration" ? 1 : 0;
  m.training_options["exit_layer"] = choice.speculate ? choice.exit_layer : 0;
  m.training_options["draft_len"] = choice.speculate ? choice.draft_len : 0;
  m.offline_metrics["cold_start_predicted_speedup"] = choice.speedup;
  m.offline_metrics["cold_start_calibration_requests"] = static_cast<double>(choice.n_requests);
  m.offline_metrics["cold_start_calibration_tokens"] = static_cast<double>(choice.n_tokens);
  m.training_data.behaviour_versions = {"cold-start:" + choice.Describe()};

  policy::dqn::QNetworkWeights w = policy::dqn::QNetwork::Random(policy::dqn::kDefaultHidden, 1).weights();
  for (float& v : w.fc1_weight) v *= 0.1f;
  for (float& v : w.fc2_weight) v *= 0.1f;
  std::fill(w.fc3_weight.begin(), w.fc3_weight.end(), 0.0f);
  // q[0] = kContinue, q[1] = kExit; a tie would go to kContinue.
  w.fc3_bias = choice.speculate ? std::vector<float>{0.0f, 1.0f} : std::vector<float>{1.0f, 0.0f};
  LEDE_ASSIGN_OR_RETURN(policy::dqn::QNetwork net, policy::dqn::QNetwork::Create(std::move(w)));
  return policy::dqn::Artifact{std::move(m), std::move(net)};
}

Status WriteColdStartPolicy(const std::string& policy_root, const policy::dqn::Artifact& artifact) {
  StatusOr<std::string> serving = policy::dqn::ResolveServingVersion(policy_root);
  if (serving.ok()) {
    return AlreadyExistsError(policy_root + " already serves policy " + *serving + "; nothing written");
  }
  const std::string& version = artifact.metadata.version;
  LEDE_RETURN_IF_ERROR(policy::dqn::SaveArtifact(policy::dqn::VersionDir(policy_root, version), artifact));
  return policy::dqn::PublishServingVersion(policy_root, version, artifact.metadata.model_fingerprint);
}

}  // namespace lede::trainer
