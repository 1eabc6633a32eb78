// File: shared/tokenizer/chat_template.cc
//
// A tree-walking interpreter of the Jinja2 subset described in
// chat_template.h. Three stages:
//   1. Lex the template into text / {{ }} / {% %} pieces, applying "-"
//      whitespace control, trim_blocks and lstrip_blocks the way Jinja's
//      lexer does (a block tag at the start of a line, counting the start of
//      the template and the text after a tag that ate its newline, takes the
//      spaces and tabs before it; the first newline after a block tag or
//      comment is dropped).
//   2. Parse each tag's expression tokens by recursive descent with Jinja's
//      precedence (or < and < not < comparisons < + - < ~ < * / // % < ** <
//      unary < postfix and filters/tests), and the tags into a statement tree.
//   3. Render with a stack of scopes: a for loop's body is a scope of its
//      own (so {% set %} inside a loop does not leak, as in Jinja, which is
//      why templates use namespace()); if-blocks are not.
// Values follow Python: ints, floats, strings (UTF-8; length and slices
// count code points), lists, insertion-ordered dicts, None, booleans, and
// Jinja's Undefined (prints as "", false, iterates as empty; taking an
// attribute of it is an error).
//
// The interpreter lives in internal/: jinja_value (the values),
// jinja_lexer (stage 1 and the expression tokens), jinja_expr_parser and
// jinja_parser (stage 2; jinja_ast holds the trees), jinja_renderer (stage 3).
#include "shared/tokenizer/chat_template.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <utility>

#include "shared/file/file.h"
#include "shared/status/status_macros.h"
#include "shared/tokenizer/gguf_tokenizer.h"
#include "shared/tokenizer/hf_config.h"
#include "shared/tokenizer/internal/jinja_ast.h"
#include "shared/tokenizer/internal/jinja_parser.h"
#include "shared/tokenizer/internal/jinja_renderer.h"
#include "shared/tokenizer/tokenizer.h"

namespace lede::tokenizer {

ChatTemplate::ChatTemplate(std::shared_ptr<const internal::TemplateProgram> program) : program_(std::move(program)) {}

StatusOr<ChatTemplate> ChatTemplate::Parse(std::string_view source, const std::string& name) {
  LEDE_ASSIGN_OR_RETURN(std::shared_ptr<internal::TemplateProgram> program, internal::ParseTemplate(source, name));
  return ChatTemplate(std::move(program));
}

StatusOr<std::string> ChatTemplate::RenderJson(const std::string& variables_json, std::time_t now) const {
  nlohmann::ordered_json vars;
  try {
    vars = nlohmann::ordered_json::parse(variables_json);
  } catch (const nlohmann::ordered_json::exception& e) {
    return InvalidArgumentError(std::string("chat template variables: bad JSON: ") + e.what());
  }
  if (!vars.is_object()) return InvalidArgumentError("chat template variables: not a JSON object");
  return internal::RenderTemplate(*program_, vars, now);
}

StatusOr<std::string> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                           const ChatTemplateOptions& options) const {
  for (const ChatMessage& m : messages) {
    if (!IsValidUtf8(m.role) || !IsValidUtf8(m.content)) return InvalidArgumentError("chat message: invalid UTF-8");
  }
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  vars["messages"] = nlohmann::ordered_json::array();
  for (const ChatMessage& m : messages) vars["messages"].push_back({{"role", m.role}, {"content", m.content}});
  vars["add_generation_prompt"] = options.add_generation_prompt;
  vars["bos_token"] = options.bos_token;
  vars["eos_token"] = options.eos_token;
  return RenderJson(vars.dump(), options.now);
}

StatusOr<ModelChatTemplate> LoadModelChatTemplate(const std::string& model_dir, const std::string& template_path) {
  std::error_code gguf_ec;
  if (std::filesystem::path(model_dir).extension() == ".gguf" && std::filesystem::is_regular_file(model_dir, gguf_ec)) {
    LEDE_ASSIGN_OR_RETURN(GgufChatTemplate g, ReadGgufChatTemplate(model_dir));
    std::string text = std::move(g.text), source = model_dir + " tokenizer.chat_template";
    if (!template_path.empty()) {
      LEDE_ASSIGN_OR_RETURN(text, file::ReadFile(template_path));
      source = template_path;
    }
    LEDE_ASSIGN_OR_RETURN(ChatTemplate parsed, ChatTemplate::Parse(text, source));
    return ModelChatTemplate{std::move(parsed), g.bos_token, g.eos_token, source};
  }
  LEDE_ASSIGN_OR_RETURN(HfTokenizerConfig config, ReadHfTokenizerConfig(model_dir.empty() ? "." : model_dir));
  std::string source = template_path, text;
  if (source.empty()) {
    const std::string jinja = (std::filesystem::path(model_dir) / "chat_template.jinja").string();
    std::error_code ec;
    if (std::filesystem::exists(jinja, ec)) source = jinja;
  }
  if (!source.empty()) {
    LEDE_ASSIGN_OR_RETURN(text, file::ReadFile(source));
  } else if (!config.chat_template.empty()) {
    text = config.chat_template;
    source = config.source + " chat_template";
  } else {
    return NotFoundError("no chat template in " + model_dir +
                         " (neither chat_template.jinja nor a chat_template in tokenizer_config.json)");
  }
  LEDE_ASSIGN_OR_RETURN(ChatTemplate parsed, ChatTemplate::Parse(text, source));
  return ModelChatTemplate{std::move(parsed), config.bos_token.value_or(""), config.eos_token.value_or(""), source};
}

}  // namespace lede::tokenizer
