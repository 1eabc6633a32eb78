#include "shared/model/llama.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "shared/checkpoint/mapped_file.h"
#include "shared/model/cpu/cpu_kernels.h"
#include "shared/model/cpu/cpu_quant_kernels.h"
#include "shared/model/loaders/llama_tensors.h"
#include "shared/model/torch_boundary.h"
#include "shared/status/status_macros.h"

// LlamaModel's weights: how each matrix is stored (rounded, packed, packed
// only, in ggml blocks) and loading them from a checkpoint
// (loaders/llama_tensors.h reads the checkpoint's side).
namespace lede::model {

namespace {
// at::Tensor::_version(), or 0 for an inference tensor (made under
// c10::InferenceMode), which has no version counter and cannot be trained.
int64_t WeightVersion(const at::Tensor& w) { return w.is_inference() ? 0 : w._version(); }
}  // namespace

const LlamaModel::PackedWeight* LlamaModel::PackedOrNull(const at::Tensor& w, const PackedWeight& p) {
  if (p.bytes() == 0) return nullptr;
  if (!w.defined()) return &p;  // packed only: the weight itself
  return WeightVersion(w) == p.version ? &p : nullptr;
}

namespace {
// Drops the resident pages of a checkpoint tensor that a packed-only matrix
// was made from, when it lies in a file mapping (checkpoint::ReleaseMappedPages).
void ReleaseSource(const at::Tensor& t) {
  if (t.defined() && t.device().is_cpu() && t.is_contiguous()) {
    checkpoint::ReleaseMappedPages(t.data_ptr(), static_cast<size_t>(t.nbytes()));
  }
}
int64_t TensorBytes(const at::Tensor& t) {
  return t.defined() ? static_cast<int64_t>(t.numel() * t.element_size()) : 0;
}
}  // namespace

bool LlamaModel::PackedOnly(int64_t in) const {
  if (!fused_ || options_.writable_weights) return false;
  return (weights_ == loaders::WeightFormat::kBf16 && cpu::Packable(in)) ||
         (weights_ == loaders::WeightFormat::kQ8_0 && cpu::Q8Packable(in)) ||
         (loaders::IsGgmlWeightFormat(weights_) && in % 32 == 0);
}

void LlamaModel::PackParts(const std::vector<at::Tensor>& parts, const at::Tensor& q8_0_blocks,
                           PackedWeight* p) const {
  const int64_t in = parts[0].size(1);
  int64_t out = 0;
  for (const at::Tensor& t : parts) {
    TORCH_CHECK(t.dim() == 2 && t.size(1) == in, "matrix parts must be [rows, ", in, "]");
    out += t.size(0);
  }
  p->format = weights_;
  p->rows = out;
  p->in = in;
  p->version = 0;
  if (weights_ == loaders::WeightFormat::kQ8_0 && q8_0_blocks.defined()) {  // the file's own blocks, as they are
    const int64_t nb = in / cpu::kQ8Block;
    TORCH_CHECK(q8_0_blocks.scalar_type() == at::kByte && q8_0_blocks.dim() == 2 && q8_0_blocks.size(0) == out &&
                    q8_0_blocks.size(1) == nb * static_cast<int64_t>(sizeof(cpu::BlockQ8_0)),
                "q8_0 blocks of a [", out, ", ", in, "] matrix must be uint8 [", out, ", ", nb * 34, "]");
    at::Tensor blocks = q8_0_blocks.contiguous();
    p->q8.resize(cpu::PackedQ8_0Bytes(out, in));
    cpu::PackRowsQ8_0(reinterpret_cast<const cpu::BlockQ8_0*>(blocks.data_ptr()), out, in, p->q8.data());
    return;
  }
  bool all_bf16 = true;
  for (const at::Tensor& t : parts) all_bf16 = all_bf16 && t.scalar_type() == at::kBFloat16;
  if (weights_ == loaders::WeightFormat::kBf16) {
    p->bf16.resize(static_cast<size_t>(cpu::PackedRowsPadded(out) * in));
  } else {
    p->q8.resize(cpu::PackedQ8_0Bytes(out, in));
  }
  // Chunks of kChunk rows (a multiple of 4: each chunk is the packed layout
  // of its rows), converted through a buffer of the chunk only. On the
  // calling thread: at::parallel_for here took the 1B smoke checkpoint's
  // load from 13 s to 190 s on this busy 2-core VM (2 threads spinning at
  // each matrix's join while the other was descheduled).
  constexpr int64_t kChunk = 64;
  const int64_t n_chunks = (out + kChunk - 1) / kChunk;
  auto pack_chunks = [&](int64_t c0, int64_t c1) {
    const bool raw_bf16 = weights_ == loaders::WeightFormat::kBf16 && all_bf16;
    at::Tensor buf = at::empty({kChunk, in}, raw_bf16 ? at::kBFloat16 : at::kFloat);
    std::vector<cpu::BlockQ8_0> blocks;
    if (weights_ == loaders::WeightFormat::kQ8_0) blocks.resize(static_cast<size_t>(kChunk * in / cpu::kQ8Block));
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t r0 = c * kChunk, n = std::min(kChunk, out - r0);
      // Rows [r0, r0 + n) of the concatenation, from the parts they lie in.
      int64_t part_begin = 0, filled = 0;
      for (const at::Tensor& t : parts) {
        const int64_t part_end = part_begin + t.size(0);
        const int64_t a = std::max(r0, part_begin), b = std::min(r0 + n, part_end);
        if (a < b) {
          const at::Tensor rows = t.narrow(0, a - part_begin, b - a);
          buf.narrow(0, filled, b - a).copy_(rows);
          ReleaseSource(rows);  // its pages in a file mapping stop counting as resident
          filled += b - a;
        }
        part_begin = part_end;
      }
      if (raw_bf16) {
        cpu::PackRowsBf16FromBf16(reinterpret_cast<const uint16_t*>(buf.data_ptr()), n, in,
                                  p->bf16.data() + cpu::PackedBf16Offset(r0, in));
      } else if (weights_ == loaders::WeightFormat::kBf16) {
        cpu::PackRowsBf16(buf.data_ptr<float>(), n, in, p->bf16.data() + cpu::PackedBf16Offset(r0, in));
      } else {
        cpu::QuantizeRowsQ8_0(buf.data_ptr<float>(), n, in, blocks.data());
        cpu::PackRowsQ8_0(blocks.data(), n, in, p->q8.data() + cpu::PackedQ8_0Offset(r0, in));
      }
    }
  };
  pack_chunks(0, n_chunks);
}

