// File: shared/tokenizer/chat_template.cc
//
// A tree-walking interpreter of the Jinja2 subset described in
// chat_template.h. Three stages:
//   1. Lex the template into text / {{ }} / {% %} pieces, applying "-"
//      whitespace control, trim_blocks and lstrip_blocks the way Jinja's
//      lexer does (a block tag at the start of a line, counting the start of
//      the template and the text after a tag that ate its newline, takes the
//      spaces and tabs before it; the first newline after a block tag or
//      comment is dropped).
//   2. Parse each tag's expression tokens by recursive descent with Jinja's
//      precedence (or < and < not < comparisons < + - < ~ < * / // % < ** <
//      unary < postfix and filters/tests), and the tags into a statement tree.
//   3. Render with a stack of scopes: a for loop's body is a scope of its
//      own (so {% set %} inside a loop does not leak, as in Jinja, which is
//      why templates use namespace()); if-blocks are not.
// Values follow Python: ints, floats, strings (UTF-8; length and slices
// count code points), lists, insertion-ordered dicts, None, booleans, and
// Jinja's Undefined (prints as "", false, iterates as empty; taking an
// attribute of it is an error).
#include "shared/tokenizer/chat_template.h"

#include <algorithm>
#include <cctype>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <utility>

#include "shared/file/file.h"
#include "shared/status/status_macros.h"
#include "shared/tokenizer/gguf_tokenizer.h"
#include "shared/tokenizer/hf_config.h"
#include "shared/tokenizer/tokenizer.h"

namespace lede::tokenizer {
namespace internal {

// ---------------------------------------------------------------------------
// Values

struct Value;
using List = std::vector<Value>;
struct Dict {
  std::vector<std::pair<std::string, Value>> items;  // insertion order
  const Value* Find(const std::string& key) const;
  Value* Find(const std::string& key);
  void Set(const std::string& key, Value v);
};

struct Value {
  enum class Type { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace, kFunction };
  Type type = Type::kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                  // kString; kUndefined: the name; kFunction: its name
  std::shared_ptr<List> list;     // kList
  std::shared_ptr<Dict> dict;     // kDict, kNamespace
  std::shared_ptr<Value> self;    // kFunction: the bound object (methods)

