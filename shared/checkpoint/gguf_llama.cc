// File: shared/checkpoint/gguf_llama.cc
//
// The llama architecture of GGUF files (contracts in gguf.h): GGUF tensor
// names <-> Hugging Face names, the llama.* metadata <-> ModelConfig (read:
// GgufLlamaConfig, with every tensor's dims checked; written:
// AddLlamaMetadata), and Llama-3 RoPE scaling as llama.cpp's
// rope_freqs.weight.
#include "shared/checkpoint/gguf.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "shared/checkpoint/internal/gguf_internal.h"
#include "shared/checkpoint/model_limits.h"
#include "shared/status/status_macros.h"

namespace lede::checkpoint {

using internal::NeString;
using internal::ShortestDecimal;

namespace {

struct NamePair {
  const char* gguf;
  const char* hf;
};
constexpr NamePair kLayerNames[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
};
constexpr NamePair kGlobalNames[] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};

// "<prefix><digits>.<rest>" -> (layer, rest), or layer -1.
std::pair<int64_t, std::string> SplitLayer(const std::string& name, const std::string& prefix) {
  if (name.compare(0, prefix.size(), prefix) != 0) return {-1, ""};
  size_t i = prefix.size(), j = i;
  while (j < name.size() && j - i < 6 && name[j] >= '0' && name[j] <= '9') ++j;
  if (j == i || j >= name.size() || name[j] != '.') return {-1, ""};
  return {std::stoll(name.substr(i, j - i)), name.substr(j + 1)};
}

}  // namespace

std::string GgufToHfName(const std::string& gguf_name) {
  for (const NamePair& p : kGlobalNames) {
    if (gguf_name == p.gguf) return p.hf;
  }
  auto [layer, rest] = SplitLayer(gguf_name, "blk.");
  if (layer < 0) return "";
  for (const NamePair& p : kLayerNames) {
    if (rest == p.gguf) return "model.layers." + std::to_string(layer) + "." + p.hf;
  }
  return "";
}

std::string HfToGgufName(const std::string& hf_name) {
  for (const NamePair& p : kGlobalNames) {
    if (hf_name == p.hf) return p.gguf;
  }
  auto [layer, rest] = SplitLayer(hf_name, "model.layers.");
  if (layer < 0) return "";
  for (const NamePair& p : kLayerNames) {
    if (rest == p.hf) return "blk." + std::to_string(layer) + "." + p.gguf;
  }
  return "";
}

