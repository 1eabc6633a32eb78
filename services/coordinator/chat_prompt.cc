#include "services/coordinator/chat_prompt.h"

#include <cctype>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "absl/strings/match.h"
#include "nlohmann/json.hpp"

namespace lede::coordinator {

StatusOr<std::string> RenderPlainChatPrompt(const std::vector<ChatMessage>& messages) {
  if (messages.empty()) return InvalidArgumentError("messages: empty");
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role.empty()) return InvalidArgumentError("messages[" + std::to_string(i) + "].role: empty");
    std::string role = m.role;
    if (role == "developer") role = "system";
    role[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(role[0])));
    out += role + ": " + m.content + "\n";
  }
  if (messages.back().role != "assistant") {
    out += "Assistant:";
  } else {
    out.pop_back();  // continue the assistant's message
  }
  return out;
}

bool HasChatTemplate(const std::string& model_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (model_dir.empty() || !fs::is_directory(model_dir, ec)) return false;
  if (fs::exists(fs::path(model_dir) / "chat_template.jinja", ec)) return true;
  std::ifstream in(fs::path(model_dir) / "tokenizer_config.json");
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.contains("chat_template") && !j["chat_template"].is_null();
}

ChatPromptRenderer TemplateChatRenderer(tokenizer::ModelChatTemplate chat_template) {
  auto t = std::make_shared<const tokenizer::ModelChatTemplate>(std::move(chat_template));
  return [t](const std::vector<ChatMessage>& messages) -> StatusOr<std::string> {
    if (messages.empty()) return InvalidArgumentError("messages: empty");
    tokenizer::ChatTemplateOptions o;
    o.add_generation_prompt = messages.back().role != "assistant";
    o.bos_token = t->bos_token;
    o.eos_token = t->eos_token;
    StatusOr<std::string> text = t->chat_template.Render(messages, o);
    if (!text.ok()) return InvalidArgumentError("messages: " + std::string(text.status().message()));
    if (!t->bos_token.empty() && absl::StartsWith(*text, t->bos_token)) text->erase(0, t->bos_token.size());
    return text;
  };
}

ChatPromptRenderer ChatRendererFor(const std::string& model_dir, std::string* which) {
  if (!HasChatTemplate(model_dir)) {
    if (which != nullptr) *which = "plain (the checkpoint has no chat template)";
    return RenderPlainChatPrompt;
  }
  StatusOr<tokenizer::ModelChatTemplate> t = tokenizer::LoadModelChatTemplate(model_dir);
  if (!t.ok()) {
    if (which != nullptr) *which = "plain (the chat template does not load: " + t.status().ToString() + ")";
    return RenderPlainChatPrompt;
  }
  if (which != nullptr) *which = "chat_template " + t->source;
  return TemplateChatRenderer(std::move(*t));
}

}  // namespace lede::coordinator
