// The helpers the `lede` subcommands share (internal/common.h).
#include "services/cli/internal/common.h"

#include <filesystem>
#include <system_error>
#include <vector>

#include "shared/model/loaders/model_load_flags.h"
#include "shared/status/status_macros.h"
#include "shared/tokenizer/chat_template.h"

namespace lede::cli::internal {

StatusOr<model::ModelOptions> ModelFlags::Options() const {
  std::error_code ec;
  if (!std::filesystem::exists(model, ec)) {
    return NotFoundError("--model: no such file or directory: " + model);
  }
  LEDE_ASSIGN_OR_RETURN(model::ModelOptions o, model::loaders::ModelOptionsFromFlags(*this));
  LEDE_RETURN_IF_ERROR(model::loaders::ApplyThreadsFlag(threads).status());
  return o;
}

int Fail(std::ostream& err, const Status& s, int code) {
  err << "lede: " << model::loaders::OneLineMessage(s) << "\n";
  return code;
}

int LoadFailureCode(const Status&) { return model::loaders::kExitLoadFailure; }

StatusOr<std::string> RenderChatPrompt(const std::string& tokenizer_path, const std::string& template_path,
                                       const std::string& system, const std::string& user,
                                       bool add_generation_prompt) {
  // A GGUF file carries its own template (tokenizer.chat_template).
  const std::string dir = std::filesystem::path(tokenizer_path).extension() == ".gguf"
                              ? tokenizer_path
                              : std::filesystem::path(tokenizer_path).parent_path().string();
  StatusOr<tokenizer::ModelChatTemplate> tmpl = tokenizer::LoadModelChatTemplate(dir, template_path);
  if (tmpl.status().code() == StatusCode::kNotFound && template_path.empty()) {
    return NotFoundError(std::string(tmpl.status().message()) + "; pass --chat-template FILE");
  }
  LEDE_RETURN_IF_ERROR(tmpl.status());
  std::vector<tokenizer::ChatMessage> messages;
  if (!system.empty()) messages.push_back({"system", system});
  messages.push_back({"user", user});
  tokenizer::ChatTemplateOptions o;
  o.add_generation_prompt = add_generation_prompt;
  o.bos_token = tmpl->bos_token;
  o.eos_token = tmpl->eos_token;
  return tmpl->chat_template.Render(messages, o);
}

}  // namespace lede::cli::internal