std::vector<float> Llama3RopeFreqFactors(const ModelConfig& c) {
  const RopeScaling& s = c.rope_scaling;
  const int64_t hd = c.head_dim(), half = hd / 2;
  const double old_ctx = static_cast<double>(s.original_max_position_embeddings);
  const double low_wavelen = old_ctx / s.low_freq_factor, high_wavelen = old_ctx / s.high_freq_factor;
  std::vector<float> out(static_cast<size_t>(half), 1.0f);
  for (int64_t i = 0; i < half; ++i) {
    const double inv = std::pow(c.rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(hd));
    const double wavelen = 2.0 * M_PI / inv;
    if (wavelen < high_wavelen) continue;
    if (wavelen > low_wavelen) {
      out[i] = static_cast<float>(s.factor);
    } else {
      const double smooth = (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      out[i] = static_cast<float>(1.0 / ((1.0 - smooth) / s.factor + smooth));
    }
  }
  return out;
}

namespace {

// Finds Llama-3 scaling parameters that reproduce rope_freqs.weight.
Status MatchLlama3Scaling(const GgufTensor& t, const std::string& src, ModelConfig* c) {
  const int64_t half = c->head_dim() / 2;
  if (t.ne != std::vector<int64_t>{half}) {
    return InvalidArgumentError(src + ": tensor rope_freqs.weight has dims " + NeString(t.ne) + ", expected [" +
                                std::to_string(half) + "] (head dim / 2)");
  }
  std::vector<float> given(static_cast<size_t>(half));
  LEDE_RETURN_IF_ERROR(DequantizeToF32(t, given.data()));
  const float factor = *std::max_element(given.begin(), given.end());
  if (!(factor >= 1.0f) || !std::isfinite(factor)) {
    return InvalidArgumentError(src + ": tensor rope_freqs.weight: factors must be finite and at least 1");
  }
  ModelConfig trial = *c;
  trial.rope_scaling.type = RopeScaling::Type::kLlama3;
  trial.rope_scaling.factor = factor;
  for (int64_t orig : {8192, 4096, 2048, 16384, 32768, 131072}) {
    for (double low : {1.0, 2.0}) {
      for (double high : {4.0, 8.0, 2.0}) {
        trial.rope_scaling.low_freq_factor = low;
        trial.rope_scaling.high_freq_factor = high;
        trial.rope_scaling.original_max_position_embeddings = orig;
        const std::vector<float> want = Llama3RopeFreqFactors(trial);
        bool same = true;
        for (int64_t i = 0; i < half && same; ++i) same = std::fabs(want[i] - given[i]) <= 1e-4f * given[i];
        if (same) {
          c->rope_scaling = trial.rope_scaling;
          return OkStatus();
        }
      }
    }
  }
  return InvalidArgumentError(src + ": tensor rope_freqs.weight matches no Llama-3 RoPE scaling (factor " +
                              std::to_string(factor) + "; per-frequency factors of another shape are not supported)");
}

// Reads a metadata integer that must be in [1, max] (model_config.h's
// bounds).
StatusOr<int64_t> PositiveInt(const GgufFile& f, const std::string& key, int64_t max) {
  const std::string& src = f.source();
  LEDE_ASSIGN_OR_RETURN(int64_t v, f.GetInt(key));
  if (v <= 0 || v > max) {
    return InvalidArgumentError(src + ": metadata key " + key + " is " + std::to_string(v) + ", outside [1, " +
                                std::to_string(max) + "]");
  }
  return v;
}

// Reads the llama dims, norm epsilon and rope settings and checks they agree.
Status ReadLlamaHyperparams(const GgufFile& f, ModelConfig* c) {
  const std::string& src = f.source();
  LEDE_ASSIGN_OR_RETURN(c->dim, PositiveInt(f, "llama.embedding_length", kMaxModelDim));
  LEDE_ASSIGN_OR_RETURN(c->hidden_dim, PositiveInt(f, "llama.feed_forward_length", kMaxModelDim));
  LEDE_ASSIGN_OR_RETURN(c->n_layers, PositiveInt(f, "llama.block_count", kMaxLayers));
  LEDE_ASSIGN_OR_RETURN(c->n_heads, PositiveInt(f, "llama.attention.head_count", kMaxModelDim));
  c->n_kv_heads = c->n_heads;
  if (f.Find("llama.attention.head_count_kv") != nullptr) {
    LEDE_ASSIGN_OR_RETURN(c->n_kv_heads, PositiveInt(f, "llama.attention.head_count_kv", kMaxModelDim));
  }
  LEDE_ASSIGN_OR_RETURN(c->max_seq_len, PositiveInt(f, "llama.context_length", kMaxContextTokens));
  LEDE_ASSIGN_OR_RETURN(c->rms_norm_eps, f.GetFloat("llama.attention.layer_norm_rms_epsilon"));
  if (!(c->rms_norm_eps > 0.0 && c->rms_norm_eps < 1.0)) {
    return InvalidArgumentError(src + ": metadata key llama.attention.layer_norm_rms_epsilon must be in (0, 1)");
  }
  if (f.Find("llama.rope.freq_base") != nullptr) {
    LEDE_ASSIGN_OR_RETURN(c->rope_theta, f.GetFloat("llama.rope.freq_base"));
    if (!(c->rope_theta > 1.0)) {
      return InvalidArgumentError(src + ": metadata key llama.rope.freq_base must be above 1");
    }
  }
  // This project's exact copies (written by `lede export` when the float32
  // keys cannot hold the checkpoint's values): used when they agree with
  // the llama.cpp keys to float32 precision.
  for (const auto& [key, value] : {std::pair{kExactRmsNormEpsKey, &c->rms_norm_eps},
                                   std::pair{kExactRopeThetaKey, &c->rope_theta}}) {
    if (f.Find(key) == nullptr) continue;
    LEDE_ASSIGN_OR_RETURN(double exact, f.GetFloat(key));
    if (static_cast<float>(exact) != static_cast<float>(*value)) {
      return InvalidArgumentError(src + ": metadata key " + key + " contradicts its llama.* float32 key");
    }
    *value = exact;
  }
  if (c->dim % c->n_heads != 0 || c->n_heads % c->n_kv_heads != 0 || (c->dim / c->n_heads) % 2 != 0) {
    return InvalidArgumentError(src + ": metadata keys llama.embedding_length (" + std::to_string(c->dim) +
                                "), llama.attention.head_count (" + std::to_string(c->n_heads) +
                                ") and head_count_kv (" + std::to_string(c->n_kv_heads) + ") are inconsistent");
  }
  for (const char* key : {"llama.rope.dimension_count", "llama.attention.key_length",
                          "llama.attention.value_length"}) {
    if (f.Find(key) == nullptr) continue;
    LEDE_ASSIGN_OR_RETURN(int64_t v, f.GetInt(key));
    if (v != c->head_dim()) {
      return InvalidArgumentError(src + ": metadata key " + std::string(key) + " is " + std::to_string(v) +
                                  ", expected the head dim " + std::to_string(c->head_dim()) +
                                  " (partial rotary and other head sizes are not supported)");
    }
  }
  if (f.Find("llama.rope.scaling.type") != nullptr) {
    LEDE_ASSIGN_OR_RETURN(std::string type, f.GetString("llama.rope.scaling.type"));
    if (type == "linear") {
      c->rope_scaling.type = RopeScaling::Type::kLinear;
      LEDE_ASSIGN_OR_RETURN(c->rope_scaling.factor, f.GetFloat("llama.rope.scaling.factor"));
      if (!(c->rope_scaling.factor > 0.0)) {
        return InvalidArgumentError(src + ": metadata key llama.rope.scaling.factor must be positive");
      }
    } else if (type != "none" && !(type == "llama3" && f.FindTensor("rope_freqs.weight") != nullptr)) {
      return InvalidArgumentError(src + ": metadata key llama.rope.scaling.type is \"" + type +
                                  "\" (supported: none, linear)");
    }
  }
  return OkStatus();
}

// Reads the vocabulary size, tied embeddings and the special token ids.
Status ReadLlamaVocab(const GgufFile& f, ModelConfig* c) {
  const std::string& src = f.source();
  const GgufTensor* embd = f.FindTensor("token_embd.weight");
  if (embd == nullptr) return InvalidArgumentError(src + ": missing tensor token_embd.weight");
  if (f.Find("llama.vocab_size") != nullptr) {
    LEDE_ASSIGN_OR_RETURN(c->vocab_size, PositiveInt(f, "llama.vocab_size", kMaxVocabSize));
  } else if (f.Find("tokenizer.ggml.tokens") != nullptr) {
    const GgufValue* tokens = f.Find("tokenizer.ggml.tokens");
    if (tokens->type != GgufValueType::kArray || tokens->array_type != GgufValueType::kString) {
      return InvalidArgumentError(src + ": metadata key tokenizer.ggml.tokens is not an array of strings");
    }
    c->vocab_size = static_cast<int64_t>(tokens->strings.size());
    if (c->vocab_size < 1 || c->vocab_size > kMaxVocabSize) {
      return InvalidArgumentError(src + ": metadata key tokenizer.ggml.tokens has " + std::to_string(c->vocab_size) +
                                  " tokens, outside [1, " + std::to_string(kMaxVocabSize) + "]");
    }
  } else {
    c->vocab_size = embd->ne.size() == 2 ? embd->ne[1] : 0;
  }
  if (const GgufValue* tokens = f.Find("tokenizer.ggml.tokens")) {
    if (static_cast<int64_t>(tokens->strings.size()) != c->vocab_size) {
      return InvalidArgumentError(src + ": metadata key tokenizer.ggml.tokens has " +
                                  std::to_string(tokens->strings.size()) + " tokens but the vocabulary size is " +
                                  std::to_string(c->vocab_size));
    }
  }
  c->rope_style = RopeStyle::kAdjacentPairs;
  c->tie_word_embeddings = f.FindTensor("output.weight") == nullptr;
  c->bos_id = 1;
  c->eos_ids = {2};
  auto token_id = [&](const std::string& key, int64_t* out) -> Status {
    LEDE_ASSIGN_OR_RETURN(*out, f.GetInt(key));
    if (*out < 0 || *out >= c->vocab_size) {
      return InvalidArgumentError(src + ": metadata key " + key + " is " + std::to_string(*out) +
                                  ", outside the vocabulary [0, " + std::to_string(c->vocab_size) + ")");
    }
    return OkStatus();
  };
  int64_t id = 0;
  if (f.Find("tokenizer.ggml.bos_token_id") != nullptr) {
    LEDE_RETURN_IF_ERROR(token_id("tokenizer.ggml.bos_token_id", &id));
    c->bos_id = static_cast<int32_t>(id);
  }
  if (f.Find("tokenizer.ggml.eos_token_id") != nullptr) {
    LEDE_RETURN_IF_ERROR(token_id("tokenizer.ggml.eos_token_id", &id));
    c->eos_ids = {static_cast<int32_t>(id)};
  }
  for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    if (f.Find(key) == nullptr) continue;
    LEDE_RETURN_IF_ERROR(token_id(key, &id));
    if (std::find(c->eos_ids.begin(), c->eos_ids.end(), id) == c->eos_ids.end()) {
      c->eos_ids.push_back(static_cast<int32_t>(id));
    }
  }
  return OkStatus();
}

// Checks that every tensor the config needs is present with the right dims.
Status CheckLlamaTensors(const GgufFile& f, const ModelConfig& c) {
  const std::string& src = f.source();
  // Every tensor the config needs, with dims in ggml order (ne[0] = in).
  // Nine tensors per block: a block count the file cannot hold is refused
  // before the list below is sized by it.
  if (c.n_layers > static_cast<int64_t>(f.tensors().size() / 9)) {
    return InvalidArgumentError(src + ": metadata key llama.block_count is " + std::to_string(c.n_layers) +
                                ", but the file holds " + std::to_string(f.tensors().size()) +
                                " tensors (each block needs 9)");
  }
  const int64_t d = c.dim, q = c.n_heads * c.head_dim(), kv = c.kv_dim(), h = c.hidden_dim;
  std::vector<std::pair<std::string, std::vector<int64_t>>> need = {{"token_embd.weight", {d, c.vocab_size}},
                                                                    {"output_norm.weight", {d}}};
  if (!c.tie_word_embeddings) need.push_back({"output.weight", {d, c.vocab_size}});
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    need.push_back({p + "attn_norm.weight", {d}});
    need.push_back({p + "attn_q.weight", {d, q}});
    need.push_back({p + "attn_k.weight", {d, kv}});
    need.push_back({p + "attn_v.weight", {d, kv}});
    need.push_back({p + "attn_output.weight", {q, d}});
    need.push_back({p + "ffn_norm.weight", {d}});
    need.push_back({p + "ffn_gate.weight", {d, h}});
    need.push_back({p + "ffn_up.weight", {d, h}});
    need.push_back({p + "ffn_down.weight", {h, d}});
  }
  for (const auto& [name, ne] : need) {
    const GgufTensor* t = f.FindTensor(name);
    if (t == nullptr) return InvalidArgumentError(src + ": missing tensor " + name);
    if (t->ne != ne) {
      return InvalidArgumentError(src + ": tensor " + name + " has dims " + NeString(t->ne) + ", but the metadata " +
                                  "(llama.embedding_length " + std::to_string(d) + ", feed_forward_length " +
                                  std::to_string(h) + ", head_count " + std::to_string(c.n_heads) +
                                  ", head_count_kv " + std::to_string(c.n_kv_heads) + ", vocabulary " +
                                  std::to_string(c.vocab_size) + ") says " + NeString(ne));
    }
  }
  return OkStatus();
}

}  // namespace