at::Tensor LlamaModel::Dense(const at::Tensor& w, const PackedWeight& p, bool keep) const {
  if (w.defined()) return w;
  std::lock_guard<std::mutex> lock(dense_mu_);
  if (p.dense.defined()) return p.dense;
  TORCH_CHECK(p.bytes() > 0, "a matrix has neither a tensor nor a packed form");
  at::Tensor t = at::empty({p.rows, p.in}, at::kFloat);
  if (p.format == loaders::WeightFormat::kBf16) {
    cpu::UnpackRowsBf16(p.bf16.data(), p.in, 0, p.rows, t.data_ptr<float>());
  } else if (loaders::IsGgmlWeightFormat(p.format)) {
    cpu::UnpackRowsGgml(p.gg, 0, p.rows, t.data_ptr<float>());
  } else {
    cpu::UnpackRowsQ8_0(p.q8.data(), p.in, 0, p.rows, t.data_ptr<float>());
  }
  if (keep) p.dense = t;
  return t;
}

int64_t LlamaModel::resident_weight_bytes() const {
  std::lock_guard<std::mutex> lock(dense_mu_);
  auto matrix = [](const at::Tensor& w, const PackedWeight& p) {
    return TensorBytes(w) + p.bytes() + TensorBytes(p.dense);
  };
  int64_t total = TensorBytes(final_norm_) + matrix(lm_head_, lm_head_packed_);
  const bool shared = embed_.defined() && lm_head_.defined() && embed_.is_alias_of(lm_head_);
  if (!shared) total += TensorBytes(embed_);
  for (const Layer& l : layers_) {
    total += TensorBytes(l.attn_norm) + TensorBytes(l.ffn_norm) + matrix(l.wqkv, l.wqkv_packed) +
             matrix(l.wo, l.wo_packed) + matrix(l.w13, l.w13_packed) + matrix(l.w2, l.w2_packed);
  }
  return total;
}

