// File: shared/tokenizer/gguf_tokenizer.cc
//
// GGUF tokenizer metadata <-> tokenizer.json (contracts in gguf_tokenizer.h).
#include "shared/tokenizer/gguf_tokenizer.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "shared/file/file.h"
#include "shared/status/status_macros.h"
#include "shared/tokenizer/tokenizer.h"

namespace lede::tokenizer {
namespace {

using Json = nlohmann::json;  // key order is irrelevant to HfTokenizer; lookups are O(log n)

constexpr int32_t kTypeNormal = 1, kTypeUnknown = 2, kTypeControl = 3, kTypeUserDefined = 4, kTypeByte = 6;

// Llama-3's pre-tokenizer regex (tokenizer.json's Split pattern).
constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr char kMetaspace[] = "\xE2\x96\x81";  // U+2581

// Byte offsets of the UTF-8 character starts of `s` (valid UTF-8).
std::vector<size_t> CharStarts(const std::string& s) {
  std::vector<size_t> starts;
  for (size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) starts.push_back(i);
  }
  return starts;
}

// SentencePiece pieces are short (16 characters by default); longer ones
// are not merge results here, which keeps a hostile vocabulary linear.
constexpr size_t kMaxMergedPieceBytes = 256;

// Merges implied by SentencePiece BPE scores: (a, b) for every split of a
// normal piece into two vocabulary pieces, highest score of the merged piece
// first (then lower merged id, then lower ids of a and b).
Json MergesFromScores(const std::vector<std::string>& tokens, const std::vector<float>& scores,
                      const std::vector<int32_t>& types) {
  std::unordered_map<std::string, int32_t> id_of;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t type = types.empty() ? kTypeNormal : types[i];
    if (type == kTypeNormal || type == kTypeUserDefined || type == kTypeByte) id_of.emplace(tokens[i], static_cast<int32_t>(i));
  }
  std::vector<std::tuple<float, int32_t, int32_t, int32_t>> cand;  // (-score, id, a, b)
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (!types.empty() && types[i] != kTypeNormal) continue;
    const std::string& p = tokens[i];
    if (p.size() > kMaxMergedPieceBytes) continue;
    const std::vector<size_t> starts = CharStarts(p);
    for (size_t k = 1; k < starts.size(); ++k) {
      auto a = id_of.find(p.substr(0, starts[k]));
      if (a == id_of.end()) continue;
      auto b = id_of.find(p.substr(starts[k]));
      if (b == id_of.end()) continue;
      cand.emplace_back(-scores[i], static_cast<int32_t>(i), a->second, b->second);
    }
  }
  std::sort(cand.begin(), cand.end());
  Json merges = Json::array();
  for (const auto& [neg, id, a, b] : cand) merges.push_back(Json::array({tokens[a], tokens[b]}));
  return merges;
}

// Fills the model, normalizer, pre-tokenizer and decoder of a llama
// (SentencePiece-style) vocabulary: merges come from the token scores.
Status BuildLlamaModel(const checkpoint::GgufFile& f, const std::vector<std::string>& tokens,
                       const std::vector<int32_t>& types, int64_t unk, Json vocab, Json* model_json, Json* root) {
  const std::string& src = f.source();
  const size_t n = tokens.size();
  std::vector<float> scores(n, 0.0f);
  if (f.Find("tokenizer.ggml.scores") != nullptr) {
    LEDE_ASSIGN_OR_RETURN(std::vector<double> s, f.GetNumberArray("tokenizer.ggml.scores"));
    if (s.size() != n) {
      return InvalidArgumentError(src + ": metadata key tokenizer.ggml.scores has " + std::to_string(s.size()) +
                                  " entries for " + std::to_string(n) + " tokens");
    }
    for (size_t i = 0; i < n; ++i) scores[i] = static_cast<float>(s[i]);
  } else {
    return InvalidArgumentError(src + ": missing metadata key tokenizer.ggml.scores (needed by the llama vocab)");
  }
  bool add_space_prefix = true;
  if (f.Find("tokenizer.ggml.add_space_prefix") != nullptr) {
    LEDE_ASSIGN_OR_RETURN(add_space_prefix, f.GetBool("tokenizer.ggml.add_space_prefix"));
  }
  (*model_json)["unk_token"] = unk >= 0 ? Json(tokens[static_cast<size_t>(unk)]) : Json(nullptr);
  (*model_json)["fuse_unk"] = true;
  (*model_json)["byte_fallback"] = true;
  (*model_json)["vocab"] = std::move(vocab);
  (*model_json)["merges"] = MergesFromScores(tokens, scores, types);
  Json normalizers = Json::array();
  if (add_space_prefix) normalizers.push_back({{"type", "Prepend"}, {"prepend", kMetaspace}});
  normalizers.push_back({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kMetaspace}});
  (*root)["normalizer"] = {{"type", "Sequence"}, {"normalizers", normalizers}};
  (*root)["pre_tokenizer"] = nullptr;
  Json decoders = Json::array({Json{{"type", "Replace"}, {"pattern", {{"String", kMetaspace}}}, {"content", " "}},
                               Json{{"type", "ByteFallback"}}, Json{{"type", "Fuse"}}});
  if (add_space_prefix) decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  (*root)["decoder"] = {{"type", "Sequence"}, {"decoders", decoders}};
  return OkStatus();
}

