#include "shared/model/llama.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include "shared/checkpoint/mapped_file.h"
#include "shared/model/cpu_kernels.h"
#include "shared/model/cpu_quant_kernels.h"
#include "shared/model/internal/step_graphs.h"
#include "shared/model/torch_boundary.h"
#include "shared/status/status_macros.h"

namespace lede::model {
namespace {

std::string LayerName(int64_t i, const char* suffix) {
  return "model.layers." + std::to_string(i) + "." + suffix;
}

// Inverse frequencies of RoPE, [head_dim / 2], float64, with the config's
// scaling (Llama-3.1 "llama3" frequency-dependent scaling, or linear).
at::Tensor InverseFrequencies(const ModelConfig& c) {
  const int64_t half = c.head_dim() / 2;
  auto opts = at::TensorOptions().dtype(at::kDouble);
  at::Tensor inv = at::pow(c.rope_theta, at::arange(0, half, opts) * (-2.0 / c.head_dim()));
  const RopeScaling& s = c.rope_scaling;
  if (s.type == RopeScaling::Type::kLinear) {
    inv = inv / s.factor;
  } else if (s.type == RopeScaling::Type::kLlama3) {
    const double old_ctx = static_cast<double>(s.original_max_position_embeddings);
    const double low_wavelen = old_ctx / s.low_freq_factor;
    const double high_wavelen = old_ctx / s.high_freq_factor;
    auto acc = inv.accessor<double, 1>();
    for (int64_t i = 0; i < half; ++i) {
      const double f = acc[i];
      const double wavelen = 2.0 * M_PI / f;
      if (wavelen < high_wavelen) continue;
      if (wavelen > low_wavelen) {
        acc[i] = f / s.factor;
      } else {
        const double smooth = (old_ctx / wavelen - s.low_freq_factor) /
                              (s.high_freq_factor - s.low_freq_factor);
        acc[i] = (1.0 - smooth) * f / s.factor + smooth * f;
      }
    }
  }
  return inv;
}

// Scratch of the fused path, one per thread (const methods run concurrently
// on distinct slots from distinct threads). Each buffer grows to the largest
// shape seen and is then reused: no allocation per step after warm-up.
struct FusedScratch {
  std::vector<float> xn, qkv, attn, h13, ffn, scores;
  std::vector<int64_t> row_slot, row_pos;  // per row of a ragged call: its slot and position
};

// SetFusedThreads() of this thread.
thread_local int fused_threads = 1;

// Products smaller than this (rows x out x in multiply-adds) stay on the
// calling thread: the fork/join would cost more than it saves.
constexpr int64_t kMinParallelWork = int64_t{1} << 15;

FusedScratch& Scratch() {
  thread_local FusedScratch scratch;
  return scratch;
}

float* Grow(std::vector<float>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
}

// Y (+)= X W^T over the rows of a ragged batch, every row computed exactly as
// in a one-segment call of its own. With W packed (cpu::PackRows), every row
// goes through the packed few-row kernel, whose rows do not depend on the
// other rows: a sequence's results in a batch are bitwise those of its solo
// pass, prefill included, and the fused path never reads the row-major
// copy. (With sgemm for prefill, the row-major copy was read into the
// caches and the packed one evicted: on lede-tiny the decode steps right
// after a 97-token prefill took 950-1070 us, 670 us with the packed
// prefill, against about 550 us warm; and this CPU's sgemm reached no more
// than the packed kernel on prompts of 25-150 tokens.) Without a
// packed W: runs of segments of at most kMaxRowsWithoutBlas rows go through
// MatMulRows together, a longer segment through sgemm on its own rows (as
// cpu::MatMulNT does for that segment alone). Either way the weights are
// read once for all the short segments.
//
// MatMulRows over n rows, its output columns split across the
// SetFusedThreads() threads at multiples of 4 rows of W (each element as the
// one-thread call computes it; cpu::MatMulRowsStrided): each thread reads
// its share of W once for all rows (once per kRowTile rows: the tile of X
// stays in L1/L2 while W streams past it).
//
// packed: W in the cpu::PackRows layout, or bf16 / Q8_0 packed
// (cpu_quant_kernels.h; the same split points hold), or nullptr to read the
// row-major w.
constexpr int64_t kRowTile = 48;

template <typename Packed>
void RowsProduct(const float* x, int64_t n, int64_t in, const float* w, const Packed* packed,
                 int64_t out, float* y, bool accumulate) {
  auto product = [&](int64_t o0, int64_t o1) {
    for (int64_t r0 = 0; r0 < n; r0 += kRowTile) {
      const int64_t rows = std::min(kRowTile, n - r0);
      const float* xt = x + r0 * in;
      float* yt = y + r0 * out + o0;
      if (packed != nullptr && packed->format == WeightFormat::kBf16) {
        cpu::MatMulRowsPackedBf16(xt, rows, in, packed->bf16.data() + cpu::PackedBf16Offset(o0, in), o1 - o0,
                                  yt, out, accumulate);
      } else if (packed != nullptr && IsGgmlWeightFormat(packed->format)) {
        cpu::MatMulRowsGgml(xt, rows, in, packed->gg, o0, o1, yt, out, accumulate);
      } else if (packed != nullptr && packed->format == WeightFormat::kQ8_0) {
        cpu::MatMulRowsPackedQ8_0(xt, rows, in, packed->q8.data() + cpu::PackedQ8_0Offset(o0, in), o1 - o0, yt,
                                  out, accumulate);
      } else if (packed != nullptr) {
        cpu::MatMulRowsPacked(xt, rows, in, packed->data.data() + o0 * in, o1 - o0, yt, out, accumulate);
      } else {
        cpu::MatMulRowsStrided(xt, rows, in, w + o0 * in, o1 - o0, yt, out, accumulate);
      }
    }
  };
  const int64_t T = fused_threads;
  if (T <= 1 || n * out * in < kMinParallelWork || out < 8 * T) {
    product(0, out);
    return;
  }
  const int64_t blocks = out / 4;
  at::parallel_for(0, T, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t o0 = blocks * t / T * 4;
      const int64_t o1 = t + 1 == T ? out : blocks * (t + 1) / T * 4;
      if (o1 > o0) product(o0, o1);
    }
  });
}

// packed as RowsProduct's (sgemm, without it, reads the row-major w).
template <typename Packed>
void RaggedMatMul(const float* x, const RaggedSegment* segs, int64_t n_segs, int64_t in,
                  const float* w, const Packed* packed, int64_t out, float* y, bool accumulate) {
  int64_t row = 0, run_begin = 0, run_rows = 0;
  auto flush = [&] {
    if (run_rows > 0) {
      RowsProduct(x + run_begin * in, run_rows, in, w, packed, out, y + run_begin * out, accumulate);
    }
    run_rows = 0;
  };
  for (int64_t s = 0; s < n_segs; ++s) {
    const int64_t n = segs[s].n_positions;
    if (packed != nullptr || n <= cpu::kMaxRowsWithoutBlas) {
      if (run_rows == 0) run_begin = row;
      run_rows += n;
    } else {
      flush();
      cpu::MatMulBlas(x + row * in, n, in, w, out, y + row * out, accumulate);
    }
    row += n;
  }
  flush();
}

}  // namespace