int64_t LlamaModel::packed_weight_bytes() const {
  auto bytes = [](const at::Tensor& w, const PackedWeight& p) {
    return p.bytes() > 0 ? p.bytes() : static_cast<int64_t>(w.numel() * w.element_size());
  };
  int64_t total = bytes(lm_head_, lm_head_packed_);
  for (const Layer& l : layers_) {
    total += bytes(l.wqkv, l.wqkv_packed) + bytes(l.wo, l.wo_packed) + bytes(l.w13, l.w13_packed) +
             bytes(l.w2, l.w2_packed);
  }
  return total;
}

void LlamaModel::StoreMatrix(at::Tensor* w, const at::Tensor& q8_0_blocks, PackedWeight* p) const {
  const int64_t out = w->size(0), in = w->size(1);
  if (weights_ == loaders::WeightFormat::kBf16 && cpu::Packable(in)) {
    *w = w->to(at::kBFloat16).to(w->scalar_type()).contiguous();  // round to nearest even
    if (!fused_) return;
    at::Tensor cpu_w = w->to(at::kCPU, at::kFloat).contiguous();
    p->bf16.resize(static_cast<size_t>(cpu::PackedRowsPadded(out) * in));
    cpu::PackRowsBf16(cpu_w.data_ptr<float>(), out, in, p->bf16.data());
  } else if (weights_ == loaders::WeightFormat::kQ8_0 && cpu::Q8Packable(in)) {
    const int64_t nb = in / cpu::kQ8Block;
    at::Tensor blocks = q8_0_blocks;
    if (!blocks.defined()) {
      at::Tensor cpu_w = w->to(at::kCPU, at::kFloat).contiguous();
      blocks = at::empty({out, nb * static_cast<int64_t>(sizeof(cpu::BlockQ8_0))}, at::kByte);
      cpu::QuantizeRowsQ8_0(cpu_w.data_ptr<float>(), out, in, reinterpret_cast<cpu::BlockQ8_0*>(blocks.data_ptr()));
    }
    TORCH_CHECK(blocks.scalar_type() == at::kByte && blocks.dim() == 2 && blocks.size(0) == out &&
                    blocks.size(1) == nb * static_cast<int64_t>(sizeof(cpu::BlockQ8_0)),
                "q8_0 blocks of a [", out, ", ", in, "] matrix must be uint8 [", out, ", ", nb * 34, "]");
    blocks = blocks.contiguous();
    const auto* b = reinterpret_cast<const cpu::BlockQ8_0*>(blocks.data_ptr());
    at::Tensor values = at::empty({out, in}, at::kFloat);
    cpu::DequantizeRowsQ8_0(b, out, in, values.data_ptr<float>());
    *w = values.to(w->options()).contiguous();
    if (!fused_) return;
    p->q8.resize(cpu::PackedQ8_0Bytes(out, in));
    cpu::PackRowsQ8_0(b, out, in, p->q8.data());
  } else {
    return;  // float32: PackWeights
  }
  p->format = weights_;
  p->version = WeightVersion(*w);
}

void LlamaModel::PackWeights() {
  auto pack = [](const at::Tensor& w, PackedWeight* p) {
    if (p->bytes() > 0) return;  // packed in another format by StoreMatrix, or packed only
    const int64_t out = w.size(0), in = w.size(1);
    if (!w.is_contiguous() || w.scalar_type() != at::kFloat || !cpu::Packable(in)) return;
    p->format = loaders::WeightFormat::kF32;
    p->data.resize(static_cast<size_t>(out * in));
    cpu::PackRows(w.data_ptr<float>(), out, in, p->data.data());
    p->version = WeightVersion(w);
  };
  for (Layer& l : layers_) {
    pack(l.wqkv, &l.wqkv_packed);
    pack(l.wo, &l.wo_packed);
    pack(l.w13, &l.w13_packed);
    pack(l.w2, &l.w2_packed);
  }
  pack(lm_head_, &lm_head_packed_);
}

