// File: shared/tokenizer/internal/jinja_value.h
//
// The values of the chat-template interpreter (chat_template.h), which
// follow Python: ints, floats, strings (UTF-8; length and slices count code
// points), lists, insertion-ordered dicts, None, booleans, and Jinja's
// Undefined (prints as "", false, iterates as empty; taking an attribute of
// it is an error); and Python's str(), repr() and json.dumps() of them.
#ifndef LEDE_SHARED_TOKENIZER_INTERNAL_JINJA_VALUE_H_
#define LEDE_SHARED_TOKENIZER_INTERNAL_JINJA_VALUE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "shared/status/status.h"

namespace lede::tokenizer::internal {

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

// The value's type name as Python's type(v).__name__ spells it.
const char* TypeName(const Value& v);

// Python truthiness (Undefined and None are false).
bool Truthy(const Value& v);

// Python ==: numbers compare by value across int, float and bool; lists and
// dicts element by element (dicts ignore order).
bool Equal(const Value& a, const Value& b);

// UTF-8 code point boundaries of `s` (byte offsets, including the end).
std::vector<size_t> CodePointOffsets(const std::string& s);
size_t CodePointCount(const std::string& s);

// Python float repr: the shortest digits that round-trip, positional for
// exponents in [-4, 16), scientific otherwise.
std::string PyFloat(double x);

// repr() of a Python string: single quotes unless it holds one and no
// double quote.
std::string PyStrRepr(const std::string& s);

// str(v) as Python prints it.
std::string PyStr(const Value& v);

// repr(v) as Python prints it.
std::string PyRepr(const Value& v);

// json.dumps(x, ensure_ascii=False, indent=indent, sort_keys=sort_keys),
// appended to *out; `depth` is the nesting level of `v` (0 at the top).
// InvalidArgumentError for a value JSON cannot hold (Undefined, functions).
Status ToJson(const Value& v, int indent, bool sort_keys, int depth, std::string* out);

// The value of a JSON document: objects keep their key order.
Value FromJson(const nlohmann::ordered_json& j);

// Python's str.isspace() characters: whether one starts at byte `pos` of
// `s`; *len is its length in bytes.
bool IsPySpaceAt(const std::string& s, size_t pos, size_t* len);

// str.strip / lstrip / rstrip: `chars` (a string Value) or, when null or
// not a string, Python's whitespace; counts code points.
std::string PyStrip(const std::string& s, bool left, bool right, const Value* chars);

// ASCII upper- or lower-casing; other bytes unchanged.
std::string AsciiCase(std::string s, bool upper);

}  // namespace lede::tokenizer::internal

#endif  // LEDE_SHARED_TOKENIZER_INTERNAL_JINJA_VALUE_H_
