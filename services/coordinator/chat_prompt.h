// File: services/coordinator/chat_prompt.h
//
// Chat messages → prompt text for /v1/chat/completions. A checkpoint with a
// chat template (tokenizer_config.json's `chat_template`, or
// chat_template.jinja) is rendered with it (TemplateChatRenderer, through
// shared/tokenizer's Jinja-subset renderer, as transformers'
// apply_chat_template would); a checkpoint without one, or whose template
// uses a construct outside the subset, gets the plain format below. Both sit
// behind the ChatPromptRenderer function type, so the HTTP front end does not
// know which.
//
// The plain format (documented in docs/api.md "Chat formatting"): one block per message,
// "<Role>: <content>\n" with Role = System (for system and developer),
// User, Assistant, or the role name with its first letter upper-cased for
// any other role (Tool), blocks in order, then "Assistant:" when the last
// message is not the assistant's (the generation prompt); a last assistant
// message is continued instead (no trailing newline). Example:
//   [{system, "Be brief."}, {user, "Hi"}]  →  "System: Be brief.\nUser: Hi\nAssistant:"
// The tokenizer then adds BOS as for any prompt.
//
// Thread-safety: pure functions; a renderer may be called concurrently.
#ifndef LEDE_SERVICES_COORDINATOR_CHAT_PROMPT_H_
#define LEDE_SERVICES_COORDINATOR_CHAT_PROMPT_H_

#include <functional>
#include <string>
#include <vector>

#include "shared/status/status.h"
#include "shared/tokenizer/chat_template.h"

namespace lede::coordinator {

// One turn: role ("system", "user", "assistant", "developer", "tool", ...)
// and UTF-8 content (content parts already joined), as the template renders it.
using ChatMessage = tokenizer::ChatMessage;

// Renders a conversation as the prompt to complete. Errors: kInvalidArgument
// naming the offending field ("messages[2].role: ...").
using ChatPromptRenderer = std::function<StatusOr<std::string>(const std::vector<ChatMessage>&)>;

// The plain format above. Errors: kInvalidArgument "messages: empty" for no
// messages, "messages[i].role: empty" for a message without a role.
StatusOr<std::string> RenderPlainChatPrompt(const std::vector<ChatMessage>& messages);

// True when `model_dir` holds a chat template (tokenizer_config.json with a
// "chat_template" key, or chat_template.jinja).
bool HasChatTemplate(const std::string& model_dir);

// A renderer over the checkpoint's template: add_generation_prompt unless
// the last message is the assistant's (which is then continued), the
// template's bos_token / eos_token. Templates write BOS themselves while the
// coordinator's tokenizer adds one to every prompt, so a leading bos_token
// is cut from the text (the same ids when BOS is a special token of the
// tokenizer, as for Llama-2/3 and Mistral). Errors: kInvalidArgument
// "messages: empty"; the template's own (raise_exception, type errors) as
// kInvalidArgument naming "messages".
ChatPromptRenderer TemplateChatRenderer(tokenizer::ModelChatTemplate chat_template);

// The renderer for the checkpoint in `model_dir`: TemplateChatRenderer when
// it has a template that parses, else RenderPlainChatPrompt. `which`
// (may be null) receives "chat_template <source>" or the reason for "plain".
ChatPromptRenderer ChatRendererFor(const std::string& model_dir, std::string* which);

}  // namespace lede::coordinator

#endif  // LEDE_SERVICES_COORDINATOR_CHAT_PROMPT_H_
