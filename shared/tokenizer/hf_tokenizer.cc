// File: shared/tokenizer/hf_tokenizer.cc
//
// tokenizer.json loading and BPE encoding. The pipeline of Encode():
//   added tokens split the raw text -> each other segment: normalizer ->
//   pre-tokenizer pieces -> BPE per piece -> ids.
// The BPE merge loop keeps the symbols of a piece in a doubly linked list
// and the candidate pairs in a min-heap ordered by (rank, position), so a
// piece of n symbols costs O(n log n); a popped pair is used only if both
// symbols are still the ones it was made from (lazy deletion).
#include "shared/tokenizer/hf_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <queue>
#include <system_error>
#include <unordered_map>
#include <utility>

#include "shared/file/file.h"
#include "shared/status/status_macros.h"

namespace lede::tokenizer {
namespace {

using Json = nlohmann::json;

constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // U+2581 "▁"

// The pattern of GPT-2's pre-tokenizer (ByteLevel with use_regex = true).
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Length of the (valid) UTF-8 character that starts with `lead`.
size_t Utf8Length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

// GPT-2's reversible map from bytes to printable code points: printable
// Latin-1 bytes map to themselves, the other 68 to 256, 257, ... in order.
std::vector<uint32_t> ByteToCodePoint() {
  std::vector<uint32_t> map(256);
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    map[b] = printable ? b : next++;
  }
  return map;
}

// Decodes a byte-level model string ("Ġthe") back to raw bytes (" the").
// Characters outside the map are kept as their UTF-8 bytes.
std::string ByteLevelToBytes(std::string_view s, const std::unordered_map<uint32_t, uint8_t>& inverse) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    const auto lead = static_cast<unsigned char>(s[i]);
    const size_t n = std::min(Utf8Length(lead), s.size() - i);
    uint32_t cp = lead;
    if (n == 2) cp = ((lead & 0x1F) << 6) | (s[i + 1] & 0x3F);
    if (n == 3) cp = ((lead & 0x0F) << 12) | ((s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
    if (n == 4) {
      cp = ((lead & 0x07) << 18) | ((s[i + 1] & 0x3F) << 12) | ((s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F);
    }
    auto it = inverse.find(cp);
    if (it != inverse.end()) {
      out.push_back(static_cast<char>(it->second));
    } else {
      out.append(s.substr(i, n));
    }
    i += n;
  }
  return out;
}

void ReplaceAll(std::string* s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  size_t pos = 0;
  while (true) {
    const size_t hit = s->find(from, pos);
    if (hit == std::string::npos) break;
    out.append(*s, pos, hit - pos);
    out.append(to);
    pos = hit + from.size();
  }
  out.append(*s, pos, std::string::npos);
  *s = std::move(out);
}

// "<0x0A>" -> 0x0A.
std::optional<uint8_t> ByteFallbackValue(std::string_view piece) {
  if (piece.size() != 6 || piece.substr(0, 3) != "<0x" || piece[5] != '>') return std::nullopt;
  int v = 0;
  for (size_t i = 3; i < 5; ++i) {
    const char c = piece[i];
    v *= 16;
    if (c >= '0' && c <= '9') {
      v += c - '0';
    } else if (c >= 'A' && c <= 'F') {
      v += c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      v += c - 'a' + 10;
    } else {
      return std::nullopt;
    }
  }
  return static_cast<uint8_t>(v);
}

// A member by reference (Json::value() would copy a 128k-entry vocabulary),
// or a shared null.
const Json& Member(const Json& j, const char* key) {
  static const Json* const kNull = new Json();
  if (!j.is_object()) return *kNull;
  auto it = j.find(key);
  return it == j.end() ? *kNull : *it;
}

std::string TypeOf(const Json& j) {
  if (j.is_object() && j.contains("type") && j["type"].is_string()) return j["type"].get<std::string>();
  return "";
}

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool lstrip = false;
  bool rstrip = false;
  bool special = false;
};

// A compiled PCRE2 pattern (owned).
struct Regex {
  pcre2_code* code = nullptr;
  Regex() = default;
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  ~Regex() {
    if (code != nullptr) pcre2_code_free(code);
  }
};

// One step of the pre-tokenizer.
struct PreTokenizerStep {
  enum class Kind { kSplit, kByteLevelRegex, kMetaspace } kind = Kind::kSplit;
  std::shared_ptr<Regex> regex;  // kSplit, kByteLevelRegex
  bool remove_matches = false;   // Split behaviour "Removed" (else "Isolated")
  bool invert = false;           // Split: the pattern matches the gaps
  // kMetaspace
  std::string replacement;
  enum class Prepend { kAlways, kFirst, kNever } prepend = Prepend::kAlways;
  bool split = true;
};

}  // namespace

