// File: shared/model/loaders/llama_tensors.h
//
// The checkpoint side of LlamaModel::FromCheckpoint (llama_weights.cc): the
// tensors of one decoder layer under their Hugging Face names, rotated to
// rotate-half RoPE when the file stores adjacent pairs, and a matrix in
// ggml blocks built from what the file stores (docs/design.md §5). The model
// side (rounding, packing, which matrices stay packed only) is LlamaModel's.
// The tensors returned share the checkpoint's storage: never write into
// them. Stateless; safe to call from any thread.
#ifndef LEDE_SHARED_MODEL_LOADERS_LLAMA_TENSORS_H_
#define LEDE_SHARED_MODEL_LOADERS_LLAMA_TENSORS_H_

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "shared/model/cpu/cpu_ggml_kernels.h"
#include "shared/model/loaders/checkpoint.h"
#include "shared/model/loaders/weight_format.h"
#include "shared/status/status.h"

namespace lede::model::loaders {

// "model.layers.<layer>.<suffix>", e.g. LayerTensorName(0, "mlp.up_proj.weight").
std::string LayerTensorName(int64_t layer, const char* suffix);

// The tensor `name` of the checkpoint; kInvalidArgument
// "<source>: missing tensor <name>" when it lacks it.
StatusOr<at::Tensor> RequiredTensor(const Checkpoint& checkpoint, const std::string& name);

// The file's own Q8_0 blocks of tensor `name` (Checkpoint::q8_0_blocks:
// uint8 [rows, in / 32 * 34]), or an undefined tensor.
at::Tensor Q8_0BlocksOf(const Checkpoint& checkpoint, const std::string& name);

// The Q8_0 blocks of a matrix whose rows are those of several tensors:
// `parts` concatenated along rows, or undefined unless every part is defined.
at::Tensor ConcatQ8_0Blocks(const std::vector<at::Tensor>& parts);

// One decoder layer as the checkpoint holds it (its dtypes, CPU), shapes as
// in checkpoint.h: wq [H*hd, d], wk / wv [Hkv*hd, d], wo [d, H*hd],
// w1 / w3 [hidden, d], w2 [d, hidden], attn_norm / ffn_norm [d]. The *_blocks
// are each matrix's Q8_0 blocks (Q8_0BlocksOf) or undefined. When the
// checkpoint's rope_style is kAdjacentPairs, wq / wk and their blocks are
// permuted to rotate-half (PermuteRopeRows).
struct LlamaLayerTensors {
  at::Tensor wq, wk, wv, wo, w1, w3, w2, attn_norm, ffn_norm;
  at::Tensor wq_blocks, wk_blocks, wv_blocks, wo_blocks, w1_blocks, w3_blocks, w2_blocks;
};

// Layer `layer`'s tensors. kInvalidArgument naming the first one missing (in
// the order q, k, v, o, gate, up, down, input norm, post-attention norm), or
// the layer when q / k cannot be permuted.
StatusOr<LlamaLayerTensors> ReadLlamaLayer(const Checkpoint& checkpoint, int64_t layer);

// The matrix whose rows are those of `parts` ([rows_i, in], any float
// dtype; checkpoint names `names`, llama.cpp roles `roles`, layer `layer`
// (n_layers for the head); `heads`: the q / k head count of a part whose
// rows ReadLlamaLayer permuted to rotate-half, else 0) in ggml blocks for
// `weights` (kQ4_0 / kQ4_K_M / kGguf, weight_format.h): a part the file
// stores in a block type is kept as it is (kGguf: any type; kQ4_0 / kQ4_K_M:
// the type their mix gives it), the rest is quantized to the mix's type
// (LlamaCppTensorType). c10::Error when a part's blocks cannot be kept or
// quantized; callers run under TorchBoundary.
cpu::GgmlMatrix GgmlMatrixOf(const Checkpoint& checkpoint, WeightFormat weights, const std::vector<at::Tensor>& parts,
                             const std::vector<std::string>& names, const std::vector<TensorRole>& roles,
                             int64_t layer, const std::vector<int64_t>& heads);

}  // namespace lede::model::loaders

#endif  // LEDE_SHARED_MODEL_LOADERS_LLAMA_TENSORS_H_
