// File: shared/checkpoint/model_config.cc
//
// ModelConfig validation, fingerprinting and the Hugging Face config.json
// reader/writer. Torch-free; JSON via nlohmann-json (header-only).
#include "shared/checkpoint/model_config.h"

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <exception>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "shared/checkpoint/model_limits.h"
#include "shared/status/status_macros.h"

namespace lede::checkpoint {
namespace {

using Json = nlohmann::json;

// Hugging Face LlamaConfig defaults for the optional fields.
constexpr double kHfDefaultRmsNormEps = 1e-6;
constexpr double kHfDefaultRopeTheta = 10000.0;

std::string FieldError(const std::string& source, const std::string& field,
                       const std::string& what) {
  return source + ": field \"" + field + "\" " + what;
}

// Reads a required (or, with `optional` and `*present` false, absent)
// integer field. Accepts JSON integers only; a float such as 64.0 is
// rejected as mistyped.
Status ReadInt(const Json& obj, const std::string& field,
               const std::string& source, bool optional, int64_t* out,
               bool* present = nullptr) {
  if (present != nullptr) *present = false;
  auto it = obj.find(field);
  if (it == obj.end() || (optional && it->is_null())) {
    if (optional) return OkStatus();
    return InvalidArgumentError(FieldError(source, field, "is missing"));
  }
  if (it->is_number_unsigned()) {
    const uint64_t v = it->get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return InvalidArgumentError(FieldError(source, field, "is out of range"));
    }
    *out = static_cast<int64_t>(v);
  } else if (it->is_number_integer()) {
    *out = it->get<int64_t>();
  } else {
    return InvalidArgumentError(
        FieldError(source, field,
                   std::string("must be an integer, got ") + it->type_name()));
  }
  if (present != nullptr) *present = true;
  return OkStatus();
}

// Reads a number (integer or float) field.
Status ReadDouble(const Json& obj, const std::string& field,
                  const std::string& source, bool optional, double* out) {
  auto it = obj.find(field);
  if (it == obj.end() || (optional && it->is_null())) {
    if (optional) return OkStatus();
    return InvalidArgumentError(FieldError(source, field, "is missing"));
  }
  if (!it->is_number()) {
    return InvalidArgumentError(
        FieldError(source, field,
                   std::string("must be a number, got ") + it->type_name()));
  }
  *out = it->get<double>();
  if (!std::isfinite(*out)) {
    return InvalidArgumentError(FieldError(source, field, "is not finite"));
  }
  return OkStatus();
}

Status ReadTokenId(const Json& value, const std::string& field,
                   const std::string& source, int32_t* out) {
  if (!value.is_number_integer()) {
    return InvalidArgumentError(FieldError(
        source, field,
        std::string("must be an integer token id, got ") + value.type_name()));
  }
  const int64_t v = value.get<int64_t>();
  if (v < 0 || v > std::numeric_limits<int32_t>::max()) {
    return InvalidArgumentError(
        FieldError(source, field, "is not a valid token id"));
  }
  *out = static_cast<int32_t>(v);
  return OkStatus();
}

Status ParseRopeScaling(const Json& root, const std::string& source,
                        RopeScaling* out) {
  *out = RopeScaling();
  auto it = root.find("rope_scaling");
  if (it == root.end() || it->is_null()) return OkStatus();
  if (!it->is_object()) {
    return InvalidArgumentError(FieldError(
        source, "rope_scaling",
        std::string("must be an object or null, got ") + it->type_name()));
  }
  const Json& rs = *it;
  std::string type;
  for (const char* key : {"rope_type", "type"}) {
    auto t = rs.find(key);
    if (t == rs.end() || t->is_null()) continue;
    if (!t->is_string()) {
      return InvalidArgumentError(FieldError(
          source, std::string("rope_scaling.") + key, "must be a string"));
    }
    type = t->get<std::string>();
    break;
  }
  if (type.empty() || type == "default") return OkStatus();
  if (type == "linear") {
    out->type = RopeScaling::Type::kLinear;
    LEDE_RETURN_IF_ERROR(ReadDouble(rs, "factor", source + " rope_scaling",
                                    false, &out->factor));
  } else if (type == "llama3") {
    out->type = RopeScaling::Type::kLlama3;
    const std::string where = source + " rope_scaling";
    LEDE_RETURN_IF_ERROR(ReadDouble(rs, "factor", where, false, &out->factor));
    LEDE_RETURN_IF_ERROR(
        ReadDouble(rs, "low_freq_factor", where, false, &out->low_freq_factor));
    LEDE_RETURN_IF_ERROR(ReadDouble(rs, "high_freq_factor", where, false,
                                    &out->high_freq_factor));
    LEDE_RETURN_IF_ERROR(ReadInt(rs, "original_max_position_embeddings", where,
                                 false,
                                 &out->original_max_position_embeddings));
  } else {
    return InvalidArgumentError(
        FieldError(source, "rope_scaling.rope_type",
                   "has unsupported value \"" + type +
                       "\" (supported: default, linear, llama3)"));
  }
  return OkStatus();
}

// Reads the dims, the norm epsilon and the RoPE settings (the fields that
// define the architecture's shapes).
Status ReadHfShapes(const Json& root, const std::string& source,
                    ModelConfig* c) {
  LEDE_RETURN_IF_ERROR(ReadInt(root, "hidden_size", source, false, &c->dim));
  LEDE_RETURN_IF_ERROR(
      ReadInt(root, "intermediate_size", source, false, &c->hidden_dim));
  LEDE_RETURN_IF_ERROR(
      ReadInt(root, "num_hidden_layers", source, false, &c->n_layers));
  LEDE_RETURN_IF_ERROR(
      ReadInt(root, "num_attention_heads", source, false, &c->n_heads));
  c->n_kv_heads = c->n_heads;
  LEDE_RETURN_IF_ERROR(
      ReadInt(root, "num_key_value_heads", source, true, &c->n_kv_heads));
  LEDE_RETURN_IF_ERROR(
      ReadInt(root, "vocab_size", source, false, &c->vocab_size));
  LEDE_RETURN_IF_ERROR(ReadInt(root, "max_position_embeddings", source, false,
                               &c->max_seq_len));
  c->rms_norm_eps = kHfDefaultRmsNormEps;
  LEDE_RETURN_IF_ERROR(
      ReadDouble(root, "rms_norm_eps", source, true, &c->rms_norm_eps));
  c->rope_theta = kHfDefaultRopeTheta;
  LEDE_RETURN_IF_ERROR(
      ReadDouble(root, "rope_theta", source, true, &c->rope_theta));
  LEDE_RETURN_IF_ERROR(ParseRopeScaling(root, source, &c->rope_scaling));
  c->rope_style = RopeStyle::kRotateHalf;
  return OkStatus();
}

// Reads tie_word_embeddings and the BOS / EOS token ids (eos_token_id: one
// id or an array of them).
Status ReadHfTokens(const Json& root, const std::string& source,
                    ModelConfig* c) {
  c->tie_word_embeddings = false;
  if (auto it = root.find("tie_word_embeddings");
      it != root.end() && !it->is_null()) {
    if (!it->is_boolean()) {
      return InvalidArgumentError(
          FieldError(source, "tie_word_embeddings", "must be a boolean"));
    }
    c->tie_word_embeddings = it->get<bool>();
  }
  if (auto it = root.find("bos_token_id"); it != root.end() && !it->is_null()) {
    LEDE_RETURN_IF_ERROR(ReadTokenId(*it, "bos_token_id", source, &c->bos_id));
  }
  if (auto it = root.find("eos_token_id"); it != root.end() && !it->is_null()) {
    std::vector<int32_t> eos;
    if (it->is_array()) {
      for (const Json& v : *it) {
        int32_t id = 0;
        LEDE_RETURN_IF_ERROR(ReadTokenId(v, "eos_token_id", source, &id));
        eos.push_back(id);
      }
    } else {
      int32_t id = 0;
      LEDE_RETURN_IF_ERROR(ReadTokenId(*it, "eos_token_id", source, &id));
      eos.push_back(id);
    }
    c->eos_ids = std::move(eos);
  }
  return OkStatus();
}

// Refuses the fields that would silently change the architecture if
// ignored: an activation other than SiLU, a head_dim other than
// hidden_size / num_attention_heads.
Status CheckHfUnsupported(const Json& root, const std::string& source,
                          const ModelConfig& c) {
  if (auto it = root.find("hidden_act"); it != root.end() && !it->is_null()) {
    if (!it->is_string() || (it->get<std::string>() != "silu" &&
                             it->get<std::string>() != "swish")) {
      return InvalidArgumentError(FieldError(
          source, "hidden_act", "is unsupported (only silu is implemented)"));
    }
  }
  if (auto it = root.find("head_dim"); it != root.end() && !it->is_null()) {
    int64_t head_dim = 0;
    LEDE_RETURN_IF_ERROR(ReadInt(root, "head_dim", source, false, &head_dim));
    if (c.n_heads <= 0 || head_dim * c.n_heads != c.dim) {
      return InvalidArgumentError(
          FieldError(source, "head_dim",
                     "must equal hidden_size / num_attention_heads (got " +
                         std::to_string(head_dim) + ")"));
    }
  }
  return OkStatus();
}

// Bounds, named by their config.json keys (Validate repeats them under the
// ModelConfig field names for configs made elsewhere).
Status CheckHfBounds(const std::string& source, const ModelConfig& c) {
  for (const auto& [key, value, max] :
       {std::tuple<const char*, int64_t, int64_t>{"hidden_size", c.dim, kMaxModelDim},
        {"intermediate_size", c.hidden_dim, kMaxModelDim},
        {"num_hidden_layers", c.n_layers, kMaxLayers},
        {"num_attention_heads", c.n_heads, kMaxModelDim},
        {"num_key_value_heads", c.n_kv_heads, kMaxModelDim},
        {"vocab_size", c.vocab_size, kMaxVocabSize},
        {"max_position_embeddings", c.max_seq_len, kMaxContextTokens}}) {
    if (value <= 0 || value > max) {
      return InvalidArgumentError(FieldError(source, key,
                                             "is " + std::to_string(value) + ", outside [1, " +
                                                 std::to_string(max) + "]"));
    }
  }
  return OkStatus();
}

StatusOr<ModelConfig> ParseHfConfigImpl(const std::string& json_text,
                                        const std::string& source) {
  Json root =
      Json::parse(json_text, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    return InvalidArgumentError(source + ": invalid JSON");
  }
  if (!root.is_object()) {
    return InvalidArgumentError(source + ": top level must be a JSON object");
  }
  ModelConfig c;
  LEDE_RETURN_IF_ERROR(ReadHfShapes(root, source, &c));
  LEDE_RETURN_IF_ERROR(ReadHfTokens(root, source, &c));
  LEDE_RETURN_IF_ERROR(CheckHfUnsupported(root, source, c));
  LEDE_RETURN_IF_ERROR(CheckHfBounds(source, c));
  Status valid = c.Validate();
  if (!valid.ok()) {
    return Status(valid.code(), source + ": " + std::string(valid.message()));
  }
  return c;
}

std::string Hex64(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, h);
  return buf;
}

}  // namespace