struct HfTokenizer::Impl {
  std::string source;
  bool byte_level = false;      // the model's strings are GPT-2-mapped bytes
  bool ignore_merges = false;
  bool byte_fallback = false;
  bool fuse_unk = false;
  int32_t unk_id = -1;
  std::unordered_map<std::string, int32_t> vocab;  // model-space string (raw bytes if byte_level) -> id
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (left id, right id) -> (rank, merged id)
  std::vector<int32_t> byte_ids;  // byte_level: raw byte -> id; SP: <0xNN> -> id (-1 if none)

  // Normalizer (SentencePiece style): prepend, then replace.
  std::string normalizer_prepend;
  std::vector<std::pair<std::string, std::string>> normalizer_replace;

  std::vector<PreTokenizerStep> pre_tokenizer;
  bool byte_level_add_prefix_space = false;

  std::vector<AddedToken> added;  // longest first
  std::vector<std::vector<size_t>> added_by_first_byte;  // [256]: indices into `added`, longest first
  std::vector<std::string> token_bytes;  // id -> decoded bytes
  std::vector<bool> contributes_nothing;  // id -> special added token
  bool strip_space_after_special = false;  // SentencePiece-style decoders

  int32_t vocab_size = 0;
  int32_t bos = -1;
  int32_t eos = -1;
  bool default_add_bos = false;
  bool default_add_eos = false;

  std::optional<int32_t> Lookup(std::string_view s) const {
    auto it = vocab.find(std::string(s));
    if (it == vocab.end()) return std::nullopt;
    return it->second;
  }

  Status ApplyPreTokenizer(const std::string& segment, bool first_segment, std::vector<std::string>* pieces) const;
  void Bpe(std::string_view piece, std::vector<int32_t>* ids) const;
  Status EncodeSegment(std::string_view segment, bool first_segment, std::vector<int32_t>* ids) const;
};

namespace {

// Splits each piece by `regex`; matches and gaps become pieces ("Isolated"),
// or matches are dropped ("Removed"); with `invert` the roles swap.
Status RegexSplit(const Regex& regex, bool remove_matches, bool invert, const std::vector<std::string>& in,
                  std::vector<std::string>* out, const std::string& source) {
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(regex.code, nullptr);
  if (md == nullptr) return InternalError(source + ": PCRE2 match data allocation failed");
  Status status = OkStatus();
  for (const std::string& s : in) {
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    size_t pos = 0;   // next byte to search from
    size_t last = 0;  // end of the last emitted piece
    auto emit = [&](size_t b, size_t e, bool is_match) {
      if (e <= b) return;
      const bool keep = invert ? is_match : (!is_match || !remove_matches);
      const bool as_gap_removed = invert && !is_match && remove_matches;
      if (keep && !as_gap_removed) out->push_back(s.substr(b, e - b));
    };
    while (pos <= s.size()) {
      const int rc = pcre2_match(regex.code, subject, s.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        PCRE2_UCHAR buf[256];
        pcre2_get_error_message(rc, buf, sizeof(buf));
        status = InternalError(source + ": regex match failed: " + reinterpret_cast<const char*>(buf));
        break;
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      const size_t b = ov[0], e = ov[1];
      if (e == b) {  // empty match: step over one character
        if (b >= s.size()) break;
        pos = b + Utf8Length(static_cast<unsigned char>(s[b]));
        continue;
      }
      emit(last, b, false);
      emit(b, e, true);
      last = e;
      pos = e;
    }
    if (!status.ok()) break;
    emit(last, s.size(), false);
  }
  pcre2_match_data_free(md);
  return status;
}

StatusOr<std::shared_ptr<Regex>> CompileRegex(std::string_view pattern, const std::string& source) {
  auto regex = std::make_shared<Regex>();
  int err = 0;
  PCRE2_SIZE offset = 0;
  regex->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                              &err, &offset, nullptr);
  if (regex->code == nullptr) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof(buf));
    return InvalidArgumentError(source + ": pre_tokenizer regex rejected by PCRE2 at offset " +
                                std::to_string(offset) + ": " + reinterpret_cast<const char*>(buf));
  }
  return regex;
}

Status Unsupported(const std::string& source, const std::string& what, const std::string& type) {
  return UnimplementedError(source + ": unsupported " + what + " type \"" + type + "\"");
}