  static Value Undefined(std::string name) {
    Value v;
    v.s = std::move(name);
    return v;
  }
  static Value None() {
    Value v;
    v.type = Type::kNone;
    return v;
  }
  static Value Bool(bool x) {
    Value v;
    v.type = Type::kBool;
    v.b = x;
    return v;
  }
  static Value Int(int64_t x) {
    Value v;
    v.type = Type::kInt;
    v.i = x;
    return v;
  }
  static Value Float(double x) {
    Value v;
    v.type = Type::kFloat;
    v.f = x;
    return v;
  }
  static Value Str(std::string x) {
    Value v;
    v.type = Type::kString;
    v.s = std::move(x);
    return v;
  }
  static Value MakeList(List items = {}) {
    Value v;
    v.type = Type::kList;
    v.list = std::make_shared<List>(std::move(items));
    return v;
  }
  static Value MakeDict() {
    Value v;
    v.type = Type::kDict;
    v.dict = std::make_shared<Dict>();
    return v;
  }
  static Value Function(std::string name, std::shared_ptr<Value> self = nullptr) {
    Value v;
    v.type = Type::kFunction;
    v.s = std::move(name);
    v.self = std::move(self);
    return v;
  }
  bool is_undefined() const { return type == Type::kUndefined; }
  bool is_number() const { return type == Type::kInt || type == Type::kFloat || type == Type::kBool; }
  double AsDouble() const { return type == Type::kFloat ? f : static_cast<double>(type == Type::kBool ? b : i); }
};

const Value* Dict::Find(const std::string& key) const {
  for (const auto& kv : items) {
    if (kv.first == key) return &kv.second;
  }
  return nullptr;
}
Value* Dict::Find(const std::string& key) {
  for (auto& kv : items) {
    if (kv.first == key) return &kv.second;
  }
  return nullptr;
}
void Dict::Set(const std::string& key, Value v) {
  if (Value* old = Find(key)) {
    *old = std::move(v);
  } else {
    items.emplace_back(key, std::move(v));
  }
}

const char* TypeName(const Value& v) {
  switch (v.type) {
    case Value::Type::kUndefined: return "undefined";
    case Value::Type::kNone: return "NoneType";
    case Value::Type::kBool: return "bool";
    case Value::Type::kInt: return "int";
    case Value::Type::kFloat: return "float";
    case Value::Type::kString: return "str";
    case Value::Type::kList: return "list";
    case Value::Type::kDict: return "dict";
    case Value::Type::kNamespace: return "Namespace";
    case Value::Type::kFunction: return "function";
  }
  return "?";
}

bool Truthy(const Value& v) {
  switch (v.type) {
    case Value::Type::kUndefined:
    case Value::Type::kNone: return false;
    case Value::Type::kBool: return v.b;
    case Value::Type::kInt: return v.i != 0;
    case Value::Type::kFloat: return v.f != 0;
    case Value::Type::kString: return !v.s.empty();
    case Value::Type::kList: return !v.list->empty();
    case Value::Type::kDict: return !v.dict->items.empty();
    default: return true;
  }
}

bool Equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.type == Value::Type::kFloat || b.type == Value::Type::kFloat) return a.AsDouble() == b.AsDouble();
    return (a.type == Value::Type::kBool ? a.b : a.i) == (b.type == Value::Type::kBool ? b.b : b.i);
  }
  if (a.type != b.type) return false;
  switch (a.type) {
    case Value::Type::kUndefined:
    case Value::Type::kNone: return true;
    case Value::Type::kString: return a.s == b.s;
    case Value::Type::kList:
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k) {
        if (!Equal((*a.list)[k], (*b.list)[k])) return false;
      }
      return true;
    case Value::Type::kDict:
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [key, val] : a.dict->items) {
        const Value* other = b.dict->Find(key);
        if (other == nullptr || !Equal(val, *other)) return false;
      }
      return true;
    default: return a.dict == b.dict && a.s == b.s;
  }
}

// UTF-8 code point boundaries of `s` (byte offsets, including the end).
std::vector<size_t> CodePointOffsets(const std::string& s) {
  std::vector<size_t> offsets;
  for (size_t k = 0; k < s.size(); ++k) {
    if ((static_cast<unsigned char>(s[k]) & 0xC0) != 0x80) offsets.push_back(k);
  }
  offsets.push_back(s.size());
  return offsets;
}

size_t CodePointCount(const std::string& s) { return CodePointOffsets(s).size() - 1; }

// Python float repr: the shortest digits that round-trip, positional for
// exponents in [-4, 16), scientific otherwise.
std::string PyFloat(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  if (x == 0) return std::signbit(x) ? "-0.0" : "0.0";
  char buf[64];
  int precision = 1;
  for (; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*e", precision - 1, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  // buf = [-]d.ddde[+-]XX
  std::string str(buf);
  const bool negative = str[0] == '-';
  if (negative) str.erase(0, 1);
  const size_t e = str.find('e');
  const int exponent = std::atoi(str.c_str() + e + 1);
  std::string digits = str.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out;
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out = "0." + std::string(-exponent - 1, '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exponent + 1) {
      out = digits + std::string(exponent + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, exponent + 1) + "." + digits.substr(exponent + 1);
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp_buf[16];
    std::snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += exp_buf;
  }
  return negative ? "-" + out : out;
}

std::string PyRepr(const Value& v);

std::string PyStrRepr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == quote || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  out += quote;
  return out;
}

