// File: shared/tokenizer/internal/jinja_parser.h
//
// The chat-template parser: template source to its statement tree.
#ifndef LEDE_SHARED_TOKENIZER_INTERNAL_JINJA_PARSER_H_
#define LEDE_SHARED_TOKENIZER_INTERNAL_JINJA_PARSER_H_

#include <memory>
#include <string>
#include <string_view>

#include "shared/status/status.h"
#include "shared/tokenizer/internal/jinja_ast.h"

namespace lede::tokenizer::internal {

// Lexes and parses `source` (the subset of Jinja2 that chat_template.h
// describes); `name` names the template in error messages.
// InvalidArgumentError for a syntax error and UnimplementedError for a
// Jinja feature left out (a tag, filter or test), each naming the template
// and, except for an unexpected end of the template, the line.
StatusOr<std::shared_ptr<TemplateProgram>> ParseTemplate(std::string_view source, const std::string& name);

}  // namespace lede::tokenizer::internal

#endif  // LEDE_SHARED_TOKENIZER_INTERNAL_JINJA_PARSER_H_