Status ParseNormalizer(const Json& j, HfTokenizer::Impl* t) {
  if (j.is_null()) return OkStatus();
  const std::string type = TypeOf(j);
  if (type == "Sequence") {
    if (!j.contains("normalizers") || !j["normalizers"].is_array()) {
      return InvalidArgumentError(t->source + ": normalizer Sequence without \"normalizers\"");
    }
    for (const Json& n : j["normalizers"]) LEDE_RETURN_IF_ERROR(ParseNormalizer(n, t));
    return OkStatus();
  }
  if (type == "Prepend") {
    if (!t->normalizer_replace.empty()) {
      return UnimplementedError(t->source + ": normalizer Prepend after Replace is not supported");
    }
    t->normalizer_prepend = j.value("prepend", "");
    return OkStatus();
  }
  if (type == "Replace") {
    const Json& p = j.value("pattern", Json::object());
    if (!p.contains("String") || !p["String"].is_string()) {
      return UnimplementedError(t->source + ": normalizer Replace with a Regex pattern is not supported");
    }
    t->normalizer_replace.emplace_back(p["String"].get<std::string>(), j.value("content", ""));
    return OkStatus();
  }
  return Unsupported(t->source, "normalizer", type.empty() ? j.dump() : type);
}

Status ParsePreTokenizer(const Json& j, HfTokenizer::Impl* t) {
  if (j.is_null()) return OkStatus();
  const std::string type = TypeOf(j);
  if (type == "Sequence") {
    if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array()) {
      return InvalidArgumentError(t->source + ": pre_tokenizer Sequence without \"pretokenizers\"");
    }
    for (const Json& p : j["pretokenizers"]) LEDE_RETURN_IF_ERROR(ParsePreTokenizer(p, t));
    return OkStatus();
  }
  if (type == "Split") {
    const Json& p = j.value("pattern", Json::object());
    std::string pattern;
    if (p.contains("Regex") && p["Regex"].is_string()) {
      pattern = p["Regex"].get<std::string>();
    } else if (p.contains("String") && p["String"].is_string()) {
      // A literal: quote it for PCRE2.
      pattern = "\\Q" + p["String"].get<std::string>() + "\\E";
    } else {
      return InvalidArgumentError(t->source + ": pre_tokenizer Split without a Regex or String pattern");
    }
    const std::string behavior = j.value("behavior", "Isolated");
    if (behavior != "Isolated" && behavior != "Removed") {
      return UnimplementedError(t->source + ": unsupported Split behavior \"" + behavior + "\"");
    }
    PreTokenizerStep step;
    step.kind = PreTokenizerStep::Kind::kSplit;
    LEDE_ASSIGN_OR_RETURN(step.regex, CompileRegex(pattern, t->source));
    step.remove_matches = behavior == "Removed";
    step.invert = j.value("invert", false);
    t->pre_tokenizer.push_back(std::move(step));
    return OkStatus();
  }
  if (type == "ByteLevel") {
    t->byte_level_add_prefix_space = j.value("add_prefix_space", false);
    if (j.value("use_regex", true)) {
      PreTokenizerStep step;
      step.kind = PreTokenizerStep::Kind::kByteLevelRegex;
      LEDE_ASSIGN_OR_RETURN(step.regex, CompileRegex(kGpt2Pattern, t->source));
      t->pre_tokenizer.push_back(std::move(step));
    }
    return OkStatus();
  }
  if (type == "Metaspace") {
    PreTokenizerStep step;
    step.kind = PreTokenizerStep::Kind::kMetaspace;
    step.replacement = j.value("replacement", std::string(kMetaspace));
    std::string scheme = j.value("prepend_scheme", "");
    if (scheme.empty()) scheme = j.value("add_prefix_space", true) ? "always" : "never";
    if (scheme == "always") {
      step.prepend = PreTokenizerStep::Prepend::kAlways;
    } else if (scheme == "first") {
      step.prepend = PreTokenizerStep::Prepend::kFirst;
    } else if (scheme == "never") {
      step.prepend = PreTokenizerStep::Prepend::kNever;
    } else {
      return UnimplementedError(t->source + ": unsupported Metaspace prepend_scheme \"" + scheme + "\"");
    }
    step.split = j.value("split", true);
    t->pre_tokenizer.push_back(std::move(step));
    return OkStatus();
  }
  return Unsupported(t->source, "pre_tokenizer", type.empty() ? j.dump() : type);
}

