// File: shared/tokenizer/chat_template.h
//
// ChatTemplate: renders a checkpoint's chat_template (tokenizer_config.json)
// for a conversation, the way transformers' apply_chat_template does: a
// Jinja2 template in an ImmutableSandboxedEnvironment with trim_blocks and
// lstrip_blocks, the globals raise_exception(msg), strftime_now(fmt) and
// namespace(...), the loopcontrols extension ({% break %}, {% continue %}),
// and transformers' tojson (json.dumps with ensure_ascii=False).
//
// The renderer is our own interpreter of the subset that real chat templates
// use (Llama-3/3.1, Qwen2.5, Mistral-Nemo are golden-tested byte for byte
// against Debian's python3-jinja2, tests/shared/tokenizer/chat_template_test.cc):
//  - text, {{ expr }}, {% stmt %}, {# comment #}, "-" whitespace control;
//  - for (one name or a tuple, inline "if" filter, loop.index/index0/first/
//    last/length/revindex/revindex0/previtem/nextitem, else), if/elif/else,
//    set (names and namespace attributes; block set), break/continue,
//    generation/endgeneration (rendered as is);
//  - literals (strings with Python escapes, ints, floats, true/false/none in
//    either case, lists, dicts), attribute and item access, slices, calls,
//    not/and/or, comparisons, in / not in, + - * / // % **, ~, the
//    conditional expression, filters trim, tojson (indent, sort_keys),
//    length/count, string, list, first, last, join, upper, lower,
//    capitalize, title, default/d, items, replace, int, float, abs, reverse,
//    selectattr, rejectattr, map, safe; tests defined, undefined, none,
//    string, number, integer, float, boolean, true, false, mapping,
//    sequence, iterable, equalto/eq, ne, odd, even, divisibleby, in; string
//    methods strip/lstrip/rstrip/split/startswith/endswith/upper/lower/
//    title/capitalize/replace, dict methods items/keys/values/get.
// Anything else (macros, call blocks, include, unknown filters or tests) is
// rejected at Parse() with kUnimplemented naming the construct and its line.
// Values print as Python would (True, None, ['a', 1]).
//
// Thread-safety: a parsed ChatTemplate is immutable; Render() is const and
// safe to call concurrently.
#ifndef LEDE_SHARED_TOKENIZER_CHAT_TEMPLATE_H_
#define LEDE_SHARED_TOKENIZER_CHAT_TEMPLATE_H_

#include <ctime>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "shared/status/status.h"

namespace lede::tokenizer {

// One turn of a conversation.
struct ChatMessage {
  std::string role;     // "system", "user", "assistant", "tool", ...
  std::string content;  // UTF-8
};

// What a template is rendered with (the variables transformers passes).
struct ChatTemplateOptions {
  // Ends the text with the assistant header, so the model answers next.
  bool add_generation_prompt = true;
  std::string bos_token;  // tokenizer_config.json's bos_token ("" if none)
  std::string eos_token;  // its eos_token
  // The time strftime_now() formats (local time), in seconds since the
  // epoch; 0 = the current time. Tests fix it.
  std::time_t now = 0;
};

namespace internal {
struct TemplateProgram;
}  // namespace internal

class ChatTemplate {
 public:
  // Parses `source` (Jinja text). `name` labels errors ("tokenizer_config.json
  // chat_template").
  // Errors: kInvalidArgument for a syntax error, kUnimplemented for a
  // construct outside the subset; both name the construct and its line.
  static StatusOr<ChatTemplate> Parse(std::string_view source, const std::string& name);

  // Renders for `messages`.
  // Errors: kInvalidArgument with the template's message if it calls
  // raise_exception (e.g. roles that do not alternate), or for a type error
  // while rendering (adding a string to a number, indexing past a list, an
  // attribute of an undefined value), with the line.
  StatusOr<std::string> Render(const std::vector<ChatMessage>& messages, const ChatTemplateOptions& options) const;

  // Renders with a JSON object of variables (messages with any fields, e.g.
  // tool_calls; tools; documents; add_generation_prompt; bos_token; ...).
  // `now` as in ChatTemplateOptions. Errors: kInvalidArgument for bad JSON
  // (or not an object); otherwise as Render().
  StatusOr<std::string> RenderJson(const std::string& variables_json, std::time_t now = 0) const;

 private:
  explicit ChatTemplate(std::shared_ptr<const internal::TemplateProgram> program);
  std::shared_ptr<const internal::TemplateProgram> program_;
};

// A checkpoint's chat template and the special tokens it is rendered with.
struct ModelChatTemplate {
  ChatTemplate chat_template;
  std::string bos_token;  // tokenizer_config.json's bos_token ("" if none)
  std::string eos_token;
  std::string source;     // the file the template came from
};

// The chat template of the checkpoint in `model_dir`: `template_path` when
// given, else model_dir/chat_template.jinja, else tokenizer_config.json's
// chat_template; bos/eos tokens from tokenizer_config.json. A `model_dir`
// that is a .gguf file gives its tokenizer.chat_template (template_path
// still wins) and the BOS/EOS texts of its vocabulary.
// Errors: kNotFound naming the files looked at when there is none; those of
// ReadHfTokenizerConfig, of reading the file, and of ChatTemplate::Parse
// (kUnimplemented for a construct outside the subset).
StatusOr<ModelChatTemplate> LoadModelChatTemplate(const std::string& model_dir,
                                                  const std::string& template_path = "");

}  // namespace lede::tokenizer

#endif  // LEDE_SHARED_TOKENIZER_CHAT_TEMPLATE_H_
