// File: shared/tokenizer/internal/jinja_expr_parser.cc
//
// See jinja_expr_parser.h.
#include "shared/tokenizer/internal/jinja_expr_parser.h"

#include <memory>

#include "shared/status/status_macros.h"

namespace lede::tokenizer::internal {

namespace {

const std::vector<std::string>& KnownFilters() {
  static const std::vector<std::string> f = {
      "trim", "tojson", "length", "count", "string", "list", "first", "last", "join", "upper", "lower",
      "capitalize", "title", "default", "d", "items", "replace", "int", "float", "abs", "reverse",
      "selectattr", "rejectattr", "map", "safe", "unique"};
  return f;
}
const std::vector<std::string>& KnownTests() {
  static const std::vector<std::string> t = {
      "defined", "undefined", "none", "string", "number", "integer", "float", "boolean", "true", "false",
      "mapping", "sequence", "iterable", "equalto", "eq", "ne", "odd", "even", "divisibleby", "in", "callable"};
  return t;
}

}  // namespace

bool ExprParser::IsOp(const char* op, size_t ahead) const {
  return Peek(ahead).kind == Token::Kind::kOp && Peek(ahead).text == op;
}

bool ExprParser::IsName(const char* n, size_t ahead) const {
  return Peek(ahead).kind == Token::Kind::kName && Peek(ahead).text == n;
}

Status ExprParser::Error(const std::string& what) const {
  return InvalidArgumentError(name_ + ": line " + std::to_string(Peek().line) + ": " + what);
}

Status ExprParser::Expect(const char* op) {
  if (!IsOp(op)) {
    return Error(std::string("expected '") + op + "', got '" + (AtEnd() ? "end of tag" : Peek().text) + "'");
  }
  ++p_;
  return OkStatus();
}

StatusOr<std::string> ExprParser::ExpectName() {
  if (Peek().kind != Token::Kind::kName) return Error("expected a name, got '" + Peek().text + "'");
  return Next().text;
}

ExprPtr ExprParser::Make(Expr::Kind kind) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = Peek().line;
  return e;
}

StatusOr<ExprPtr> ExprParser::Parse(bool with_condexpr) {
  LEDE_ASSIGN_OR_RETURN(ExprPtr e, ParseOr());
  while (with_condexpr && IsName("if")) {
    ++p_;
    auto cond = Make(Expr::Kind::kCond);
    cond->args.push_back(std::move(e));
    LEDE_ASSIGN_OR_RETURN(ExprPtr test, ParseOr());
    cond->args.push_back(std::move(test));
    if (IsName("else")) {
      ++p_;
      LEDE_ASSIGN_OR_RETURN(ExprPtr other, Parse());
      cond->args.push_back(std::move(other));
    } else {
      cond->args.push_back(nullptr);
    }
    e = std::move(cond);
  }
  return e;
}

StatusOr<ExprPtr> ExprParser::ParseOr() {
  LEDE_ASSIGN_OR_RETURN(ExprPtr e, ParseAnd());
  while (IsName("or")) {
    ++p_;
    auto n = Make(Expr::Kind::kOr);
    n->args.push_back(std::move(e));
    LEDE_ASSIGN_OR_RETURN(ExprPtr r, ParseAnd());
    n->args.push_back(std::move(r));
    e = std::move(n);
  }
  return e;
}

StatusOr<ExprPtr> ExprParser::ParseAnd() {
  LEDE_ASSIGN_OR_RETURN(ExprPtr e, ParseNot());
  while (IsName("and")) {
    ++p_;
    auto n = Make(Expr::Kind::kAnd);
    n->args.push_back(std::move(e));
    LEDE_ASSIGN_OR_RETURN(ExprPtr r, ParseNot());
    n->args.push_back(std::move(r));
    e = std::move(n);
  }
  return e;
}