// Fills the model, normalizer, pre-tokenizer and decoder of a gpt2
// (byte-level BPE) vocabulary from tokenizer.ggml.merges and .pre.
Status BuildGpt2Model(const checkpoint::GgufFile& f, Json vocab, Json* model_json, Json* root) {
  const std::string& src = f.source();
  std::string pre = "default";
  if (f.Find("tokenizer.ggml.pre") != nullptr) {
    LEDE_ASSIGN_OR_RETURN(pre, f.GetString("tokenizer.ggml.pre"));
  }
  LEDE_ASSIGN_OR_RETURN(std::vector<std::string> merges, f.GetStringArray("tokenizer.ggml.merges"));
  Json merges_json = Json::array();
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string& m = merges[i];
    const size_t space = m.find(' ', 1);
    if (space == std::string::npos || space + 1 >= m.size() || m.find(' ', space + 1) != std::string::npos) {
      return InvalidArgumentError(src + ": metadata key tokenizer.ggml.merges[" + std::to_string(i) +
                                  "] is not two tokens separated by one space");
    }
    merges_json.push_back(m);
  }
  (*model_json)["unk_token"] = nullptr;
  (*model_json)["fuse_unk"] = false;
  (*model_json)["byte_fallback"] = false;
  if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3") {
    (*model_json)["ignore_merges"] = true;
    (*root)["pre_tokenizer"] = {
        {"type", "Sequence"},
        {"pretokenizers",
         Json::array({Json{{"type", "Split"},
                           {"pattern", {{"Regex", std::string(kLlama3Pattern)}}},
                           {"behavior", "Isolated"},
                           {"invert", false}},
                      Json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
  } else if (pre == "default" || pre == "gpt2") {
    (*model_json)["ignore_merges"] = false;
    (*root)["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  } else {
    return UnimplementedError(src + ": metadata key tokenizer.ggml.pre is \"" + pre +
                              "\" (supported: llama-bpe, default)");
  }
  (*model_json)["vocab"] = std::move(vocab);
  (*model_json)["merges"] = std::move(merges_json);
  (*root)["normalizer"] = nullptr;
  (*root)["decoder"] = {{"type", "ByteLevel"}};
  return OkStatus();
}

}  // namespace

StatusOr<GgufTokenizerJson> GgufTokenizerToHfJson(const checkpoint::GgufFile& f) {
  const std::string& src = f.source();
  LEDE_ASSIGN_OR_RETURN(std::string model, f.GetString("tokenizer.ggml.model"));
  LEDE_ASSIGN_OR_RETURN(std::vector<std::string> tokens, f.GetStringArray("tokenizer.ggml.tokens"));
  if (tokens.empty() || tokens.size() >= static_cast<size_t>(kMaxHfVocabSize)) {
    return InvalidArgumentError(src + ": metadata key tokenizer.ggml.tokens has " + std::to_string(tokens.size()) +
                                " tokens");
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (!IsValidUtf8(tokens[i]) || tokens[i].empty()) {
      return InvalidArgumentError(src + ": metadata key tokenizer.ggml.tokens[" + std::to_string(i) +
                                  "] is empty or not valid UTF-8");
    }
  }
  const size_t n = tokens.size();
  std::vector<int32_t> types(n, kTypeNormal);
  if (f.Find("tokenizer.ggml.token_type") != nullptr) {
    LEDE_ASSIGN_OR_RETURN(std::vector<double> t, f.GetNumberArray("tokenizer.ggml.token_type"));
    if (t.size() != n) {
      return InvalidArgumentError(src + ": metadata key tokenizer.ggml.token_type has " + std::to_string(t.size()) +
                                  " entries for " + std::to_string(n) + " tokens");
    }
    for (size_t i = 0; i < n; ++i) types[i] = static_cast<int32_t>(t[i]);
  }
  auto special_id = [&](const std::string& key) -> StatusOr<int64_t> {
    if (f.Find(key) == nullptr) return int64_t{-1};
    LEDE_ASSIGN_OR_RETURN(int64_t id, f.GetInt(key));
    if (id < 0 || static_cast<size_t>(id) >= n) {
      return InvalidArgumentError(src + ": metadata key " + key + " is " + std::to_string(id) +
                                  ", outside the vocabulary [0, " + std::to_string(n) + ")");
    }
    return id;
  };
  LEDE_ASSIGN_OR_RETURN(int64_t bos, special_id("tokenizer.ggml.bos_token_id"));
  LEDE_ASSIGN_OR_RETURN(int64_t eos, special_id("tokenizer.ggml.eos_token_id"));
  LEDE_ASSIGN_OR_RETURN(int64_t unk, special_id("tokenizer.ggml.unknown_token_id"));

  GgufTokenizerJson out;
  out.config.source = src;
  Json root = Json::object();
  root["version"] = "1.0";
  Json added = Json::array();
  Json vocab = Json::object();
  Json model_json = Json::object();
  model_json["type"] = "BPE";
  model_json["dropout"] = nullptr;
  for (size_t i = 0; i < n; ++i) {
    if (!vocab.contains(tokens[i])) vocab[tokens[i]] = static_cast<int64_t>(i);
    if (types[i] == kTypeControl || types[i] == kTypeUserDefined || types[i] == kTypeUnknown ||
        static_cast<int64_t>(i) == bos || static_cast<int64_t>(i) == eos) {
      added.push_back({{"id", static_cast<int64_t>(i)}, {"content", tokens[i]}, {"single_word", false},
                       {"lstrip", false}, {"rstrip", false}, {"normalized", false},
                       {"special", types[i] != kTypeUserDefined}});
    }
  }
  if (model == "llama") {
    LEDE_RETURN_IF_ERROR(BuildLlamaModel(f, tokens, types, unk, std::move(vocab), &model_json, &root));
    out.config.add_bos_token = true;
  } else if (model == "gpt2") {
    LEDE_RETURN_IF_ERROR(BuildGpt2Model(f, std::move(vocab), &model_json, &root));
    out.config.add_bos_token = false;
  } else {
    return UnimplementedError(src + ": metadata key tokenizer.ggml.model is \"" + model +
                              "\" (supported: llama, gpt2)");
  }
  if (f.Find("tokenizer.ggml.add_bos_token") != nullptr) {
    LEDE_ASSIGN_OR_RETURN(bool add_bos, f.GetBool("tokenizer.ggml.add_bos_token"));
    out.config.add_bos_token = add_bos;
  }
  if (f.Find("tokenizer.ggml.add_eos_token") != nullptr) {
    LEDE_ASSIGN_OR_RETURN(bool add_eos, f.GetBool("tokenizer.ggml.add_eos_token"));
    out.config.add_eos_token = add_eos;
  }
  if (bos >= 0) out.config.bos_token = tokens[static_cast<size_t>(bos)];
  if (eos >= 0) out.config.eos_token = tokens[static_cast<size_t>(eos)];
  if (f.Find("tokenizer.chat_template") != nullptr) {
    LEDE_ASSIGN_OR_RETURN(out.config.chat_template, f.GetString("tokenizer.chat_template"));
  }
  root["added_tokens"] = std::move(added);
  root["post_processor"] = nullptr;
  root["model"] = std::move(model_json);
  out.json = root.dump();
  return out;
}

StatusOr<std::unique_ptr<HfTokenizer>> LoadGgufTokenizer(const checkpoint::GgufFile& file) {
  LEDE_ASSIGN_OR_RETURN(GgufTokenizerJson j, GgufTokenizerToHfJson(file));
  return HfTokenizer::FromJson(j.json, file.source(), j.config);
}

StatusOr<std::unique_ptr<HfTokenizer>> LoadGgufTokenizer(const std::string& path) {
  LEDE_ASSIGN_OR_RETURN(std::shared_ptr<const checkpoint::GgufFile> file, checkpoint::GgufFile::Open(path));
  return LoadGgufTokenizer(*file);
}

StatusOr<GgufChatTemplate> ReadGgufChatTemplate(const std::string& path) {
  LEDE_ASSIGN_OR_RETURN(std::shared_ptr<const checkpoint::GgufFile> f, checkpoint::GgufFile::Open(path));
  if (f->Find("tokenizer.chat_template") == nullptr) {
    return NotFoundError(path + ": no chat template (metadata key tokenizer.chat_template)");
  }
  GgufChatTemplate t;
  LEDE_ASSIGN_OR_RETURN(t.text, f->GetString("tokenizer.chat_template"));
  LEDE_ASSIGN_OR_RETURN(GgufTokenizerJson j, GgufTokenizerToHfJson(*f));
  t.bos_token = j.config.bos_token.value_or("");
  t.eos_token = j.config.eos_token.value_or("");
  return t;
}

// --- Writing ----------------------------------------------------------------------

namespace {

// A minimal protobuf reader for SentencePiece's ModelProto: pieces (field 1:
// {1 piece, 2 score, 3 type}), trainer_spec (2: model_type = 3), and
// normalizer_spec (3: add_dummy_prefix = 3).
class ProtoReader {
 public:
  ProtoReader(const uint8_t* p, size_t n) : p_(p), end_(p + n) {}
  bool done() const { return p_ >= end_; }
  bool Varint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p_ >= end_) return false;
      const uint8_t b = *p_++;
      *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  }
  // Reads a field header and its payload: varint in *v, fixed32 in *f32, or
  // bytes in [*data, *data + *len). false at a malformed field.
  bool Next(uint32_t* field, uint32_t* wire, uint64_t* v, const uint8_t** data, size_t* len) {
    uint64_t key;
    if (!Varint(&key)) return false;
    *field = static_cast<uint32_t>(key >> 3);
    *wire = static_cast<uint32_t>(key & 7);
    switch (*wire) {
      case 0: return Varint(v);
      case 1: if (end_ - p_ < 8) return false; std::memcpy(v, p_, 8); p_ += 8; return true;
      case 5: { if (end_ - p_ < 4) return false; uint32_t x; std::memcpy(&x, p_, 4); *v = x; p_ += 4; return true; }
      case 2: {
        uint64_t n;
        if (!Varint(&n) || n > static_cast<uint64_t>(end_ - p_)) return false;
        *data = p_;
        *len = static_cast<size_t>(n);
        p_ += n;
        return true;
      }
      default: return false;
    }
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

StatusOr<GgufVocab> ReadSentencePieceModel(const std::string& path) {
  LEDE_ASSIGN_OR_RETURN(std::string bytes, file::ReadFile(path));
  GgufVocab v;
  v.model = "llama";
  ProtoReader r(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  uint64_t model_type = 1;  // UNIGRAM by default
  while (!r.done()) {
    uint32_t field, wire;
    uint64_t x = 0;
    const uint8_t* data = nullptr;
    size_t len = 0;
    if (!r.Next(&field, &wire, &x, &data, &len)) return InvalidArgumentError(path + ": malformed SentencePiece model");
    if (wire != 2) continue;
    ProtoReader sub(data, len);
    if (field == 1) {
      std::string piece;
      float score = 0.0f;
      int32_t type = kTypeNormal;
      while (!sub.done()) {
        uint32_t f2, w2;
        uint64_t y = 0;
        const uint8_t* d2 = nullptr;
        size_t l2 = 0;
        if (!sub.Next(&f2, &w2, &y, &d2, &l2)) return InvalidArgumentError(path + ": malformed SentencePiece piece");
        if (f2 == 1 && w2 == 2) piece.assign(reinterpret_cast<const char*>(d2), l2);
        if (f2 == 2 && w2 == 5) {
          const auto u = static_cast<uint32_t>(y);
          std::memcpy(&score, &u, 4);
        }
        if (f2 == 3 && w2 == 0) type = static_cast<int32_t>(y);
      }
      v.tokens.push_back(piece);
      v.scores.push_back(score);
      v.token_types.push_back(type);
    } else if (field == 2 || field == 3) {
      while (!sub.done()) {
        uint32_t f2, w2;
        uint64_t y = 0;
        const uint8_t* d2 = nullptr;
        size_t l2 = 0;
        if (!sub.Next(&f2, &w2, &y, &d2, &l2)) return InvalidArgumentError(path + ": malformed SentencePiece spec");
        if (field == 2 && f2 == 3 && w2 == 0) model_type = y;
        if (field == 3 && f2 == 3 && w2 == 0) v.add_space_prefix = y != 0;
      }
    }
  }
  if (model_type != 2) {
    return UnimplementedError(path + ": SentencePiece model type " + std::to_string(model_type) +
                              " (only BPE, type 2, maps to GGUF's llama vocabulary)");
  }
  if (v.tokens.empty()) return InvalidArgumentError(path + ": SentencePiece model without pieces");
  return v;
}

StatusOr<GgufVocab> ReadLlama2cVocab(const std::string& path) {
  LEDE_ASSIGN_OR_RETURN(std::string bytes, file::ReadFile(path));
  GgufVocab v;
  v.model = "llama";
  size_t pos = 4;
  if (bytes.size() < 4) return InvalidArgumentError(path + ": truncated llama2.c tokenizer");
  while (pos < bytes.size()) {
    if (bytes.size() - pos < 8) return InvalidArgumentError(path + ": truncated llama2.c tokenizer record");
    float score;
    int32_t len;
    std::memcpy(&score, bytes.data() + pos, 4);
    std::memcpy(&len, bytes.data() + pos + 4, 4);
    pos += 8;
    if (len < 0 || static_cast<size_t>(len) > bytes.size() - pos) {
      return InvalidArgumentError(path + ": truncated llama2.c tokenizer record");
    }
    std::string piece = bytes.substr(pos, static_cast<size_t>(len));
    pos += static_cast<size_t>(len);
    const size_t id = v.tokens.size();
    int32_t type = kTypeNormal;
    if (id == 0) type = kTypeUnknown;
    else if (id <= 2) type = kTypeControl;
    else if (piece.size() == 6 && piece.compare(0, 3, "<0x") == 0 && piece[5] == '>') type = kTypeByte;
    // llama2.c stores SentencePiece's "▁" as a space.
    std::string escaped;
    for (char ch : piece) escaped += ch == ' ' ? std::string(kMetaspace) : std::string(1, ch);
    if (!IsValidUtf8(escaped)) return InvalidArgumentError(path + ": token " + std::to_string(id) + " is not UTF-8");
    v.tokens.push_back(std::move(escaped));
    v.scores.push_back(score);
    v.token_types.push_back(type);
  }
  if (v.tokens.size() < 3) return InvalidArgumentError(path + ": fewer than 3 tokens");
  return v;
}

StatusOr<GgufVocab> ReadTokenizerJsonVocab(const std::string& path) {
  LEDE_ASSIGN_OR_RETURN(std::string text, file::ReadFile(path));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("model") || !j["model"].is_object() ||
      !j["model"].contains("vocab") || !j["model"]["vocab"].is_object()) {
    return InvalidArgumentError(path + ": not a tokenizer.json with a BPE model.vocab");
  }
  const nlohmann::json& model = j["model"];
  if (model.value("type", std::string("BPE")) != "BPE") {
    return UnimplementedError(path + ": only BPE tokenizer.json files map to GGUF");
  }
  GgufVocab v;
  std::map<int64_t, std::string> by_id;
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() >= kMaxHfVocabSize) {
      return InvalidArgumentError(path + ": vocab entry " + it.key() + " has no valid id");
    }
    by_id[it.value().get<int64_t>()] = it.key();
  }
  std::map<int64_t, bool> added_special;
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const auto& a : j["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
          !a["content"].is_string() || a["id"].get<int64_t>() < 0 || a["id"].get<int64_t>() >= kMaxHfVocabSize) {
        return InvalidArgumentError(path + ": malformed added_tokens entry");
      }
      by_id[a["id"].get<int64_t>()] = a["content"].get<std::string>();
      added_special[a["id"].get<int64_t>()] = a.value("special", false);
    }
  }
  const int64_t n = by_id.empty() ? 0 : by_id.rbegin()->first + 1;
  v.tokens.resize(static_cast<size_t>(n));
  v.token_types.assign(static_cast<size_t>(n), kTypeNormal);
  for (int64_t i = 0; i < n; ++i) {
    auto it = by_id.find(i);
    if (it == by_id.end()) {
      v.tokens[i] = "[PAD" + std::to_string(i) + "]";  // a hole in the ids: llama.cpp's converter does the same
      v.token_types[i] = 5;
      continue;
    }
    v.tokens[i] = it->second;
    auto a = added_special.find(i);
    if (a != added_special.end()) v.token_types[i] = a->second ? kTypeControl : kTypeUserDefined;
  }
  std::vector<std::string> merges;
  for (const auto& m : model.value("merges", nlohmann::json::array())) {
    if (m.is_string()) {
      merges.push_back(m.get<std::string>());
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
    } else {
      return InvalidArgumentError(path + ": malformed merge");
    }
  }
  const std::string pre_dump = j.value("pre_tokenizer", nlohmann::json()).dump();
  const bool byte_level = pre_dump.find("\"ByteLevel\"") != std::string::npos;
  if (byte_level) {
    v.model = "gpt2";
    v.merges = std::move(merges);
    v.add_bos = false;
    if (pre_dump.find(nlohmann::json(std::string(kLlama3Pattern)).dump()) != std::string::npos) {
      v.pre = "llama-bpe";
    } else if (j["pre_tokenizer"].value("type", "") == "ByteLevel" && j["pre_tokenizer"].value("use_regex", true)) {
      v.pre = "gpt2";
    } else {
      return UnimplementedError(path + ": byte-level pre-tokenizer other than Llama-3's or GPT-2's");
    }
    const std::string post = j.value("post_processor", nlohmann::json()).dump();
    v.add_bos = post.find("SpecialToken") != std::string::npos;
  } else {
    // SentencePiece-style BPE: each piece's score is minus the rank of the
    // first merge that builds it, so that merging by score is merging by rank.
    v.model = "llama";
    v.scores.assign(static_cast<size_t>(n), 0.0f);
    std::unordered_map<std::string, int64_t> id_of;
    for (int64_t i = 0; i < n; ++i) id_of.emplace(v.tokens[i], i);
    std::vector<bool> seen(static_cast<size_t>(n), false);
    for (size_t r = 0; r < merges.size(); ++r) {
      const size_t space = merges[r].find(' ');
      if (space == std::string::npos) continue;
      auto it = id_of.find(merges[r].substr(0, space) + merges[r].substr(space + 1));
      if (it == id_of.end() || seen[it->second]) continue;
      seen[it->second] = true;
      v.scores[it->second] = -static_cast<float>(r + 1);
    }
    for (int64_t i = 0; i < n; ++i) {
      const std::string& t = v.tokens[i];
      if (v.token_types[i] == kTypeNormal && t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') {
        v.token_types[i] = kTypeByte;
      }
      if (model.contains("unk_token") && model["unk_token"].is_string() && t == model["unk_token"].get<std::string>()) {
        v.token_types[i] = kTypeUnknown;
      }
      if (v.token_types[i] == kTypeNormal && !seen[i] && CharStarts(t).size() > 1) v.scores[i] = -1e9f;
    }
  }
  return v;
}

