#include "services/coordinator/request_validation.h"

#include <cmath>
#include <string>

#include "shared/tokenizer/tokenizer.h"

namespace lede::coordinator {

StatusOr<CheckedRequest> ValidateRequest(const lede::v1::GenerateRequest& request, int64_t max_new_tokens_limit,
                                         bool fill_max_tokens) {
  if (request.request_id().size() > 128) return InvalidArgumentError("request_id: longer than 128 bytes");
  if (!tokenizer::IsValidUtf8(request.request_id())) return InvalidArgumentError("request_id: invalid UTF-8");
  if (!request.prompt().empty() && request.prompt_token_ids_size() > 0) {
    return InvalidArgumentError("prompt: give prompt or prompt_token_ids, not both");
  }
  if (request.prompt().empty() && request.prompt_token_ids_size() == 0) return InvalidArgumentError("prompt: empty");
  if (!tokenizer::IsValidUtf8(request.prompt())) return InvalidArgumentError("prompt: invalid UTF-8");
  CheckedRequest checked;
  checked.auto_max_tokens = fill_max_tokens && request.max_new_tokens() == 0;
  if (!checked.auto_max_tokens &&
      (request.max_new_tokens() <= 0 || request.max_new_tokens() > max_new_tokens_limit)) {
    return InvalidArgumentError("max_new_tokens: must be in [1, " + std::to_string(max_new_tokens_limit) +
                                "], got " + std::to_string(request.max_new_tokens()));
  }
  if (!(request.temperature() >= 0.0f) || !std::isfinite(request.temperature())) {
    return InvalidArgumentError("temperature: must be a finite number >= 0");
  }
  checked.top_p = request.top_p() == 0.0f ? 1.0 : request.top_p();
  if (!(checked.top_p > 0.0 && checked.top_p <= 1.0)) return InvalidArgumentError("top_p: must be in (0, 1]");
  const lede::v1::SpeculationMethod method = request.method();
  if (!lede::v1::SpeculationMethod_IsValid(method)) {
    return InvalidArgumentError("method: unknown speculation method " + std::to_string(method));
  }
  const lede::v1::SpeculationParams& sp = request.speculation();
  if (method == lede::v1::SPECULATION_METHOD_THRESHOLD && !(sp.threshold() > 0.0f && sp.threshold() <= 1.0f)) {
    return InvalidArgumentError("speculation.threshold: must be in (0, 1]");
  }
  if ((method == lede::v1::SPECULATION_METHOD_LEDE || method == lede::v1::SPECULATION_METHOD_UNSPECIFIED) &&
      !(sp.epsilon() >= 0.0f && sp.epsilon() <= 1.0f)) {
    return InvalidArgumentError("speculation.epsilon: must be in [0, 1]");
  }
  for (int i = 0; i < request.stop_size(); ++i) {
    if (request.stop(i).empty() || !tokenizer::IsValidUtf8(request.stop(i))) {
      return InvalidArgumentError("stop[" + std::to_string(i) + "]: empty or invalid UTF-8");
    }
  }
  return checked;
}

Status ValidateForModel(const lede::v1::GenerateRequest& request, const lede::v1::ModelInfo& info) {
  if (request.method() == lede::v1::SPECULATION_METHOD_STATIC) {
    const lede::v1::SpeculationParams& sp = request.speculation();
    if (sp.exit_layer() < 1 || sp.exit_layer() > info.n_layers()) {
      return InvalidArgumentError("speculation.exit_layer: " + std::to_string(sp.exit_layer()) + " outside [1, " +
                                  std::to_string(info.n_layers()) + "]");
    }
    if (sp.draft_length() < 1 || sp.draft_length() > info.max_draft_length()) {
      return InvalidArgumentError("speculation.draft_length: " + std::to_string(sp.draft_length()) +
                                  " outside [1, " + std::to_string(info.max_draft_length()) + "]");
    }
  }
  for (int i = 0; i < request.prompt_token_ids_size(); ++i) {
    const int32_t id = request.prompt_token_ids(i);
    if (id < 0 || id >= info.vocab_size()) {
      return InvalidArgumentError("prompt_token_ids[" + std::to_string(i) + "]: " + std::to_string(id) +
                                  " outside [0, " + std::to_string(info.vocab_size()) + ")");
    }
  }
  return OkStatus();
}

}  // namespace lede::coordinator