// Decoders: only checked, since decoding follows from the model's shape.
Status ParseDecoder(const Json& j, HfTokenizer::Impl* t) {
  if (j.is_null()) return OkStatus();
  const std::string type = TypeOf(j);
  if (type == "Sequence") {
    if (!j.contains("decoders") || !j["decoders"].is_array()) {
      return InvalidArgumentError(t->source + ": decoder Sequence without \"decoders\"");
    }
    for (const Json& d : j["decoders"]) LEDE_RETURN_IF_ERROR(ParseDecoder(d, t));
    return OkStatus();
  }
  if (type == "Strip") {
    if (j.value("start", 0) > 1 || j.value("stop", 0) != 0) {
      return UnimplementedError(t->source + ": decoder Strip other than start=1, stop=0 is not supported");
    }
    t->strip_space_after_special = j.value("start", 0) == 1;
    return OkStatus();
  }
  if (type == "Metaspace") {
    const std::string scheme = j.value("prepend_scheme", j.value("add_prefix_space", true) ? "always" : "never");
    t->strip_space_after_special = scheme != "never";
    return OkStatus();
  }
  if (type == "ByteLevel" || type == "Replace" || type == "ByteFallback" || type == "Fuse") return OkStatus();
  return Unsupported(t->source, "decoder", type.empty() ? j.dump() : type);
}

// TemplateProcessing "single": [SpecialToken?, Sequence A, SpecialToken?].
Status ParsePostProcessor(const Json& j, HfTokenizer::Impl* t, std::optional<std::string>* bos_name,
                          std::optional<std::string>* eos_name) {
  if (j.is_null()) return OkStatus();
  const std::string type = TypeOf(j);
  if (type == "Sequence") {
    if (!j.contains("processors") || !j["processors"].is_array()) {
      return InvalidArgumentError(t->source + ": post_processor Sequence without \"processors\"");
    }
    for (const Json& p : j["processors"]) LEDE_RETURN_IF_ERROR(ParsePostProcessor(p, t, bos_name, eos_name));
    return OkStatus();
  }
  if (type == "ByteLevel") return OkStatus();
  if (type == "TemplateProcessing") {
    const Json& single = j.value("single", Json::array());
    bool seen_sequence = false;
    for (const Json& item : single) {
      if (item.contains("Sequence")) {
        seen_sequence = true;
      } else if (item.contains("SpecialToken")) {
        const std::string id = item["SpecialToken"].value("id", "");
        if (!seen_sequence) {
          if (t->default_add_bos) {
            return UnimplementedError(t->source + ": post_processor with more than one token before $A");
          }
          *bos_name = id;
          t->default_add_bos = true;
        } else {
          if (t->default_add_eos) {
            return UnimplementedError(t->source + ": post_processor with more than one token after $A");
          }
          *eos_name = id;
          t->default_add_eos = true;
        }
      }
    }
    return OkStatus();
  }
  return Unsupported(t->source, "post_processor", type.empty() ? j.dump() : type);
}

// --- FromJson, field by field (each reads one part of tokenizer.json) ------

using ByteInverse = std::unordered_map<uint32_t, uint8_t>;     // GPT-2 code point -> byte
using ModelStrings = std::vector<std::pair<int32_t, std::string>>;  // id -> vocab key as in the file

ByteInverse InverseByteMap() {
  const std::vector<uint32_t> byte_map = ByteToCodePoint();
  ByteInverse inverse;
  for (uint32_t b = 0; b < 256; ++b) inverse[byte_map[b]] = static_cast<uint8_t>(b);
  return inverse;
}

// "model": a BPE model without dropout, subword prefix or word suffix.
Status ParseBpeOptions(const Json& model, HfTokenizer::Impl* t) {
  const std::string& source = t->source;
  if (!model.is_object()) return InvalidArgumentError(source + ": field \"model\" is missing");
  const std::string model_type = model.contains("type") ? TypeOf(model) : "BPE";
  if (model_type != "BPE") return Unsupported(source, "model", model_type);
  if (!model.value("dropout", Json()).is_null()) {
    return UnimplementedError(source + ": BPE dropout is not supported");
  }
  for (const char* field : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const Json& v = model.value(field, Json());
    if (!v.is_null() && !(v.is_string() && v.get<std::string>().empty())) {
      return UnimplementedError(source + ": BPE " + field + " is not supported");
    }
  }
  t->ignore_merges = model.value("ignore_merges", false);
  t->byte_fallback = model.value("byte_fallback", false);
  t->fuse_unk = model.value("fuse_unk", false);
  return OkStatus();
}

// "model.vocab": token string -> id (byte strings for byte-level models).
Status ParseVocab(const Json& model, const ByteInverse& inverse, HfTokenizer::Impl* t, ModelStrings* model_strings,
                  int32_t* max_id) {
  const Json& vocab = Member(model, "vocab");
  if (!vocab.is_object() || vocab.empty()) {
    return InvalidArgumentError(t->source + ": field \"model.vocab\" is missing or empty");
  }
  model_strings->reserve(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() >= kMaxHfVocabSize) {
      return InvalidArgumentError(t->source + ": vocab entry \"" + it.key() + "\" has no valid id (ids are in [0, " +
                                  std::to_string(kMaxHfVocabSize) + "))");
    }
    const auto id = static_cast<int32_t>(it.value().get<int64_t>());
    std::string key = t->byte_level ? ByteLevelToBytes(it.key(), inverse) : it.key();
    t->vocab.emplace(std::move(key), id);
    model_strings->emplace_back(id, it.key());
    *max_id = std::max(*max_id, id);
  }
  return OkStatus();
}

