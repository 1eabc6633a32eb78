// File: shared/tokenizer/internal/jinja_ast.h
//
// The parsed form of a chat template: expression trees (Expr) and the
// statement tree (Node) that jinja_parser.h builds and jinja_renderer.h
// walks. Plain structs; a TemplateProgram is immutable once parsed.
#ifndef LEDE_SHARED_TOKENIZER_INTERNAL_JINJA_AST_H_
#define LEDE_SHARED_TOKENIZER_INTERNAL_JINJA_AST_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "shared/tokenizer/internal/jinja_value.h"

namespace lede::tokenizer::internal {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;
struct Expr {
  enum class Kind {
    kLiteral, kName, kGetAttr, kGetItem, kSlice, kCall, kFilter, kTest, kNeg, kPos, kNot, kAnd, kOr,
    kBinary, kCompare, kCond, kList, kDict, kConcat
  };
  Kind kind;
  int line = 0;
  Value literal;
  std::string name;  // kName, kGetAttr attribute, kFilter/kTest name, kBinary/kCompare operator
  bool negated = false;  // kTest "is not"
  std::vector<ExprPtr> args;  // operands; kSlice: object, start, stop, step (null = absent)
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;
struct Node {
  enum class Kind { kText, kOutput, kIf, kFor, kSet, kSetBlock, kBreak, kContinue, kBlock };
  Kind kind;
  int line = 0;
  std::string text;                     // kText
  ExprPtr expr;                         // kOutput, kSet value, kFor iterable
  std::vector<std::pair<ExprPtr, Body>> branches;  // kIf (condition, body)
  Body body;                            // kFor, kSetBlock, kBlock; kIf: else
  Body else_body;                       // kFor
  std::vector<std::string> targets;     // kFor, kSet/kSetBlock (one)
  std::string attr;                     // kSet/kSetBlock: ns.attr
  ExprPtr filter;                       // kFor inline if
};

struct TemplateProgram {
  std::string name;
  Body body;
};

}  // namespace lede::tokenizer::internal

#endif  // LEDE_SHARED_TOKENIZER_INTERNAL_JINJA_AST_H_
