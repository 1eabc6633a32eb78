// File: shared/tokenizer/hf_config.cc
//
// tokenizer_config.json, generation_config.json and config.json readers.
#include "shared/tokenizer/hf_config.h"

#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <system_error>
#include <utility>

#include "shared/file/file.h"
#include "shared/status/status_macros.h"

namespace lede::tokenizer {
namespace {

using Json = nlohmann::json;

Status FieldError(const std::string& source, const std::string& field, const std::string& what) {
  return InvalidArgumentError(source + ": field \"" + field + "\" " + what);
}

StatusOr<Json> ParseJson(const std::string& text, const std::string& source) {
  try {
    Json j = Json::parse(text);
    if (!j.is_object()) return InvalidArgumentError(source + ": not a JSON object");
    return j;
  } catch (const Json::exception& e) {
    return InvalidArgumentError(source + ": bad JSON: " + e.what());
  }
}

// A token given as a string or as an AddedToken object {"content": ...}.
Status ReadTokenString(const Json& root, const std::string& field, const std::string& source,
                       std::optional<std::string>* out) {
  auto it = root.find(field);
  if (it == root.end() || it->is_null()) return OkStatus();
  if (it->is_string()) {
    *out = it->get<std::string>();
    return OkStatus();
  }
  if (it->is_object()) {
    auto c = it->find("content");
    if (c != it->end() && c->is_string()) {
      *out = c->get<std::string>();
      return OkStatus();
    }
  }
  return FieldError(source, field, "must be a string or an object with a \"content\" string");
}

Status ReadBool(const Json& root, const std::string& field, const std::string& source,
                std::optional<bool>* out) {
  auto it = root.find(field);
  if (it == root.end() || it->is_null()) return OkStatus();
  if (!it->is_boolean()) return FieldError(source, field, "must be a boolean");
  *out = it->get<bool>();
  return OkStatus();
}

StatusOr<int32_t> ReadId(const Json& v, const std::string& field, const std::string& source) {
  if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
      v.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
    return FieldError(source, field, "must be a non-negative integer token id (or a list of them)");
  }
  return static_cast<int32_t>(v.get<int64_t>());
}

}  // namespace

StatusOr<HfTokenizerConfig> ParseHfTokenizerConfig(const std::string& json_text, const std::string& source) {
  LEDE_ASSIGN_OR_RETURN(Json root, ParseJson(json_text, source));
  HfTokenizerConfig c;
  c.source = source;
  LEDE_RETURN_IF_ERROR(ReadTokenString(root, "bos_token", source, &c.bos_token));
  LEDE_RETURN_IF_ERROR(ReadTokenString(root, "eos_token", source, &c.eos_token));
  LEDE_RETURN_IF_ERROR(ReadBool(root, "add_bos_token", source, &c.add_bos_token));
  LEDE_RETURN_IF_ERROR(ReadBool(root, "add_eos_token", source, &c.add_eos_token));
  if (auto it = root.find("chat_template"); it != root.end() && !it->is_null()) {
    if (it->is_string()) {
      c.chat_template = it->get<std::string>();
    } else if (it->is_array()) {
      bool found = false;
      for (const Json& t : *it) {
        if (t.is_object() && t.value("name", "") == "default" && t.contains("template") &&
            t["template"].is_string()) {
          c.chat_template = t["template"].get<std::string>();
          found = true;
        }
      }
      if (!found) return FieldError(source, "chat_template", "is a list without a \"default\" template");
    } else {
      return FieldError(source, "chat_template", "must be a string or a list of named templates");
    }
  }
  return c;
}

StatusOr<HfTokenizerConfig> ReadHfTokenizerConfig(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "tokenizer_config.json").string();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return HfTokenizerConfig{};
  LEDE_ASSIGN_OR_RETURN(std::string text, file::ReadFile(path));
  return ParseHfTokenizerConfig(text, path);
}

StatusOr<GenerationIds> ParseGenerationIds(const std::string& json_text, const std::string& source) {
  LEDE_ASSIGN_OR_RETURN(Json root, ParseJson(json_text, source));
  GenerationIds g;
  if (auto it = root.find("bos_token_id"); it != root.end() && !it->is_null()) {
    LEDE_ASSIGN_OR_RETURN(int32_t id, ReadId(*it, "bos_token_id", source));
    g.bos_id = id;
  }
  if (auto it = root.find("eos_token_id"); it != root.end() && !it->is_null()) {
    if (it->is_array()) {
      for (const Json& v : *it) {
        LEDE_ASSIGN_OR_RETURN(int32_t id, ReadId(v, "eos_token_id", source));
        g.eos_ids.push_back(id);
      }
    } else {
      LEDE_ASSIGN_OR_RETURN(int32_t id, ReadId(*it, "eos_token_id", source));
      g.eos_ids.push_back(id);
    }
    g.source = source;
  }
  return g;
}

StatusOr<GenerationIds> ReadGenerationIds(const std::string& dir) {
  namespace fs = std::filesystem;
  GenerationIds out;
  // generation_config.json wins field by field; config.json fills the gaps.
  for (const char* name : {"generation_config.json", "config.json"}) {
    const std::string path = (fs::path(dir) / name).string();
    std::error_code ec;
    if (!fs::exists(path, ec)) continue;
    LEDE_ASSIGN_OR_RETURN(std::string text, file::ReadFile(path));
    LEDE_ASSIGN_OR_RETURN(GenerationIds g, ParseGenerationIds(text, path));
    if (!out.bos_id) out.bos_id = g.bos_id;
    if (out.eos_ids.empty() && !g.eos_ids.empty()) {
      out.eos_ids = std::move(g.eos_ids);
      out.source = g.source;
    }
  }
  return out;
}

}  // namespace lede::tokenizer
