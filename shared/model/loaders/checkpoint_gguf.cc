// File: shared/model/loaders/checkpoint_gguf.cc
//
// GGUF checkpoints (LoadGgufCheckpoint, WriteGgufCheckpoint in
// checkpoint.h) over the torch-free shared/checkpoint/gguf.h. Reading: F32
// tensors are wrapped in place (zero copy); F16, BF16 and Q8_0 are widened to
// float32 (the eager reference's weights); Q8_0 matrices also go to
// Checkpoint::q8_0_blocks as they are (zero copy) and Checkpoint::storage
// says the file's format, which --weights auto keeps; Checkpoint::stored
// keeps every tensor's bytes as the file has them. Q/K rows stay in the file's order
// (llama.cpp's adjacent-pair RoPE order, config.rope_style =
// kAdjacentPairs); LlamaModel::FromCheckpoint permutes them, as for llama2.c.
#include <ATen/ATen.h>

#include <filesystem>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "shared/checkpoint/gguf.h"
#include "shared/model/loaders/checkpoint.h"
#include "shared/model/loaders/internal/checkpoint_internal.h"
#include "shared/status/status_macros.h"

namespace lede::model::loaders {
namespace {

using checkpoint::GgmlType;
using checkpoint::GgufFile;
using checkpoint::GgufTensor;
using internal::TensorMap;

StatusOr<Checkpoint> LoadGgufCheckpointImpl(const std::string& path) {
  LEDE_ASSIGN_OR_RETURN(std::shared_ptr<const GgufFile> file, GgufFile::Open(path));
  Checkpoint ckpt;
  ckpt.source = path;
  LEDE_ASSIGN_OR_RETURN(ckpt.config, checkpoint::GgufLlamaConfig(*file));
  ckpt.gguf = file;
  const std::shared_ptr<const void> owner = file;
  for (const GgufTensor& t : file->tensors()) {
    const std::string name = checkpoint::GgufToHfName(t.name);
    if (name.empty()) continue;  // not a llama weight this engine uses
    if (name == "lm_head.weight" && ckpt.config.tie_word_embeddings) continue;
    at::Tensor tensor;
    if (t.type == GgmlType::kF32) {
      tensor = internal::TensorFromMapping(owner, t.data, t.shape(), at::kFloat);
    } else {
      tensor = at::empty(t.shape(), at::kFloat);
      LEDE_RETURN_IF_ERROR(checkpoint::DequantizeToF32(t, tensor.data_ptr<float>()));
    }
    if (t.type == GgmlType::kQ8_0 && t.ne.size() == 2) {
      // The blocks as they are, [rows, in / 32 * 34] bytes, zero copy (the
      // deleter keeps the mapping); q/k rows in the file's order, permuted
      // with the float32 rows by LlamaModel (config.rope_style).
      const int64_t row_bytes = static_cast<int64_t>(t.nbytes) / t.ne[1];
      std::shared_ptr<const void> keep = owner;
      ckpt.q8_0_blocks[name] = at::from_blob(
          const_cast<uint8_t*>(t.data), {t.ne[1], row_bytes}, [keep](void*) mutable { keep.reset(); },
          at::TensorOptions().dtype(at::kByte));
    }
    ckpt.tensors[name] = std::move(tensor);
    ckpt.stored[name] = &t;
  }
  LEDE_RETURN_IF_ERROR(internal::CheckTensors(ckpt.config, ckpt.tensors, path, nullptr));
  // The file's storage, which --weights auto keeps: every matrix the fused
  // path multiplies by (projections, and the head or the tied embedding).
  // A file with any other ggml block type (Q4_0, Q4_K_M, ...) keeps its
  // blocks as they are (kGguf, cpu_ggml_kernels.h).
  bool all_bf16 = true, all_q8 = true, any_block = false;
  for (const auto& [name, t] : ckpt.stored) {
    const bool is_matrix = name != "model.embed_tokens.weight" && t->ne.size() == 2;
    const bool is_head = name == (ckpt.config.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
    if (!is_matrix && !is_head) continue;
    all_bf16 = all_bf16 && t->type == GgmlType::kBF16;
    all_q8 = all_q8 && t->type == GgmlType::kQ8_0;
    any_block = any_block || (checkpoint::IsQuantizedGgmlType(t->type) && t->type != GgmlType::kQ8_0);
  }
  ckpt.storage = any_block ? WeightFormat::kGguf
                 : all_q8  ? WeightFormat::kQ8_0
                 : all_bf16 ? WeightFormat::kBf16
                            : WeightFormat::kF32;
  return ckpt;
}

bool IsRopeProjection(const std::string& hf_name, bool* is_q) {
  auto ends = [&](const char* s) {
    const std::string suffix(s);
    return hf_name.size() >= suffix.size() && hf_name.compare(hf_name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  *is_q = ends("self_attn.q_proj.weight");
  return *is_q || ends("self_attn.k_proj.weight");
}

// The llama.cpp role and layer of a matrix by its HF name (layer -1 and
// false for a norm).
bool MatrixRole(const std::string& hf, bool tied, TensorRole* role, int64_t* layer) {
  *layer = -1;
  if (hf == "lm_head.weight") return *role = TensorRole::kOutput, true;
  if (hf == "model.embed_tokens.weight") return *role = tied ? TensorRole::kOutput : TensorRole::kTokenEmbd, true;
  const std::string prefix = "model.layers.";
  if (hf.compare(0, prefix.size(), prefix) != 0) return false;
  const size_t dot = hf.find('.', prefix.size());
  if (dot == std::string::npos) return false;
  *layer = std::stoll(hf.substr(prefix.size(), dot - prefix.size()));
  const std::string rest = hf.substr(dot + 1);
  const std::pair<const char*, TensorRole> roles[] = {
      {"self_attn.q_proj.weight", TensorRole::kAttnQ}, {"self_attn.k_proj.weight", TensorRole::kAttnK},
      {"self_attn.v_proj.weight", TensorRole::kAttnV}, {"self_attn.o_proj.weight", TensorRole::kAttnO},
      {"mlp.gate_proj.weight", TensorRole::kFfnGate},  {"mlp.up_proj.weight", TensorRole::kFfnUp},
      {"mlp.down_proj.weight", TensorRole::kFfnDown}};
  for (const auto& [name, r] : roles) {
    if (rest == name) return *role = r, true;
  }
  return false;
}

// The stored type of a tensor: one type for every matrix (`weights`, F32
// where Q8_0 cannot hold the rows), or llama.cpp's mix (`mix` a ggml
// WeightFormat). Norms stay F32.
GgmlType ExportType(const std::string& hf, const at::Tensor& t, const checkpoint::ModelConfig& config, GgmlType weights,
                    WeightFormat mix) {
  if (t.dim() == 1) return GgmlType::kF32;
  if (IsGgmlWeightFormat(mix)) {
    TensorRole role;
    int64_t layer;
    if (!MatrixRole(hf, config.tie_word_embeddings, &role, &layer)) return GgmlType::kF32;
    return LlamaCppTensorType(mix, role, layer, config.n_layers, t.size(-1));
  }
  if (t.size(-1) % checkpoint::GgmlBlockValues(weights) != 0) return GgmlType::kF32;
  return weights;
}

Status WriteGgufCheckpointImpl(const std::string& path, const checkpoint::ModelConfig& config, const TensorMap& tensors,
                               GgmlType weights, WeightFormat mix, checkpoint::GgufWriter* writer) {
  LEDE_RETURN_IF_ERROR(config.Validate());
  LEDE_RETURN_IF_ERROR(internal::CheckTensors(config, tensors, path, nullptr));
  std::string name = std::filesystem::path(path).stem().string();
  LEDE_RETURN_IF_ERROR(checkpoint::AddLlamaMetadata(config, name, writer));
  // The order llama.cpp's converter writes: embedding, the blocks, the final
  // norm and the head.
  std::vector<std::string> order = {"model.embed_tokens.weight"};
  for (int64_t i = 0; i < config.n_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    for (const char* s : {"input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                          "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
                          "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"}) {
      order.push_back(p + s);
    }
  }
  order.push_back("model.norm.weight");
  if (!config.tie_word_embeddings) order.push_back("lm_head.weight");
  std::list<std::vector<uint8_t>> keep;  // the writer borrows the bytes
  for (const std::string& hf : order) {
    at::Tensor t = internal::AsContiguous(tensors.at(hf), at::kFloat);
    bool is_q = false;
    if (IsRopeProjection(hf, &is_q) && config.rope_style == checkpoint::RopeStyle::kRotateHalf) {
      // llama.cpp's row order: rotate-half rows (i, i + hd/2) become adjacent
      // pairs (2i, 2i + 1) within each head.
      t = PermuteRopeRows(t, is_q ? config.n_heads : config.n_kv_heads, /*to_rotate_half=*/false);
      if (!t.defined()) return InvalidArgumentError(path + ": cannot permute " + hf + " to llama.cpp's row order");
    }
    // Norms stay F32 (as llama.cpp writes them); a matrix whose rows are not
    // a multiple of its type's block stays F32 too.
    const GgmlType type = ExportType(hf, t, config, weights, mix);
    LEDE_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes,
                          checkpoint::QuantizeFromF32(t.data_ptr<float>(), t.numel(), type));
    keep.push_back(std::move(bytes));
    LEDE_RETURN_IF_ERROR(writer->AddTensor(checkpoint::HfToGgufName(hf), type, t.sizes().vec(), keep.back().data(),
                                           keep.back().size()));
  }
  return writer->Write(path);
}

}  // namespace

StatusOr<Checkpoint> LoadGgufCheckpoint(const std::string& path) {
  return TorchBoundary(path, [&] { return LoadGgufCheckpointImpl(path); });
}

Status WriteGgufCheckpoint(const std::string& path, const checkpoint::ModelConfig& config,
                           const std::map<std::string, at::Tensor>& tensors, checkpoint::GgmlType weights,
                           checkpoint::GgufWriter* writer) {
  return TorchBoundary(path, [&] {
    return WriteGgufCheckpointImpl(path, config, tensors, weights, WeightFormat::kAuto, writer);
  });
}

Status WriteGgufCheckpoint(const std::string& path, const checkpoint::ModelConfig& config,
                           const std::map<std::string, at::Tensor>& tensors, WeightFormat mix,
                           checkpoint::GgufWriter* writer) {
  if (!IsGgmlWeightFormat(mix) || mix == WeightFormat::kGguf) {
    return InvalidArgumentError(std::string("weights: ") + WeightFormatName(mix) + " is not a llama.cpp mix (q4_0, q4_k_m)");
  }
  return TorchBoundary(path, [&] {
    return WriteGgufCheckpointImpl(path, config, tensors, GgmlType::kF32, mix, writer);
  });
}

}  // namespace lede::model::loaders