// str(v) as Python prints it.
std::string PyStr(const Value& v) {
  switch (v.type) {
    case Value::Type::kUndefined: return "";
    case Value::Type::kNone: return "None";
    case Value::Type::kBool: return v.b ? "True" : "False";
    case Value::Type::kInt: return std::to_string(v.i);
    case Value::Type::kFloat: return PyFloat(v.f);
    case Value::Type::kString: return v.s;
    default: return PyRepr(v);
  }
}

std::string PyRepr(const Value& v) {
  switch (v.type) {
    case Value::Type::kString: return PyStrRepr(v.s);
    case Value::Type::kList: {
      std::string out = "[";
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k > 0) out += ", ";
        out += PyRepr((*v.list)[k]);
      }
      return out + "]";
    }
    case Value::Type::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [key, val] : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        out += PyStrRepr(key) + ": " + PyRepr(val);
      }
      return out + "}";
    }
    case Value::Type::kNamespace: return "<Namespace>";
    case Value::Type::kFunction: return "<function " + v.s + ">";
    default: return PyStr(v);
  }
}

// json.dumps(x, ensure_ascii=False, indent=indent, sort_keys=sort_keys).
Status ToJson(const Value& v, int indent, bool sort_keys, int depth, std::string* out) {
  auto newline = [&](int d) {
    if (indent < 0) return;
    *out += '\n';
    out->append(static_cast<size_t>(indent * d), ' ');
  };
  const std::string item_sep = indent < 0 ? ", " : ",";
  switch (v.type) {
    case Value::Type::kNone: *out += "null"; return OkStatus();
    case Value::Type::kBool: *out += v.b ? "true" : "false"; return OkStatus();
    case Value::Type::kInt: *out += std::to_string(v.i); return OkStatus();
    case Value::Type::kFloat:
      *out += std::isnan(v.f) ? "NaN" : std::isinf(v.f) ? (v.f > 0 ? "Infinity" : "-Infinity") : PyFloat(v.f);
      return OkStatus();
    case Value::Type::kString: {
      *out += '"';
      for (const char c : v.s) {
        const auto u = static_cast<unsigned char>(c);
        switch (c) {
          case '"': *out += "\\\""; break;
          case '\\': *out += "\\\\"; break;
          case '\n': *out += "\\n"; break;
          case '\r': *out += "\\r"; break;
          case '\t': *out += "\\t"; break;
          case '\b': *out += "\\b"; break;
          case '\f': *out += "\\f"; break;
          default:
            if (u < 0x20) {
              char buf[8];
              std::snprintf(buf, sizeof(buf), "\\u%04x", u);
              *out += buf;
            } else {
              *out += c;
            }
        }
      }
      *out += '"';
      return OkStatus();
    }
    case Value::Type::kList: {
      if (v.list->empty()) {
        *out += "[]";
        return OkStatus();
      }
      *out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k > 0) *out += item_sep;
        newline(depth + 1);
        LEDE_RETURN_IF_ERROR(ToJson((*v.list)[k], indent, sort_keys, depth + 1, out));
      }
      newline(depth);
      *out += ']';
      return OkStatus();
    }
    case Value::Type::kDict: {
      if (v.dict->items.empty()) {
        *out += "{}";
        return OkStatus();
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      if (sort_keys) {
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      }
      *out += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k > 0) *out += item_sep;
        newline(depth + 1);
        LEDE_RETURN_IF_ERROR(ToJson(Value::Str(items[k]->first), indent, sort_keys, depth + 1, out));
        *out += ": ";
        LEDE_RETURN_IF_ERROR(ToJson(items[k]->second, indent, sort_keys, depth + 1, out));
      }
      newline(depth);
      *out += '}';
      return OkStatus();
    }
    default:
      return InvalidArgumentError(std::string("Object of type ") + TypeName(v) + " is not JSON serializable");
  }
}