StatusOr<ExprPtr> ExprParser::ParseNot() {
  if (IsName("not")) {
    auto n = Make(Expr::Kind::kNot);
    ++p_;
    LEDE_ASSIGN_OR_RETURN(ExprPtr r, ParseNot());
    n->args.push_back(std::move(r));
    return n;
  }
  return ParseCompare();
}

StatusOr<ExprPtr> ExprParser::ParseCompare() {
  LEDE_ASSIGN_OR_RETURN(ExprPtr e, ParseMath1());
  while (true) {
    std::string op;
    if (IsOp("==") || IsOp("!=") || IsOp("<") || IsOp(">") || IsOp("<=") || IsOp(">=")) {
      op = Next().text;
    } else if (IsName("in")) {
      ++p_;
      op = "in";
    } else if (IsName("not") && IsName("in", 1)) {
      p_ += 2;
      op = "not in";
    } else {
      break;
    }
    auto n = Make(Expr::Kind::kCompare);
    n->name = op;
    n->args.push_back(std::move(e));
    LEDE_ASSIGN_OR_RETURN(ExprPtr r, ParseMath1());
    n->args.push_back(std::move(r));
    e = std::move(n);
  }
  return e;
}

StatusOr<ExprPtr> ExprParser::ParseMath1() {
  LEDE_ASSIGN_OR_RETURN(ExprPtr e, ParseConcat());
  while (IsOp("+") || IsOp("-")) {
    auto n = Make(Expr::Kind::kBinary);
    n->name = Next().text;
    n->args.push_back(std::move(e));
    LEDE_ASSIGN_OR_RETURN(ExprPtr r, ParseConcat());
    n->args.push_back(std::move(r));
    e = std::move(n);
  }
  return e;
}

StatusOr<ExprPtr> ExprParser::ParseConcat() {
  LEDE_ASSIGN_OR_RETURN(ExprPtr e, ParseMath2());
  if (!IsOp("~")) return e;
  auto n = Make(Expr::Kind::kConcat);
  n->args.push_back(std::move(e));
  while (IsOp("~")) {
    ++p_;
    LEDE_ASSIGN_OR_RETURN(ExprPtr r, ParseMath2());
    n->args.push_back(std::move(r));
  }
  return n;
}

StatusOr<ExprPtr> ExprParser::ParseMath2() {
  LEDE_ASSIGN_OR_RETURN(ExprPtr e, ParsePow());
  while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
    auto n = Make(Expr::Kind::kBinary);
    n->name = Next().text;
    n->args.push_back(std::move(e));
    LEDE_ASSIGN_OR_RETURN(ExprPtr r, ParsePow());
    n->args.push_back(std::move(r));
    e = std::move(n);
  }
  return e;
}

StatusOr<ExprPtr> ExprParser::ParsePow() {
  LEDE_ASSIGN_OR_RETURN(ExprPtr e, ParseUnary(true));
  while (IsOp("**")) {
    auto n = Make(Expr::Kind::kBinary);
    n->name = Next().text;
    n->args.push_back(std::move(e));
    LEDE_ASSIGN_OR_RETURN(ExprPtr r, ParseUnary(true));
    n->args.push_back(std::move(r));
    e = std::move(n);
  }
  return e;
}

StatusOr<ExprPtr> ExprParser::ParseUnary(bool with_filter) {
  ExprPtr e;
  if (IsOp("-") || IsOp("+")) {
    auto n = Make(IsOp("-") ? Expr::Kind::kNeg : Expr::Kind::kPos);
    ++p_;
    LEDE_ASSIGN_OR_RETURN(ExprPtr r, ParseUnary(false));
    n->args.push_back(std::move(r));
    e = std::move(n);
  } else {
    LEDE_ASSIGN_OR_RETURN(e, ParsePrimary());
    LEDE_ASSIGN_OR_RETURN(e, ParsePostfix(std::move(e)));
  }
  if (with_filter) return ParseFilterAndTest(std::move(e));
  return e;
}