// "added_tokens": matched before the pre-tokenizer, longest first.
Status ParseAddedTokens(const Json& root, HfTokenizer::Impl* t, int32_t* max_id) {
  const std::string& source = t->source;
  const Json& added = Member(root, "added_tokens");
  if (!added.is_null() && !added.is_array()) {
    return InvalidArgumentError(source + ": field \"added_tokens\" must be a list");
  }
  for (const Json& a : added.is_array() ? added : Json::array()) {
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
        !a["content"].is_string()) {
      return InvalidArgumentError(source + ": an added_tokens entry lacks \"id\" or \"content\"");
    }
    AddedToken tok;
    const int64_t id = a["id"].get<int64_t>();
    if (id < 0 || id >= kMaxHfVocabSize) {
      return InvalidArgumentError(source + ": added_tokens id " + std::to_string(id) + " outside [0, " +
                                  std::to_string(kMaxHfVocabSize) + ")");
    }
    tok.id = static_cast<int32_t>(id);
    tok.content = a["content"].get<std::string>();
    tok.lstrip = a.value("lstrip", false);
    tok.rstrip = a.value("rstrip", false);
    tok.special = a.value("special", false);
    if (tok.content.empty()) return InvalidArgumentError(source + ": added token " + std::to_string(tok.id) + " is empty");
    *max_id = std::max(*max_id, tok.id);
    t->added.push_back(std::move(tok));
  }
  std::stable_sort(t->added.begin(), t->added.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
  return OkStatus();
}

// Added tokens by first byte, and the id of each byte (byte-level or byte fallback).
void BuildLookupTables(const ModelStrings& model_strings, HfTokenizer::Impl* t) {
  t->added_by_first_byte.assign(256, {});
  for (size_t k = 0; k < t->added.size(); ++k) {
    t->added_by_first_byte[static_cast<unsigned char>(t->added[k].content[0])].push_back(k);
  }
  t->byte_ids.assign(256, -1);
  if (t->byte_level) {
    for (uint32_t b = 0; b < 256; ++b) {
      if (auto id = t->Lookup(std::string(1, static_cast<char>(b)))) t->byte_ids[b] = *id;
    }
  } else {
    for (const auto& [id, s] : model_strings) {
      if (auto v = ByteFallbackValue(s)) t->byte_ids[*v] = id;
    }
  }
}

// "model.unk_token": must name a vocab entry when present.
Status ParseUnkToken(const Json& model, HfTokenizer::Impl* t) {
  const Json& unk = Member(model, "unk_token");
  if (!unk.is_string()) return OkStatus();
  const Json& vocab = Member(model, "vocab");
  const std::string u = unk.get<std::string>();
  auto it = vocab.find(u);
  if (it == vocab.end()) return InvalidArgumentError(t->source + ": unk_token \"" + u + "\" is not in the vocab");
  t->unk_id = static_cast<int32_t>(it.value().get<int64_t>());
  return OkStatus();
}

// "model.merges": "A B" strings or [A, B] pairs, rank = position in the list.
Status ParseMerges(const Json& model, HfTokenizer::Impl* t) {
  const std::string& source = t->source;
  const Json& vocab = Member(model, "vocab");
  const Json& merges = Member(model, "merges");
  if (!merges.is_array()) return InvalidArgumentError(source + ": field \"model.merges\" is missing");
  int32_t rank = 0;
  t->merges.reserve(merges.size());
  for (const Json& m : merges) {
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ', 1);
      if (sp == std::string::npos) return InvalidArgumentError(source + ": merge \"" + s + "\" is not \"A B\"");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      return InvalidArgumentError(source + ": merge " + std::to_string(rank) + " is neither \"A B\" nor [A, B]");
    }
    const std::string merged_key = a + b;
    auto ia = vocab.find(a), ib = vocab.find(b), im = vocab.find(merged_key);
    if (ia == vocab.end() || ib == vocab.end() || im == vocab.end()) {
      return InvalidArgumentError(source + ": merge " + std::to_string(rank) + " (\"" + a + "\", \"" + b +
                                  "\") names a token not in the vocab");
    }
    const uint64_t key = (static_cast<uint64_t>(ia.value().get<uint32_t>()) << 32) | ib.value().get<uint32_t>();
    t->merges.emplace(key, std::make_pair(rank, static_cast<int32_t>(im.value().get<int64_t>())));
    ++rank;
  }
  return OkStatus();
}