void LlamaModel::StoreParts(const std::vector<at::Tensor>& parts, const at::Tensor& q8_0_blocks,
                            const at::TensorOptions& opts, bool copy, at::Tensor* w, PackedWeight* p) const {
  if (PackedOnly(parts[0].size(1))) {
    PackParts(parts, q8_0_blocks, p);
    *w = at::Tensor();
    return;
  }
  *w = parts.size() == 1 ? parts[0].to(opts, /*non_blocking=*/false, copy).contiguous()
                         : at::cat(parts, 0).to(opts).contiguous();
  StoreMatrix(w, q8_0_blocks, p);
}

void LlamaModel::StoreGgml(cpu::GgmlMatrix g, const at::TensorOptions& opts, at::Tensor* w, PackedWeight* p) const {
  const int64_t rows = g.rows(), in = g.in();
  if (PackedOnly(in)) {
    *w = at::Tensor();
    p->version = 0;
  } else {
    at::Tensor values = at::empty({rows, in}, at::kFloat);
    cpu::UnpackRowsGgml(g, 0, rows, values.data_ptr<float>());
    *w = values.to(opts).contiguous();
    p->version = WeightVersion(*w);
    if (!fused_) return;  // the eager path reads *w
  }
  p->format = weights_;
  p->rows = rows;
  p->in = in;
  p->gg = std::move(g);
}

Status LlamaModel::LoadEmbedding(const loaders::Checkpoint& checkpoint, const at::TensorOptions& opts, bool copy) {
  const checkpoint::ModelConfig& c = checkpoint.config;
  LEDE_ASSIGN_OR_RETURN(at::Tensor embed, loaders::RequiredTensor(checkpoint, "model.embed_tokens.weight"));
  LEDE_ASSIGN_OR_RETURN(at::Tensor norm, loaders::RequiredTensor(checkpoint, "model.norm.weight"));
  final_norm_ = norm.to(opts, /*non_blocking=*/false, copy);
  if (!c.tie_word_embeddings) {
    // Checked here, before any layer: LoadHead reads it last.
    LEDE_RETURN_IF_ERROR(loaders::RequiredTensor(checkpoint, "lm_head.weight").status());
  }
  if (c.tie_word_embeddings && PackedOnly(c.dim)) {
    // embed_ stays undefined: Embed reads the packed head's rows.
  } else if (!c.tie_word_embeddings && PackedOnly(c.dim) && !copy &&
             (embed.scalar_type() == at::kBFloat16 || embed.scalar_type() == at::kHalf)) {
    embed_ = embed.contiguous();  // the file's dtype, in its mapping: rows are read per token
  } else {
    embed_ = embed.to(opts, /*non_blocking=*/false, copy);
  }
  return OkStatus();
}

