// lede_batch_bench: wall time of the batched verifier and drafter steps
// (shared/model/batch.h RunVerifierBatch, RunDrafterBatch) against the same
// work as solo Verifier / Drafter calls, on one model, for B sessions of one
// kind of work:
//   step     an autoregressive step per session
//   verify   a static round per session (K drafts at exit layer E, drafted once)
//   draft    one draft step per session at exit layer E (blocks [0, E) and
//            the exit head)
// Prints ms per step (batched) and per B solo calls, and the speed-up. The
// numbers are per call on the calling thread (--threads sets its intra-op
// threads). Nothing here asserts.
//
// --kernel-rows R1,R2,... first times the packed few-row products alone
// (cpu::MatMulRowsPacked, MatMulRowsPackedBf16, MatMulRowsPackedQ8_0) on
// the model's gate/up shape [2F, d] and down shape [d, F] (random weights,
// larger than the L3 cache at the memory-bound shapes) at each row count:
// ms per product, GFLOP/s (2 x rows x out x in per second), and the
// speed-up over rows x the one-row product (the most rows can share one
// read of the weights). Its compute ceiling is the same product over a
// 4 x in matrix that stays in L1 (GFLOP/s at 12 rows): the batched step
// can gain at most rows x t(1 row) / (rows x flops / ceiling).
//
// usage: lede_batch_bench [--model models/lede-tiny] [--batches 1,2,4,8,16,32]
//                         [--k 3] [--exit-layer 2] [--context 128] [--iters 50] [--threads 1]
//                         [--work step,verify,draft] [--kernel-rows 1,2,4,8,16,32] [--json FILE]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include "shared/flags/flags.h"
#include "shared/model/batch.h"
#include "shared/model/cpu_kernels.h"
#include "shared/model/cpu_quant_kernels.h"
#include "shared/model/decoding.h"
#include "shared/model/kv_cache.h"
#include "shared/model/llama.h"

