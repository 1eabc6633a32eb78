// File: shared/model/checkpoint_gguf.cc
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
#include "shared/model/checkpoint.h"
#include "shared/model/internal/checkpoint_internal.h"
#include "shared/status/status_macros.h"

namespace lede::model {
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
  bool all_bf16 = true, all_q8 = true;
  for (const auto& [name, t] : ckpt.stored) {
    const bool is_matrix = name != "model.embed_tokens.weight" && t->ne.size() == 2;
    const bool is_head = name == (ckpt.config.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
    if (!is_matrix && !is_head) continue;
    all_bf16 = all_bf16 && t->type == GgmlType::kBF16;
    all_q8 = all_q8 && t->type == GgmlType::kQ8_0;
  }
  ckpt.storage = all_q8 ? WeightFormat::kQ8_0 : all_bf16 ? WeightFormat::kBf16 : WeightFormat::kF32;
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

Status WriteGgufCheckpointImpl(const std::string& path, const checkpoint::ModelConfig& config, const TensorMap& tensors,
                               GgmlType weights, checkpoint::GgufWriter* writer) {
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
    // a multiple of 32 cannot be Q8_0 and stays F32 too.
    GgmlType type = weights;
    if (t.dim() == 1 || (type == GgmlType::kQ8_0 && t.size(-1) % checkpoint::kQ8_0BlockValues != 0)) {
      type = GgmlType::kF32;
    }
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
  return TorchBoundary(path, [&] { return WriteGgufCheckpointImpl(path, config, tensors, weights, writer); });
}

}  // namespace lede::model
