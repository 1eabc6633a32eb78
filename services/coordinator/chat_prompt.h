// File: services/coordinator/chat_prompt.h
//
// Chat messages → prompt text for /v1/chat/completions. A checkpoint's own
// chat template (tokenizer_config.json's `chat_template` or
// chat_template.jinja) is the right renderer; until shared/tokenizer has a
// template renderer, the coordinator renders every chat with the plain
// format below, behind the ChatPromptRenderer function type so the real
// renderer can replace it without touching the HTTP front end.
//
// The plain format (documented in README "Serving"): one block per message,
// "<Role>: <content>\n" with Role = System (for system and developer),
// User, Assistant, or the role name with its first letter upper-cased for
// any other role (Tool), blocks in order, then "Assistant:" when the last
// message is not the assistant's (the generation prompt); a last assistant
// message is continued instead (no trailing newline). Example:
//   [{system, "Be brief."}, {user, "Hi"}]  →  "System: Be brief.\nUser: Hi\nAssistant:"
// The tokenizer then adds BOS as for any prompt.
//
// Thread-safety: pure functions.
#ifndef LEDE_SERVICES_COORDINATOR_CHAT_PROMPT_H_
#define LEDE_SERVICES_COORDINATOR_CHAT_PROMPT_H_

#include <functional>
#include <string>
#include <vector>

#include "shared/status/status.h"

namespace lede::coordinator {

struct ChatMessage {
  std::string role;     // "system", "user", "assistant", "developer", "tool", ...
  std::string content;  // UTF-8 text (content parts already joined)
};

// Renders a conversation as the prompt to complete. Errors: kInvalidArgument
// naming the offending field ("messages[2].role: ...").
using ChatPromptRenderer = std::function<StatusOr<std::string>(const std::vector<ChatMessage>&)>;

// The plain format above. Errors: kInvalidArgument "messages: empty" for no
// messages, "messages[i].role: empty" for a message without a role.
StatusOr<std::string> RenderPlainChatPrompt(const std::vector<ChatMessage>& messages);

// True when `model_dir` holds a chat template (tokenizer_config.json with a
// "chat_template" key, or chat_template.jinja): the renderer the checkpoint
// asks for, which the coordinator cannot run yet (it logs that it falls
// back to the plain format).
bool HasChatTemplate(const std::string& model_dir);

}  // namespace lede::coordinator

#endif  // LEDE_SERVICES_COORDINATOR_CHAT_PROMPT_H_