Status ExprParser::ParseCallArgs(Expr* call) {
  LEDE_RETURN_IF_ERROR(Expect("("));
  while (!IsOp(")")) {
    if (Peek().kind == Token::Kind::kName && IsOp("=", 1)) {
      std::string key = Next().text;
      ++p_;
      LEDE_ASSIGN_OR_RETURN(ExprPtr v, Parse());
      call->kwargs.emplace_back(std::move(key), std::move(v));
    } else {
      LEDE_ASSIGN_OR_RETURN(ExprPtr v, Parse());
      call->args.push_back(std::move(v));
    }
    if (!IsOp(",")) break;
    ++p_;
  }
  return Expect(")");
}

StatusOr<ExprPtr> ExprParser::ParsePostfix(ExprPtr e) {
  while (true) {
    if (IsOp(".")) {
      ++p_;
      auto n = Make(Expr::Kind::kGetAttr);
      if (Peek().kind == Token::Kind::kInt) {
        n->kind = Expr::Kind::kGetItem;
        n->args.push_back(std::move(e));
        auto idx = Make(Expr::Kind::kLiteral);
        idx->literal = Value::Int(std::strtoll(Next().text.c_str(), nullptr, 10));
        n->args.push_back(std::move(idx));
      } else {
        LEDE_ASSIGN_OR_RETURN(n->name, ExpectName());
        n->args.push_back(std::move(e));
      }
      e = std::move(n);
    } else if (IsOp("[")) {
      ++p_;
      ExprPtr parts[3];
      bool slice = false;
      for (int k = 0; k < 3; ++k) {
        if (!IsOp(":") && !IsOp("]")) {
          LEDE_ASSIGN_OR_RETURN(parts[k], Parse());
        }
        if (k < 2 && IsOp(":")) {
          slice = true;
          ++p_;
        } else {
          break;
        }
      }
      LEDE_RETURN_IF_ERROR(Expect("]"));
      auto n = Make(slice ? Expr::Kind::kSlice : Expr::Kind::kGetItem);
      n->args.push_back(std::move(e));
      if (slice) {
        for (auto& part : parts) n->args.push_back(std::move(part));
      } else {
        if (!parts[0]) return Error("empty subscript");
        n->args.push_back(std::move(parts[0]));
      }
      e = std::move(n);
    } else if (IsOp("(")) {
      auto n = Make(Expr::Kind::kCall);
      n->args.push_back(std::move(e));
      LEDE_RETURN_IF_ERROR(ParseCallArgs(n.get()));
      e = std::move(n);
    } else {
      return e;
    }
  }
}

StatusOr<ExprPtr> ExprParser::ParseFilterAndTest(ExprPtr e) {
  while (true) {
    if (IsOp("|")) {
      ++p_;
      auto n = Make(Expr::Kind::kFilter);
      LEDE_ASSIGN_OR_RETURN(n->name, ExpectName());
      if (std::find(KnownFilters().begin(), KnownFilters().end(), n->name) == KnownFilters().end()) {
        return UnimplementedError(name_ + ": line " + std::to_string(n->line) + ": unsupported filter '" +
                                  n->name + "'");
      }
      n->args.push_back(std::move(e));
      if (IsOp("(")) LEDE_RETURN_IF_ERROR(ParseCallArgs(n.get()));
      e = std::move(n);
    } else if (IsName("is")) {
      ++p_;
      auto n = Make(Expr::Kind::kTest);
      if (IsName("not")) {
        ++p_;
        n->negated = true;
      }
      if (IsName("none") || IsName("true") || IsName("false")) {
        n->name = Next().text;
      } else {
        LEDE_ASSIGN_OR_RETURN(n->name, ExpectName());
      }
      if (std::find(KnownTests().begin(), KnownTests().end(), n->name) == KnownTests().end()) {
        return UnimplementedError(name_ + ": line " + std::to_string(n->line) + ": unsupported test '" +
                                  n->name + "'");
      }
      n->args.push_back(std::move(e));
      if (IsOp("(")) {
        LEDE_RETURN_IF_ERROR(ParseCallArgs(n.get()));
      } else if ((Peek().kind == Token::Kind::kString || Peek().kind == Token::Kind::kInt ||
                  Peek().kind == Token::Kind::kFloat ||
                  (Peek().kind == Token::Kind::kName && !IsName("and") && !IsName("or") && !IsName("else") &&
                   !IsName("if") && !IsName("is") && !IsName("in") && !IsName("not")))) {
        LEDE_ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
        LEDE_ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
        n->args.push_back(std::move(arg));
      }
      e = std::move(n);
    } else {
      return e;
    }
  }
}

