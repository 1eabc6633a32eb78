// File: shared/tokenizer/internal/jinja_expr_parser.h
//
// The chat-template expression parser: one tag's tokens to an Expr tree.
#ifndef LEDE_SHARED_TOKENIZER_INTERNAL_JINJA_EXPR_PARSER_H_
#define LEDE_SHARED_TOKENIZER_INTERNAL_JINJA_EXPR_PARSER_H_

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "shared/status/status.h"
#include "shared/tokenizer/internal/jinja_ast.h"
#include "shared/tokenizer/internal/jinja_lexer.h"

namespace lede::tokenizer::internal {

// Recursive descent over one tag's tokens with Jinja's precedence: or < and
// < not < comparisons < + - < ~ < * / // % < ** < unary < postfix and
// filters/tests. Unknown filters and tests are errors at parse time.
// Errors are InvalidArgumentError (UnimplementedError for Jinja features the
// interpreter leaves out), naming the template and the line.
class ExprParser {
 public:
  ExprParser(std::vector<Token> tokens, std::string name) : t_(std::move(tokens)), name_(std::move(name)) {}

  // expression := or ['if' or ['else' expression]]; without `with_condexpr`
  // a trailing 'if' is left for the caller (a for tag's filter).
  StatusOr<ExprPtr> Parse(bool with_condexpr = true);

  // The token `ahead` places on (the kEnd token past the end).
  const Token& Peek(size_t ahead = 0) const { return t_[std::min(p_ + ahead, t_.size() - 1)]; }
  bool AtEnd() const { return Peek().kind == Token::Kind::kEnd; }
  bool IsOp(const char* op, size_t ahead = 0) const;
  bool IsName(const char* n, size_t ahead = 0) const;
  // Returns the current token and moves past it.
  Token Next() { return t_[std::min(p_++, t_.size() - 1)]; }
  // InvalidArgumentError naming the template and the current token's line.
  Status Error(const std::string& what) const;
  Status Expect(const char* op);
  StatusOr<std::string> ExpectName();

 private:
  ExprPtr Make(Expr::Kind kind);
  StatusOr<ExprPtr> ParseOr();
  StatusOr<ExprPtr> ParseAnd();
  StatusOr<ExprPtr> ParseNot();
  StatusOr<ExprPtr> ParseCompare();
  StatusOr<ExprPtr> ParseMath1();
  StatusOr<ExprPtr> ParseConcat();
  StatusOr<ExprPtr> ParseMath2();
  StatusOr<ExprPtr> ParsePow();
  StatusOr<ExprPtr> ParseUnary(bool with_filter);
  Status ParseCallArgs(Expr* call);
  StatusOr<ExprPtr> ParsePostfix(ExprPtr e);
  StatusOr<ExprPtr> ParseFilterAndTest(ExprPtr e);
  StatusOr<ExprPtr> ParsePrimary();

  std::vector<Token> t_;
  std::string name_;
  size_t p_ = 0;
};

}  // namespace lede::tokenizer::internal

#endif  // LEDE_SHARED_TOKENIZER_INTERNAL_JINJA_EXPR_PARSER_H_
