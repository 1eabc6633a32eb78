// File: shared/tokenizer/internal/jinja_parser.cc
//
// The statement parser: {% %} tags into a tree, recursive over nested
// blocks; each tag's expressions go to ExprParser.
#include "shared/tokenizer/internal/jinja_parser.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "shared/status/status_macros.h"
#include "shared/tokenizer/internal/jinja_expr_parser.h"
#include "shared/tokenizer/internal/jinja_lexer.h"

namespace lede::tokenizer::internal {

namespace {

class TemplateParser {
 public:
  TemplateParser(std::vector<Piece> pieces, std::string name) : pieces_(std::move(pieces)), name_(std::move(name)) {}

  // Parses until a block tag whose keyword is in `ends` (consumed; returned
  // in *end with its parser positioned after the keyword), or the end.
  Status ParseBody(const std::vector<std::string>& ends, Body* body, std::string* end,
                   std::unique_ptr<ExprParser>* end_parser) {
    while (i_ < pieces_.size()) {
      const Piece& piece = pieces_[i_++];
      if (piece.kind == Piece::Kind::kText) {
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::kText;
        n->line = piece.line;
        n->text = piece.content;
        body->push_back(std::move(n));
        continue;
      }
      LEDE_ASSIGN_OR_RETURN(std::vector<Token> tokens, Tokenize(piece.content, piece.line, name_));
      auto p = std::make_unique<ExprParser>(std::move(tokens), name_);
      if (piece.kind == Piece::Kind::kVar) {
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::kOutput;
        n->line = piece.line;
        LEDE_ASSIGN_OR_RETURN(n->expr, p->Parse());
        if (!p->AtEnd()) return p->Error("unexpected '" + p->Peek().text + "' in {{ }}");
        body->push_back(std::move(n));
        continue;
      }
      if (p->Peek().kind != Token::Kind::kName) return p->Error("expected a tag name");
      const std::string keyword = p->Next().text;
      if (std::find(ends.begin(), ends.end(), keyword) != ends.end()) {
        *end = keyword;
        *end_parser = std::move(p);
        return OkStatus();
      }
      LEDE_RETURN_IF_ERROR(ParseTag(keyword, piece.line, p.get(), body));
    }
    if (!ends.empty()) {
      return InvalidArgumentError(name_ + ": unexpected end of template; expected '{% " + ends.back() + " %}'");
    }
    return OkStatus();
  }

  Status ExpectTagEnd(ExprParser* p) {
    if (!p->AtEnd()) return p->Error("unexpected '" + p->Peek().text + "' at the end of the tag");
    return OkStatus();
  }