StatusOr<ModelConfig> GgufLlamaConfig(const GgufFile& f) {
  const std::string& src = f.source();
  LEDE_ASSIGN_OR_RETURN(std::string arch, f.GetString("general.architecture"));
  if (arch != "llama") {
    return InvalidArgumentError(src + ": metadata key general.architecture is \"" + arch +
                                "\" (supported: llama)");
  }
  ModelConfig c;
  LEDE_RETURN_IF_ERROR(ReadLlamaHyperparams(f, &c));
  if (const GgufTensor* freqs = f.FindTensor("rope_freqs.weight")) {
    LEDE_RETURN_IF_ERROR(MatchLlama3Scaling(*freqs, src, &c));
  }
  LEDE_RETURN_IF_ERROR(ReadLlamaVocab(f, &c));
  LEDE_RETURN_IF_ERROR(c.Validate());
  LEDE_RETURN_IF_ERROR(CheckLlamaTensors(f, c));
  return c;
}

Status AddLlamaMetadata(const ModelConfig& c, const std::string& name, GgufWriter* w) {
  LEDE_RETURN_IF_ERROR(c.Validate());
  w->AddString("general.architecture", "llama");
  w->AddString("general.name", name);
  w->AddUint32("general.alignment", 32);
  w->AddUint32("llama.context_length", static_cast<uint32_t>(c.max_seq_len));
  w->AddUint32("llama.embedding_length", static_cast<uint32_t>(c.dim));
  w->AddUint32("llama.block_count", static_cast<uint32_t>(c.n_layers));
  w->AddUint32("llama.feed_forward_length", static_cast<uint32_t>(c.hidden_dim));
  w->AddUint32("llama.rope.dimension_count", static_cast<uint32_t>(c.head_dim()));
  w->AddUint32("llama.attention.head_count", static_cast<uint32_t>(c.n_heads));
  w->AddUint32("llama.attention.head_count_kv", static_cast<uint32_t>(c.n_kv_heads));
  w->AddFloat32("llama.attention.layer_norm_rms_epsilon", static_cast<float>(c.rms_norm_eps));
  w->AddFloat32("llama.rope.freq_base", static_cast<float>(c.rope_theta));
  // A value the float32 key cannot give back exactly (a widened checkpoint's
  // eps * d/D) travels exactly too, so that the file's architecture
  // fingerprint is its source's (policies and calibrations are keyed by it).
  for (const auto& [key, value] : {std::pair{kExactRmsNormEpsKey, c.rms_norm_eps},
                                   std::pair{kExactRopeThetaKey, c.rope_theta}}) {
    if (ShortestDecimal(static_cast<float>(value)) != value) w->AddFloat64(key, value);
  }
  w->AddUint32("llama.vocab_size", static_cast<uint32_t>(c.vocab_size));
  if (c.rope_scaling.type == RopeScaling::Type::kLinear) {
    w->AddString("llama.rope.scaling.type", "linear");
    w->AddFloat32("llama.rope.scaling.factor", static_cast<float>(c.rope_scaling.factor));
  }
  if (c.rope_scaling.type == RopeScaling::Type::kLlama3) {
    const std::vector<float> factors = Llama3RopeFreqFactors(c);
    std::vector<uint8_t> bytes(factors.size() * 4);
    std::memcpy(bytes.data(), factors.data(), bytes.size());
    LEDE_RETURN_IF_ERROR(w->AddTensor("rope_freqs.weight", GgmlType::kF32, {static_cast<int64_t>(factors.size())},
                                      std::move(bytes)));
  }
  return OkStatus();
}

}  // namespace lede::checkpoint
