// File: shared/tokenizer/internal/jinja_renderer.cc
//
// See jinja_renderer.h.
#include "shared/tokenizer/internal/jinja_renderer.h"

#include <algorithm>
#include <cctype>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "shared/status/status_macros.h"
#include "shared/tokenizer/internal/jinja_value.h"

#include "shared/tokenizer/internal/jinja_renderer_impl.h"

namespace lede::tokenizer::internal {

Renderer::Renderer(const TemplateProgram& program, std::time_t now) : program_(program), now_(now) {
  scopes_.emplace_back();
}

Status Renderer::Error(int line, const std::string& what) const {
  return InvalidArgumentError(program_.name + ": line " + std::to_string(line) + ": " + what);
}

StatusOr<Flow> Renderer::Exec(const Body& body, std::string* out) {
  for (const NodePtr& n : body) {
    LEDE_ASSIGN_OR_RETURN(Flow flow, ExecNode(*n, out));
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

StatusOr<Flow> Renderer::ExecNode(const Node& n, std::string* out) {
  switch (n.kind) {
    case Node::Kind::kText: *out += n.text; return Flow::kNormal;
    case Node::Kind::kOutput: {
      LEDE_ASSIGN_OR_RETURN(Value v, Eval(*n.expr));
      *out += PyStr(v);
      return Flow::kNormal;
    }
    case Node::Kind::kIf:
      for (const auto& [cond, body] : n.branches) {
        LEDE_ASSIGN_OR_RETURN(Value c, Eval(*cond));
        if (Truthy(c)) return Exec(body, out);
      }
      return Exec(n.body, out);
    case Node::Kind::kFor: return ExecFor(n, out);
    case Node::Kind::kSet: {
      LEDE_ASSIGN_OR_RETURN(Value v, Eval(*n.expr));
      return Assign(n, std::move(v));
    }
    case Node::Kind::kSetBlock: {
      std::string captured;
      LEDE_ASSIGN_OR_RETURN(Flow flow, Exec(n.body, &captured));
      (void)flow;
      return Assign(n, Value::Str(std::move(captured)));
    }
    case Node::Kind::kBreak: return Flow::kBreak;
    case Node::Kind::kContinue: return Flow::kContinue;
    case Node::Kind::kBlock: return Exec(n.body, out);
  }
  return Flow::kNormal;
}

StatusOr<Flow> Renderer::Assign(const Node& n, Value v) {
  if (n.attr.empty()) {
    scopes_.back()[n.targets[0]] = std::move(v);
    return Flow::kNormal;
  }
  const Value ns = Lookup(n.targets[0]);
  if (ns.type != Value::Type::kNamespace) {
    return Error(n.line, "cannot assign attribute on non-namespace object '" + n.targets[0] + "'");
  }
  ns.dict->Set(n.attr, std::move(v));
  return Flow::kNormal;
}

StatusOr<List> Renderer::Iterate(const Value& v, int line) {
  switch (v.type) {
    case Value::Type::kUndefined: return List{};
    case Value::Type::kList: return *v.list;
    case Value::Type::kDict: {
      List keys;
      for (const auto& kv : v.dict->items) keys.push_back(Value::Str(kv.first));
      return keys;
    }
    case Value::Type::kString: {
      List chars;
      const std::vector<size_t> cps = CodePointOffsets(v.s);
      for (size_t k = 0; k + 1 < cps.size(); ++k) chars.push_back(Value::Str(v.s.substr(cps[k], cps[k + 1] - cps[k])));
      return chars;
    }
    default: return Error(line, std::string("'") + TypeName(v) + "' object is not iterable");
  }
}

Status Renderer::Bind(const Node& n, const Value& item, std::unordered_map<std::string, Value>* scope) {
  if (n.targets.size() == 1) {
    (*scope)[n.targets[0]] = item;
    return OkStatus();
  }
  if (item.type != Value::Type::kList || item.list->size() != n.targets.size()) {
    return Error(n.line, "cannot unpack " + std::string(TypeName(item)) + " into " +
                             std::to_string(n.targets.size()) + " names");
  }
  for (size_t k = 0; k < n.targets.size(); ++k) (*scope)[n.targets[k]] = (*item.list)[k];
  return OkStatus();
}

StatusOr<Flow> Renderer::ExecFor(const Node& n, std::string* out) {
  LEDE_ASSIGN_OR_RETURN(Value seq, Eval(*n.expr));
  LEDE_ASSIGN_OR_RETURN(List items, Iterate(seq, n.line));
  if (n.filter) {
    List kept;
    for (const Value& item : items) {
      scopes_.emplace_back();
      Status s = Bind(n, item, &scopes_.back());
      StatusOr<Value> keep = s.ok() ? Eval(*n.filter) : StatusOr<Value>(s);
      scopes_.pop_back();
      if (!keep.ok()) return keep.status();
      if (Truthy(*keep)) kept.push_back(item);
    }
    items = std::move(kept);
  }
  if (items.empty()) return Exec(n.else_body, out);
  const auto length = static_cast<int64_t>(items.size());
  for (int64_t k = 0; k < length; ++k) {
    scopes_.emplace_back();
    Value loop = Value::MakeDict();
    loop.dict->Set("index", Value::Int(k + 1));
    loop.dict->Set("index0", Value::Int(k));
    loop.dict->Set("revindex", Value::Int(length - k));
    loop.dict->Set("revindex0", Value::Int(length - k - 1));
    loop.dict->Set("first", Value::Bool(k == 0));
    loop.dict->Set("last", Value::Bool(k == length - 1));
    loop.dict->Set("length", Value::Int(length));
    loop.dict->Set("previtem", k > 0 ? items[k - 1] : Value::Undefined("loop.previtem"));
    loop.dict->Set("nextitem", k + 1 < length ? items[k + 1] : Value::Undefined("loop.nextitem"));
    scopes_.back()["loop"] = loop;
    Status s = Bind(n, items[k], &scopes_.back());
    StatusOr<Flow> flow = s.ok() ? Exec(n.body, out) : StatusOr<Flow>(s);
    scopes_.pop_back();
    if (!flow.ok()) return flow.status();
    if (*flow == Flow::kBreak) break;
  }
  return Flow::kNormal;
}

Value Renderer::Lookup(const std::string& name) const {
  for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
    auto found = it->find(name);
    if (found != it->end()) return found->second;
  }
  static const char* const kFunctions[] = {"raise_exception", "strftime_now", "namespace", "range", "dict"};
  for (const char* f : kFunctions) {
    if (name == f) return Value::Function(name);
  }
  return Value::Undefined(name);
}

StatusOr<Value> Renderer::GetAttr(const Value& obj, const std::string& name, int line) {
  if (obj.is_undefined()) return Error(line, "'" + obj.s + "' is undefined");
  if (obj.type == Value::Type::kDict || obj.type == Value::Type::kNamespace) {
    if (obj.type == Value::Type::kDict && (name == "items" || name == "keys" || name == "values" || name == "get")) {
      return Value::Function("dict." + name, std::make_shared<Value>(obj));
    }
    if (const Value* v = obj.dict->Find(name)) return *v;
  }
  if (obj.type == Value::Type::kString && IsStringMethod(name)) {
    return Value::Function("str." + name, std::make_shared<Value>(obj));
  }
  return Value::Undefined(name);
}

StatusOr<Value> Renderer::GetItem(const Value& obj, const Value& key, int line) {
  if (obj.is_undefined()) return Error(line, "'" + obj.s + "' is undefined");
  if (obj.type == Value::Type::kDict || obj.type == Value::Type::kNamespace) {
    if (key.type == Value::Type::kString) {
      if (const Value* v = obj.dict->Find(key.s)) return *v;
      return GetAttr(obj, key.s, line);
    }
    return Value::Undefined(PyStr(key));
  }
  if ((obj.type == Value::Type::kList || obj.type == Value::Type::kString) && key.type == Value::Type::kInt) {
    if (obj.type == Value::Type::kList) {
      int64_t idx = key.i < 0 ? key.i + static_cast<int64_t>(obj.list->size()) : key.i;
      if (idx < 0 || idx >= static_cast<int64_t>(obj.list->size())) return Value::Undefined("[" + PyStr(key) + "]");
      return (*obj.list)[idx];
    }
    const std::vector<size_t> cps = CodePointOffsets(obj.s);
    const int64_t n = static_cast<int64_t>(cps.size()) - 1;
    const int64_t idx = key.i < 0 ? key.i + n : key.i;
    if (idx < 0 || idx >= n) return Value::Undefined("[" + PyStr(key) + "]");
    return Value::Str(obj.s.substr(cps[idx], cps[idx + 1] - cps[idx]));
  }
  if (key.type == Value::Type::kString) return GetAttr(obj, key.s, line);
  return Value::Undefined("[" + PyStr(key) + "]");
}

StatusOr<Value> Renderer::Slice(const Value& obj, const Value* start, const Value* stop, const Value* step, int line) {
  int64_t n = 0;
  std::vector<size_t> cps;
  if (obj.type == Value::Type::kList) {
    n = static_cast<int64_t>(obj.list->size());
  } else if (obj.type == Value::Type::kString) {
    cps = CodePointOffsets(obj.s);
    n = static_cast<int64_t>(cps.size()) - 1;
  } else {
    return Error(line, std::string("'") + TypeName(obj) + "' object is not subscriptable");
  }
  auto get = [&](const Value* v, int64_t def) -> StatusOr<int64_t> {
    if (v == nullptr || v->type == Value::Type::kNone) return def;
    if (v->type != Value::Type::kInt) return Error(line, "slice indices must be integers");
    return v->i;
  };
  LEDE_ASSIGN_OR_RETURN(int64_t st, get(step, 1));
  if (st == 0) return Error(line, "slice step cannot be zero");
  LEDE_ASSIGN_OR_RETURN(int64_t b, get(start, st > 0 ? 0 : n - 1));
  LEDE_ASSIGN_OR_RETURN(int64_t e, get(stop, st > 0 ? n : -1));
  auto clamp = [&](int64_t x, bool is_start) {
    if (x < 0) x += n;
    if (st > 0) return std::clamp<int64_t>(x, 0, n);
    (void)is_start;
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  if (start != nullptr && start->type != Value::Type::kNone) b = clamp(b, true);
  if (stop != nullptr && stop->type != Value::Type::kNone) e = clamp(e, false);
  std::vector<int64_t> idx;
  for (int64_t k = b; st > 0 ? k < e : k > e; k += st) idx.push_back(k);
  if (obj.type == Value::Type::kList) {
    List out;
    for (int64_t k : idx) out.push_back((*obj.list)[k]);
    return Value::MakeList(std::move(out));
  }
  std::string out;
  for (int64_t k : idx) out += obj.s.substr(cps[k], cps[k + 1] - cps[k]);
  return Value::Str(out);
}

StatusOr<Value> Renderer::Arith(const std::string& op, const Value& a, const Value& b, int line) {
  if (op == "+") {
    if (a.type == Value::Type::kString && b.type == Value::Type::kString) return Value::Str(a.s + b.s);
    if (a.type == Value::Type::kList && b.type == Value::Type::kList) {
      List out = *a.list;
      out.insert(out.end(), b.list->begin(), b.list->end());
      return Value::MakeList(std::move(out));
    }
  }
  if (op == "*") {
    const Value* str = a.type == Value::Type::kString ? &a : b.type == Value::Type::kString ? &b : nullptr;
    const Value* num = str == &a ? &b : &a;
    if (str != nullptr && num->type == Value::Type::kInt) {
      std::string out;
      for (int64_t k = 0; k < num->i; ++k) out += str->s;
      return Value::Str(out);
    }
  }
  if (a.is_undefined() || b.is_undefined()) {
    return Error(line, "'" + (a.is_undefined() ? a.s : b.s) + "' is undefined");
  }
  if (!a.is_number() || !b.is_number()) {
    return Error(line, std::string("unsupported operand type(s) for ") + op + ": '" + TypeName(a) + "' and '" +
                           TypeName(b) + "'");
  }
  const bool ints = a.type != Value::Type::kFloat && b.type != Value::Type::kFloat;
  const int64_t x = a.type == Value::Type::kBool ? a.b : a.i, y = b.type == Value::Type::kBool ? b.b : b.i;
  const double fx = a.AsDouble(), fy = b.AsDouble();
  if (op == "+") return ints ? Value::Int(x + y) : Value::Float(fx + fy);
  if (op == "-") return ints ? Value::Int(x - y) : Value::Float(fx - fy);
  if (op == "*") return ints ? Value::Int(x * y) : Value::Float(fx * fy);
  if (op == "/") {
    if (fy == 0) return Error(line, "division by zero");
    return Value::Float(fx / fy);
  }
  if (op == "//" || op == "%") {
    if (fy == 0) return Error(line, "integer division or modulo by zero");
    if (ints) {
      int64_t q = x / y, r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {
        --q;
        r += y;
      }
      return Value::Int(op == "//" ? q : r);
    }
    const double q = std::floor(fx / fy);
    return Value::Float(op == "//" ? q : fx - q * fy);
  }
  if (op == "**") return ints && y >= 0 ? Value::Int(static_cast<int64_t>(std::pow(x, y))) : Value::Float(std::pow(fx, fy));
  return Error(line, "unknown operator " + op);
}

StatusOr<bool> Renderer::Compare(const std::string& op, const Value& a, const Value& b, int line) {
  if (op == "==") return Equal(a, b);
  if (op == "!=") return !Equal(a, b);
  if (op == "in" || op == "not in") {
    bool found = false;
    if (b.type == Value::Type::kString && a.type == Value::Type::kString) {
      found = b.s.find(a.s) != std::string::npos;
    } else if (b.type == Value::Type::kList) {
      found = std::any_of(b.list->begin(), b.list->end(), [&](const Value& v) { return Equal(a, v); });
    } else if (b.type == Value::Type::kDict || b.type == Value::Type::kNamespace) {
      found = a.type == Value::Type::kString && b.dict->Find(a.s) != nullptr;
    } else if (b.is_undefined()) {
      return Error(line, "'" + b.s + "' is undefined");
    } else {
      return Error(line, std::string("argument of type '") + TypeName(b) + "' is not iterable");
    }
    return op == "in" ? found : !found;
  }
  int c = 0;
  if (a.is_number() && b.is_number()) {
    c = a.AsDouble() < b.AsDouble() ? -1 : a.AsDouble() > b.AsDouble() ? 1 : 0;
  } else if (a.type == Value::Type::kString && b.type == Value::Type::kString) {
    c = a.s.compare(b.s);
  } else {
    return Error(line, "'" + op + "' not supported between instances of '" + TypeName(a) + "' and '" +
                           TypeName(b) + "'");
  }
  if (op == "<") return c < 0;
  if (op == ">") return c > 0;
  if (op == "<=") return c <= 0;
  return c >= 0;
}

Status Renderer::EvalArgs(const Expr& e, size_t first, std::vector<Value>* args, std::map<std::string, Value>* kwargs) {
  for (size_t k = first; k < e.args.size(); ++k) {
    LEDE_ASSIGN_OR_RETURN(Value v, Eval(*e.args[k]));
    args->push_back(std::move(v));
  }
  for (const auto& [key, ex] : e.kwargs) {
    LEDE_ASSIGN_OR_RETURN(Value v, Eval(*ex));
    (*kwargs)[key] = std::move(v);
  }
  return OkStatus();
}

StatusOr<Value> Renderer::Eval(const Expr& e) {
  switch (e.kind) {
    case Expr::Kind::kLiteral: return e.literal;
    case Expr::Kind::kName: return Lookup(e.name);
    case Expr::Kind::kGetAttr: {
      LEDE_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
      return GetAttr(obj, e.name, e.line);
    }
    case Expr::Kind::kGetItem: {
      LEDE_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
      LEDE_ASSIGN_OR_RETURN(Value key, Eval(*e.args[1]));
      return GetItem(obj, key, e.line);
    }
    case Expr::Kind::kSlice: {
      LEDE_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
      Value parts[3];
      bool present[3] = {false, false, false};
      for (int k = 0; k < 3; ++k) {
        if (e.args[k + 1]) {
          LEDE_ASSIGN_OR_RETURN(parts[k], Eval(*e.args[k + 1]));
          present[k] = true;
        }
      }
      return Slice(obj, present[0] ? &parts[0] : nullptr, present[1] ? &parts[1] : nullptr,
                   present[2] ? &parts[2] : nullptr, e.line);
    }
    case Expr::Kind::kCall:
    case Expr::Kind::kFilter:
    case Expr::Kind::kTest:
      return EvalCall(e);
    case Expr::Kind::kNeg:
    case Expr::Kind::kPos: {
      LEDE_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
      if (!v.is_number()) return Error(e.line, std::string("bad operand type for unary -: '") + TypeName(v) + "'");
      if (e.kind == Expr::Kind::kPos) return v;
      return v.type == Value::Type::kFloat ? Value::Float(-v.f) : Value::Int(-(v.type == Value::Type::kBool ? v.b : v.i));
    }
    case Expr::Kind::kNot: {
      LEDE_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
      return Value::Bool(!Truthy(v));
    }
    case Expr::Kind::kAnd: {
      LEDE_ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
      if (!Truthy(a)) return a;
      return Eval(*e.args[1]);
    }
    case Expr::Kind::kOr: {
      LEDE_ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
      if (Truthy(a)) return a;
      return Eval(*e.args[1]);
    }
    case Expr::Kind::kBinary: {
      LEDE_ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
      LEDE_ASSIGN_OR_RETURN(Value b, Eval(*e.args[1]));
      return Arith(e.name, a, b, e.line);
    }
    case Expr::Kind::kCompare: {
      LEDE_ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
      LEDE_ASSIGN_OR_RETURN(Value b, Eval(*e.args[1]));
      LEDE_ASSIGN_OR_RETURN(bool r, Compare(e.name, a, b, e.line));
      return Value::Bool(r);
    }
    case Expr::Kind::kConcat:
      return EvalCollection(e);
    case Expr::Kind::kCond: {
      LEDE_ASSIGN_OR_RETURN(Value c, Eval(*e.args[1]));
      if (Truthy(c)) return Eval(*e.args[0]);
      if (e.args[2]) return Eval(*e.args[2]);
      return Value::Undefined("else");
    }
    case Expr::Kind::kList:
    case Expr::Kind::kDict:
      return EvalCollection(e);
  }
  return Error(e.line, "internal: unknown expression");
}

StatusOr<Value> Renderer::EvalCall(const Expr& e) {
  switch (e.kind) {
  case Expr::Kind::kCall: {
    LEDE_ASSIGN_OR_RETURN(Value f, Eval(*e.args[0]));
    if (f.type != Value::Type::kFunction) {
      if (f.is_undefined()) return Error(e.line, "'" + f.s + "' is undefined");
      return Error(e.line, std::string("'") + TypeName(f) + "' object is not callable");
    }
    std::vector<Value> args;
    std::map<std::string, Value> kwargs;
    LEDE_RETURN_IF_ERROR(EvalArgs(e, 1, &args, &kwargs));
    return CallFunction(f, args, kwargs, e.line);
  }
  case Expr::Kind::kFilter: {
    LEDE_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
    std::vector<Value> args;
    std::map<std::string, Value> kwargs;
    LEDE_RETURN_IF_ERROR(EvalArgs(e, 1, &args, &kwargs));
    return ApplyFilter(e.name, v, args, kwargs, e.line);
  }
  case Expr::Kind::kTest: {
    LEDE_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
    std::vector<Value> args;
    std::map<std::string, Value> kwargs;
    LEDE_RETURN_IF_ERROR(EvalArgs(e, 1, &args, &kwargs));
    LEDE_ASSIGN_OR_RETURN(bool r, ApplyTest(e.name, v, args, e.line));
    return Value::Bool(r != e.negated);
  }
    default: break;
  }
  return Error(e.line, "internal: not a call");
}

StatusOr<Value> Renderer::EvalCollection(const Expr& e) {
  switch (e.kind) {
  case Expr::Kind::kConcat: {
    std::string out;
    for (const ExprPtr& a : e.args) {
      LEDE_ASSIGN_OR_RETURN(Value v, Eval(*a));
      out += PyStr(v);
    }
    return Value::Str(out);
  }
  case Expr::Kind::kList: {
    List out;
    for (const ExprPtr& a : e.args) {
      LEDE_ASSIGN_OR_RETURN(Value v, Eval(*a));
      out.push_back(std::move(v));
    }
    return Value::MakeList(std::move(out));
  }
  case Expr::Kind::kDict: {
    Value d = Value::MakeDict();
    for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
      LEDE_ASSIGN_OR_RETURN(Value key, Eval(*e.args[k]));
      LEDE_ASSIGN_OR_RETURN(Value v, Eval(*e.args[k + 1]));
      if (key.type != Value::Type::kString) return Error(e.line, "dict keys must be strings");
      d.dict->Set(key.s, std::move(v));
    }
    return d;
  }
    default: break;
  }
  return Error(e.line, "internal: not a collection");
}

StatusOr<std::string> RenderTemplate(const TemplateProgram& program, const nlohmann::ordered_json& variables,
                                     std::time_t now) {
  Renderer renderer(program, now);
  for (auto it = variables.begin(); it != variables.end(); ++it) renderer.globals()[it.key()] = FromJson(it.value());
  std::string out;
  LEDE_ASSIGN_OR_RETURN(Flow flow, renderer.Exec(program.body, &out));
  (void)flow;
  return out;
}

}  // namespace lede::tokenizer::internal