// A GGUF file's own tokenizer keys, as they are (re-export, e.g. f32 -> q8_0).
StatusOr<GgufVocab> ReadGgufFileVocab(const std::string& path) {
  LEDE_ASSIGN_OR_RETURN(std::shared_ptr<const checkpoint::GgufFile> f, checkpoint::GgufFile::Open(path));
  GgufVocab v;
  LEDE_ASSIGN_OR_RETURN(v.model, f->GetString("tokenizer.ggml.model"));
  if (v.model != "llama" && v.model != "gpt2") {
    return UnimplementedError(path + ": metadata key tokenizer.ggml.model is \"" + v.model +
                              "\" (supported: llama, gpt2)");
  }
  LEDE_ASSIGN_OR_RETURN(v.tokens, f->GetStringArray("tokenizer.ggml.tokens"));
  const size_t n = v.tokens.size();
  v.token_types.assign(n, kTypeNormal);
  if (f->Find("tokenizer.ggml.token_type") != nullptr) {
    LEDE_ASSIGN_OR_RETURN(std::vector<double> t, f->GetNumberArray("tokenizer.ggml.token_type"));
    if (t.size() != n) return InvalidArgumentError(path + ": metadata key tokenizer.ggml.token_type: wrong length");
    for (size_t i = 0; i < n; ++i) v.token_types[i] = static_cast<int32_t>(t[i]);
  }
  if (v.model == "llama") {
    LEDE_ASSIGN_OR_RETURN(std::vector<double> sc, f->GetNumberArray("tokenizer.ggml.scores"));
    if (sc.size() != n) return InvalidArgumentError(path + ": metadata key tokenizer.ggml.scores: wrong length");
    v.scores.assign(sc.begin(), sc.end());
    if (f->Find("tokenizer.ggml.add_space_prefix") != nullptr) {
      LEDE_ASSIGN_OR_RETURN(v.add_space_prefix, f->GetBool("tokenizer.ggml.add_space_prefix"));
    }
    v.add_bos = true;
  } else {
    LEDE_ASSIGN_OR_RETURN(v.merges, f->GetStringArray("tokenizer.ggml.merges"));
    v.pre = "gpt2";
    if (f->Find("tokenizer.ggml.pre") != nullptr) {
      LEDE_ASSIGN_OR_RETURN(std::string pre, f->GetString("tokenizer.ggml.pre"));
      if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3") v.pre = "llama-bpe";
    }
    v.add_bos = false;
  }
  if (f->Find("tokenizer.ggml.add_bos_token") != nullptr) {
    LEDE_ASSIGN_OR_RETURN(v.add_bos, f->GetBool("tokenizer.ggml.add_bos_token"));
  }
  if (f->Find("tokenizer.chat_template") != nullptr) {
    LEDE_ASSIGN_OR_RETURN(v.chat_template, f->GetString("tokenizer.chat_template"));
  }
  return v;
}

}  // namespace