  Status ParseTag(const std::string& keyword, int line, ExprParser* p, Body* body) {
    auto n = std::make_unique<Node>();
    n->line = line;
    std::string end;
    std::unique_ptr<ExprParser> ep;
    if (keyword == "if") {
      n->kind = Node::Kind::kIf;
      LEDE_ASSIGN_OR_RETURN(ExprPtr cond, p->Parse());
      LEDE_RETURN_IF_ERROR(ExpectTagEnd(p));
      while (true) {
        Body branch;
        LEDE_RETURN_IF_ERROR(ParseBody({"elif", "else", "endif"}, &branch, &end, &ep));
        n->branches.emplace_back(std::move(cond), std::move(branch));
        if (end == "elif") {
          LEDE_ASSIGN_OR_RETURN(cond, ep->Parse());
          LEDE_RETURN_IF_ERROR(ExpectTagEnd(ep.get()));
          continue;
        }
        LEDE_RETURN_IF_ERROR(ExpectTagEnd(ep.get()));
        if (end == "else") {
          LEDE_RETURN_IF_ERROR(ParseBody({"endif"}, &n->body, &end, &ep));
          LEDE_RETURN_IF_ERROR(ExpectTagEnd(ep.get()));
        }
        break;
      }
    } else if (keyword == "for") {
      n->kind = Node::Kind::kFor;
      while (true) {
        LEDE_ASSIGN_OR_RETURN(std::string target, p->ExpectName());
        n->targets.push_back(target);
        if (!p->IsOp(",")) break;
        p->Next();
      }
      if (!p->IsName("in")) return p->Error("expected 'in' in a for tag");
      p->Next();
      LEDE_ASSIGN_OR_RETURN(n->expr, p->Parse(/*with_condexpr=*/false));
      if (p->IsName("if")) {
        p->Next();
        LEDE_ASSIGN_OR_RETURN(n->filter, p->Parse(false));
      }
      if (p->IsName("recursive")) {
        return UnimplementedError(name_ + ": line " + std::to_string(line) + ": unsupported 'for ... recursive'");
      }
      LEDE_RETURN_IF_ERROR(ExpectTagEnd(p));
      LEDE_RETURN_IF_ERROR(ParseBody({"else", "endfor"}, &n->body, &end, &ep));
      LEDE_RETURN_IF_ERROR(ExpectTagEnd(ep.get()));
      if (end == "else") {
        LEDE_RETURN_IF_ERROR(ParseBody({"endfor"}, &n->else_body, &end, &ep));
        LEDE_RETURN_IF_ERROR(ExpectTagEnd(ep.get()));
      }
    } else if (keyword == "set") {
      LEDE_ASSIGN_OR_RETURN(std::string target, p->ExpectName());
      n->targets.push_back(target);
      if (p->IsOp(".")) {
        p->Next();
        LEDE_ASSIGN_OR_RETURN(n->attr, p->ExpectName());
      }
      if (p->IsOp(",")) {
        return UnimplementedError(name_ + ": line " + std::to_string(line) + ": unsupported tuple 'set'");
      }
      if (p->IsOp("=")) {
        p->Next();
        n->kind = Node::Kind::kSet;
        LEDE_ASSIGN_OR_RETURN(n->expr, p->Parse());
        LEDE_RETURN_IF_ERROR(ExpectTagEnd(p));
      } else {
        n->kind = Node::Kind::kSetBlock;
        LEDE_RETURN_IF_ERROR(ExpectTagEnd(p));
        LEDE_RETURN_IF_ERROR(ParseBody({"endset"}, &n->body, &end, &ep));
        LEDE_RETURN_IF_ERROR(ExpectTagEnd(ep.get()));
      }
    } else if (keyword == "break" || keyword == "continue") {
      n->kind = keyword == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      LEDE_RETURN_IF_ERROR(ExpectTagEnd(p));
    } else if (keyword == "generation") {
      // transformers' AssistantTracker: marks assistant text, renders as is.
      n->kind = Node::Kind::kBlock;
      LEDE_RETURN_IF_ERROR(ExpectTagEnd(p));
      LEDE_RETURN_IF_ERROR(ParseBody({"endgeneration"}, &n->body, &end, &ep));
    } else if (keyword == "elif" || keyword == "else" || keyword == "endif" || keyword == "endfor" ||
               keyword == "endset" || keyword == "endgeneration") {
      return InvalidArgumentError(name_ + ": line " + std::to_string(line) + ": unexpected '{% " + keyword + " %}'");
    } else {
      return UnimplementedError(name_ + ": line " + std::to_string(line) + ": unsupported tag '" + keyword + "'");
    }
    body->push_back(std::move(n));
    return OkStatus();
  }

 private:
  std::vector<Piece> pieces_;
  std::string name_;
  size_t i_ = 0;
};

}  // namespace

StatusOr<std::shared_ptr<TemplateProgram>> ParseTemplate(std::string_view source, const std::string& name) {
  LEDE_ASSIGN_OR_RETURN(std::vector<Piece> pieces, Lex(source, name));
  auto program = std::make_shared<TemplateProgram>();
  program->name = name;
  TemplateParser parser(std::move(pieces), name);
  std::string end;
  std::unique_ptr<ExprParser> end_parser;
  LEDE_RETURN_IF_ERROR(parser.ParseBody({}, &program->body, &end, &end_parser));
  return program;
}

}  // namespace lede::tokenizer::internal
