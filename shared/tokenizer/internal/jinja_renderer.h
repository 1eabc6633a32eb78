// File: shared/tokenizer/internal/jinja_renderer.h
//
// The chat-template renderer: walks a TemplateProgram with a stack of
// scopes. A for loop's body is a scope of its own (so {% set %} inside a
// loop does not leak, as in Jinja, which is why templates use
// namespace()); if-blocks are not.
#ifndef LEDE_SHARED_TOKENIZER_INTERNAL_JINJA_RENDERER_H_
#define LEDE_SHARED_TOKENIZER_INTERNAL_JINJA_RENDERER_H_

#include <ctime>
#include <nlohmann/json.hpp>
#include <string>

#include "shared/status/status.h"
#include "shared/tokenizer/internal/jinja_ast.h"

namespace lede::tokenizer::internal {

// Renders `program` with the members of the JSON object `variables` as its
// globals; `now` is the time strftime_now() formats (0: the current time,
// local time zone). Errors, each naming the template, lose the output:
// InvalidArgumentError for a runtime error (with the line), such as an
// attribute of Undefined, or for raise_exception(message) (with its
// message); UnimplementedError for a filter or test the parser let through
// but the renderer lacks.
StatusOr<std::string> RenderTemplate(const TemplateProgram& program, const nlohmann::ordered_json& variables,
                                     std::time_t now);

}  // namespace lede::tokenizer::internal

#endif  // LEDE_SHARED_TOKENIZER_INTERNAL_JINJA_RENDERER_H_