Status ModelConfig::Validate() const {
  auto positive = [](const char* name, int64_t v, int64_t max) -> Status {
    if (v <= 0) {
      return InvalidArgumentError(std::string("ModelConfig.") + name +
                                  " must be positive, got " +
                                  std::to_string(v));
    }
    if (v > max) {
      return InvalidArgumentError(std::string("ModelConfig.") + name + " is " + std::to_string(v) +
                                  ", above its bound " + std::to_string(max));
    }
    return OkStatus();
  };
  LEDE_RETURN_IF_ERROR(positive("dim", dim, kMaxModelDim));
  LEDE_RETURN_IF_ERROR(positive("hidden_dim", hidden_dim, kMaxModelDim));
  LEDE_RETURN_IF_ERROR(positive("n_layers", n_layers, kMaxLayers));
  LEDE_RETURN_IF_ERROR(positive("n_heads", n_heads, kMaxModelDim));
  LEDE_RETURN_IF_ERROR(positive("n_kv_heads", n_kv_heads, kMaxModelDim));
  LEDE_RETURN_IF_ERROR(positive("vocab_size", vocab_size, kMaxVocabSize));
  LEDE_RETURN_IF_ERROR(positive("max_seq_len", max_seq_len, kMaxContextTokens));
  if (dim % n_heads != 0) {
    return InvalidArgumentError("ModelConfig.dim (" + std::to_string(dim) +
                                ") is not divisible by n_heads (" +
                                std::to_string(n_heads) + ")");
  }
  if (n_heads % n_kv_heads != 0) {
    return InvalidArgumentError("ModelConfig.n_heads (" +
                                std::to_string(n_heads) +
                                ") is not divisible by n_kv_heads (" +
                                std::to_string(n_kv_heads) + ")");
  }
  if (head_dim() % 2 != 0) {
    return InvalidArgumentError("ModelConfig.head_dim (" +
                                std::to_string(head_dim()) +
                                ") must be even for RoPE");
  }
  if (!(rms_norm_eps > 0.0) || !std::isfinite(rms_norm_eps)) {
    return InvalidArgumentError("ModelConfig.rms_norm_eps must be positive");
  }
  if (!(rope_theta > 0.0) || !std::isfinite(rope_theta)) {
    return InvalidArgumentError("ModelConfig.rope_theta must be positive");
  }
  if (rope_scaling.type != RopeScaling::Type::kNone) {
    if (!(rope_scaling.factor > 0.0) || !std::isfinite(rope_scaling.factor)) {
      return InvalidArgumentError(
          "ModelConfig.rope_scaling.factor must be positive");
    }
    if (rope_scaling.type == RopeScaling::Type::kLlama3) {
      if (!(rope_scaling.low_freq_factor > 0.0) ||
          !(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor)) {
        return InvalidArgumentError(
            "ModelConfig.rope_scaling needs 0 < low_freq_factor < "
            "high_freq_factor");
      }
      if (rope_scaling.original_max_position_embeddings <= 0) {
        return InvalidArgumentError(
            "ModelConfig.rope_scaling.original_max_position_embeddings must be "
            "positive");
      }
    }
  }
  return OkStatus();
}

