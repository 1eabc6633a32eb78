// File: shared/tokenizer/internal/jinja_lexer.cc
//
// See jinja_lexer.h.
#include "shared/tokenizer/internal/jinja_lexer.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>

namespace lede::tokenizer::internal {

namespace {

int CountLines(std::string_view s, size_t begin, size_t end) {
  return static_cast<int>(std::count(s.begin() + begin, s.begin() + end, '\n'));
}

std::string RStripAll(const std::string& s) {
  size_t end = s.size();
  while (end > 0 && std::isspace(static_cast<unsigned char>(s[end - 1]))) --end;
  return s.substr(0, end);
}

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

// Lexes the number literal at s[k] (digits with `_` separators, an optional
// fraction and exponent) into *tokens; returns the position after it.
size_t LexNumber(const std::string& s, size_t k, int line, std::vector<Token>* tokens) {
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
  tokens->push_back({is_float ? Token::Kind::kFloat : Token::Kind::kInt, num, line});
  return e;
}

// LexString's failures (positions no string can end at).
constexpr size_t kBadEscape = std::string::npos;
constexpr size_t kUnterminated = std::string::npos - 1;

// Lexes the quoted string literal at s[k] (Python escapes) into *out,
// counting newlines into *line; returns the position after the closing
// quote, or kBadEscape / kUnterminated.
size_t LexString(const std::string& s, size_t k, int* line, std::string* out) {
  const char quote = s[k];
  size_t e = k + 1;
  while (e < s.size()) {
    const char d = s[e];
    if (d == quote) return e + 1;
    if (d == '\n') ++*line;
    if (d != '\\' || e + 1 >= s.size()) {
      *out += d;
      ++e;
      continue;
    }
    const char x = s[e + 1];
    e += 2;
    switch (x) {
      case 'n': *out += '\n'; break;
      case 't': *out += '\t'; break;
      case 'r': *out += '\r'; break;
      case '0': *out += '\0'; break;
      case 'a': *out += '\a'; break;
      case 'b': *out += '\b'; break;
      case 'f': *out += '\f'; break;
      case 'v': *out += '\v'; break;
      case '\\': *out += '\\'; break;
      case '\'': *out += '\''; break;
      case '"': *out += '"'; break;
      case '\n': break;  // line continuation
      case 'x':
      case 'u':
      case 'U': {
        const size_t n = x == 'x' ? 2 : x == 'u' ? 4 : 8;
        if (e + n > s.size()) return kBadEscape;
        const uint32_t cp = static_cast<uint32_t>(std::strtoul(s.substr(e, n).c_str(), nullptr, 16));
        AppendUtf8(cp, out);
        e += n;
        break;
      }
      default:
        *out += '\\';
        *out += x;
    }
  }
  return kUnterminated;
}

}  // namespace

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
      k = LexNumber(s, k, line, &tokens);
      continue;
    }
    if (c == '\'' || c == '"') {
      std::string out;
      const size_t e = LexString(s, k, &line, &out);
      if (e == kBadEscape) return error("bad escape in a string literal");
      if (e == kUnterminated) return error("unterminated string literal");
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

}  // namespace lede::tokenizer::internal
