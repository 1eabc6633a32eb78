#include "shared/model/loaders/llama_tensors.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "shared/status/status_macros.h"

namespace lede::model::loaders {

std::string LayerTensorName(int64_t layer, const char* suffix) {
  return "model.layers." + std::to_string(layer) + "." + suffix;
}

StatusOr<at::Tensor> RequiredTensor(const Checkpoint& checkpoint, const std::string& name) {
  auto it = checkpoint.tensors.find(name);
  if (it == checkpoint.tensors.end()) {
    return InvalidArgumentError(checkpoint.source + ": missing tensor " + name);
  }
  return it->second;
}

at::Tensor Q8_0BlocksOf(const Checkpoint& checkpoint, const std::string& name) {
  auto it = checkpoint.q8_0_blocks.find(name);
  return it == checkpoint.q8_0_blocks.end() ? at::Tensor() : it->second;
}

at::Tensor ConcatQ8_0Blocks(const std::vector<at::Tensor>& parts) {
  for (const at::Tensor& b : parts) {
    if (!b.defined()) return at::Tensor();
  }
  return parts.size() == 1 ? parts[0] : at::cat(parts, 0);
}

StatusOr<LlamaLayerTensors> ReadLlamaLayer(const Checkpoint& checkpoint, int64_t layer) {
  const checkpoint::ModelConfig& c = checkpoint.config;
  auto name = [&](const char* suffix) { return LayerTensorName(layer, suffix); };
  LlamaLayerTensors l;
  LEDE_ASSIGN_OR_RETURN(l.wq, RequiredTensor(checkpoint, name("self_attn.q_proj.weight")));
  LEDE_ASSIGN_OR_RETURN(l.wk, RequiredTensor(checkpoint, name("self_attn.k_proj.weight")));
  LEDE_ASSIGN_OR_RETURN(l.wv, RequiredTensor(checkpoint, name("self_attn.v_proj.weight")));
  LEDE_ASSIGN_OR_RETURN(l.wo, RequiredTensor(checkpoint, name("self_attn.o_proj.weight")));
  LEDE_ASSIGN_OR_RETURN(l.w1, RequiredTensor(checkpoint, name("mlp.gate_proj.weight")));
  LEDE_ASSIGN_OR_RETURN(l.w3, RequiredTensor(checkpoint, name("mlp.up_proj.weight")));
  LEDE_ASSIGN_OR_RETURN(l.w2, RequiredTensor(checkpoint, name("mlp.down_proj.weight")));
  LEDE_ASSIGN_OR_RETURN(l.attn_norm, RequiredTensor(checkpoint, name("input_layernorm.weight")));
  LEDE_ASSIGN_OR_RETURN(l.ffn_norm, RequiredTensor(checkpoint, name("post_attention_layernorm.weight")));
  l.wq_blocks = Q8_0BlocksOf(checkpoint, name("self_attn.q_proj.weight"));
  l.wk_blocks = Q8_0BlocksOf(checkpoint, name("self_attn.k_proj.weight"));
  l.wv_blocks = Q8_0BlocksOf(checkpoint, name("self_attn.v_proj.weight"));
  l.wo_blocks = Q8_0BlocksOf(checkpoint, name("self_attn.o_proj.weight"));
  l.w1_blocks = Q8_0BlocksOf(checkpoint, name("mlp.gate_proj.weight"));
  l.w3_blocks = Q8_0BlocksOf(checkpoint, name("mlp.up_proj.weight"));
  l.w2_blocks = Q8_0BlocksOf(checkpoint, name("mlp.down_proj.weight"));
  if (c.rope_style == checkpoint::RopeStyle::kAdjacentPairs) {
    l.wq = PermuteRopeRows(l.wq, c.n_heads, /*to_rotate_half=*/true);
    l.wk = PermuteRopeRows(l.wk, c.n_kv_heads, /*to_rotate_half=*/true);
    if (!l.wq.defined() || !l.wk.defined()) {
      return InvalidArgumentError(checkpoint.source + ": layer " + std::to_string(layer) +
                                  " q/k projections cannot be permuted to rotate-half");
    }
    if (l.wq_blocks.defined()) l.wq_blocks = PermuteRopeRows(l.wq_blocks, c.n_heads, /*to_rotate_half=*/true);
    if (l.wk_blocks.defined()) l.wk_blocks = PermuteRopeRows(l.wk_blocks, c.n_kv_heads, /*to_rotate_half=*/true);
  }
  return l;
}

cpu::GgmlMatrix GgmlMatrixOf(const Checkpoint& checkpoint, WeightFormat weights, const std::vector<at::Tensor>& parts,
                             const std::vector<std::string>& names, const std::vector<TensorRole>& roles,
                             int64_t layer, const std::vector<int64_t>& heads) {
  const int64_t in = parts[0].size(1);
  cpu::GgmlMatrix g(in);
  for (size_t i = 0; i < parts.size(); ++i) {
    const checkpoint::GgmlType mix = LlamaCppTensorType(weights, roles[i], layer, checkpoint.config.n_layers, in);
    auto it = checkpoint.stored.find(names[i]);
    const checkpoint::GgufTensor* st = it == checkpoint.stored.end() ? nullptr : it->second;
    if (st != nullptr && cpu::GgmlPackable(st->type, in) && (weights == WeightFormat::kGguf || st->type == mix) &&
        st->ne.size() == 2 && st->ne[1] == parts[i].size(0)) {
      const int64_t rows = st->ne[1];
      at::Tensor blocks = at::from_blob(const_cast<uint8_t*>(st->data),
                                        {rows, static_cast<int64_t>(st->nbytes) / rows},
                                        at::TensorOptions().dtype(at::kByte));
      if (heads[i] > 0) blocks = PermuteRopeRows(blocks, heads[i], /*to_rotate_half=*/true);
      blocks = blocks.contiguous();
      TORCH_CHECK(g.AppendBlocks(st->type, blocks.data_ptr<uint8_t>(), rows), names[i], ": cannot keep its ",
                  checkpoint::GgmlTypeName(st->type), " blocks");
    } else {
      at::Tensor rows = parts[i].to(at::kCPU, at::kFloat).contiguous();
      TORCH_CHECK(g.AppendQuantized(mix, rows.data_ptr<float>(), rows.size(0)), names[i],
                  ": cannot quantize to ", checkpoint::GgmlTypeName(mix));
    }
  }
  return g;
}

}  // namespace lede::model::loaders
