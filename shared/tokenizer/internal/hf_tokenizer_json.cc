// File: shared/tokenizer/internal/hf_tokenizer_json.cc
//
// Builds HfTokenizer's state from tokenizer.json, one part of the file per
// function (internal/hf_tokenizer_impl.h); hf_tokenizer.cc encodes with it.

#include <algorithm>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <utility>

#include "shared/status/status_macros.h"
#include "shared/tokenizer/internal/hf_tokenizer_impl.h"

namespace lede::tokenizer::internal {
namespace {

using Json = nlohmann::json;

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

using ModelStrings = std::vector<std::pair<int32_t, std::string>>;  // id -> vocab key as in the file

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

StatusOr<std::unique_ptr<HfTokenizer::Impl>> ParseTokenizerJson(const std::string& json_text,
                                                                 const std::string& source,
                                                                 const HfTokenizerConfig& config) {
  Json root;
  try {
    root = Json::parse(json_text);
  } catch (const Json::exception& e) {
    return InvalidArgumentError(source + ": bad JSON: " + e.what());
  }
  if (!root.is_object()) return InvalidArgumentError(source + ": not a JSON object");
  auto t = std::make_unique<HfTokenizer::Impl>();
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
  return t;
}

}  // namespace lede::tokenizer::internal