// FNV-1a 64 over a canonical text of the fields that fix tensor shapes and
// the forward computation: dim, hidden_dim, n_layers, n_heads, n_kv_heads,
// vocab_size, max_seq_len, rms_norm_eps, rope_theta, rope_scaling and
// tie_word_embeddings. Not included: rope_style (a storage convention of the
// checkpoint; the engine always computes rotate-half) and bos/eos ids
// (tokenizer properties). Returns 16 lowercase hex digits.
std::string ModelConfig::ArchitectureFingerprint() const {
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "llama;d=%" PRId64 ";ff=%" PRId64 ";L=%" PRId64 ";H=%" PRId64
                ";Hkv=%" PRId64 ";V=%" PRId64 ";T=%" PRId64
                ";eps=%.17g;theta=%.17g;rs=%d,%.17g,%.17g,%.17g,%" PRId64
                ";tie=%d",
                dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size,
                max_seq_len, rms_norm_eps, rope_theta,
                static_cast<int>(rope_scaling.type), rope_scaling.factor,
                rope_scaling.low_freq_factor, rope_scaling.high_freq_factor,
                rope_scaling.original_max_position_embeddings,
                tie_word_embeddings ? 1 : 0);
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a 64 offset basis
  for (const char* p = buf; *p != '\0'; ++p) {
    h ^= static_cast<uint8_t>(*p);
    h *= 0x100000001b3ULL;  // FNV-1a 64 prime
  }
  return Hex64(h);
}

