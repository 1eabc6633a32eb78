// File: shared/tokenizer/internal/jinja_lexer.h
//
// The chat-template lexer: template source to pieces (text and tags), and
// a tag's expression to tokens.
#ifndef LEDE_SHARED_TOKENIZER_INTERNAL_JINJA_LEXER_H_
#define LEDE_SHARED_TOKENIZER_INTERNAL_JINJA_LEXER_H_

#include <string>
#include <string_view>
#include <vector>

#include "shared/status/status.h"

namespace lede::tokenizer::internal {

struct Piece {
  enum class Kind { kText, kVar, kBlock } kind;
  std::string content;
  int line;
};

// Splits a template into text, {{ }} and {% %} pieces (comments dropped),
// applying Jinja's defaults: newlines normalized to "\n", one trailing
// newline dropped, "-" whitespace control, trim_blocks and lstrip_blocks (a
// block tag at the start of a line, counting the start of the template and
// the text after a tag that ate its newline, takes the spaces and tabs before
// it; the first newline after a block tag or comment is dropped).
// InvalidArgumentError, naming `name` and the line, for an unclosed tag.
StatusOr<std::vector<Piece>> Lex(std::string_view raw, const std::string& name);

struct Token {
  enum class Kind { kName, kString, kInt, kFloat, kOp, kEnd } kind;
  std::string text;
  int line;
};

// The tokens of one tag's expression `s` (which starts on line `line`),
// ending with a kEnd token. String literals are unescaped as Python does.
// InvalidArgumentError, naming `name` and the line, for a bad token.
StatusOr<std::vector<Token>> Tokenize(const std::string& s, int line, const std::string& name);

}  // namespace lede::tokenizer::internal

#endif  // LEDE_SHARED_TOKENIZER_INTERNAL_JINJA_LEXER_H_