namespace {

using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// The packed few-row products alone (see the file comment), one row of the
// JSON per (format, shape, rows).
nlohmann::json KernelRows(int64_t d, int64_t F, const std::vector<int64_t>& rows, int64_t iters) {
  namespace cpu = lede::model::cpu;
  nlohmann::json out = nlohmann::json::array();
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  struct Shape {
    const char* name;
    int64_t out, in;
  };
  const Shape shapes[] = {{"gate_up", 2 * F, d}, {"down", d, F}, {"l1_ceiling", 4, d}};
  int64_t max_rows = 1;
  for (int64_t r : rows) max_rows = std::max(max_rows, r);
  std::printf("\npacked few-row products (one thread): ms per product, GFLOP/s, speed-up over rows x 1 row\n");
  std::printf("%-6s %-10s %6s %10s %9s %8s\n", "format", "shape", "rows", "ms", "GFLOP/s", "speedup");
  for (const Shape& sh : shapes) {
    std::vector<float> w(static_cast<size_t>(sh.out * sh.in)), packed(w.size());
    for (float& v : w) v = normal(rng);
    cpu::PackRows(w.data(), sh.out, sh.in, packed.data());
    std::vector<uint16_t> bf16(static_cast<size_t>(cpu::PackedRowsPadded(sh.out) * sh.in));
    cpu::PackRowsBf16(w.data(), sh.out, sh.in, bf16.data());
    std::vector<cpu::BlockQ8_0> blocks(static_cast<size_t>(sh.out * sh.in / cpu::kQ8Block));
    cpu::QuantizeRowsQ8_0(w.data(), sh.out, sh.in, blocks.data());
    std::vector<uint8_t> q8(cpu::PackedQ8_0Bytes(sh.out, sh.in));
    cpu::PackRowsQ8_0(blocks.data(), sh.out, sh.in, q8.data());
    const int64_t ldy = sh.out + (std::getenv("PAD") ? 16 : 0);
    std::vector<float> x(static_cast<size_t>(max_rows * sh.in)), y(static_cast<size_t>(max_rows * ldy));
    for (float& v : x) v = normal(rng);
    // A small matrix stays in L1: repeat it so that one timing is ~1 ms.
    const int64_t reps = std::max<int64_t>(1, (int64_t{1} << 22) / (sh.out * sh.in));
    for (const char* format : {"f32", "bf16", "q8_0"}) {
      auto product = [&](int64_t n) {
        for (int64_t k = 0; k < reps; ++k) {
          if (format[0] == 'f') {
            cpu::MatMulRowsPacked(x.data(), n, sh.in, packed.data(), sh.out, y.data(), ldy, false);
          } else if (format[0] == 'b') {
            cpu::MatMulRowsPackedBf16(x.data(), n, sh.in, bf16.data(), sh.out, y.data(), sh.out, false);
          } else {
            cpu::MatMulRowsPackedQ8_0(x.data(), n, sh.in, q8.data(), sh.out, y.data(), sh.out, false);
          }
        }
      };
      double one = 0;
      for (int64_t n : rows) {
        product(n);  // warm-up
        std::vector<double> times;
        for (int64_t it = 0; it < iters; ++it) {
          auto t0 = Clock::now();
          product(n);
          times.push_back(Ms(Clock::now() - t0) / static_cast<double>(reps));
        }
        std::sort(times.begin(), times.end());
        const double ms = times[times.size() / 2];  // median
        if (n == rows.front()) one = ms / static_cast<double>(n);
        const double gflops = 2.0 * static_cast<double>(n * sh.out * sh.in) / (ms * 1e6);
        const double speedup = one * static_cast<double>(n) / ms;
        std::printf("%-6s %-10s %6ld %10.4f %9.1f %7.2fx\n", format, sh.name, (long)n, ms, gflops, speedup);
        out.push_back({{"format", format}, {"shape", sh.name}, {"out", sh.out}, {"in", sh.in}, {"rows", n},
                       {"median_ms", ms}, {"gflops", gflops}, {"speedup_over_rows_x_one", speedup}});
      }
    }
  }
  return out;
}

// Writes `out` to `path`; the process's exit status (1 when it cannot).
int WriteJson(const std::string& path, const nlohmann::json& out) {
  std::ofstream f(path);
  f << out.dump(2) << "\n";
  if (f) return 0;
  std::fprintf(stderr, "lede_batch_bench: cannot write %s\n", path.c_str());
  return 1;
}

int Run(const std::vector<std::string>& args) {
  std::string model_path = "models/lede-tiny", batches = "1,2,4,8,16,32", json_path, weights = "auto";
  int64_t k = 3, exit_layer = 2, context = 128, iters = 50, threads = 1;
  lede::flags::FlagSet flags;
  flags.Add("model", &model_path, "model directory or .bin");
  flags.Add("batches", &batches, "batch sizes (sessions)");
  flags.Add("k", &k, "drafts per verification round");
  flags.Add("exit-layer", &exit_layer, "exit layer of the rounds");
  flags.Add("context", &context, "committed tokens per session before the timed steps");
  flags.Add("iters", &iters, "timed steps per size");
  flags.Add("threads", &threads, "intra-op threads of this thread");
  flags.Add("json", &json_path, "also write the rows as JSON here");
  std::string kernel_rows, work_kinds = "step,verify,draft";
  flags.Add("work", &work_kinds, "kinds of work to time: step, verify, draft");
  flags.Add("kernel-rows", &kernel_rows, "also time the packed products alone at these row counts (e.g. 1,2,4,8,16,32)");
  flags.Add("weights", &weights, "matrix storage of the fused CPU path: auto (the checkpoint's), f32, bf16 or q8_0");
  if (lede::Status s = flags.Parse(args); !s.ok()) {
    std::fprintf(stderr, "lede_batch_bench: %s\n%s", std::string(s.message()).c_str(), flags.Usage().c_str());
    return 2;
  }
  at::set_num_threads(static_cast<int>(threads));
  lede::model::SetFusedThreads(static_cast<int>(threads));  // the batched and the solo calls alike
  lede::model::ModelOptions model_options;
  auto weight_format = lede::model::ParseWeightFormat(weights);
  if (!weight_format.ok()) {
    std::fprintf(stderr, "lede_batch_bench: --%s\n", std::string(weight_format.status().message()).c_str());
    return 2;
  }
  model_options.weights = *weight_format;
  auto loaded = lede::model::LlamaModel::Load(model_path, model_options);
  if (!loaded.ok()) {
    std::fprintf(stderr, "lede_batch_bench: %s\n", loaded.status().ToString().c_str());
    return 1;
  }
  const lede::model::LlamaModel& m = **loaded;
  std::vector<int64_t> sizes;
  std::stringstream in(batches);
  for (std::string t; std::getline(in, t, ',');) sizes.push_back(std::stoll(t));
  int64_t max_b = 1;
  for (int64_t b : sizes) max_b = std::max(max_b, b);
  lede::model::KvCacheOptions ko;
  ko.n_slots = max_b;
  ko.max_draft_len = std::max<int64_t>(k, 1);
  auto cache = lede::model::KvCache::Create(m.config(), ko);
  if (!cache.ok()) return 1;
  c10::InferenceMode guard;
  lede::model::Verifier verifier(m, *cache);
  lede::model::Drafter drafter(m, *cache);
  std::vector<int32_t> prompt(context);
  for (int64_t i = 0; i < context; ++i) prompt[i] = static_cast<int32_t>(1 + (i * 37) % (m.config().vocab_size - 1));
  nlohmann::json kernel_json = nlohmann::json::array();
  if (!kernel_rows.empty()) {
    std::vector<int64_t> kr;
    std::stringstream ks(kernel_rows);
    for (std::string t; std::getline(ks, t, ',');) kr.push_back(std::stoll(t));
    kernel_json = KernelRows(m.config().dim, m.config().hidden_dim, kr, std::max<int64_t>(3, iters));
  }
  std::printf("%s, context %ld, K=%ld at E=%ld, %ld threads (at::get_num_threads %d); ms per step\n",
              model_path.c_str(), (long)context, (long)k, (long)exit_layer, (long)threads, at::get_num_threads());
  std::printf("%6s %-7s %10s %10s %8s\n", "B", "work", "batched", "solo x B", "speedup");
  nlohmann::json rows = nlohmann::json::array();
  for (const char* kind : {"step", "verify", "draft"}) {
    if (("," + work_kinds + ",").find(std::string(",") + kind + ",") == std::string::npos) continue;
    const bool verify = std::string(kind) == "verify", draft = std::string(kind) == "draft";
    for (int64_t B : sizes) {
      for (int64_t s = 0; s < B; ++s) (void)verifier.Prefill(s, prompt);
      std::vector<lede::model::VerifierWork> work(B);
      for (int64_t s = 0; s < B; ++s) {
        work[s].slot = s;
        if (verify) {
          work[s].kind = lede::model::VerifierWork::Kind::kVerify;
          work[s].exit_layer = exit_layer;
          for (int64_t i = 0; i < k; ++i) {
            (void)drafter.DraftStep(s, i, 5, exit_layer);
            work[s].tokens.push_back(5);
          }
        } else {
          work[s].kind = lede::model::VerifierWork::Kind::kStep;
          work[s].tokens = {5};
        }
      }
      std::vector<lede::model::DraftWork> drafts(B);
      for (int64_t s = 0; s < B; ++s) {
        drafts[s].slot = s;
        drafts[s].token = 5;
        drafts[s].last = exit_layer;
      }
      // Steps commit a position each: truncate back so the context stays put.
      auto reset = [&] {
        for (int64_t s = 0; s < B; ++s) (void)cache->Truncate(s, context);
      };
      double batched = 0, solo = 0;
      for (int64_t it = 0; it < iters + 3; ++it) {
        reset();
        auto t0 = Clock::now();
        if (draft) {
          (void)lede::model::RunDrafterBatch(m, *cache, drafts);
        } else {
          (void)lede::model::RunVerifierBatch(m, *cache, work);
        }
        auto t1 = Clock::now();
        reset();
        auto t2 = Clock::now();
        for (const auto& w : work) {
          if (draft) {
            (void)drafter.DraftStep(w.slot, 0, 5, exit_layer);
          } else if (verify) {
            (void)verifier.Verify(w.slot, exit_layer, w.tokens);
          } else {
            (void)verifier.Step(w.slot, w.tokens[0]);
          }
        }
        auto t3 = Clock::now();
        if (it >= 3) {  // warm-up
          batched += Ms(t1 - t0);
          solo += Ms(t3 - t2);
        }
      }
      batched /= iters;
      solo /= iters;
      std::printf("%6ld %-7s %10.3f %10.3f %7.2fx\n", (long)B, kind, batched, solo, solo / batched);
      rows.push_back({{"sessions", B}, {"work", kind}, {"batched_ms", batched}, {"solo_ms", solo},
                      {"speedup", solo / batched}});
    }
  }
  if (json_path.empty()) return 0;
  return WriteJson(json_path, {{"benchmark", "lede_batch_bench"}, {"model", model_path}, {"context", context},
                               {"k", k}, {"exit_layer", exit_layer}, {"iters", iters}, {"threads", threads},
                               {"rows", rows}, {"kernel_rows", kernel_json}});
}

}  // namespace

int main(int argc, char** argv) { return Run(std::vector<std::string>(argv + 1, argv + argc)); }
