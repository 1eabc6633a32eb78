// File: shared/model/loaders/checkpoint_llama2c.cc
//
// llama2.c "version 0" .bin checkpoints (LoadLlama2cCheckpoint,
// WriteLlama2cCheckpoint in checkpoint.h): a 7 int32 header (dim,
// hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size (negative: untied
// classifier), seq_len), then float32 arrays (testdata/models/README.md).
// Loaded tensors are zero-copy views of one read-only mapping.
#include <ATen/ATen.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "shared/checkpoint/mapped_file.h"
#include "shared/model/loaders/checkpoint.h"
#include "shared/model/loaders/internal/checkpoint_internal.h"
#include "shared/status/status_macros.h"

namespace lede::model::loaders {
namespace {

using internal::TensorMap;

constexpr int64_t kLlama2cHeaderBytes = 7 * sizeof(int32_t);


struct Llama2cLayout {
  int64_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
  bool tied;
  int64_t head_dim() const { return dim / n_heads; }
  int64_t kv_dim() const { return head_dim() * n_kv_heads; }
  // Number of float32 values after the header.
  int64_t n_floats() const {
    const int64_t L = n_layers, d = dim, kv = kv_dim(), f = hidden_dim;
    int64_t n = vocab_size * d;                   // token_embedding
    n += L * d;                                   // rms_att
    n += L * d * d + 2 * L * kv * d + L * d * d;  // wq, wk, wv, wo
    n += L * d;                                   // rms_ffn
    n += 3 * L * f * d;                           // w1, w2, w3
    n += d;                                       // rms_final
    n += seq_len * head_dim();                    // freq_cis_real + imag
    if (!tied) n += vocab_size * d;               // wcls
    return n;
  }
};

// Bounds that keep n_floats() far from int64 overflow and reject garbage.
Status CheckLlama2cHeader(const std::string& file, const int64_t h[7]) {
  static const char* const kNames[7] = {"dim",     "hidden_dim", "n_layers",
                                        "n_heads", "n_kv_heads", "vocab_size",
                                        "seq_len"};
  static const int64_t kMax[7] = {1 << 16, 1 << 20, 1 << 12, 1 << 12,
                                  1 << 12, 1 << 24, 1 << 24};
  for (int i = 0; i < 7; ++i) {
    const int64_t v = (i == 5) ? std::abs(h[i]) : h[i];
    if (v <= 0 || v > kMax[i]) {
      return InvalidArgumentError(file + ": implausible llama2.c header: " +
                                  kNames[i] + " = " + std::to_string(h[i]));
    }
  }
  if (h[0] % h[3] != 0 || (h[0] / h[3]) % 2 != 0 || h[3] % h[4] != 0) {
    return InvalidArgumentError(file + ": inconsistent llama2.c header: dim " +
                                std::to_string(h[0]) + ", n_heads " +
                                std::to_string(h[3]) + ", n_kv_heads " +
                                std::to_string(h[4]));
  }
  return OkStatus();
}

StatusOr<Checkpoint> LoadLlama2cCheckpointImpl(const std::string& file) {
  LEDE_ASSIGN_OR_RETURN(std::shared_ptr<const checkpoint::MappedFile> map,
                        checkpoint::MappedFile::Open(file));
  const int64_t size = static_cast<int64_t>(map->size());
  if (size < kLlama2cHeaderBytes) {
    return InvalidArgumentError(
        file + ": truncated llama2.c checkpoint: " + std::to_string(size) +
        " bytes, expected at least the 28-byte header");
  }
  int32_t raw[7];
  std::memcpy(raw, map->data(), sizeof(raw));
  int64_t h[7];
  for (int i = 0; i < 7; ++i) h[i] = raw[i];
  LEDE_RETURN_IF_ERROR(CheckLlama2cHeader(file, h));
  const Llama2cLayout lay{h[0], h[1],           h[2], h[3],
                          h[4], std::abs(h[5]), h[6], h[5] > 0};
  const int64_t expected = kLlama2cHeaderBytes + 4 * lay.n_floats();
  if (size != expected) {
    return InvalidArgumentError(
        file + ": " + (size < expected ? "truncated" : "oversized") +
        " llama2.c checkpoint: the header implies " + std::to_string(expected) +
        " bytes, the file has " + std::to_string(size));
  }

  Checkpoint ckpt;
  ckpt.source = file;
  checkpoint::ModelConfig& c = ckpt.config;
  c.dim = lay.dim;
  c.hidden_dim = lay.hidden_dim;
  c.n_layers = lay.n_layers;
  c.n_heads = lay.n_heads;
  c.n_kv_heads = lay.n_kv_heads;
  c.vocab_size = lay.vocab_size;
  c.max_seq_len = lay.seq_len;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.rope_scaling = checkpoint::RopeScaling();
  c.rope_style = checkpoint::RopeStyle::kAdjacentPairs;
  c.tie_word_embeddings = lay.tied;
  c.bos_id = 1;
  c.eos_ids = {2};
  Status valid = c.Validate();
  if (!valid.ok()) {
    return InvalidArgumentError(file + ": " + std::string(valid.message()));
  }

  // One zero-copy view over all floats; every tensor is a view of it.
  at::Tensor all = internal::TensorFromMapping(map, map->data() + kLlama2cHeaderBytes,
                                     {lay.n_floats()}, at::kFloat);
  int64_t pos = 0;
  auto take = [&](std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    at::Tensor t = all.narrow(0, pos, n).view(shape);
    pos += n;
    return t;
  };
  const int64_t L = lay.n_layers, d = lay.dim, kv = lay.kv_dim(),
                f = lay.hidden_dim;
  TensorMap& t = ckpt.tensors;
  t["model.embed_tokens.weight"] = take({lay.vocab_size, d});
  auto per_layer = [&](const std::string& suffix, at::Tensor stacked) {
    for (int64_t i = 0; i < L; ++i) {
      t["model.layers." + std::to_string(i) + "." + suffix] = stacked[i];
    }
  };
  per_layer("input_layernorm.weight", take({L, d}));
  per_layer("self_attn.q_proj.weight", take({L, d, d}));
  per_layer("self_attn.k_proj.weight", take({L, kv, d}));
  per_layer("self_attn.v_proj.weight", take({L, kv, d}));
  per_layer("self_attn.o_proj.weight", take({L, d, d}));
  per_layer("post_attention_layernorm.weight", take({L, d}));
  per_layer("mlp.gate_proj.weight", take({L, f, d}));
  per_layer("mlp.down_proj.weight", take({L, d, f}));
  per_layer("mlp.up_proj.weight", take({L, f, d}));
  t["model.norm.weight"] = take({d});
  take({lay.seq_len * lay.head_dim()});  // legacy freq_cis_real/imag: skipped
  if (!lay.tied) t["lm_head.weight"] = take({lay.vocab_size, d});
  if (pos != lay.n_floats()) {
    return InternalError(file + ": llama2.c layout accounting is off");
  }
  LEDE_RETURN_IF_ERROR(internal::CheckTensors(c, t, file, nullptr));
  return ckpt;
}

Status WriteLlama2cCheckpointImpl(const std::string& file,
                                  const checkpoint::ModelConfig& config,
                                  const TensorMap& tensors) {
  LEDE_RETURN_IF_ERROR(config.Validate());
  // llama2.c v0 fixes these; writing anything else would change the model.
  if (std::abs(config.rms_norm_eps - 1e-5) > 1e-12 ||
      config.rope_theta != 10000.0 ||
      config.rope_scaling.type != checkpoint::RopeScaling::Type::kNone) {
    return InvalidArgumentError(
        file +
        ": llama2.c checkpoints require rms_norm_eps 1e-5, rope_theta "
        "10000 and no rope_scaling");
  }
  const int64_t h64[7] = {
      config.dim,        config.hidden_dim, config.n_layers,   config.n_heads,
      config.n_kv_heads, config.vocab_size, config.max_seq_len};
  LEDE_RETURN_IF_ERROR(CheckLlama2cHeader(file, h64));
  LEDE_RETURN_IF_ERROR(internal::CheckTensors(config, tensors, file, nullptr));

  int32_t header[7];
  for (int i = 0; i < 7; ++i) header[i] = static_cast<int32_t>(h64[i]);
  if (!config.tie_word_embeddings) header[5] = -header[5];

  LEDE_ASSIGN_OR_RETURN(std::unique_ptr<checkpoint::AtomicFile> out,
                        checkpoint::AtomicFile::Create(file));
  LEDE_RETURN_IF_ERROR(out->Append(header, sizeof(header)));
  auto write = [&](const std::string& name) -> Status {
    return internal::WriteTensorData(*out, internal::AsContiguous(tensors.at(name), at::kFloat));
  };
  auto write_layers = [&](const std::string& suffix) -> Status {
    for (int64_t i = 0; i < config.n_layers; ++i) {
      LEDE_RETURN_IF_ERROR(
          write("model.layers." + std::to_string(i) + "." + suffix));
    }
    return OkStatus();
  };
  LEDE_RETURN_IF_ERROR(write("model.embed_tokens.weight"));
  for (const char* suffix :
       {"input_layernorm.weight", "self_attn.q_proj.weight",
        "self_attn.k_proj.weight", "self_attn.v_proj.weight",
        "self_attn.o_proj.weight", "post_attention_layernorm.weight",
        "mlp.gate_proj.weight", "mlp.down_proj.weight", "mlp.up_proj.weight"}) {
    LEDE_RETURN_IF_ERROR(write_layers(suffix));
  }
  LEDE_RETURN_IF_ERROR(write("model.norm.weight"));
  // Legacy freq_cis_real and freq_cis_imag, [seq_len, head_dim/2] each.
  LEDE_RETURN_IF_ERROR(checkpoint::WriteZeros(*out, static_cast<size_t>(
      2 * config.max_seq_len * (config.head_dim() / 2) * sizeof(float))));
  if (!config.tie_word_embeddings)
    LEDE_RETURN_IF_ERROR(write("lm_head.weight"));
  return out->Commit();
}

}  // namespace

StatusOr<Checkpoint> LoadLlama2cCheckpoint(const std::string& file) {
  return TorchBoundary(file, [&] { return LoadLlama2cCheckpointImpl(file); });
}

Status WriteLlama2cCheckpoint(
    const std::string& file, const checkpoint::ModelConfig& config,
    const std::map<std::string, at::Tensor>& tensors) {
  return TorchBoundary(
      file, [&] { return WriteLlama2cCheckpointImpl(file, config, tensors); });
}

}  // namespace lede::model::loaders