void SetFusedThreads(int n_threads) { fused_threads = std::max(1, n_threads); }

void SetDecodeThreads(int n_threads) {
  at::set_num_threads(std::max(1, n_threads));
  SetFusedThreads(n_threads);
}

int FusedThreadsInUse() {
  std::atomic<int> parts{0};
  // RowsProduct's own split: one part per thread that runs.
  at::parallel_for(0, fused_threads, 1, [&](int64_t t0, int64_t t1) { parts.fetch_add(1); });
  return std::max(1, parts.load());
}

StatusOr<Kernels> ParseKernels(const std::string& name) {
  if (name == "eager") return Kernels::kEager;
  if (name == "fused") return Kernels::kFused;
  return InvalidArgumentError("kernels: unknown kernels '" + name + "' (eager or fused)");
}

const char* KernelsName(Kernels kernels) {
  return kernels == Kernels::kEager ? "eager" : "fused";
}

StatusOr<GraphMode> ParseGraphMode(const std::string& name) {
  if (name == "auto") return GraphMode::kAuto;
  if (name == "on") return GraphMode::kOn;
  if (name == "off") return GraphMode::kOff;
  return InvalidArgumentError("graphs: unknown mode '" + name + "' (auto, on or off)");
}

const char* GraphModeName(GraphMode mode) {
  return mode == GraphMode::kAuto ? "auto" : mode == GraphMode::kOn ? "on" : "off";
}

StatusOr<c10::Device> ParseDevice(const std::string& name) {
  try {
    return c10::Device(name);
  } catch (const std::exception&) {
    return InvalidArgumentError("device: unknown device '" + name + "' (cpu, cuda or cuda:N)");
  }
}

StatusOr<c10::ScalarType> ParseDtype(const std::string& name) {
  if (name == "float32") return c10::kFloat;
  if (name == "bfloat16") return c10::kBFloat16;
  if (name == "float16") return c10::kHalf;
  return InvalidArgumentError("dtype: unknown dtype '" + name + "' (float32, bfloat16 or float16)");
}

at::Tensor Linear(const at::Tensor& x, const at::Tensor& w) {
  if (x.numel() == x.size(-1)) {
    auto sizes = x.sizes().vec();
    sizes.back() = w.size(0);
    return at::mv(w, x.reshape({-1})).view(sizes);
  }
  return at::matmul(x, w.t());
}

LlamaModel::LlamaModel(ModelConfig config, ModelOptions options)
    : config_(std::move(config)), options_(options) {
  fused_ = options_.kernels == Kernels::kFused && options_.device.is_cpu() &&
           options_.dtype == c10::kFloat;
  const bool graphs = options_.graphs == GraphMode::kOn ||
                      (options_.graphs == GraphMode::kAuto && options_.device.is_cuda());
  if (graphs) graphs_ = std::make_shared<internal::StepGraphs>(*this);
}