StatusOr<GgufVocab> ReadVocabForGguf(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) return NotFoundError(path + ": no such tokenizer file");
  const std::string ext = fs::path(path).extension().string();
  if (ext == ".gguf") return ReadGgufFileVocab(path);
  StatusOr<GgufVocab> v = ext == ".model" ? ReadSentencePieceModel(path)
                          : ext == ".bin" ? ReadLlama2cVocab(path)
                          : ext == ".json" ? ReadTokenizerJsonVocab(path)
                                           : StatusOr<GgufVocab>(InvalidArgumentError(
                                                 path + ": unknown tokenizer file type (expected .model, .bin, .json)"));
  if (!v.ok() || ext == ".bin") return v;
  LEDE_ASSIGN_OR_RETURN(HfTokenizerConfig config, ReadHfTokenizerConfig(fs::path(path).parent_path().string()));
  v->chat_template = config.chat_template;
  if (config.add_bos_token) v->add_bos = *config.add_bos_token;
  return v;
}

void AddGgufTokenizerMetadata(const GgufVocab& v, int32_t bos_id, int32_t eos_id, checkpoint::GgufWriter* w) {
  w->AddString("tokenizer.ggml.model", v.model);
  if (v.model == "gpt2") w->AddString("tokenizer.ggml.pre", v.pre == "llama-bpe" ? "llama-bpe" : "default");
  w->AddStringArray("tokenizer.ggml.tokens", v.tokens);
  if (v.model == "llama") w->AddFloat32Array("tokenizer.ggml.scores", v.scores);
  w->AddInt32Array("tokenizer.ggml.token_type", v.token_types);
  if (v.model == "gpt2") w->AddStringArray("tokenizer.ggml.merges", v.merges);
  const auto n = static_cast<int32_t>(v.tokens.size());
  if (bos_id >= 0 && bos_id < n) w->AddUint32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(bos_id));
  if (eos_id >= 0 && eos_id < n) w->AddUint32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(eos_id));
  for (int32_t i = 0; i < n; ++i) {
    if (v.token_types[static_cast<size_t>(i)] == kTypeUnknown) {
      w->AddUint32("tokenizer.ggml.unknown_token_id", static_cast<uint32_t>(i));
      break;
    }
  }
  if (v.model == "llama") w->AddBool("tokenizer.ggml.add_space_prefix", v.add_space_prefix);
  w->AddBool("tokenizer.ggml.add_bos_token", v.add_bos);
  w->AddBool("tokenizer.ggml.add_eos_token", false);
  if (!v.chat_template.empty()) w->AddString("tokenizer.chat_template", v.chat_template);
}

}  // namespace lede::tokenizer
