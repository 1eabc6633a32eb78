#include "services/coordinator/request_validation.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "shared/checkpoint/gguf.h"
#include "shared/status/status_macros.h"
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

Status ValidateRequestSize(const lede::v1::GenerateRequest& request, const RequestBounds& bounds) {
  const int64_t max_bytes = bounds.max_prompt_bytes();
  const std::string window = "the context window of " + std::to_string(bounds.capacity_tokens) + " tokens";
  const int64_t prompt_bytes = static_cast<int64_t>(request.prompt().size());
  // A slot smaller than the model's window (the verifier's KV budget): what
  // the window would hold is refused for want of KV memory, not as invalid.
  const int64_t window_tokens = std::max(bounds.capacity_tokens, bounds.context_window_tokens);
  const std::string slot = "a session's KV slot of " + std::to_string(bounds.capacity_tokens) +
                           " tokens (the server's KV memory budget; the model's context window is " +
                           std::to_string(window_tokens) + ")";
  if (prompt_bytes > max_bytes && prompt_bytes <= window_tokens * bounds.max_token_bytes) {
    return ResourceExhaustedError("prompt: " + std::to_string(prompt_bytes) + " bytes cannot fit " + slot);
  }
  if (request.prompt_token_ids_size() > bounds.capacity_tokens && request.prompt_token_ids_size() <= window_tokens) {
    return ResourceExhaustedError("prompt_token_ids: " + std::to_string(request.prompt_token_ids_size()) +
                                  " tokens cannot fit " + slot);
  }
  if (prompt_bytes > max_bytes) {
    return InvalidArgumentError("prompt: " + std::to_string(prompt_bytes) + " bytes cannot fit " + window +
                                " (at most " + std::to_string(max_bytes) + " bytes)");
  }
  if (request.prompt_token_ids_size() > bounds.capacity_tokens) {
    return InvalidArgumentError("prompt_token_ids: " + std::to_string(request.prompt_token_ids_size()) +
                                " tokens cannot fit " + window);
  }
  if (request.stop_size() > kMaxStopStrings) {
    return InvalidArgumentError("stop: " + std::to_string(request.stop_size()) + " strings, at most " +
                                std::to_string(kMaxStopStrings));
  }
  int64_t stop_bytes = 0;
  for (const std::string& stop : request.stop()) stop_bytes += static_cast<int64_t>(stop.size());
  if (stop_bytes > max_bytes) {
    return InvalidArgumentError("stop: " + std::to_string(stop_bytes) + " bytes in all cannot match within " +
                                window + " (at most " + std::to_string(max_bytes) + " bytes)");
  }
  return OkStatus();
}

namespace {
constexpr int64_t kOtherFieldsBytes = 64 << 10;
}  // namespace

int64_t MaxRequestMessageBytes(const RequestBounds& bounds) {
  const int64_t prompt = std::max(bounds.max_prompt_bytes(), 10 * bounds.capacity_tokens);
  return prompt + bounds.max_prompt_bytes() + kOtherFieldsBytes;
}

int64_t MaxHttpBodyBytes(const RequestBounds& bounds) {
  const int64_t prompt = std::max(6 * bounds.max_prompt_bytes(), 12 * bounds.capacity_tokens);
  return prompt + 6 * bounds.max_prompt_bytes() + kOtherFieldsBytes;
}

namespace {

StatusOr<int64_t> ReadLlama2cSeqLen(const std::filesystem::path& bin) {
  std::ifstream in(bin, std::ios::binary);
  int32_t header[7] = {};
  if (!in.read(reinterpret_cast<char*>(header), sizeof(header))) {
    return InvalidArgumentError(bin.string() + ": shorter than a llama2.c header");
  }
  if (header[6] <= 0) return InvalidArgumentError(bin.string() + ": seq_len " + std::to_string(header[6]));
  return static_cast<int64_t>(header[6]);
}

}  // namespace

StatusOr<int64_t> ReadContextWindow(const std::string& model_path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path path(model_path);
  if (fs::is_regular_file(path, ec) && path.extension() == ".bin") return ReadLlama2cSeqLen(path);
  if (fs::is_regular_file(path, ec) && path.extension() == ".gguf") {
    LEDE_ASSIGN_OR_RETURN(std::shared_ptr<const checkpoint::GgufFile> gguf, checkpoint::GgufFile::Open(model_path));
    LEDE_ASSIGN_OR_RETURN(int64_t n, gguf->GetInt("llama.context_length"));
    if (n <= 0) return InvalidArgumentError(model_path + ": metadata key llama.context_length is not positive");
    return n;
  }
  const fs::path config = path / "config.json";
  if (fs::is_regular_file(config, ec)) {
    std::ifstream in(config);
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return InvalidArgumentError(config.string() + ": not a JSON object");
    const auto it = j.find("max_position_embeddings");
    if (it == j.end() || !it->is_number_integer() || it->get<int64_t>() <= 0) {
      return InvalidArgumentError(config.string() + ": max_position_embeddings: not a positive integer");
    }
    return it->get<int64_t>();
  }
  if (fs::is_directory(path, ec)) {
    std::vector<fs::path> bins;
    for (const fs::directory_entry& e : fs::directory_iterator(path, ec)) {
      const std::string name = e.path().filename().string();
      if (e.path().extension() == ".bin" && name.rfind("tok", 0) != 0) bins.push_back(e.path());
    }
    if (bins.size() == 1) return ReadLlama2cSeqLen(bins[0]);
  }
  return NotFoundError(model_path + ": no config.json, llama2.c .bin or .gguf file to read the context window from");
}

}  // namespace lede::coordinator