StatusOr<ModelConfig> ParseHfConfig(const std::string& json_text,
                                    const std::string& source) {
  try {
    return ParseHfConfigImpl(json_text, source);
  } catch (const std::exception& e) {  // a JSON access the checks missed
    return InternalError(source + ": " + e.what());
  }
}

std::string ToHfConfigJson(const ModelConfig& config) {
  Json j = Json::object();
  j["architectures"] = Json::array({"LlamaForCausalLM"});
  j["model_type"] = "llama";
  j["torch_dtype"] = "float32";
  j["hidden_act"] = "silu";
  j["hidden_size"] = config.dim;
  j["intermediate_size"] = config.hidden_dim;
  j["num_hidden_layers"] = config.n_layers;
  j["num_attention_heads"] = config.n_heads;
  j["num_key_value_heads"] = config.n_kv_heads;
  j["vocab_size"] = config.vocab_size;
  j["max_position_embeddings"] = config.max_seq_len;
  j["rms_norm_eps"] = config.rms_norm_eps;
  j["rope_theta"] = config.rope_theta;
  switch (config.rope_scaling.type) {
    case RopeScaling::Type::kNone:
      j["rope_scaling"] = nullptr;
      break;
    case RopeScaling::Type::kLinear:
      j["rope_scaling"] = {{"rope_type", "linear"},
                           {"factor", config.rope_scaling.factor}};
      break;
    case RopeScaling::Type::kLlama3:
      j["rope_scaling"] = {
          {"rope_type", "llama3"},
          {"factor", config.rope_scaling.factor},
          {"low_freq_factor", config.rope_scaling.low_freq_factor},
          {"high_freq_factor", config.rope_scaling.high_freq_factor},
          {"original_max_position_embeddings",
           config.rope_scaling.original_max_position_embeddings}};
      break;
  }
  j["tie_word_embeddings"] = config.tie_word_embeddings;
  j["bos_token_id"] = config.bos_id;
  if (config.eos_ids.size() == 1) {
    j["eos_token_id"] = config.eos_ids[0];
  } else {
    j["eos_token_id"] = config.eos_ids;  // [] or a list
  }
  return j.dump(2) + "\n";
}

}  // namespace lede::checkpoint