// The bytes each id decodes to; special added tokens decode to nothing when asked.
void BuildDecodingTables(const ModelStrings& model_strings, const ByteInverse& inverse, HfTokenizer::Impl* t) {
  t->token_bytes.assign(t->vocab_size, std::string());
  t->contributes_nothing.assign(t->vocab_size, false);
  for (const auto& [id, s] : model_strings) {
    if (t->byte_level) {
      t->token_bytes[id] = ByteLevelToBytes(s, inverse);
    } else if (auto v = ByteFallbackValue(s); v && t->byte_fallback) {
      t->token_bytes[id] = std::string(1, static_cast<char>(*v));
    } else {
      std::string bytes = s;
      ReplaceAll(&bytes, kMetaspace, " ");
      t->token_bytes[id] = std::move(bytes);
    }
  }
  for (const AddedToken& a : t->added) {
    t->token_bytes[a.id] = a.content;
    t->contributes_nothing[a.id] = a.special;
  }
}

// BOS/EOS: tokenizer_config.json names them, else the post-processor's template.
Status ResolveSpecialTokens(const Json& vocab, const HfTokenizerConfig& config,
                            const std::optional<std::string>& post_bos, const std::optional<std::string>& post_eos,
                            HfTokenizer::Impl* t) {
  auto find_added = [&](const std::string& name) -> std::optional<int32_t> {
    for (const AddedToken& a : t->added) {
      if (a.content == name) return a.id;
    }
    auto it = vocab.find(name);
    if (it != vocab.end()) return static_cast<int32_t>(it.value().get<int64_t>());
    return std::nullopt;
  };
  const std::optional<std::string> bos_name = config.bos_token ? config.bos_token : post_bos;
  const std::optional<std::string> eos_name = config.eos_token ? config.eos_token : post_eos;
  if (bos_name) {
    auto id = find_added(*bos_name);
    if (!id) return InvalidArgumentError(t->source + ": BOS token \"" + *bos_name + "\" is not in the vocabulary");
    t->bos = *id;
  }
  if (eos_name) {
    auto id = find_added(*eos_name);
    if (!id) return InvalidArgumentError(t->source + ": EOS token \"" + *eos_name + "\" is not in the vocabulary");
    t->eos = *id;
  }
  if (config.add_bos_token) t->default_add_bos = *config.add_bos_token && t->bos >= 0;
  if (config.add_eos_token) t->default_add_eos = *config.add_eos_token && t->eos >= 0;
  return OkStatus();
}

}  // namespace

Status HfTokenizer::Impl::ApplyPreTokenizer(const std::string& segment, bool first_segment,
                                            std::vector<std::string>* pieces) const {
  pieces->assign(1, segment);
  for (const PreTokenizerStep& step : pre_tokenizer) {
    std::vector<std::string> next;
    if (step.kind == PreTokenizerStep::Kind::kMetaspace) {
      for (std::string p : *pieces) {
        ReplaceAll(&p, " ", step.replacement);
        const bool prepend = step.prepend == PreTokenizerStep::Prepend::kAlways ||
                             (step.prepend == PreTokenizerStep::Prepend::kFirst && first_segment);
        if (prepend && p.compare(0, step.replacement.size(), step.replacement) != 0) p = step.replacement + p;
        if (!step.split) {
          next.push_back(std::move(p));
          continue;
        }
        // Each word starts at a replacement character (MergedWithNext).
        size_t start = 0;
        size_t pos = p.find(step.replacement, 1);
        while (pos != std::string::npos) {
          next.push_back(p.substr(start, pos - start));
          start = pos;
          pos = p.find(step.replacement, pos + step.replacement.size());
        }
        next.push_back(p.substr(start));
      }
    } else {
      LEDE_RETURN_IF_ERROR(RegexSplit(*step.regex, step.remove_matches, step.invert, *pieces, &next, source));
    }
    *pieces = std::move(next);
  }
  if (byte_level_add_prefix_space) {
    for (std::string& p : *pieces) {
      if (p.empty() || p[0] != ' ') p.insert(p.begin(), ' ');
    }
  }
  return OkStatus();
}

