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

namespace lede::tokenizer::internal {

namespace {

enum class Flow { kNormal, kBreak, kContinue };

// A filter's arguments: positional `args`, or `kwargs` by name (kwargs win).
struct FilterArgs {
  const std::vector<Value>& args;
  const std::map<std::string, Value>& kwargs;
  const Value* Get(const std::string& key, size_t pos) const {
    auto it = kwargs.find(key);
    if (it != kwargs.end()) return &it->second;
    return pos < args.size() ? &args[pos] : nullptr;
  }
};

class Renderer {
 public:
  Renderer(const TemplateProgram& program, std::time_t now) : program_(program), now_(now) {
    scopes_.emplace_back();
  }

  std::unordered_map<std::string, Value>& globals() { return scopes_.front(); }

  Status Error(int line, const std::string& what) const {
    return InvalidArgumentError(program_.name + ": line " + std::to_string(line) + ": " + what);
  }

  StatusOr<Flow> Exec(const Body& body, std::string* out) {
    for (const NodePtr& n : body) {
      LEDE_ASSIGN_OR_RETURN(Flow flow, ExecNode(*n, out));
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  StatusOr<Flow> ExecNode(const Node& n, std::string* out) {
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

  StatusOr<Flow> Assign(const Node& n, Value v) {
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

  StatusOr<List> Iterate(const Value& v, int line) {
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

  Status Bind(const Node& n, const Value& item, std::unordered_map<std::string, Value>* scope) {
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

  StatusOr<Flow> ExecFor(const Node& n, std::string* out) {
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

  Value Lookup(const std::string& name) const {
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

  static bool IsStringMethod(const std::string& n) {
    static const char* const k[] = {"strip", "lstrip", "rstrip", "split", "startswith", "endswith", "upper",
                                    "lower", "title", "capitalize", "replace"};
    return std::find_if(std::begin(k), std::end(k), [&](const char* m) { return n == m; }) != std::end(k);
  }

  // obj.name: a dict key or namespace attribute, a method, or Undefined.
  StatusOr<Value> GetAttr(const Value& obj, const std::string& name, int line) {
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

  StatusOr<Value> GetItem(const Value& obj, const Value& key, int line) {
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

  StatusOr<Value> Slice(const Value& obj, const Value* start, const Value* stop, const Value* step, int line) {
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

  StatusOr<Value> Arith(const std::string& op, const Value& a, const Value& b, int line) {
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

  StatusOr<bool> Compare(const std::string& op, const Value& a, const Value& b, int line) {
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

  StatusOr<bool> ApplyTest(const std::string& name, const Value& v, const std::vector<Value>& args, int line) {
    auto arg = [&](size_t k) -> StatusOr<Value> {
      if (k >= args.size()) return Error(line, "test '" + name + "' needs an argument");
      return args[k];
    };
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.type == Value::Type::kNone;
    if (name == "string") return v.type == Value::Type::kString;
    if (name == "number") return v.type == Value::Type::kInt || v.type == Value::Type::kFloat;
    if (name == "integer") return v.type == Value::Type::kInt;
    if (name == "float") return v.type == Value::Type::kFloat;
    if (name == "boolean") return v.type == Value::Type::kBool;
    if (name == "true") return v.type == Value::Type::kBool && v.b;
    if (name == "false") return v.type == Value::Type::kBool && !v.b;
    if (name == "mapping") return v.type == Value::Type::kDict;
    if (name == "sequence") {
      return v.type == Value::Type::kList || v.type == Value::Type::kString || v.type == Value::Type::kDict;
    }
    if (name == "iterable") {
      return v.type == Value::Type::kList || v.type == Value::Type::kString || v.type == Value::Type::kDict;
    }
    if (name == "callable") return v.type == Value::Type::kFunction;
    if (name == "equalto" || name == "eq" || name == "ne") {
      LEDE_ASSIGN_OR_RETURN(Value other, arg(0));
      return name == "ne" ? !Equal(v, other) : Equal(v, other);
    }
    if (name == "in") {
      LEDE_ASSIGN_OR_RETURN(Value other, arg(0));
      return Compare("in", v, other, line);
    }
    if (name == "odd" || name == "even" || name == "divisibleby") {
      if (v.type != Value::Type::kInt) return Error(line, "test '" + name + "' needs an integer");
      if (name == "odd") return v.i % 2 != 0;
      if (name == "even") return v.i % 2 == 0;
      LEDE_ASSIGN_OR_RETURN(Value d, arg(0));
      if (d.type != Value::Type::kInt || d.i == 0) return Error(line, "divisibleby needs a non-zero integer");
      return v.i % d.i == 0;
    }
    return UnimplementedError(program_.name + ": line " + std::to_string(line) + ": unsupported test '" + name + "'");
  }

  // selectattr / rejectattr / map over an iterable.
  StatusOr<Value> AttrFilter(const std::string& name, const Value& seq, const std::vector<Value>& args,
                             const std::map<std::string, Value>& kwargs, int line) {
    LEDE_ASSIGN_OR_RETURN(List items, Iterate(seq, line));
    List out;
    if (name == "map") {
      auto attr = kwargs.find("attribute");
      for (const Value& item : items) {
        if (attr != kwargs.end()) {
          LEDE_ASSIGN_OR_RETURN(Value v, GetItem(item, attr->second, line));
          if (v.is_undefined() && kwargs.count("default")) v = kwargs.at("default");
          out.push_back(v);
        } else if (!args.empty() && args[0].type == Value::Type::kString) {
          LEDE_ASSIGN_OR_RETURN(Value v, ApplyFilter(args[0].s, item, std::vector<Value>(args.begin() + 1, args.end()),
                                                     {}, line));
          out.push_back(v);
        } else {
          return Error(line, "map needs a filter name or attribute=");
        }
      }
      return Value::MakeList(std::move(out));
    }
    if (args.empty() || args[0].type != Value::Type::kString) return Error(line, name + " needs an attribute name");
    for (const Value& item : items) {
      LEDE_ASSIGN_OR_RETURN(Value attr, GetItem(item, args[0], line));
      bool ok = false;
      if (args.size() == 1) {
        ok = Truthy(attr);
      } else {
        if (args[1].type != Value::Type::kString) return Error(line, name + ": the test must be a name");
        LEDE_ASSIGN_OR_RETURN(ok, ApplyTest(args[1].s, attr, std::vector<Value>(args.begin() + 2, args.end()), line));
      }
      if (ok == (name == "selectattr")) out.push_back(item);
    }
    return Value::MakeList(std::move(out));
  }

  // String filters: trim, string, upper, lower, capitalize, title, replace; nullopt when `name` is not one of them.
  std::optional<StatusOr<Value>> StringFilter(const std::string& name, const Value& v, const FilterArgs& fa,
                                                    int line) {
    if (name == "trim") {
      if (v.type != Value::Type::kString) return Value::Str(PyStrip(PyStr(v), true, true, fa.Get("chars", 0)));
      return Value::Str(PyStrip(v.s, true, true, fa.Get("chars", 0)));
    }

    if (name == "string") return Value::Str(PyStr(v));

    if (name == "upper" || name == "lower") return Value::Str(AsciiCase(PyStr(v), name == "upper"));

    if (name == "capitalize") {
      std::string s = AsciiCase(PyStr(v), false);
      if (!s.empty()) s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
      return Value::Str(s);
    }

    if (name == "title") {
      std::string s = PyStr(v);
      bool start = true;
      for (char& c : s) {
        const bool alpha = std::isalpha(static_cast<unsigned char>(c)) != 0;
        if (alpha) c = static_cast<char>(start ? std::toupper(static_cast<unsigned char>(c))
                                               : std::tolower(static_cast<unsigned char>(c)));
        start = !alpha;
      }
      return Value::Str(s);
    }

    if (name == "replace") {
      const Value* from = fa.Get("old", 0);
      const Value* to = fa.Get("new", 1);
      if (from == nullptr || to == nullptr) return Error(line, "replace needs two arguments");
      std::string s = PyStr(v);
      const std::string f = PyStr(*from), t = PyStr(*to);
      std::string out;
      if (f.empty()) return Value::Str(s);
      size_t pos = 0;
      for (size_t hit = s.find(f); hit != std::string::npos; hit = s.find(f, pos)) {
        out.append(s, pos, hit - pos);
        out += t;
        pos = hit + f.size();
      }
      out.append(s, pos, std::string::npos);
      return Value::Str(out);
    }
    return std::nullopt;
  }

  // Sequence filters: length/count, list, first, last, reverse, unique, join, items; nullopt when `name` is not one of them.
  std::optional<StatusOr<Value>> SequenceFilter(const std::string& name, const Value& v, const FilterArgs& fa,
                                                    int line) {
    if (name == "length" || name == "count") {
      switch (v.type) {
        case Value::Type::kString: return Value::Int(static_cast<int64_t>(CodePointCount(v.s)));
        case Value::Type::kList: return Value::Int(static_cast<int64_t>(v.list->size()));
        case Value::Type::kDict: return Value::Int(static_cast<int64_t>(v.dict->items.size()));
        case Value::Type::kUndefined: return Value::Int(0);
        default: return Error(line, std::string("object of type '") + TypeName(v) + "' has no len()");
      }
    }

    if (name == "list") {
      LEDE_ASSIGN_OR_RETURN(List items, Iterate(v, line));
      return Value::MakeList(std::move(items));
    }

    if (name == "first" || name == "last") {
      LEDE_ASSIGN_OR_RETURN(List items, Iterate(v, line));
      if (items.empty()) return Value::Undefined(name);
      return name == "first" ? items.front() : items.back();
    }

    if (name == "reverse") {
      if (v.type == Value::Type::kString) {
        LEDE_ASSIGN_OR_RETURN(List chars, Iterate(v, line));
        std::string out;
        for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += it->s;
        return Value::Str(out);
      }
      LEDE_ASSIGN_OR_RETURN(List items, Iterate(v, line));
      std::reverse(items.begin(), items.end());
      return Value::MakeList(std::move(items));
    }

    if (name == "unique") {
      LEDE_ASSIGN_OR_RETURN(List items, Iterate(v, line));
      List out;
      for (const Value& item : items) {
        if (std::none_of(out.begin(), out.end(), [&](const Value& o) { return Equal(o, item); })) out.push_back(item);
      }
      return Value::MakeList(std::move(out));
    }

    if (name == "join") {
      LEDE_ASSIGN_OR_RETURN(List items, Iterate(v, line));
      const Value* sep = fa.Get("d", 0);
      const Value* attribute = fa.Get("attribute", 1);
      std::string out;
      for (size_t k = 0; k < items.size(); ++k) {
        if (k > 0 && sep != nullptr) out += PyStr(*sep);
        Value item = items[k];
        if (attribute != nullptr) {
          LEDE_ASSIGN_OR_RETURN(item, GetItem(item, *attribute, line));
        }
        out += PyStr(item);
      }
      return Value::Str(out);
    }

    if (name == "items") {
      if (v.is_undefined()) return Value::MakeList();
      if (v.type != Value::Type::kDict) return Error(line, "items needs a mapping");
      List out;
      for (const auto& [key, val] : v.dict->items) out.push_back(Value::MakeList({Value::Str(key), val}));
      return Value::MakeList(std::move(out));
    }
    return std::nullopt;
  }

  // Number filters: int, float, abs; nullopt when `name` is not one of them.
  std::optional<StatusOr<Value>> NumberFilter(const std::string& name, const Value& v, const FilterArgs& fa,
                                                    int line) {
    if (name == "int") {
      if (v.type == Value::Type::kInt) return v;
      if (v.type == Value::Type::kFloat) return Value::Int(static_cast<int64_t>(v.f));
      if (v.type == Value::Type::kBool) return Value::Int(v.b);
      if (v.type == Value::Type::kString) {
        char* end = nullptr;
        const long long x = std::strtoll(v.s.c_str(), &end, 10);
        if (end != v.s.c_str() && *end == '\0') return Value::Int(x);
      }
      const Value* def = fa.Get("default", 0);
      return def != nullptr ? *def : Value::Int(0);
    }

    if (name == "float") {
      if (v.is_number()) return Value::Float(v.AsDouble());
      if (v.type == Value::Type::kString) {
        char* end = nullptr;
        const double x = std::strtod(v.s.c_str(), &end);
        if (end != v.s.c_str() && *end == '\0') return Value::Float(x);
      }
      const Value* def = fa.Get("default", 0);
      return def != nullptr ? *def : Value::Float(0);
    }

    if (name == "abs") {
      if (v.type == Value::Type::kInt) return Value::Int(std::llabs(v.i));
      if (v.type == Value::Type::kFloat) return Value::Float(std::fabs(v.f));
      return Error(line, "bad operand type for abs()");
    }
    return std::nullopt;
  }

  StatusOr<Value> ApplyFilter(const std::string& name, const Value& v, const std::vector<Value>& args,
                              const std::map<std::string, Value>& kwargs, int line) {
    const FilterArgs fa{args, kwargs};
    if (name == "safe") return v;

    if (name == "tojson") {
      int indent = -1;
      if (const Value* i = fa.Get("indent", 0); i != nullptr && i->type == Value::Type::kInt) indent = static_cast<int>(i->i);
      const Value* sort = fa.Get("sort_keys", 3);
      std::string out;
      Status s = ToJson(v, indent, sort != nullptr && Truthy(*sort), 0, &out);
      if (!s.ok()) return Error(line, std::string(s.message()));
      return Value::Str(out);
    }

    if (name == "default" || name == "d") {
      const Value* def = fa.Get("default_value", 0);
      const Value* boolean = fa.Get("boolean", 1);
      const bool use_default = v.is_undefined() || (boolean != nullptr && Truthy(*boolean) && !Truthy(v));
      if (use_default) return def != nullptr ? *def : Value::Str("");
      return v;
    }
    if (auto r = StringFilter(name, v, fa, line)) return *std::move(r);
    if (auto r = SequenceFilter(name, v, fa, line)) return *std::move(r);
    if (auto r = NumberFilter(name, v, fa, line)) return *std::move(r);
    if (name == "selectattr" || name == "rejectattr" || name == "map") return AttrFilter(name, v, args, kwargs, line);
    return UnimplementedError(program_.name + ": line " + std::to_string(line) + ": unsupported filter '" + name + "'");
  }

  StatusOr<Value> CallFunction(const Value& f, const std::vector<Value>& args,
                               const std::map<std::string, Value>& kwargs, int line) {
    const std::string& name = f.s;
    if (name == "raise_exception") {
      return InvalidArgumentError(program_.name + ": raise_exception: " + (args.empty() ? "" : PyStr(args[0])));
    }
    if (name == "strftime_now") {
      if (args.empty() || args[0].type != Value::Type::kString) return Error(line, "strftime_now needs a format");
      const std::time_t t = now_ != 0 ? now_ : std::time(nullptr);
      std::tm tm{};
      localtime_r(&t, &tm);
      char buf[256];
      const size_t n = std::strftime(buf, sizeof(buf), args[0].s.c_str(), &tm);
      return Value::Str(std::string(buf, n));
    }
    if (name == "namespace" || name == "dict") {
      Value ns = Value::MakeDict();
      if (name == "namespace") ns.type = Value::Type::kNamespace;
      if (!args.empty() && args[0].type == Value::Type::kDict) {
        for (const auto& [k, v] : args[0].dict->items) ns.dict->Set(k, v);
      }
      for (const auto& [k, v] : kwargs) ns.dict->Set(k, v);
      return ns;
    }
    if (name == "range") {
      int64_t b = 0, e = 0, st = 1;
      for (const Value& a : args) {
        if (a.type != Value::Type::kInt) return Error(line, "range needs integers");
      }
      if (args.size() == 1) e = args[0].i;
      if (args.size() >= 2) b = args[0].i, e = args[1].i;
      if (args.size() >= 3) st = args[2].i;
      if (args.empty() || st == 0) return Error(line, "bad range arguments");
      List out;
      for (int64_t k = b; st > 0 ? k < e : k > e; k += st) {
        out.push_back(Value::Int(k));
        if (out.size() > 100000) return Error(line, "range too large");
      }
      return Value::MakeList(std::move(out));
    }
    const Value& self = *f.self;
    if (name == "dict.items" || name == "dict.keys" || name == "dict.values") {
      List out;
      for (const auto& [k, v] : self.dict->items) {
        if (name == "dict.items") out.push_back(Value::MakeList({Value::Str(k), v}));
        if (name == "dict.keys") out.push_back(Value::Str(k));
        if (name == "dict.values") out.push_back(v);
      }
      return Value::MakeList(std::move(out));
    }
    if (name == "dict.get") {
      if (args.empty()) return Error(line, "get needs a key");
      if (args[0].type == Value::Type::kString) {
        if (const Value* v = self.dict->Find(args[0].s)) return *v;
      }
      return args.size() > 1 ? args[1] : Value::None();
    }
    const std::string& s = self.s;
    const Value* a0 = args.empty() ? nullptr : &args[0];
    if (name == "str.strip") return Value::Str(PyStrip(s, true, true, a0));
    if (name == "str.lstrip") return Value::Str(PyStrip(s, true, false, a0));
    if (name == "str.rstrip") return Value::Str(PyStrip(s, false, true, a0));
    if (name == "str.upper" || name == "str.lower") return Value::Str(AsciiCase(s, name == "str.upper"));
    if (name == "str.title" || name == "str.capitalize") return ApplyFilter(name.substr(4), self, {}, {}, line);
    if (name == "str.startswith" || name == "str.endswith") {
      if (a0 == nullptr || a0->type != Value::Type::kString) return Error(line, name.substr(4) + " needs a string");
      const std::string& p = a0->s;
      if (p.size() > s.size()) return Value::Bool(false);
      return Value::Bool(name == "str.startswith" ? s.compare(0, p.size(), p) == 0
                                                  : s.compare(s.size() - p.size(), p.size(), p) == 0);
    }
    if (name == "str.replace") return ApplyFilter("replace", self, args, {}, line);
    if (name == "str.split") {
      List out;
      if (a0 == nullptr || a0->type == Value::Type::kNone) {
        size_t k = 0;
        while (k < s.size()) {
          size_t len = 0;
          while (k < s.size() && IsPySpaceAt(s, k, &len)) k += len;
          if (k >= s.size()) break;
          size_t e = k;
          while (e < s.size() && !IsPySpaceAt(s, e, &len)) ++e;
          out.push_back(Value::Str(s.substr(k, e - k)));
          k = e;
        }
      } else {
        if (a0->type != Value::Type::kString || a0->s.empty()) return Error(line, "split needs a non-empty separator");
        size_t pos = 0;
        for (size_t hit = s.find(a0->s); hit != std::string::npos; hit = s.find(a0->s, pos)) {
          out.push_back(Value::Str(s.substr(pos, hit - pos)));
          pos = hit + a0->s.size();
        }
        out.push_back(Value::Str(s.substr(pos)));
      }
      return Value::MakeList(std::move(out));
    }
    return Error(line, "unsupported call of '" + name + "'");
  }

  Status EvalArgs(const Expr& e, size_t first, std::vector<Value>* args, std::map<std::string, Value>* kwargs) {
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

  StatusOr<Value> Eval(const Expr& e) {
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
      case Expr::Kind::kConcat: {
        std::string out;
        for (const ExprPtr& a : e.args) {
          LEDE_ASSIGN_OR_RETURN(Value v, Eval(*a));
          out += PyStr(v);
        }
        return Value::Str(out);
      }
      case Expr::Kind::kCond: {
        LEDE_ASSIGN_OR_RETURN(Value c, Eval(*e.args[1]));
        if (Truthy(c)) return Eval(*e.args[0]);
        if (e.args[2]) return Eval(*e.args[2]);
        return Value::Undefined("else");
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
    }
    return Error(e.line, "internal: unknown expression");
  }

 private:
  const TemplateProgram& program_;
  std::time_t now_;
  std::vector<std::unordered_map<std::string, Value>> scopes_;
};

}  // namespace

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
