// File: shared/tokenizer/internal/jinja_filters.cc
//
// The Renderer's filters (`x | trim`), tests (`x is defined`) and callable
// functions and methods (jinja_renderer_impl.h); jinja_renderer.cc runs the rest.
#include <algorithm>
#include <cctype>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "shared/status/status_macros.h"
#include "shared/tokenizer/internal/jinja_renderer_impl.h"
#include "shared/tokenizer/internal/jinja_value.h"

namespace lede::tokenizer::internal {

bool Renderer::IsStringMethod(const std::string& n) {
  static const char* const k[] = {"strip", "lstrip", "rstrip", "split", "startswith", "endswith", "upper",
                                  "lower", "title", "capitalize", "replace"};
  return std::find_if(std::begin(k), std::end(k), [&](const char* m) { return n == m; }) != std::end(k);
}

StatusOr<bool> Renderer::ApplyTest(const std::string& name, const Value& v, const std::vector<Value>& args, int line) {
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

StatusOr<Value> Renderer::AttrFilter(const std::string& name, const Value& seq, const std::vector<Value>& args,
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

std::optional<StatusOr<Value>> Renderer::StringFilter(const std::string& name, const Value& v, const FilterArgs& fa,
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

std::optional<StatusOr<Value>> Renderer::SequenceFilter(const std::string& name, const Value& v, const FilterArgs& fa,
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

std::optional<StatusOr<Value>> Renderer::NumberFilter(const std::string& name, const Value& v, const FilterArgs& fa,
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

StatusOr<Value> Renderer::ApplyFilter(const std::string& name, const Value& v, const std::vector<Value>& args,
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

StatusOr<Value> Renderer::CallFunction(const Value& f, const std::vector<Value>& args,
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

}  // namespace lede::tokenizer::internal