int64_t LlamaModel::n_graphs() const { return graphs_ != nullptr ? graphs_->size() : 0; }

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
// The row-major float32 data of a matrix the fused path may read, or nullptr
// for a packed-only matrix (whose packed form RaggedMatMul then reads).
const float* RawOrNull(const at::Tensor& w) { return w.defined() ? w.data_ptr<float>() : nullptr; }
bool RequiresGrad(const at::Tensor& w) { return w.defined() && w.requires_grad(); }
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
  return (weights_ == WeightFormat::kBf16 && cpu::Packable(in)) ||
         (weights_ == WeightFormat::kQ8_0 && cpu::Q8Packable(in)) ||
         (IsGgmlWeightFormat(weights_) && in % 32 == 0);
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
  if (weights_ == WeightFormat::kQ8_0 && q8_0_blocks.defined()) {  // the file's own blocks, as they are
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
  if (weights_ == WeightFormat::kBf16) {
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
    const bool raw_bf16 = weights_ == WeightFormat::kBf16 && all_bf16;
    at::Tensor buf = at::empty({kChunk, in}, raw_bf16 ? at::kBFloat16 : at::kFloat);
    std::vector<cpu::BlockQ8_0> blocks;
    if (weights_ == WeightFormat::kQ8_0) blocks.resize(static_cast<size_t>(kChunk * in / cpu::kQ8Block));
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
      } else if (weights_ == WeightFormat::kBf16) {
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
  if (p.format == WeightFormat::kBf16) {
    cpu::UnpackRowsBf16(p.bf16.data(), p.in, 0, p.rows, t.data_ptr<float>());
  } else if (IsGgmlWeightFormat(p.format)) {
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
  if (weights_ == WeightFormat::kBf16 && cpu::Packable(in)) {
    *w = w->to(at::kBFloat16).to(w->scalar_type()).contiguous();  // round to nearest even
    if (!fused_) return;
    at::Tensor cpu_w = w->to(at::kCPU, at::kFloat).contiguous();
    p->bf16.resize(static_cast<size_t>(cpu::PackedRowsPadded(out) * in));
    cpu::PackRowsBf16(cpu_w.data_ptr<float>(), out, in, p->bf16.data());
  } else if (weights_ == WeightFormat::kQ8_0 && cpu::Q8Packable(in)) {
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
    p->format = WeightFormat::kF32;
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

const LlamaModel::RopeTables& LlamaModel::Rope(int64_t n_positions) const {
  const RopeTables* tables = rope_.load(std::memory_order_acquire);
  if (tables != nullptr && tables->n_positions >= n_positions) return *tables;
  std::lock_guard<std::mutex> lock(rope_mu_);
  tables = rope_.load(std::memory_order_relaxed);
  if (tables != nullptr && tables->n_positions >= n_positions) return *tables;
  TORCH_CHECK(0 <= n_positions && n_positions <= config_.max_seq_len, "positions past max_seq_len");
  // Doubling: a slowly growing context rebuilds log2 times, and every table
  // kept together stays under twice the last.
  int64_t n = std::max<int64_t>(n_positions, tables == nullptr ? 1 : 2 * tables->n_positions);
  n = std::min(n, config_.max_seq_len);
  auto built = std::make_unique<RopeTables>();
  at::Tensor inv = InverseFrequencies(config_);
  at::Tensor pos = at::arange(0, n, at::TensorOptions().dtype(at::kDouble));
  at::Tensor freqs = at::outer(pos, inv);              // [n, hd/2]
  at::Tensor full = at::cat({freqs, freqs}, -1);       // [n, hd]
  auto opts = at::TensorOptions().device(options_.device).dtype(options_.dtype);
  built->cos = at::cos(full).to(opts).contiguous();
  built->sin = at::sin(full).to(opts).contiguous();
  built->n_positions = n;
  rope_.store(built.get(), std::memory_order_release);
  rope_built_.push_back(std::move(built));
  return *rope_built_.back();
}

StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::FromCheckpoint(
    const Checkpoint& checkpoint, const ModelOptions& options) {
  const ModelConfig& c = checkpoint.config;
  LEDE_RETURN_IF_ERROR(c.Validate());
  const auto& t = checkpoint.tensors;
  auto get = [&](const std::string& name) -> StatusOr<at::Tensor> {
    auto it = t.find(name);
    if (it == t.end()) {
      return InvalidArgumentError(checkpoint.source + ": missing tensor " + name);
    }
    return it->second;
  };
  return TorchBoundary(checkpoint.source, [&]() -> StatusOr<std::unique_ptr<LlamaModel>> {
    std::unique_ptr<LlamaModel> m(new LlamaModel(c, options));
    m->config_.rope_style = RopeStyle::kRotateHalf;  // after the permutation below
    m->weights_ = options.weights == WeightFormat::kAuto ? checkpoint.storage : options.weights;
    if (m->weights_ == WeightFormat::kAuto) m->weights_ = WeightFormat::kF32;
    // The file's own Q8_0 blocks of a matrix (Checkpoint::q8_0_blocks), or
    // undefined; several names give their rows' blocks concatenated, and
    // undefined unless every one of them has blocks.
    auto blocks = [&](std::vector<at::Tensor> parts) -> at::Tensor {
      for (const at::Tensor& b : parts) {
        if (!b.defined()) return at::Tensor();
      }
      return parts.size() == 1 ? parts[0] : at::cat(parts, 0);
    };
    auto blocks_of = [&](const std::string& name) -> at::Tensor {
      auto it = checkpoint.q8_0_blocks.find(name);
      return it == checkpoint.q8_0_blocks.end() ? at::Tensor() : it->second;
    };
    auto opts = at::TensorOptions().device(options.device).dtype(options.dtype);
    const bool copy = options.writable_weights;
    const bool adjacent = c.rope_style == RopeStyle::kAdjacentPairs;
    // A matrix kept packed only (PackedOnly) is built from the checkpoint's
    // tensors in their own dtype, and their pages in a file mapping are
    // released behind it; otherwise it is a tensor of the model's
    // dtype (StoreMatrix rounds it and packs a copy).
    // kQ4_0 / kQ4_K_M / kGguf (weight_format.h): the matrix whose rows are
    // those of `parts` (checkpoint names `names`, llama.cpp roles `roles`,
    // layer `layer`; `heads`: the q / k head count of a part whose rows
    // the loop below permuted to rotate-half, else 0) in ggml blocks: a
    // part the file stores in a block type is kept as it is (kGguf: any
    // type; kQ4_0 / kQ4_K_M: the type their mix gives it), the rest is
    // quantized to the mix's type (LlamaCppTensorType).
    auto ggml_matrix = [&](const std::vector<at::Tensor>& parts, const std::vector<std::string>& names,
                           const std::vector<TensorRole>& roles, int64_t layer,
                           const std::vector<int64_t>& heads) -> cpu::GgmlMatrix {
      const int64_t in = parts[0].size(1);
      cpu::GgmlMatrix g(in);
      for (size_t i = 0; i < parts.size(); ++i) {
        const checkpoint::GgmlType mix = LlamaCppTensorType(m->weights_, roles[i], layer, c.n_layers, in);
        auto it = checkpoint.stored.find(names[i]);
        const checkpoint::GgufTensor* st = it == checkpoint.stored.end() ? nullptr : it->second;
        if (st != nullptr && cpu::GgmlPackable(st->type, in) &&
            (m->weights_ == WeightFormat::kGguf || st->type == mix) && st->ne.size() == 2 &&
            st->ne[1] == parts[i].size(0)) {
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
    };
    // The ggml form of a matrix into *p, and into *w its values (the eager
    // reference's weights) unless packed only.
    auto store_ggml = [&](cpu::GgmlMatrix g, at::Tensor* w, PackedWeight* p) {
      const int64_t rows = g.rows(), in = g.in();
      if (m->PackedOnly(in)) {
        *w = at::Tensor();
        p->version = 0;
      } else {
        at::Tensor values = at::empty({rows, in}, at::kFloat);
        cpu::UnpackRowsGgml(g, 0, rows, values.data_ptr<float>());
        *w = values.to(opts).contiguous();
        p->version = WeightVersion(*w);
        if (!m->fused_) return;  // the eager path reads *w
      }
      p->format = m->weights_;
      p->rows = rows;
      p->in = in;
      p->gg = std::move(g);
    };
    auto matrix = [&](const std::vector<at::Tensor>& parts, const at::Tensor& q8_0_blocks, at::Tensor* w,
                      PackedWeight* p) {
      if (m->PackedOnly(parts[0].size(1))) {
        m->PackParts(parts, q8_0_blocks, p);
        *w = at::Tensor();
        return;
      }
      *w = parts.size() == 1 ? parts[0].to(opts, /*non_blocking=*/false, copy).contiguous()
                             : at::cat(parts, 0).to(opts).contiguous();
      m->StoreMatrix(w, q8_0_blocks, p);
    };
    LEDE_ASSIGN_OR_RETURN(at::Tensor embed, get("model.embed_tokens.weight"));
    LEDE_ASSIGN_OR_RETURN(at::Tensor norm, get("model.norm.weight"));
    m->final_norm_ = norm.to(opts, /*non_blocking=*/false, copy);
    at::Tensor head_blocks = blocks_of(c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
    at::Tensor head = embed;  // the LM head's checkpoint tensor
    if (!c.tie_word_embeddings) {
      LEDE_ASSIGN_OR_RETURN(head, get("lm_head.weight"));
    }
    const bool head_packed_only = m->PackedOnly(c.dim);
    if (c.tie_word_embeddings && head_packed_only) {
      // embed_ stays undefined: Embed reads the packed head's rows.
    } else if (!c.tie_word_embeddings && m->PackedOnly(c.dim) && !copy &&
               (embed.scalar_type() == at::kBFloat16 || embed.scalar_type() == at::kHalf)) {
      m->embed_ = embed.contiguous();  // the file's dtype, in its mapping: rows are read per token
    } else {
      m->embed_ = embed.to(opts, /*non_blocking=*/false, copy);
    }
    for (int64_t i = 0; i < c.n_layers; ++i) {
      Layer layer;
      LEDE_ASSIGN_OR_RETURN(at::Tensor wq, get(LayerName(i, "self_attn.q_proj.weight")));
      LEDE_ASSIGN_OR_RETURN(at::Tensor wk, get(LayerName(i, "self_attn.k_proj.weight")));
      LEDE_ASSIGN_OR_RETURN(at::Tensor wv, get(LayerName(i, "self_attn.v_proj.weight")));
      LEDE_ASSIGN_OR_RETURN(at::Tensor wo, get(LayerName(i, "self_attn.o_proj.weight")));
      LEDE_ASSIGN_OR_RETURN(at::Tensor w1, get(LayerName(i, "mlp.gate_proj.weight")));
      LEDE_ASSIGN_OR_RETURN(at::Tensor w3, get(LayerName(i, "mlp.up_proj.weight")));
      LEDE_ASSIGN_OR_RETURN(at::Tensor w2, get(LayerName(i, "mlp.down_proj.weight")));
      LEDE_ASSIGN_OR_RETURN(at::Tensor an, get(LayerName(i, "input_layernorm.weight")));
      LEDE_ASSIGN_OR_RETURN(at::Tensor fn, get(LayerName(i, "post_attention_layernorm.weight")));
      at::Tensor bq = blocks_of(LayerName(i, "self_attn.q_proj.weight"));
      at::Tensor bk = blocks_of(LayerName(i, "self_attn.k_proj.weight"));
      if (adjacent) {
        wq = PermuteRopeRows(wq, c.n_heads, /*to_rotate_half=*/true);
        wk = PermuteRopeRows(wk, c.n_kv_heads, /*to_rotate_half=*/true);
        if (!wq.defined() || !wk.defined()) {
          return InvalidArgumentError(checkpoint.source + ": layer " + std::to_string(i) +
                                      " q/k projections cannot be permuted to rotate-half");
        }
        if (bq.defined()) bq = PermuteRopeRows(bq, c.n_heads, /*to_rotate_half=*/true);
        if (bk.defined()) bk = PermuteRopeRows(bk, c.n_kv_heads, /*to_rotate_half=*/true);
      }
      layer.attn_norm = an.to(opts, /*non_blocking=*/false, copy);
      layer.ffn_norm = fn.to(opts, /*non_blocking=*/false, copy);
      // Each matrix in ggml blocks (kQ4_0 / kQ4_K_M / kGguf, rows a multiple
      // of 32) or as `matrix` stores it.
      auto put = [&](const std::vector<at::Tensor>& parts, const std::vector<const char*>& names,
                     const std::vector<TensorRole>& roles, const std::vector<int64_t>& heads,
                     const at::Tensor& q8_0_blocks, at::Tensor* w, PackedWeight* p) {
        if (IsGgmlWeightFormat(m->weights_) && parts[0].size(1) % 32 == 0) {
          std::vector<std::string> full;
          for (const char* n : names) full.push_back(LayerName(i, n));
          store_ggml(ggml_matrix(parts, full, roles, i, heads), w, p);
        } else {
          matrix(parts, q8_0_blocks, w, p);
        }
      };
      const int64_t hq = adjacent ? c.n_heads : 0, hk = adjacent ? c.n_kv_heads : 0;
      put({wq, wk, wv}, {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"},
          {TensorRole::kAttnQ, TensorRole::kAttnK, TensorRole::kAttnV}, {hq, hk, 0},
          blocks({bq, bk, blocks_of(LayerName(i, "self_attn.v_proj.weight"))}), &layer.wqkv, &layer.wqkv_packed);
      put({wo}, {"self_attn.o_proj.weight"}, {TensorRole::kAttnO}, {0},
          blocks_of(LayerName(i, "self_attn.o_proj.weight")), &layer.wo, &layer.wo_packed);
      put({w1, w3}, {"mlp.gate_proj.weight", "mlp.up_proj.weight"}, {TensorRole::kFfnGate, TensorRole::kFfnUp},
          {0, 0}, blocks({blocks_of(LayerName(i, "mlp.gate_proj.weight")), blocks_of(LayerName(i, "mlp.up_proj.weight"))}),
          &layer.w13, &layer.w13_packed);
      put({w2}, {"mlp.down_proj.weight"}, {TensorRole::kFfnDown}, {0},
          blocks_of(LayerName(i, "mlp.down_proj.weight")), &layer.w2, &layer.w2_packed);
      for (const char* name : {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                               "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                               "mlp.down_proj.weight"}) {
        if (m->PackedOnly(t.at(LayerName(i, name)).size(1))) ReleaseSource(t.at(LayerName(i, name)));
      }
      m->layers_.push_back(std::move(layer));
    }
    const std::string head_name = c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
    if (IsGgmlWeightFormat(m->weights_) && c.dim % 32 == 0) {
      // The head in ggml blocks (Q6_K in llama.cpp's mixes); a tied
      // embedding then reads the same values.
      store_ggml(ggml_matrix({head}, {head_name}, {TensorRole::kOutput}, c.n_layers, {0}), &m->lm_head_,
                 &m->lm_head_packed_);
      if (head_packed_only) {
        ReleaseSource(head);
      } else {
        m->embed_ = m->embed_.contiguous();
        if (c.tie_word_embeddings) m->embed_ = m->lm_head_;
      }
    } else if (head_packed_only) {
      m->PackParts({head}, head_blocks, &m->lm_head_packed_);
      ReleaseSource(head);
    } else {
      // The fused path reads rows of these directly (no-ops when contiguous).
      m->embed_ = m->embed_.contiguous();
      m->lm_head_ = c.tie_word_embeddings ? m->embed_ : head.to(opts, /*non_blocking=*/false, copy).contiguous();
      m->StoreMatrix(&m->lm_head_, head_blocks, &m->lm_head_packed_);
      if (c.tie_word_embeddings) m->embed_ = m->lm_head_;  // one matrix: the lookup reads the stored values too
    }
    m->final_norm_ = m->final_norm_.contiguous();
    if (m->fused_) m->PackWeights();
    return m;
  });
}

StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(const std::string& path,
                                                       const ModelOptions& options) {
  // Half-precision files stay in their dtype: FromCheckpoint converts each
  // matrix once, straight into the model's storage.
  CheckpointReadOptions read;
  read.keep_half_precision = true;
  LEDE_ASSIGN_OR_RETURN(Checkpoint ckpt, LoadCheckpoint(path, read));
  return FromCheckpoint(ckpt, options);
}

StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::RandomInit(
    const ModelConfig& config, uint64_t seed, const ModelOptions& options,
    double init_std) {
  LEDE_RETURN_IF_ERROR(config.Validate());
  return TorchBoundary("RandomInit", [&]() -> StatusOr<std::unique_ptr<LlamaModel>> {
    at::Generator gen = at::detail::createCPUGenerator(seed);
    auto cpu = at::TensorOptions().dtype(at::kFloat);
    auto normal = [&](std::vector<int64_t> shape, double std) {
      return at::normal(0.0, std, shape, gen, cpu);
    };
    const ModelConfig& c = config;
    const int64_t hd = c.head_dim();
    const double out_std = init_std / std::sqrt(2.0 * c.n_layers);
    Checkpoint ckpt;
    ckpt.config = c;
    ckpt.config.rope_style = RopeStyle::kRotateHalf;
    ckpt.source = "random-init";
    auto& t = ckpt.tensors;
    t["model.embed_tokens.weight"] = normal({c.vocab_size, c.dim}, init_std);
    t["model.norm.weight"] = at::ones({c.dim}, cpu);
    if (!c.tie_word_embeddings) t["lm_head.weight"] = normal({c.vocab_size, c.dim}, init_std);
    for (int64_t i = 0; i < c.n_layers; ++i) {
      t[LayerName(i, "self_attn.q_proj.weight")] = normal({c.n_heads * hd, c.dim}, init_std);
      t[LayerName(i, "self_attn.k_proj.weight")] = normal({c.n_kv_heads * hd, c.dim}, init_std);
      t[LayerName(i, "self_attn.v_proj.weight")] = normal({c.n_kv_heads * hd, c.dim}, init_std);
      t[LayerName(i, "self_attn.o_proj.weight")] = normal({c.dim, c.n_heads * hd}, out_std);
      t[LayerName(i, "mlp.gate_proj.weight")] = normal({c.hidden_dim, c.dim}, init_std);
      t[LayerName(i, "mlp.up_proj.weight")] = normal({c.hidden_dim, c.dim}, init_std);
      t[LayerName(i, "mlp.down_proj.weight")] = normal({c.dim, c.hidden_dim}, out_std);
      t[LayerName(i, "input_layernorm.weight")] = at::ones({c.dim}, cpu);
      t[LayerName(i, "post_attention_layernorm.weight")] = at::ones({c.dim}, cpu);
    }
    return FromCheckpoint(ckpt, options);
  });
}

at::Tensor LlamaModel::RmsNorm(const at::Tensor& x, const at::Tensor& weight) const {
  if (x.scalar_type() == at::kFloat) {
    return x * at::rsqrt(x.square().mean(-1, /*keepdim=*/true) + config_.rms_norm_eps) * weight;
  }
  at::Tensor xf = x.to(at::kFloat);
  xf = xf * at::rsqrt(xf.square().mean(-1, /*keepdim=*/true) + config_.rms_norm_eps);
  return xf.to(x.scalar_type()) * weight;
}

// x [B, T, n, hd] holding positions [start_pos, start_pos + T).
at::Tensor LlamaModel::ApplyRope(const at::Tensor& x, int64_t start_pos) const {
  const int64_t T = x.size(1), hd = x.size(3), half = hd / 2;
  const RopeTables& rope = Rope(start_pos + T);
  at::Tensor cos = rope.cos.narrow(0, start_pos, T).view({1, T, 1, hd});
  at::Tensor sin = rope.sin.narrow(0, start_pos, T).view({1, T, 1, hd});
  at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

at::Tensor LlamaModel::Embed(const at::Tensor& tokens) const {
  if (embed_.defined()) {
    at::Tensor e = at::embedding(embed_, tokens);
    return e.scalar_type() == options_.dtype ? e : e.to(options_.dtype);  // a bf16 / f16 table
  }
  // Tied and packed only: each token's row of the packed LM head.
  const int64_t d = config_.dim, V = config_.vocab_size;
  const PackedWeight& p = lm_head_packed_;
  at::Tensor ids = tokens.to(at::kCPU, at::kLong).contiguous();
  auto sizes = ids.sizes().vec();
  sizes.push_back(d);
  at::Tensor out = at::empty(sizes, at::TensorOptions().dtype(at::kFloat));
  const int64_t* id = ids.data_ptr<int64_t>();
  float* dst = out.data_ptr<float>();
  for (int64_t i = 0; i < ids.numel(); ++i) {
    TORCH_CHECK(0 <= id[i] && id[i] < V, "token id ", id[i], " out of range [0, ", V, ")");
    if (p.format == WeightFormat::kBf16) {
      cpu::UnpackRowsBf16(p.bf16.data(), d, id[i], id[i] + 1, dst + i * d);
    } else if (IsGgmlWeightFormat(p.format)) {
      cpu::UnpackRowsGgml(p.gg, id[i], id[i] + 1, dst + i * d);
    } else {
      cpu::UnpackRowsQ8_0(p.q8.data(), d, id[i], id[i] + 1, dst + i * d);
    }
  }
  return out;
}

bool LlamaModel::UseFused(const at::Tensor& hidden, const KvCache* cache) const {
  if (!fused_ || cache == nullptr) return false;
  if (!hidden.device().is_cpu() || hidden.scalar_type() != at::kFloat) return false;
  if (cache->n_layers() != n_layers() || !cache->k(0).device().is_cpu() ||
      cache->k(0).scalar_type() != at::kFloat) {
    return false;
  }
  if (at::GradMode::is_enabled() &&
      (hidden.requires_grad() || RequiresGrad(lm_head_) || RequiresGrad(layers_[0].wqkv))) {
    return false;  // training: autograd records the eager operators
  }
  return true;
}

// The fused block over a ragged batch (llama.h). Per layer: RMSNorm, one
// QKV product over all N rows, RoPE and the K/V write per row, attention per
// segment and query head over the slot's cached rows, the O product added to
// the residual, RMSNorm, one gate/up product, SwiGLU, the down product added
// to the residual. Same operation order as EagerBlock.
void LlamaModel::FusedForward(float* x, int64_t first, int64_t last, const RaggedSegment* segs,
                              int64_t n_segs, KvCache& cache) const {
  const int64_t d = config_.dim, H = config_.n_heads, Hkv = config_.n_kv_heads;
  const int64_t hd = config_.head_dim(), G = H / Hkv, F = config_.hidden_dim;
  const int64_t QKV = (H + 2 * Hkv) * hd, C = cache.capacity();
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const float q_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  int64_t N = 0, max_keys = 0;
  for (int64_t s = 0; s < n_segs; ++s) {
    const RaggedSegment& g = segs[s];
    TORCH_CHECK(g.n_positions >= 1, "ragged segment without positions");
    TORCH_CHECK(g.slot >= 0 && g.slot < cache.n_slots(), "ragged segment slot out of range");
    TORCH_CHECK(g.start_pos >= 0 && g.start_pos + g.n_positions <= C, "positions past KV capacity");
    TORCH_CHECK(g.start_pos + g.n_positions <= config_.max_seq_len, "positions past max_seq_len");
    for (int64_t o = 0; o < s; ++o) TORCH_CHECK(segs[o].slot != g.slot, "ragged segments share a slot");
    N += g.n_positions;
    max_keys = std::max(max_keys, g.start_pos + g.n_positions);
  }
  FusedScratch& ws = Scratch();
  float* xn = Grow(ws.xn, N * d);
  float* qkv = Grow(ws.qkv, N * QKV);
  float* attn = Grow(ws.attn, N * H * hd);
  float* h13 = Grow(ws.h13, N * 2 * F);
  float* ffn = Grow(ws.ffn, N * F);
  const int64_t n_threads = N > 1 ? fused_threads : 1;
  float* scores = Grow(ws.scores, max_keys * n_threads);  // one score row per thread
  if (static_cast<int64_t>(ws.row_slot.size()) < N) {
    ws.row_slot.resize(N);
    ws.row_pos.resize(N);
  }
  for (int64_t s = 0, row = 0; s < n_segs; ++s) {
    for (int64_t t = 0; t < segs[s].n_positions; ++t, ++row) {
      ws.row_slot[row] = segs[s].slot;
      ws.row_pos[row] = segs[s].start_pos + t;
    }
  }
  const int64_t* row_slot = ws.row_slot.data();
  const int64_t* row_pos = ws.row_pos.data();
  const RopeTables& rope = Rope(std::min(C, config_.max_seq_len));  // the served context
  const float* cos_table = rope.cos.data_ptr<float>();
  const float* sin_table = rope.sin.data_ptr<float>();
  for (int64_t l = first; l < last; ++l) {
    const Layer& w = layers_[l];
    float* kc = cache.k(l).data_ptr<float>();  // [S, Hkv, C, hd]
    float* vc = cache.v(l).data_ptr<float>();
    cpu::RmsNorm(x, w.attn_norm.data_ptr<float>(), N, d, eps, xn);
    RaggedMatMul(xn, segs, n_segs, d, RawOrNull(w.wqkv), PackedOrNull(w.wqkv, w.wqkv_packed),
                 QKV, qkv, /*accumulate=*/false);
    // RoPE on q and k, then this position's K/V into the slot.
    int64_t row = 0;
    for (int64_t s = 0; s < n_segs; ++s) {
      for (int64_t t = 0; t < segs[s].n_positions; ++t, ++row) {
        const int64_t pos = segs[s].start_pos + t;
        float* r = qkv + row * QKV;
        cpu::RopeRotateHalf(r, H + Hkv, hd, cos_table + pos * hd, sin_table + pos * hd);
        for (int64_t j = 0; j < H * hd; ++j) r[j] *= q_scale;
        for (int64_t kvh = 0; kvh < Hkv; ++kvh) {
          const int64_t at = ((segs[s].slot * Hkv + kvh) * C + pos) * hd;
          std::memcpy(kc + at, r + (H + kvh) * hd, hd * sizeof(float));
          std::memcpy(vc + at, r + (H + Hkv + kvh) * hd, hd * sizeof(float));
        }
      }
    }
    // Attention: row t of a segment sees its slot's positions [0, start + t]
    // (rows split across the SetFusedThreads() threads; each row alone).
    auto attend = [&](int64_t r0, int64_t r1) {
      float* sc = scores + (n_threads > 1 ? at::get_thread_num() : 0) * max_keys;
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t n_keys = row_pos[r] + 1;
        const float* q = qkv + r * QKV;
        for (int64_t h = 0; h < H; ++h) {
          const int64_t base = (row_slot[r] * Hkv + h / G) * C * hd;
          cpu::AttendOne(q + h * hd, kc + base, vc + base, n_keys, hd, sc, attn + r * H * hd + h * hd);
        }
      }
    };
    if (n_threads > 1) {
      at::parallel_for(0, N, 1, attend);
    } else {
      attend(0, N);
    }
    RaggedMatMul(attn, segs, n_segs, H * hd, RawOrNull(w.wo), PackedOrNull(w.wo, w.wo_packed),
                 d, x, /*accumulate=*/true);
    cpu::RmsNorm(x, w.ffn_norm.data_ptr<float>(), N, d, eps, xn);
    RaggedMatMul(xn, segs, n_segs, d, RawOrNull(w.w13), PackedOrNull(w.w13, w.w13_packed),
                 2 * F, h13, /*accumulate=*/false);
    cpu::SiluMul(h13, N, F, ffn);
    RaggedMatMul(ffn, segs, n_segs, F, RawOrNull(w.w2), PackedOrNull(w.w2, w.w2_packed),
                 d, x, /*accumulate=*/true);
  }
}

at::Tensor LlamaModel::Block(int64_t layer, const at::Tensor& hidden, int64_t start_pos,
                             KvCache* cache, int64_t slot) const {
  TORCH_CHECK(0 <= layer && layer < n_layers(), "bad layer");
  return Forward(hidden, layer, layer + 1, start_pos, cache, slot);
}

at::Tensor LlamaModel::EagerBlock(int64_t layer, const at::Tensor& hidden, int64_t start_pos,
                                  KvCache* cache, int64_t slot) const {
  const Layer& w = layers_[layer];
  const at::Tensor wqkv = Dense(w.wqkv, w.wqkv_packed), wo = Dense(w.wo, w.wo_packed);
  const at::Tensor w13 = Dense(w.w13, w.w13_packed), w2 = Dense(w.w2, w.w2_packed);
  const int64_t B = hidden.size(0), T = hidden.size(1);
  const int64_t H = config_.n_heads, Hkv = config_.n_kv_heads, hd = config_.head_dim();
  const int64_t G = H / Hkv;
  TORCH_CHECK(start_pos + T <= config_.max_seq_len, "positions past max_seq_len");
  if (cache != nullptr) Rope(std::min(cache->capacity(), config_.max_seq_len));  // sized for the served context

  at::Tensor qkv = Linear(RmsNorm(hidden, w.attn_norm), wqkv);
  at::Tensor qk = ApplyRope(qkv.narrow(-1, 0, (H + Hkv) * hd).view({B, T, H + Hkv, hd}), start_pos);
  at::Tensor q = qk.narrow(2, 0, H);
  at::Tensor k = qk.narrow(2, H, Hkv);
  at::Tensor v = qkv.narrow(-1, (H + Hkv) * hd, Hkv * hd).view({B, T, Hkv, hd});

  at::Tensor keys, values;  // [B, Hkv, S, hd]
  if (cache != nullptr) {
    TORCH_CHECK(B == 1, "KV-cache forward takes one slot (B == 1)");
    TORCH_CHECK(start_pos + T <= cache->capacity(), "positions past KV capacity");
    at::Tensor kc = cache->k(layer).select(0, slot);  // [Hkv, C, hd]
    at::Tensor vc = cache->v(layer).select(0, slot);
    kc.narrow(1, start_pos, T).copy_(k.select(0, 0).transpose(0, 1));
    vc.narrow(1, start_pos, T).copy_(v.select(0, 0).transpose(0, 1));
    keys = kc.narrow(1, 0, start_pos + T).unsqueeze(0);
    values = vc.narrow(1, 0, start_pos + T).unsqueeze(0);
  } else {
    keys = k.transpose(1, 2);
    values = v.transpose(1, 2);
  }
  const int64_t S = keys.size(2);
  const int64_t query_offset = cache != nullptr ? start_pos : 0;

  // Queries grouped by their KV head: [B, Hkv, G*T, hd], rows ordered (g, t).
  at::Tensor qh = (q * (1.0 / std::sqrt(static_cast<double>(hd))))
                      .view({B, T, Hkv, G, hd})
                      .permute({0, 2, 3, 1, 4})
                      .reshape({B, Hkv, G * T, hd});
  at::Tensor scores = at::matmul(qh, keys.transpose(-1, -2));  // [B, Hkv, G*T, S]
  if (T > 1) {
    auto iopts = at::TensorOptions().dtype(at::kLong).device(hidden.device());
    at::Tensor key_pos = at::arange(S, iopts).unsqueeze(0);                     // [1, S]
    at::Tensor query_pos = (at::arange(T, iopts) + query_offset).unsqueeze(1);  // [T, 1]
    at::Tensor mask = at::gt(key_pos, query_pos).repeat({G, 1});                // [G*T, S]
    scores = scores.masked_fill(mask, -std::numeric_limits<double>::infinity());
  }
  at::Tensor probs = scores.scalar_type() == at::kFloat
                         ? at::softmax(scores, -1)
                         : at::softmax(scores, -1, at::kFloat).to(scores.scalar_type());
  at::Tensor attn = at::matmul(probs, values)  // [B, Hkv, G*T, hd]
                        .view({B, Hkv, G, T, hd})
                        .permute({0, 3, 1, 2, 4})
                        .reshape({B, T, H * hd});
  at::Tensor x = hidden + Linear(attn, wo);

  at::Tensor h13 = Linear(RmsNorm(x, w.ffn_norm), w13);
  const int64_t F = config_.hidden_dim;
  at::Tensor ffn = at::silu(h13.narrow(-1, 0, F)) * h13.narrow(-1, F, F);
  return x + Linear(ffn, w2);
}

at::Tensor LlamaModel::Forward(at::Tensor hidden, int64_t first, int64_t last,
                               int64_t start_pos, KvCache* cache, int64_t slot) const {
  TORCH_CHECK(0 <= first && first <= last && last <= n_layers(), "bad block range");
  if (first < last && graphs_ != nullptr && cache != nullptr && hidden.dim() == 3 && hidden.size(0) == 1 &&
      hidden.size(1) <= kMaxGraphPositions && !(at::GradMode::is_enabled() && hidden.requires_grad())) {
    return graphs_->Run(hidden, first, last, start_pos, *cache, slot);
  }
  if (first < last && UseFused(hidden, cache)) {
    TORCH_CHECK(hidden.dim() == 3 && hidden.size(0) == 1 && hidden.size(2) == config_.dim,
                "KV-cache forward takes one slot: hidden [1, T, d]");
    at::Tensor out = hidden.clone(at::MemoryFormat::Contiguous);
    const RaggedSegment seg{slot, start_pos, hidden.size(1)};
    FusedForward(out.data_ptr<float>(), first, last, &seg, 1, *cache);
    return out;
  }
  for (int64_t l = first; l < last; ++l) hidden = EagerBlock(l, hidden, start_pos, cache, slot);
  return hidden;
}

// EagerBlock with every position, slot and length on the device (llama.h
// StaticForward): RoPE gathers its rows of the tables, the K/V write is an
// index_copy_ at computed rows of the flattened pool, and attention reads
// the slot's first `context` positions under a mask built from positions.
at::Tensor LlamaModel::StaticBlock(int64_t layer, const at::Tensor& hidden, const at::Tensor& positions,
                                   const at::Tensor& slot, int64_t context, KvCache& cache) const {
  const Layer& w = layers_[layer];
  const at::Tensor wqkv = Dense(w.wqkv, w.wqkv_packed), wo = Dense(w.wo, w.wo_packed);
  const at::Tensor w13 = Dense(w.w13, w.w13_packed), w2 = Dense(w.w2, w.w2_packed);
  const int64_t T = hidden.size(1);
  const int64_t H = config_.n_heads, Hkv = config_.n_kv_heads, hd = config_.head_dim();
  const int64_t G = H / Hkv, C = cache.capacity(), S = cache.n_slots();

  at::Tensor qkv = Linear(RmsNorm(hidden, w.attn_norm), wqkv);
  at::Tensor qk_in = qkv.narrow(-1, 0, (H + Hkv) * hd).view({1, T, H + Hkv, hd});
  const RopeTables& rope = Rope(std::min(C, config_.max_seq_len));  // positions < context <= C
  at::Tensor cos = rope.cos.index_select(0, positions).view({1, T, 1, hd});
  at::Tensor sin = rope.sin.index_select(0, positions).view({1, T, 1, hd});
  const int64_t half = hd / 2;
  at::Tensor rotated = at::cat({-qk_in.narrow(-1, half, half), qk_in.narrow(-1, 0, half)}, -1);
  at::Tensor qk = qk_in * cos + rotated * sin;
  at::Tensor q = qk.narrow(2, 0, H);
  at::Tensor k = qk.narrow(2, H, Hkv);
  at::Tensor v = qkv.narrow(-1, (H + Hkv) * hd, Hkv * hd).view({1, T, Hkv, hd});

  // Rows of the pool viewed as [S * Hkv * C, hd]: (slot * Hkv + h) * C + pos.
  auto iopts = positions.options();
  at::Tensor heads = at::arange(Hkv, iopts).unsqueeze(1);                           // [Hkv, 1]
  at::Tensor rows = ((slot * Hkv + heads) * C + positions.unsqueeze(0)).reshape({-1});  // [Hkv * T]
  at::Tensor kc = cache.k(layer), vc = cache.v(layer);
  TORCH_CHECK(kc.is_contiguous() && vc.is_contiguous(), "graph step: the KV pool must be contiguous");
  kc.view({S * Hkv * C, hd}).index_copy_(0, rows, k.select(0, 0).transpose(0, 1).reshape({Hkv * T, hd}));
  vc.view({S * Hkv * C, hd}).index_copy_(0, rows, v.select(0, 0).transpose(0, 1).reshape({Hkv * T, hd}));
  at::Tensor keys = kc.narrow(2, 0, context).index_select(0, slot);    // [1, Hkv, context, hd]
  at::Tensor values = vc.narrow(2, 0, context).index_select(0, slot);

  at::Tensor qh = (q * (1.0 / std::sqrt(static_cast<double>(hd))))
                      .view({1, T, Hkv, G, hd})
                      .permute({0, 2, 3, 1, 4})
                      .reshape({1, Hkv, G * T, hd});
  at::Tensor scores = at::matmul(qh, keys.transpose(-1, -2));  // [1, Hkv, G*T, context]
  at::Tensor key_pos = at::arange(context, iopts).unsqueeze(0);  // [1, context]
  at::Tensor mask = at::gt(key_pos, positions.unsqueeze(1)).repeat({G, 1});  // [G*T, context]
  scores = scores.masked_fill(mask, -std::numeric_limits<double>::infinity());
  at::Tensor probs = scores.scalar_type() == at::kFloat
                         ? at::softmax(scores, -1)
                         : at::softmax(scores, -1, at::kFloat).to(scores.scalar_type());
  at::Tensor attn = at::matmul(probs, values)
                        .view({1, Hkv, G, T, hd})
                        .permute({0, 3, 1, 2, 4})
                        .reshape({1, T, H * hd});
  at::Tensor x = hidden + Linear(attn, wo);

  at::Tensor h13 = Linear(RmsNorm(x, w.ffn_norm), w13);
  const int64_t F = config_.hidden_dim;
  at::Tensor ffn = at::silu(h13.narrow(-1, 0, F)) * h13.narrow(-1, F, F);
  return x + Linear(ffn, w2);
}

at::Tensor LlamaModel::StaticForward(const at::Tensor& hidden, int64_t first, int64_t last,
                                     const at::Tensor& start_pos, const at::Tensor& slot, int64_t context,
                                     KvCache& cache) const {
  TORCH_CHECK(0 <= first && first <= last && last <= n_layers(), "bad block range");
  TORCH_CHECK(hidden.dim() == 3 && hidden.size(0) == 1 && hidden.size(2) == config_.dim,
              "static step: hidden [1, T, d]");
  TORCH_CHECK(0 < context && context <= cache.capacity(), "static step: context past KV capacity");
  TORCH_CHECK(hidden.size(1) <= context, "static step: more rows than context");
  at::Tensor positions = start_pos + at::arange(hidden.size(1), start_pos.options());  // [T]
  at::Tensor h = hidden;
  for (int64_t l = first; l < last; ++l) h = StaticBlock(l, h, positions, slot, context, cache);
  return first == last ? hidden.clone() : h;
}

at::Tensor LlamaModel::ForwardRagged(const at::Tensor& hidden, int64_t first, int64_t last,
                                     const std::vector<RaggedSegment>& segments,
                                     KvCache& cache) const {
  TORCH_CHECK(0 <= first && first <= last && last <= n_layers(), "bad block range");
  TORCH_CHECK(!segments.empty(), "ragged batch without segments");
  TORCH_CHECK(hidden.size(-1) == config_.dim && hidden.numel() % config_.dim == 0, "hidden [N, d]");
  int64_t n_rows = 0;
  for (const RaggedSegment& s : segments) n_rows += s.n_positions;
  TORCH_CHECK(hidden.numel() / config_.dim == n_rows, "segment rows do not add up to hidden's rows");
  if (first == last) return hidden;
  if (UseFused(hidden, &cache)) {
    at::Tensor out = hidden.clone(at::MemoryFormat::Contiguous);
    FusedForward(out.data_ptr<float>(), first, last, segments.data(),
                 static_cast<int64_t>(segments.size()), cache);
    return out;
  }
  // The reference: each segment through the eager blocks on its own.
  at::Tensor rows = hidden.reshape({n_rows, config_.dim});
  std::vector<at::Tensor> outs;
  int64_t row = 0;
  for (const RaggedSegment& s : segments) {
    at::Tensor h = rows.narrow(0, row, s.n_positions).unsqueeze(0);
    for (int64_t l = first; l < last; ++l) h = EagerBlock(l, h, s.start_pos, &cache, s.slot);
    outs.push_back(h.squeeze(0));
    row += s.n_positions;
  }
  return at::cat(outs, 0).view(hidden.sizes());
}

at::Tensor LlamaModel::FinalNorm(const at::Tensor& hidden) const {
  return RmsNorm(hidden, final_norm_);
}

at::Tensor LlamaModel::ExitLogits(const at::Tensor& hidden) const {
  if (fused_ && hidden.device().is_cpu() && hidden.scalar_type() == at::kFloat &&
      !(at::GradMode::is_enabled() && (hidden.requires_grad() || RequiresGrad(lm_head_)))) {
    const int64_t d = config_.dim, V = config_.vocab_size;
    TORCH_CHECK(hidden.size(-1) == d, "hidden [..., d]");
    at::Tensor h = hidden.contiguous();
    const int64_t n = h.numel() / d;
    auto sizes = hidden.sizes().vec();
    sizes.back() = V;
    at::Tensor logits = at::empty(sizes, at::TensorOptions().dtype(at::kFloat));
    float* xn = Grow(Scratch().xn, n * d);
    cpu::RmsNorm(h.data_ptr<float>(), final_norm_.data_ptr<float>(), n, d,
                 static_cast<float>(config_.rms_norm_eps), xn);
    const RaggedSegment all{0, 0, n};  // the rows as one segment (RaggedMatMul's choice of kernel)
    RaggedMatMul(xn, &all, 1, d, RawOrNull(lm_head_), PackedOrNull(lm_head_, lm_head_packed_),
                 V, logits.data_ptr<float>(), /*accumulate=*/false);
    return logits;
  }
  at::Tensor logits = Linear(FinalNorm(hidden), Dense(lm_head_, lm_head_packed_));
  return logits.scalar_type() == at::kFloat ? logits : logits.to(at::kFloat);
}

at::Tensor LlamaModel::ExitLogitsRagged(const at::Tensor& hidden,
                                        const std::vector<int64_t>& row_counts) const {
  const int64_t d = config_.dim, V = config_.vocab_size;
  TORCH_CHECK(hidden.dim() == 2 && hidden.size(1) == d, "hidden [M, d]");
  std::vector<RaggedSegment> segs;
  int64_t M = 0;
  for (int64_t n : row_counts) {
    TORCH_CHECK(n >= 1, "ragged exit group without rows");
    segs.push_back(RaggedSegment{0, 0, n});
    M += n;
  }
  TORCH_CHECK(M == hidden.size(0), "row counts do not add up to hidden's rows");
  if (fused_ && hidden.device().is_cpu() && hidden.scalar_type() == at::kFloat &&
      !(at::GradMode::is_enabled() && (hidden.requires_grad() || RequiresGrad(lm_head_)))) {
    at::Tensor h = hidden.contiguous();
    at::Tensor logits = at::empty({M, V}, at::TensorOptions().dtype(at::kFloat));
    float* xn = Grow(Scratch().xn, M * d);
    cpu::RmsNorm(h.data_ptr<float>(), final_norm_.data_ptr<float>(), M, d,
                 static_cast<float>(config_.rms_norm_eps), xn);
    RaggedMatMul(xn, segs.data(), static_cast<int64_t>(segs.size()), d, RawOrNull(lm_head_),
                 PackedOrNull(lm_head_, lm_head_packed_), V, logits.data_ptr<float>(),
                 /*accumulate=*/false);
    return logits;
  }
  std::vector<at::Tensor> parts;
  int64_t row = 0;
  for (int64_t n : row_counts) {
    parts.push_back(ExitLogits(hidden.narrow(0, row, n)));
    row += n;
  }
  return at::cat(parts, 0);
}

std::vector<at::Tensor> LlamaModel::Parameters() const {
  std::vector<at::Tensor> p = {embed_.defined() ? embed_ : Dense(lm_head_, lm_head_packed_), final_norm_};
  if (!config_.tie_word_embeddings) p.push_back(Dense(lm_head_, lm_head_packed_));
  for (const Layer& l : layers_) {
    p.push_back(l.attn_norm);
    p.push_back(Dense(l.wqkv, l.wqkv_packed));
    p.push_back(Dense(l.wo, l.wo_packed));
    p.push_back(l.ffn_norm);
    p.push_back(Dense(l.w13, l.w13_packed));
    p.push_back(Dense(l.w2, l.w2_packed));
  }
  return p;
}

std::map<std::string, at::Tensor> LlamaModel::NamedTensors() const {
  auto cpu = [](const at::Tensor& t) { return t.detach().to(at::kCPU, at::kFloat).contiguous(); };
  const int64_t hd = config_.head_dim();
  const int64_t q = config_.n_heads * hd, kv = config_.n_kv_heads * hd, F = config_.hidden_dim;
  std::map<std::string, at::Tensor> t;
  // Packed-only matrices are dequantized for the copy, not kept.
  const at::Tensor head = Dense(lm_head_, lm_head_packed_, /*keep=*/false);
  t["model.embed_tokens.weight"] = cpu(embed_.defined() ? embed_ : head);
  t["model.norm.weight"] = cpu(final_norm_);
  if (!config_.tie_word_embeddings) t["lm_head.weight"] = cpu(head);
  for (int64_t i = 0; i < n_layers(); ++i) {
    const Layer& l = layers_[i];
    const at::Tensor wqkv = Dense(l.wqkv, l.wqkv_packed, false), w13 = Dense(l.w13, l.w13_packed, false);
    t[LayerName(i, "self_attn.q_proj.weight")] = cpu(wqkv.narrow(0, 0, q));
    t[LayerName(i, "self_attn.k_proj.weight")] = cpu(wqkv.narrow(0, q, kv));
    t[LayerName(i, "self_attn.v_proj.weight")] = cpu(wqkv.narrow(0, q + kv, kv));
    t[LayerName(i, "self_attn.o_proj.weight")] = cpu(Dense(l.wo, l.wo_packed, false));
    t[LayerName(i, "mlp.gate_proj.weight")] = cpu(w13.narrow(0, 0, F));
    t[LayerName(i, "mlp.up_proj.weight")] = cpu(w13.narrow(0, F, F));
    t[LayerName(i, "mlp.down_proj.weight")] = cpu(Dense(l.w2, l.w2_packed, false));
    t[LayerName(i, "input_layernorm.weight")] = cpu(l.attn_norm);
    t[LayerName(i, "post_attention_layernorm.weight")] = cpu(l.ffn_norm);
  }
  return t;
}

Status LlamaModel::SaveHf(const std::string& dir) const {
  return TorchBoundary("SaveHf", [&]() -> Status {
    return WriteHfCheckpoint(dir, config_, NamedTensors());
  });
}

}  // namespace lede::model