Status LlamaModel::LoadLayer(const loaders::Checkpoint& checkpoint, int64_t i, const at::TensorOptions& opts,
                             bool copy) {
  const checkpoint::ModelConfig& c = checkpoint.config;
  LEDE_ASSIGN_OR_RETURN(loaders::LlamaLayerTensors t, loaders::ReadLlamaLayer(checkpoint, i));
  Layer layer;
  layer.attn_norm = t.attn_norm.to(opts, /*non_blocking=*/false, copy);
  layer.ffn_norm = t.ffn_norm.to(opts, /*non_blocking=*/false, copy);
  // Each matrix in ggml blocks (kQ4_0 / kQ4_K_M / kGguf, rows a multiple
  // of 32) or as StoreParts stores it.
  auto put = [&](const std::vector<at::Tensor>& parts, const std::vector<const char*>& names,
                 const std::vector<loaders::TensorRole>& roles, const std::vector<int64_t>& heads,
                 const at::Tensor& q8_0_blocks, at::Tensor* w, PackedWeight* p) {
    if (loaders::IsGgmlWeightFormat(weights_) && parts[0].size(1) % 32 == 0) {
      std::vector<std::string> full;
      for (const char* n : names) full.push_back(loaders::LayerTensorName(i, n));
      StoreGgml(loaders::GgmlMatrixOf(checkpoint, weights_, parts, full, roles, i, heads), opts, w, p);
    } else {
      StoreParts(parts, q8_0_blocks, opts, copy, w, p);
    }
  };
  using loaders::TensorRole;
  const bool adjacent = c.rope_style == checkpoint::RopeStyle::kAdjacentPairs;
  const int64_t hq = adjacent ? c.n_heads : 0, hk = adjacent ? c.n_kv_heads : 0;
  put({t.wq, t.wk, t.wv}, {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"},
      {TensorRole::kAttnQ, TensorRole::kAttnK, TensorRole::kAttnV}, {hq, hk, 0},
      loaders::ConcatQ8_0Blocks({t.wq_blocks, t.wk_blocks, t.wv_blocks}), &layer.wqkv, &layer.wqkv_packed);
  put({t.wo}, {"self_attn.o_proj.weight"}, {TensorRole::kAttnO}, {0}, t.wo_blocks, &layer.wo, &layer.wo_packed);
  put({t.w1, t.w3}, {"mlp.gate_proj.weight", "mlp.up_proj.weight"}, {TensorRole::kFfnGate, TensorRole::kFfnUp},
      {0, 0}, loaders::ConcatQ8_0Blocks({t.w1_blocks, t.w3_blocks}), &layer.w13, &layer.w13_packed);
  put({t.w2}, {"mlp.down_proj.weight"}, {TensorRole::kFfnDown}, {0}, t.w2_blocks, &layer.w2, &layer.w2_packed);
  for (const char* name : {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                           "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                           "mlp.down_proj.weight"}) {
    const at::Tensor& source = checkpoint.tensors.at(loaders::LayerTensorName(i, name));
    if (PackedOnly(source.size(1))) ReleaseSource(source);
  }
  layers_.push_back(std::move(layer));
  return OkStatus();
}

Status LlamaModel::LoadHead(const loaders::Checkpoint& checkpoint, const at::TensorOptions& opts, bool copy) {
  const checkpoint::ModelConfig& c = checkpoint.config;
  const std::string head_name = c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
  LEDE_ASSIGN_OR_RETURN(at::Tensor head, loaders::RequiredTensor(checkpoint, head_name));
  const at::Tensor head_blocks = loaders::Q8_0BlocksOf(checkpoint, head_name);
  const bool head_packed_only = PackedOnly(c.dim);
  if (loaders::IsGgmlWeightFormat(weights_) && c.dim % 32 == 0) {
    // The head in ggml blocks (Q6_K in llama.cpp's mixes); a tied
    // embedding then reads the same values.
    StoreGgml(loaders::GgmlMatrixOf(checkpoint, weights_, {head}, {head_name}, {loaders::TensorRole::kOutput},
                                    c.n_layers, {0}),
              opts, &lm_head_, &lm_head_packed_);
    if (head_packed_only) {
      ReleaseSource(head);
    } else {
      embed_ = embed_.contiguous();
      if (c.tie_word_embeddings) embed_ = lm_head_;
    }
  } else if (head_packed_only) {
    PackParts({head}, head_blocks, &lm_head_packed_);
    ReleaseSource(head);
  } else {
    // The fused path reads rows of these directly (no-ops when contiguous).
    embed_ = embed_.contiguous();
    lm_head_ = c.tie_word_embeddings ? embed_ : head.to(opts, /*non_blocking=*/false, copy).contiguous();
    StoreMatrix(&lm_head_, head_blocks, &lm_head_packed_);
    if (c.tie_word_embeddings) embed_ = lm_head_;  // one matrix: the lookup reads the stored values too
  }
  return OkStatus();
}

StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::FromCheckpoint(const loaders::Checkpoint& checkpoint,
                                                                 const ModelOptions& options) {
  const checkpoint::ModelConfig& c = checkpoint.config;
  LEDE_RETURN_IF_ERROR(c.Validate());
  return TorchBoundary(checkpoint.source, [&]() -> StatusOr<std::unique_ptr<LlamaModel>> {
    std::unique_ptr<LlamaModel> m(new LlamaModel(c, options));
    m->config_.rope_style = checkpoint::RopeStyle::kRotateHalf;  // loaders::ReadLlamaLayer permutes q / k
    m->weights_ = options.weights == loaders::WeightFormat::kAuto ? checkpoint.storage : options.weights;
    if (m->weights_ == loaders::WeightFormat::kAuto) m->weights_ = loaders::WeightFormat::kF32;
    const auto opts = at::TensorOptions().device(options.device).dtype(options.dtype);
    const bool copy = options.writable_weights;
    LEDE_RETURN_IF_ERROR(m->LoadEmbedding(checkpoint, opts, copy));
    for (int64_t i = 0; i < c.n_layers; ++i) {
      LEDE_RETURN_IF_ERROR(m->LoadLayer(checkpoint, i, opts, copy));
    }
    LEDE_RETURN_IF_ERROR(m->LoadHead(checkpoint, opts, copy));
    m->final_norm_ = m->final_norm_.contiguous();
    if (m->fused_) m->PackWeights();
    return m;
  });
}

StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(const std::string& path,
                                                       const ModelOptions& options) {
  // Half-precision files stay in their dtype: FromCheckpoint converts each
  // matrix once, straight into the model's storage.
  loaders::CheckpointReadOptions read;
  read.keep_half_precision = true;
  LEDE_ASSIGN_OR_RETURN(loaders::Checkpoint ckpt, loaders::LoadCheckpoint(path, read));
  return FromCheckpoint(ckpt, options);
}

StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::RandomInit(
    const checkpoint::ModelConfig& config, uint64_t seed, const ModelOptions& options,
    double init_std) {
  LEDE_RETURN_IF_ERROR(config.Validate());
  return TorchBoundary("RandomInit", [&]() -> StatusOr<std::unique_ptr<LlamaModel>> {
    at::Generator gen = at::detail::createCPUGenerator(seed);
    auto cpu = at::TensorOptions().dtype(at::kFloat);
    auto normal = [&](std::vector<int64_t> shape, double std) {
      return at::normal(0.0, std, shape, gen, cpu);
    };
    const checkpoint::ModelConfig& c = config;
    const int64_t hd = c.head_dim();
    const double out_std = init_std / std::sqrt(2.0 * c.n_layers);
    loaders::Checkpoint ckpt;
    ckpt.config = c;
    ckpt.config.rope_style = checkpoint::RopeStyle::kRotateHalf;
    ckpt.source = "random-init";
    auto& t = ckpt.tensors;
    t["model.embed_tokens.weight"] = normal({c.vocab_size, c.dim}, init_std);
    t["model.norm.weight"] = at::ones({c.dim}, cpu);
    if (!c.tie_word_embeddings) t["lm_head.weight"] = normal({c.vocab_size, c.dim}, init_std);
    for (int64_t i = 0; i < c.n_layers; ++i) {
      t[loaders::LayerTensorName(i, "self_attn.q_proj.weight")] = normal({c.n_heads * hd, c.dim}, init_std);
      t[loaders::LayerTensorName(i, "self_attn.k_proj.weight")] = normal({c.n_kv_heads * hd, c.dim}, init_std);
      t[loaders::LayerTensorName(i, "self_attn.v_proj.weight")] = normal({c.n_kv_heads * hd, c.dim}, init_std);
      t[loaders::LayerTensorName(i, "self_attn.o_proj.weight")] = normal({c.dim, c.n_heads * hd}, out_std);
      t[loaders::LayerTensorName(i, "mlp.gate_proj.weight")] = normal({c.hidden_dim, c.dim}, init_std);
      t[loaders::LayerTensorName(i, "mlp.up_proj.weight")] = normal({c.hidden_dim, c.dim}, init_std);
      t[loaders::LayerTensorName(i, "mlp.down_proj.weight")] = normal({c.dim, c.hidden_dim}, out_std);
      t[loaders::LayerTensorName(i, "input_layernorm.weight")] = at::ones({c.dim}, cpu);
      t[loaders::LayerTensorName(i, "post_attention_layernorm.weight")] = at::ones({c.dim}, cpu);
    }
    return FromCheckpoint(ckpt, options);
  });
}

}  // namespace lede::model
