#include "shared/model/llama.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include "shared/model/cpu/cpu_kernels.h"
#include "shared/model/cpu/cpu_quant_kernels.h"
#include "shared/model/cpu/worker_team.h"
#include "shared/model/internal/paged_kv.h"
#include "shared/model/internal/step_graphs.h"
#include "shared/model/loaders/llama_tensors.h"
#include "shared/model/torch_boundary.h"
#include "shared/status/status_macros.h"

namespace lede::model {
namespace {

// Inverse frequencies of RoPE, [head_dim / 2], float64, with the config's
// scaling (Llama-3.1 "llama3" frequency-dependent scaling, or linear).
at::Tensor InverseFrequencies(const checkpoint::ModelConfig& c) {
  const int64_t half = c.head_dim() / 2;
  auto opts = at::TensorOptions().dtype(at::kDouble);
  at::Tensor inv = at::pow(c.rope_theta, at::arange(0, half, opts) * (-2.0 / c.head_dim()));
  const checkpoint::RopeScaling& s = c.rope_scaling;
  if (s.type == checkpoint::RopeScaling::Type::kLinear) {
    inv = inv / s.factor;
  } else if (s.type == checkpoint::RopeScaling::Type::kLlama3) {
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
  std::vector<float> xn, qkv, attn, h13, ffn;
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
// MatMulRows over n rows, its output columns cut at multiples of 4 rows of
// W into kChunksPerThread chunks per SetFusedThreads() thread, which the
// threads claim in turn (cpu::ParallelFor; each element as the one-thread
// call computes it; cpu::MatMulRowsStrided): each chunk of W is read once
// for all rows (once per kRowTile rows: the tile of X stays in L1/L2 while
// W streams past it).
//
// packed: W in the cpu::PackRows layout, or bf16 / Q8_0 packed
// (cpu_quant_kernels.h; the same split points hold), or nullptr to read the
// row-major w.
constexpr int64_t kRowTile = 48;
// Chunks of a product's output rows per thread (cpu::ParallelFor). One: a
// thread that is late for its chunk still loses it to a thread done with
// its own. More cost more than they balance, as each chunk quantizes the
// activations again (8-bit and K-quant weights) and runs shorter kernels:
// on the 5x widening at q8_0, 2 threads, in process, LEDE ran 286-305
// tok/s with 1 chunk per thread, 268-284 with 2, 259-272 with 4.
constexpr int64_t kChunksPerThread = 1;

template <typename Packed>
void RowsProduct(const float* x, int64_t n, int64_t in, const float* w, const Packed* packed,
                 int64_t out, float* y, bool accumulate) {
  auto product = [&](int64_t o0, int64_t o1) {
    for (int64_t r0 = 0; r0 < n; r0 += kRowTile) {
      const int64_t rows = std::min(kRowTile, n - r0);
      const float* xt = x + r0 * in;
      float* yt = y + r0 * out + o0;
      if (packed != nullptr && packed->format == loaders::WeightFormat::kBf16) {
        cpu::MatMulRowsPackedBf16(xt, rows, in, packed->bf16.data() + cpu::PackedBf16Offset(o0, in), o1 - o0,
                                  yt, out, accumulate);
      } else if (packed != nullptr && loaders::IsGgmlWeightFormat(packed->format)) {
        cpu::MatMulRowsGgml(xt, rows, in, packed->gg, o0, o1, yt, out, accumulate);
      } else if (packed != nullptr && packed->format == loaders::WeightFormat::kQ8_0) {
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
  const int64_t chunks = kChunksPerThread * T, blocks = (out + 3) / 4;
  const int64_t grain = 4 * std::max<int64_t>(1, (blocks + chunks - 1) / chunks);
  cpu::ParallelFor(static_cast<int>(T), out, grain, [&](int, int64_t o0, int64_t o1) { product(o0, o1); });
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

// TORCH_CHECKs that ragged segments name distinct slots of `cache` and
// positions within the capacity, the slot's KV blocks and the window; *rows
// = their positions in all.
void CheckSegments(const RaggedSegment* segs, int64_t n_segs, const KvCache& cache, int64_t max_seq_len,
                   int64_t* rows) {
  for (int64_t s = 0; s < n_segs; ++s) {
    const RaggedSegment& g = segs[s];
    const int64_t end = g.start_pos + g.n_positions;
    TORCH_CHECK(g.n_positions >= 1, "ragged segment without positions");
    TORCH_CHECK(g.slot >= 0 && g.slot < cache.n_slots(), "ragged segment slot out of range");
    TORCH_CHECK(g.start_pos >= 0 && end <= cache.capacity(), "positions past KV capacity");
    TORCH_CHECK(end <= cache.mapped_tokens(g.slot), "positions ", g.start_pos, "..", end, " of slot ", g.slot,
                " past its KV blocks (", cache.mapped_tokens(g.slot), " tokens: the sequence outgrew what it reserved)");
    TORCH_CHECK(end <= max_seq_len, "positions past max_seq_len");
    for (int64_t o = 0; o < s; ++o) TORCH_CHECK(segs[o].slot != g.slot, "ragged segments share a slot");
    *rows += g.n_positions;
  }
}


}  // namespace

void SetFusedThreads(int n_threads) { fused_threads = std::max(1, n_threads); }

void SetDecodeThreads(int n_threads) {
  at::set_num_threads(std::max(1, n_threads));
  SetFusedThreads(n_threads);
}

int FusedThreadsInUse() { return cpu::ParallelForThreads(fused_threads); }

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

LlamaModel::LlamaModel(checkpoint::ModelConfig config, ModelOptions options)
    : config_(std::move(config)), options_(options) {
  fused_ = options_.kernels == Kernels::kFused && options_.device.is_cpu() &&
           options_.dtype == c10::kFloat;
  const bool graphs = options_.graphs == GraphMode::kOn ||
                      (options_.graphs == GraphMode::kAuto && options_.device.is_cuda());
  if (graphs) graphs_ = std::make_shared<internal::StepGraphs>(*this);
}

int64_t LlamaModel::n_graphs() const { return graphs_ != nullptr ? graphs_->size() : 0; }

namespace {
// The row-major float32 data of a matrix the fused path may read, or nullptr
// for a packed-only matrix (whose packed form RaggedMatMul then reads).
const float* RawOrNull(const at::Tensor& w) { return w.defined() ? w.data_ptr<float>() : nullptr; }
bool RequiresGrad(const at::Tensor& w) { return w.defined() && w.requires_grad(); }
}  // namespace

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
    if (p.format == loaders::WeightFormat::kBf16) {
      cpu::UnpackRowsBf16(p.bf16.data(), d, id[i], id[i] + 1, dst + i * d);
    } else if (loaders::IsGgmlWeightFormat(p.format)) {
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
  const at::ScalarType kv = cache->k(0).scalar_type();
  if (cache->n_layers() != n_layers() || !cache->k(0).device().is_cpu() ||
      (kv != at::kFloat && kv != at::kBFloat16)) {
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
  int64_t N = 0;
  CheckSegments(segs, n_segs, cache, config_.max_seq_len, &N);
  FusedScratch& ws = Scratch();
  float* xn = Grow(ws.xn, N * d);
  float* qkv = Grow(ws.qkv, N * QKV);
  float* attn = Grow(ws.attn, N * H * hd);
  float* h13 = Grow(ws.h13, N * 2 * F);
  float* ffn = Grow(ws.ffn, N * F);
  const int64_t n_threads = N > 1 ? fused_threads : 1;
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
    const internal::PagedKv kv(cache, l);
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
        kv.Store(segs[s].slot, pos, r + H * hd, r + (H + Hkv) * hd);
      }
    }
    // Attention: row t of a segment sees its slot's positions [0, start + t].
    // A thread's rows of one segment attend together (each K/V row read once
    // for all of them; a row's output does not depend on which rows join it).
    auto attend = [&](int, int64_t r0, int64_t r1) {
      for (int64_t a = r0, e; a < r1; a = e) {
        for (e = a + 1; e < r1 && row_slot[e] == row_slot[a] && row_pos[e] == row_pos[e - 1] + 1;) ++e;
        // Query heads kvh * G .. kvh * G + G - 1 share kv head kvh (GQA).
        for (int64_t kvh = 0; kvh < Hkv; ++kvh) {
          kv.AttendRows(qkv + a * QKV + kvh * G * hd, QKV, e - a, G, row_slot[a], kvh, row_pos[a] + 1,
                        attn + (a * H + kvh * G) * hd, H * hd);
        }
      }
    };
    // About two chunks a thread (the team balances them), at most 32 rows
    // (a chunk's score rows are its scratch: 32 x G x the context).
    const int64_t attend_grain = std::clamp<int64_t>((N + 2 * n_threads - 1) / (2 * n_threads), 1, 32);
    cpu::ParallelFor(static_cast<int>(n_threads), N, attend_grain, attend);
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
    // The pool's rows [NB * Hkv * P, hd] of the slot's first start_pos + T
    // positions (kv_cache.h RowOf, which refuses a position without a
    // block): write this step's, the last T, then gather them all.
    const at::Tensor kc = cache->k(layer).view({-1, hd}), vc = cache->v(layer).view({-1, hd});
    const at::Tensor rows = internal::KvRows(*cache, slot, 0, start_pos + T, hidden.device());  // [Hkv, start + T]
    const at::Tensor written = rows.narrow(1, start_pos, T).reshape({-1});
    const at::ScalarType kv = kc.scalar_type();  // the pool's K/V dtype
    kc.index_copy_(0, written, k.select(0, 0).transpose(0, 1).reshape({Hkv * T, hd}).to(kv));
    vc.index_copy_(0, written, v.select(0, 0).transpose(0, 1).reshape({Hkv * T, hd}).to(kv));
    const at::Tensor context = rows.reshape({-1});
    keys = kc.index_select(0, context).view({1, Hkv, start_pos + T, hd}).to(q.scalar_type());
    values = vc.index_select(0, context).view({1, Hkv, start_pos + T, hd}).to(q.scalar_type());
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
  const int64_t G = H / Hkv, C = cache.capacity();

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

  // Rows of the pool viewed as [NB * Hkv * P, hd] (kv_cache.h RowOf):
  // (block * Hkv + h) * P + pos % P, the block from the slot's table row on
  // the device. Positions past the slot's blocks (-1) are clamped to block
  // 0: they are read only as context past the query, which the mask hides.
  auto iopts = positions.options();
  const int64_t P = cache.block_tokens();
  const at::Tensor table = cache.block_table().index_select(0, slot).reshape({-1});  // [MB]
  const at::Tensor heads = at::arange(Hkv, iopts).unsqueeze(1);                    // [Hkv, 1]
  auto rows_of = [&](const at::Tensor& pos) {                                        // [n] -> [Hkv * n]
    const at::Tensor block = table.index_select(0, at::div(pos, P, "trunc")).clamp_min(0);
    return ((block.unsqueeze(0) * Hkv + heads) * P + at::remainder(pos, P).unsqueeze(0)).reshape({-1});
  };
  const at::Tensor rows = rows_of(positions);  // [Hkv * T]
  at::Tensor kc = cache.k(layer), vc = cache.v(layer);
  TORCH_CHECK(kc.is_contiguous() && vc.is_contiguous(), "graph step: the KV pool must be contiguous");
  kc = kc.view({-1, hd});
  vc = vc.view({-1, hd});
  const at::ScalarType kv = kc.scalar_type();  // the pool's K/V dtype
  kc.index_copy_(0, rows, k.select(0, 0).transpose(0, 1).reshape({Hkv * T, hd}).to(kv));
  vc.index_copy_(0, rows, v.select(0, 0).transpose(0, 1).reshape({Hkv * T, hd}).to(kv));
  const at::Tensor context_rows = rows_of(at::arange(context, iopts));
  at::Tensor keys = kc.index_select(0, context_rows).view({1, Hkv, context, hd}).to(q.scalar_type());
  at::Tensor values = vc.index_select(0, context_rows).view({1, Hkv, context, hd}).to(q.scalar_type());

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
    t[loaders::LayerTensorName(i, "self_attn.q_proj.weight")] = cpu(wqkv.narrow(0, 0, q));
    t[loaders::LayerTensorName(i, "self_attn.k_proj.weight")] = cpu(wqkv.narrow(0, q, kv));
    t[loaders::LayerTensorName(i, "self_attn.v_proj.weight")] = cpu(wqkv.narrow(0, q + kv, kv));
    t[loaders::LayerTensorName(i, "self_attn.o_proj.weight")] = cpu(Dense(l.wo, l.wo_packed, false));
    t[loaders::LayerTensorName(i, "mlp.gate_proj.weight")] = cpu(w13.narrow(0, 0, F));
    t[loaders::LayerTensorName(i, "mlp.up_proj.weight")] = cpu(w13.narrow(0, F, F));
    t[loaders::LayerTensorName(i, "mlp.down_proj.weight")] = cpu(Dense(l.w2, l.w2_packed, false));
    t[loaders::LayerTensorName(i, "input_layernorm.weight")] = cpu(l.attn_norm);
    t[loaders::LayerTensorName(i, "post_attention_layernorm.weight")] = cpu(l.ffn_norm);
  }
  return t;
}

Status LlamaModel::SaveHf(const std::string& dir) const {
  return TorchBoundary("SaveHf", [&]() -> Status {
    return loaders::WriteHfCheckpoint(dir, config_, NamedTensors());
  });
}

}  // namespace lede::model
