// File: shared/tokenizer/internal/jinja_value.cc
//
// Python semantics of the interpreter's values: see jinja_value.h.
#include "shared/tokenizer/internal/jinja_value.h"

#include <cctype>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "shared/status/status_macros.h"

namespace lede::tokenizer::internal {

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

std::vector<size_t> CodePointOffsets(const std::string& s) {
  std::vector<size_t> offsets;
  for (size_t k = 0; k < s.size(); ++k) {
    if ((static_cast<unsigned char>(s[k]) & 0xC0) != 0x80) offsets.push_back(k);
  }
  offsets.push_back(s.size());
  return offsets;
}

size_t CodePointCount(const std::string& s) { return CodePointOffsets(s).size() - 1; }

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

}  // namespace lede::tokenizer::internal