void HfTokenizer::Impl::Bpe(std::string_view piece, std::vector<int32_t>* ids) const {
  if (piece.empty()) return;
  if (ignore_merges) {
    if (auto id = Lookup(piece)) {
      ids->push_back(*id);
      return;
    }
  }
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  auto push = [&](int32_t id) {
    const int32_t n = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, n - 1, n + 1, true});
  };
  if (byte_level) {
    for (const char c : piece) {
      const int32_t id = byte_ids[static_cast<unsigned char>(c)];
      if (id >= 0) {
        push(id);
      } else if (unk_id >= 0) {
        push(unk_id);
      }
    }
  } else {
    size_t i = 0;
    bool last_unk = false;
    while (i < piece.size()) {
      const size_t n = std::min(Utf8Length(static_cast<unsigned char>(piece[i])), piece.size() - i);
      const std::string_view ch = piece.substr(i, n);
      i += n;
      if (auto id = Lookup(ch)) {
        push(*id);
        last_unk = false;
        continue;
      }
      bool all_bytes = byte_fallback;
      if (byte_fallback) {
        for (const char c : ch) all_bytes = all_bytes && byte_ids[static_cast<unsigned char>(c)] >= 0;
      }
      if (all_bytes) {
        for (const char c : ch) push(byte_ids[static_cast<unsigned char>(c)]);
        last_unk = false;
      } else if (unk_id >= 0) {
        if (!(fuse_unk && last_unk)) push(unk_id);
        last_unk = true;
      }
    }
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;

  struct Candidate {
    int32_t rank;
    int32_t pos;  // left symbol
    int32_t left_id, right_id, merged_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto consider = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = symbols[left].next;
    if (right < 0) return;
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(symbols[left].id)) << 32) |
                         static_cast<uint32_t>(symbols[right].id);
    auto it = merges.find(key);
    if (it == merges.end()) return;
    heap.push({it->second.first, left, symbols[left].id, symbols[right].id, it->second.second});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) consider(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& left = symbols[c.pos];
    if (!left.alive || left.id != c.left_id || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    if (!right.alive || right.id != c.right_id) continue;
    left.id = c.merged_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = c.pos;
    consider(left.prev);
    consider(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) ids->push_back(symbols[i].id);
}

Status HfTokenizer::Impl::EncodeSegment(std::string_view segment, bool first_segment,
                                        std::vector<int32_t>* ids) const {
  if (segment.empty()) return OkStatus();
  std::string normalized(segment);
  if (!normalizer_prepend.empty()) normalized = normalizer_prepend + normalized;
  for (const auto& [from, to] : normalizer_replace) ReplaceAll(&normalized, from, to);
  std::vector<std::string> pieces;
  LEDE_RETURN_IF_ERROR(ApplyPreTokenizer(normalized, first_segment, &pieces));
  for (const std::string& p : pieces) Bpe(p, ids);
  return OkStatus();
}

HfTokenizer::HfTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HfTokenizer::~HfTokenizer() = default;

StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::Load(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return NotFoundError("tokenizer file '" + path + "' not found");
  LEDE_ASSIGN_OR_RETURN(std::string text, file::ReadFile(path));
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  LEDE_ASSIGN_OR_RETURN(HfTokenizerConfig config, ReadHfTokenizerConfig(dir.string()));
  return FromJson(text, path, config);
}

StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::FromJson(const std::string& json_text, const std::string& source,
                                                              const HfTokenizerConfig& config) {
  Json root;
  try {
    root = Json::parse(json_text);
  } catch (const Json::exception& e) {
    return InvalidArgumentError(source + ": bad JSON: " + e.what());
  }
  if (!root.is_object()) return InvalidArgumentError(source + ": not a JSON object");
  auto t = std::make_unique<Impl>();
  t->source = source;
  try {
    const Json& model = Member(root, "model");
    LEDE_RETURN_IF_ERROR(ParseBpeOptions(model, t.get()));
    LEDE_RETURN_IF_ERROR(ParseNormalizer(root.value("normalizer", Json()), t.get()));
    LEDE_RETURN_IF_ERROR(ParsePreTokenizer(root.value("pre_tokenizer", Json()), t.get()));
    LEDE_RETURN_IF_ERROR(ParseDecoder(root.value("decoder", Json()), t.get()));
    std::optional<std::string> post_bos, post_eos;
    LEDE_RETURN_IF_ERROR(ParsePostProcessor(root.value("post_processor", Json()), t.get(), &post_bos, &post_eos));

    // Byte-level when the pre-tokenizer (or decoder) maps bytes.
    const std::string dump_pre = root.value("pre_tokenizer", Json()).dump();
    const std::string dump_dec = root.value("decoder", Json()).dump();
    t->byte_level = dump_pre.find("\"ByteLevel\"") != std::string::npos ||
                    dump_dec.find("\"ByteLevel\"") != std::string::npos;

    const ByteInverse inverse = InverseByteMap();
    int32_t max_id = -1;
    ModelStrings model_strings;
    LEDE_RETURN_IF_ERROR(ParseVocab(model, inverse, t.get(), &model_strings, &max_id));
    LEDE_RETURN_IF_ERROR(ParseAddedTokens(root, t.get(), &max_id));
    t->vocab_size = max_id + 1;
    BuildLookupTables(model_strings, t.get());
    LEDE_RETURN_IF_ERROR(ParseUnkToken(model, t.get()));
    LEDE_RETURN_IF_ERROR(ParseMerges(model, t.get()));
    BuildDecodingTables(model_strings, inverse, t.get());
    LEDE_RETURN_IF_ERROR(ResolveSpecialTokens(Member(model, "vocab"), config, post_bos, post_eos, t.get()));
  } catch (const Json::exception& e) {
    return InvalidArgumentError(source + ": malformed tokenizer.json: " + e.what());
  }
  return std::unique_ptr<HfTokenizer>(new HfTokenizer(std::move(t)));
}

int32_t HfTokenizer::vocab_size() const { return impl_->vocab_size; }
int32_t HfTokenizer::bos_id() const { return impl_->bos; }
int32_t HfTokenizer::eos_id() const { return impl_->eos; }
bool HfTokenizer::DefaultAddBos() const { return impl_->default_add_bos; }
bool HfTokenizer::DefaultAddEos() const { return impl_->default_add_eos; }

std::optional<int32_t> HfTokenizer::TokenId(std::string_view content) const {
  for (const AddedToken& a : impl_->added) {
    if (a.content == content) return a.id;
  }
  if (impl_->byte_level) {
    return impl_->Lookup(ByteLevelToBytes(content, InverseByteMap()));
  }
  return impl_->Lookup(content);
}

StatusOr<std::vector<int32_t>> HfTokenizer::Encode(std::string_view text, bool add_bos, bool add_eos) const {
  if (!IsValidUtf8(text)) return InvalidArgumentError("text is not valid UTF-8");
  const Impl& t = *impl_;
  std::vector<int32_t> ids;
  if (add_bos && t.bos >= 0) ids.push_back(t.bos);

  // Added tokens first: at each position the longest token that starts
  // there; lstrip/rstrip take the whitespace beside a token with it.
  size_t seg_start = 0;
  size_t pos = 0;
  bool first_segment = true;
  auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (pos < text.size()) {
    const AddedToken* hit = nullptr;
    for (const size_t k : t.added_by_first_byte[static_cast<unsigned char>(text[pos])]) {
      const AddedToken& a = t.added[k];
      if (text.compare(pos, a.content.size(), a.content) == 0) {
        hit = &a;
        break;
      }
    }
    if (hit == nullptr) {
      ++pos;
      continue;
    }
    size_t seg_end = pos;
    if (hit->lstrip) {
      while (seg_end > seg_start && is_space(text[seg_end - 1])) --seg_end;
    }
    LEDE_RETURN_IF_ERROR(t.EncodeSegment(text.substr(seg_start, seg_end - seg_start), first_segment, &ids));
    if (seg_end > seg_start) first_segment = false;
    ids.push_back(hit->id);
    first_segment = false;
    pos += hit->content.size();
    if (hit->rstrip) {
      while (pos < text.size() && is_space(text[pos])) ++pos;
    }
    seg_start = pos;
  }
  LEDE_RETURN_IF_ERROR(t.EncodeSegment(text.substr(seg_start), first_segment, &ids));
  if (add_eos && t.eos >= 0) ids.push_back(t.eos);
  return ids;
}

std::string HfTokenizer::TokenBytes(int32_t prev_id, int32_t id) const {
  const Impl& t = *impl_;
  if (id < 0 || id >= t.vocab_size || t.contributes_nothing[id]) return std::string();
  const std::string& bytes = t.token_bytes[id];
  const bool at_start = prev_id < 0 || prev_id == t.bos;
  if (t.strip_space_after_special && at_start && !bytes.empty() && bytes[0] == ' ') return bytes.substr(1);
  return bytes;
}

std::string HfTokenizer::Decode(const std::vector<int32_t>& ids) const {
  const Impl& t = *impl_;
  std::string bytes;
  bool first = true;
  for (const int32_t id : ids) {
    if (id < 0 || id >= t.vocab_size || t.contributes_nothing[id]) continue;
    const std::string& b = t.token_bytes[id];
    if (first && t.strip_space_after_special && !b.empty() && b[0] == ' ') {
      bytes.append(b, 1, std::string::npos);
    } else {
      bytes += b;
    }
    if (!b.empty()) first = false;
  }
  return SanitizeUtf8(bytes);
}

}  // namespace lede::tokenizer