StatusOr<ExprPtr> ExprParser::ParsePrimary() {
  const Token& tok = Peek();
  if (tok.kind == Token::Kind::kString) {
    auto n = Make(Expr::Kind::kLiteral);
    std::string s = Next().text;
    while (Peek().kind == Token::Kind::kString) s += Next().text;  // adjacent literals concatenate
    n->literal = Value::Str(std::move(s));
    return n;
  }
  if (tok.kind == Token::Kind::kInt) {
    auto n = Make(Expr::Kind::kLiteral);
    n->literal = Value::Int(std::strtoll(Next().text.c_str(), nullptr, 10));
    return n;
  }
  if (tok.kind == Token::Kind::kFloat) {
    auto n = Make(Expr::Kind::kLiteral);
    n->literal = Value::Float(std::strtod(Next().text.c_str(), nullptr));
    return n;
  }
  if (tok.kind == Token::Kind::kName) {
    auto n = Make(Expr::Kind::kLiteral);
    const std::string w = Next().text;
    if (w == "true" || w == "True") {
      n->literal = Value::Bool(true);
    } else if (w == "false" || w == "False") {
      n->literal = Value::Bool(false);
    } else if (w == "none" || w == "None") {
      n->literal = Value::None();
    } else {
      n->kind = Expr::Kind::kName;
      n->name = w;
    }
    return n;
  }
  if (IsOp("(")) {
    ++p_;
    LEDE_ASSIGN_OR_RETURN(ExprPtr e, Parse());
    if (IsOp(",")) {  // a tuple: a list for our purposes
      auto list = Make(Expr::Kind::kList);
      list->args.push_back(std::move(e));
      while (IsOp(",")) {
        ++p_;
        if (IsOp(")")) break;
        LEDE_ASSIGN_OR_RETURN(ExprPtr item, Parse());
        list->args.push_back(std::move(item));
      }
      e = std::move(list);
    }
    LEDE_RETURN_IF_ERROR(Expect(")"));
    return e;
  }
  if (IsOp("[")) {
    auto list = Make(Expr::Kind::kList);
    ++p_;
    while (!IsOp("]")) {
      LEDE_ASSIGN_OR_RETURN(ExprPtr item, Parse());
      list->args.push_back(std::move(item));
      if (!IsOp(",")) break;
      ++p_;
    }
    LEDE_RETURN_IF_ERROR(Expect("]"));
    return list;
  }
  if (IsOp("{")) {
    auto dict = Make(Expr::Kind::kDict);
    ++p_;
    while (!IsOp("}")) {
      LEDE_ASSIGN_OR_RETURN(ExprPtr key, Parse());
      LEDE_RETURN_IF_ERROR(Expect(":"));
      LEDE_ASSIGN_OR_RETURN(ExprPtr value, Parse());
      dict->args.push_back(std::move(key));
      dict->args.push_back(std::move(value));
      if (!IsOp(",")) break;
      ++p_;
    }
    LEDE_RETURN_IF_ERROR(Expect("}"));
    return dict;
  }
  return Error("unexpected '" + (tok.kind == Token::Kind::kEnd ? std::string("end of tag") : tok.text) + "'");
}

}  // namespace lede::tokenizer::internal