Value FromJson(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::None();
    case nlohmann::ordered_json::value_t::boolean: return Value::Bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
    case nlohmann::ordered_json::value_t::number_unsigned: return Value::Int(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_float: return Value::Float(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::Str(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      Value v = Value::MakeList();
      for (const auto& e : j) v.list->push_back(FromJson(e));
      return v;
    }
    case nlohmann::ordered_json::value_t::object: {
      Value v = Value::MakeDict();
      for (auto it = j.begin(); it != j.end(); ++it) v.dict->Set(it.key(), FromJson(it.value()));
      return v;
    }
    default: return Value::None();
  }
}

// Python's str.isspace() characters.
bool IsPySpaceAt(const std::string& s, size_t pos, size_t* len) {
  const auto u = static_cast<unsigned char>(s[pos]);
  *len = 1;
  if (u == ' ' || (u >= 0x09 && u <= 0x0D) || (u >= 0x1C && u <= 0x1F)) return true;
  if (u < 0x80) return false;
  static const char* const kSpaces[] = {"\xC2\x85", "\xC2\xA0", "\xE1\x9A\x80", "\xE2\x80\x80", "\xE2\x80\x81",
                                        "\xE2\x80\x82", "\xE2\x80\x83", "\xE2\x80\x84", "\xE2\x80\x85",
                                        "\xE2\x80\x86", "\xE2\x80\x87", "\xE2\x80\x88", "\xE2\x80\x89",
                                        "\xE2\x80\x8A", "\xE2\x80\xA8", "\xE2\x80\xA9", "\xE2\x80\xAF",
                                        "\xE2\x81\x9F", "\xE3\x80\x80"};
  for (const char* sp : kSpaces) {
    const size_t n = std::char_traits<char>::length(sp);
    if (s.compare(pos, n, sp) == 0) {
      *len = n;
      return true;
    }
  }
  return false;
}

std::string PyStrip(const std::string& s, bool left, bool right, const Value* chars) {
  const std::vector<size_t> cps = CodePointOffsets(s);
  auto is_strip = [&](size_t k) {  // code point k
    const std::string cp = s.substr(cps[k], cps[k + 1] - cps[k]);
    if (chars != nullptr && chars->type == Value::Type::kString) return chars->s.find(cp) != std::string::npos;
    size_t len = 0;
    return IsPySpaceAt(s, cps[k], &len) && len == cp.size();
  };
  size_t begin = 0, end = cps.size() - 1;
  if (left) {
    while (begin < end && is_strip(begin)) ++begin;
  }
  if (right) {
    while (end > begin && is_strip(end - 1)) --end;
  }
  return s.substr(cps[begin], cps[end] - cps[begin]);
}

std::string AsciiCase(std::string s, bool upper) {
  for (char& c : s) c = static_cast<char>(upper ? std::toupper(static_cast<unsigned char>(c))
                                                : std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// ---------------------------------------------------------------------------
// Expressions

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

// ---------------------------------------------------------------------------
// Statements

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

namespace {

// ---------------------------------------------------------------------------
// Lexer

struct Piece {
  enum class Kind { kText, kVar, kBlock } kind;
  std::string content;
  int line;
};

int CountLines(std::string_view s, size_t begin, size_t end) {
  return static_cast<int>(std::count(s.begin() + begin, s.begin() + end, '\n'));
}

std::string RStripAll(const std::string& s) {
  size_t end = s.size();
  while (end > 0 && std::isspace(static_cast<unsigned char>(s[end - 1]))) --end;
  return s.substr(0, end);
}

StatusOr<std::vector<Piece>> Lex(std::string_view raw, const std::string& name) {
  // Jinja's defaults: newlines normalized to "\n", one trailing newline
  // dropped (keep_trailing_newline = False).
  std::string normalized;
  normalized.reserve(raw.size());
  for (size_t k = 0; k < raw.size(); ++k) {
    if (raw[k] == '\r') {
      normalized += '\n';
      if (k + 1 < raw.size() && raw[k + 1] == '\n') ++k;
    } else {
      normalized += raw[k];
    }
  }
  if (!normalized.empty() && normalized.back() == '\n') normalized.pop_back();
  const std::string_view src = normalized;
  std::vector<Piece> pieces;
  size_t pos = 0;
  int line = 1;
  bool line_starting = true;  // the last tag ended with a newline (or none yet)
  bool strip_next = false;    // the last tag ended with "-"
  while (pos <= src.size()) {
    size_t open = std::string_view::npos;
    for (size_t k = src.find('{', pos); k != std::string_view::npos; k = src.find('{', k + 1)) {
      if (k + 1 < src.size() && (src[k + 1] == '{' || src[k + 1] == '%' || src[k + 1] == '#')) {
        open = k;
        break;
      }
    }
    std::string text(src.substr(pos, open == std::string_view::npos ? std::string_view::npos : open - pos));
    const int text_line = line;
    if (strip_next) {
      size_t b = 0;
      while (b < text.size() && std::isspace(static_cast<unsigned char>(text[b]))) ++b;
      text.erase(0, b);
    }
    if (open == std::string_view::npos) {
      if (!text.empty()) pieces.push_back({Piece::Kind::kText, text, text_line});
      break;
    }
    line += CountLines(src, pos, open);
    const char kind = src[open + 1];
    const char sign = open + 2 < src.size() ? src[open + 2] : '\0';
    if (sign == '-') {
      text = RStripAll(text);
    } else if (sign != '+' && kind != '{') {
      // lstrip_blocks: spaces and tabs between the line start and the tag.
      const size_t nl = text.rfind('\n');
      const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if (l_pos > 0 || line_starting) {
        const bool blank = std::all_of(text.begin() + static_cast<std::ptrdiff_t>(l_pos), text.end(),
                                       [](char c) { return c == ' ' || c == '\t'; });
        if (blank) text.erase(l_pos);
      }
    }
    if (!text.empty()) pieces.push_back({Piece::Kind::kText, text, text_line});
    const std::string_view close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    const size_t inner = open + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
    size_t end = src.find(close, inner);
    if (kind != '#') {
      // A closing delimiter inside a string literal does not end the tag.
      char quote = 0;
      end = std::string_view::npos;
      for (size_t k = inner; k + 1 < src.size(); ++k) {
        const char c = src[k];
        if (quote != 0) {
          if (c == '\\') {
            ++k;
          } else if (c == quote) {
            quote = 0;
          }
        } else if (c == '\'' || c == '"') {
          quote = c;
        } else if (src.compare(k, 2, close) == 0) {
          end = k;
          break;
        }
      }
    }
    if (end == std::string_view::npos) {
      return InvalidArgumentError(name + ": line " + std::to_string(line) + ": unclosed '" +
                                  std::string(src.substr(open, 2)) + "'");
    }
    bool strip_after = end > inner && src[end - 1] == '-';
    const size_t content_end = strip_after ? end - 1 : end;
    const std::string content(src.substr(inner, content_end - inner));
    if (kind != '#') pieces.push_back({kind == '{' ? Piece::Kind::kVar : Piece::Kind::kBlock, content, line});
    line += CountLines(src, open, end + 2);
    pos = end + 2;
    line_starting = false;
    strip_next = strip_after;
    if (!strip_after && kind != '{' && pos < src.size() && src[pos] == '\n') {  // trim_blocks
      ++pos;
      ++line;
      line_starting = true;
    }
    if (pos >= src.size()) break;
  }
  return pieces;
}

// ---------------------------------------------------------------------------
// Expression tokens

struct Token {
  enum class Kind { kName, kString, kInt, kFloat, kOp, kEnd } kind;
  std::string text;
  int line;
};

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

StatusOr<std::vector<Token>> Tokenize(const std::string& s, int line, const std::string& name) {
  std::vector<Token> tokens;
  size_t k = 0;
  auto error = [&](const std::string& what) {
    return InvalidArgumentError(name + ": line " + std::to_string(line) + ": " + what);
  };
  while (k < s.size()) {
    const char c = s[k];
    if (std::isspace(static_cast<unsigned char>(c))) {
      if (c == '\n') ++line;
      ++k;
      continue;
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t e = k;
      while (e < s.size() && (std::isalnum(static_cast<unsigned char>(s[e])) || s[e] == '_')) ++e;
      tokens.push_back({Token::Kind::kName, s.substr(k, e - k), line});
      k = e;
      continue;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t e = k;
      bool is_float = false;
      while (e < s.size() && (std::isdigit(static_cast<unsigned char>(s[e])) || s[e] == '_')) ++e;
      if (e + 1 < s.size() && s[e] == '.' && std::isdigit(static_cast<unsigned char>(s[e + 1]))) {
        is_float = true;
        ++e;
        while (e < s.size() && std::isdigit(static_cast<unsigned char>(s[e]))) ++e;
      }
      if (e < s.size() && (s[e] == 'e' || s[e] == 'E')) {
        size_t x = e + 1;
        if (x < s.size() && (s[x] == '+' || s[x] == '-')) ++x;
        if (x < s.size() && std::isdigit(static_cast<unsigned char>(s[x]))) {
          is_float = true;
          e = x;
          while (e < s.size() && std::isdigit(static_cast<unsigned char>(s[e]))) ++e;
        }
      }
      std::string num = s.substr(k, e - k);
      num.erase(std::remove(num.begin(), num.end(), '_'), num.end());
      tokens.push_back({is_float ? Token::Kind::kFloat : Token::Kind::kInt, num, line});
      k = e;
      continue;
    }
    if (c == '\'' || c == '"') {
      std::string out;
      size_t e = k + 1;
      bool closed = false;
      while (e < s.size()) {
        const char d = s[e];
        if (d == c) {
          closed = true;
          ++e;
          break;
        }
        if (d == '\n') ++line;
        if (d != '\\' || e + 1 >= s.size()) {
          out += d;
          ++e;
          continue;
        }
        const char x = s[e + 1];
        e += 2;
        switch (x) {
          case 'n': out += '\n'; break;
          case 't': out += '\t'; break;
          case 'r': out += '\r'; break;
          case '0': out += '\0'; break;
          case 'a': out += '\a'; break;
          case 'b': out += '\b'; break;
          case 'f': out += '\f'; break;
          case 'v': out += '\v'; break;
          case '\\': out += '\\'; break;
          case '\'': out += '\''; break;
          case '"': out += '"'; break;
          case '\n': break;  // line continuation
          case 'x':
          case 'u':
          case 'U': {
            const size_t n = x == 'x' ? 2 : x == 'u' ? 4 : 8;
            if (e + n > s.size()) return error("bad escape in a string literal");
            const uint32_t cp = static_cast<uint32_t>(std::strtoul(s.substr(e, n).c_str(), nullptr, 16));
            AppendUtf8(cp, &out);
            e += n;
            break;
          }
          default:
            out += '\\';
            out += x;
        }
      }
      if (!closed) return error("unterminated string literal");
      tokens.push_back({Token::Kind::kString, out, line});
      k = e;
      continue;
    }
    static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                       ">",  "|",  ".",  ",",  ":",  "(",  ")", "[", "]", "{", "}", "="};
    bool matched = false;
    for (const char* op : kOps) {
      const size_t n = std::char_traits<char>::length(op);
      if (s.compare(k, n, op) == 0) {
        tokens.push_back({Token::Kind::kOp, op, line});
        k += n;
        matched = true;
        break;
      }
    }
    if (!matched) return error(std::string("unexpected character '") + c + "'");
  }
  tokens.push_back({Token::Kind::kEnd, "", line});
  return tokens;
}

// ---------------------------------------------------------------------------
// Expression parser

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

class ExprParser {
 public:
  ExprParser(std::vector<Token> tokens, std::string name) : t_(std::move(tokens)), name_(std::move(name)) {}

  const Token& Peek(size_t ahead = 0) const { return t_[std::min(p_ + ahead, t_.size() - 1)]; }
  bool AtEnd() const { return Peek().kind == Token::Kind::kEnd; }
  bool IsOp(const char* op, size_t ahead = 0) const {
    return Peek(ahead).kind == Token::Kind::kOp && Peek(ahead).text == op;
  }
  bool IsName(const char* n, size_t ahead = 0) const {
    return Peek(ahead).kind == Token::Kind::kName && Peek(ahead).text == n;
  }
  Token Next() { return t_[std::min(p_++, t_.size() - 1)]; }
  Status Error(const std::string& what) const {
    return InvalidArgumentError(name_ + ": line " + std::to_string(Peek().line) + ": " + what);
  }
  Status Expect(const char* op) {
    if (!IsOp(op)) {
      return Error(std::string("expected '") + op + "', got '" + (AtEnd() ? "end of tag" : Peek().text) + "'");
    }
    ++p_;
    return OkStatus();
  }
  StatusOr<std::string> ExpectName() {
    if (Peek().kind != Token::Kind::kName) return Error("expected a name, got '" + Peek().text + "'");
    return Next().text;
  }

  ExprPtr Make(Expr::Kind kind) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = Peek().line;
    return e;
  }

  // expression := or ['if' or ['else' expression]]
  StatusOr<ExprPtr> Parse(bool with_condexpr = true) {
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

  StatusOr<ExprPtr> ParseOr() {
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
  StatusOr<ExprPtr> ParseAnd() {
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
  StatusOr<ExprPtr> ParseNot() {
    if (IsName("not")) {
      auto n = Make(Expr::Kind::kNot);
      ++p_;
      LEDE_ASSIGN_OR_RETURN(ExprPtr r, ParseNot());
      n->args.push_back(std::move(r));
      return n;
    }
    return ParseCompare();
  }
  StatusOr<ExprPtr> ParseCompare() {
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
  StatusOr<ExprPtr> ParseMath1() {
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
  StatusOr<ExprPtr> ParseConcat() {
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
  StatusOr<ExprPtr> ParseMath2() {
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
  StatusOr<ExprPtr> ParsePow() {
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
  StatusOr<ExprPtr> ParseUnary(bool with_filter) {
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

  Status ParseCallArgs(Expr* call) {
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

  StatusOr<ExprPtr> ParsePostfix(ExprPtr e) {
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

  StatusOr<ExprPtr> ParseFilterAndTest(ExprPtr e) {
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

  StatusOr<ExprPtr> ParsePrimary() {
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

  size_t p_ = 0;

 private:
  std::vector<Token> t_;
  std::string name_;
};

// ---------------------------------------------------------------------------
// Statement parser

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
        ++p->p_;
      }
      if (!p->IsName("in")) return p->Error("expected 'in' in a for tag");
      ++p->p_;
      LEDE_ASSIGN_OR_RETURN(n->expr, p->Parse(/*with_condexpr=*/false));
      if (p->IsName("if")) {
        ++p->p_;
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
        ++p->p_;
        LEDE_ASSIGN_OR_RETURN(n->attr, p->ExpectName());
      }
      if (p->IsOp(",")) {
        return UnimplementedError(name_ + ": line " + std::to_string(line) + ": unsupported tuple 'set'");
      }
      if (p->IsOp("=")) {
        ++p->p_;
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

// ---------------------------------------------------------------------------
// Renderer

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
}  // namespace internal

ChatTemplate::ChatTemplate(std::shared_ptr<const internal::TemplateProgram> program) : program_(std::move(program)) {}

StatusOr<ChatTemplate> ChatTemplate::Parse(std::string_view source, const std::string& name) {
  LEDE_ASSIGN_OR_RETURN(std::vector<internal::Piece> pieces, internal::Lex(source, name));
  auto program = std::make_shared<internal::TemplateProgram>();
  program->name = name;
  internal::TemplateParser parser(std::move(pieces), name);
  std::string end;
  std::unique_ptr<internal::ExprParser> end_parser;
  LEDE_RETURN_IF_ERROR(parser.ParseBody({}, &program->body, &end, &end_parser));
  return ChatTemplate(std::move(program));
}

StatusOr<std::string> ChatTemplate::RenderJson(const std::string& variables_json, std::time_t now) const {
  nlohmann::ordered_json vars;
  try {
    vars = nlohmann::ordered_json::parse(variables_json);
  } catch (const nlohmann::ordered_json::exception& e) {
    return InvalidArgumentError(std::string("chat template variables: bad JSON: ") + e.what());
  }
  if (!vars.is_object()) return InvalidArgumentError("chat template variables: not a JSON object");
  internal::Renderer renderer(*program_, now);
  for (auto it = vars.begin(); it != vars.end(); ++it) renderer.globals()[it.key()] = internal::FromJson(it.value());
  std::string out;
  LEDE_ASSIGN_OR_RETURN(internal::Flow flow, renderer.Exec(program_->body, &out));
  (void)flow;
  return out;
}

StatusOr<std::string> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                           const ChatTemplateOptions& options) const {
  for (const ChatMessage& m : messages) {
    if (!IsValidUtf8(m.role) || !IsValidUtf8(m.content)) return InvalidArgumentError("chat message: invalid UTF-8");
  }
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  vars["messages"] = nlohmann::ordered_json::array();
  for (const ChatMessage& m : messages) vars["messages"].push_back({{"role", m.role}, {"content", m.content}});
  vars["add_generation_prompt"] = options.add_generation_prompt;
  vars["bos_token"] = options.bos_token;
  vars["eos_token"] = options.eos_token;
  return RenderJson(vars.dump(), options.now);
}

StatusOr<ModelChatTemplate> LoadModelChatTemplate(const std::string& model_dir, const std::string& template_path) {
  std::error_code gguf_ec;
  if (std::filesystem::path(model_dir).extension() == ".gguf" && std::filesystem::is_regular_file(model_dir, gguf_ec)) {
    LEDE_ASSIGN_OR_RETURN(GgufChatTemplate g, ReadGgufChatTemplate(model_dir));
    std::string text = std::move(g.text), source = model_dir + " tokenizer.chat_template";
    if (!template_path.empty()) {
      LEDE_ASSIGN_OR_RETURN(text, file::ReadFile(template_path));
      source = template_path;
    }
    LEDE_ASSIGN_OR_RETURN(ChatTemplate parsed, ChatTemplate::Parse(text, source));
    return ModelChatTemplate{std::move(parsed), g.bos_token, g.eos_token, source};
  }
  LEDE_ASSIGN_OR_RETURN(HfTokenizerConfig config, ReadHfTokenizerConfig(model_dir.empty() ? "." : model_dir));
  std::string source = template_path, text;
  if (source.empty()) {
    const std::string jinja = (std::filesystem::path(model_dir) / "chat_template.jinja").string();
    std::error_code ec;
    if (std::filesystem::exists(jinja, ec)) source = jinja;
  }
  if (!source.empty()) {
    LEDE_ASSIGN_OR_RETURN(text, file::ReadFile(source));
  } else if (!config.chat_template.empty()) {
    text = config.chat_template;
    source = config.source + " chat_template";
  } else {
    return NotFoundError("no chat template in " + model_dir +
                         " (neither chat_template.jinja nor a chat_template in tokenizer_config.json)");
  }
  LEDE_ASSIGN_OR_RETURN(ChatTemplate parsed, ChatTemplate::Parse(text, source));
  return ModelChatTemplate{std::move(parsed), config.bos_token.value_or(""), config.eos_token.value_or(""), source};
}

}  // namespace lede::tokenizer
