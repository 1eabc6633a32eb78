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
// copies cycled so that they come from DRAM) at each row count: thread CPU
// ms per product, GFLOP/s (2 x rows x out x in per second), and the
// speed-up over rows x the one-row product (what rows gain by sharing one
// read of the weights). The compute ceiling is the same product over a
// 4 x d matrix that stays in L1: a batched step of R rows can gain at most
// R x t(1 row) / (R x 2 x params / ceiling GFLOP/s).
//
// usage: lede_batch_bench [--model models/lede-tiny] [--batches 1,2,4,8,16,32]
//                         [--k 3] [--exit-layer 2] [--context 128] [--iters 50] [--threads 1]
//                         [--work step,verify,draft] [--kernel-rows 1,2,4,8,16,32] [--json FILE]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include "shared/flags/flags.h"
#include "shared/flags/model_flags.h"
#include "shared/model/loaders/model_load_flags.h"
#include "shared/model/batch.h"
#include "shared/model/cpu/cpu_kernels.h"
#include "shared/model/cpu/cpu_quant_kernels.h"
#include "shared/model/decoding.h"
#include "shared/model/kv_cache.h"
#include "shared/model/llama.h"
#include "shared/model/loaders/load_or_exit.h"

namespace {

using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// Thread CPU time in ms: on this shared 2-core VM a product longer than a
// scheduler slice is often preempted, which wall-clock would count.
double ThreadCpuMs() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) * 1e-6;
}

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
  std::printf("\npacked few-row products (one thread; thread CPU time, medians): ms per product, GFLOP/s,\n"
              "speed-up over rows x the first row count's per-row time\n");
  std::printf("%-6s %-10s %6s %10s %9s %8s\n", "format", "shape", "rows", "ms", "GFLOP/s", "speedup");
  for (const Shape& sh : shapes) {
    std::vector<float> w(static_cast<size_t>(sh.out * sh.in));
    for (float& v : w) v = normal(rng);
    // Copies of W cycled through, 96 MB of f32 in all (3x this CPU's L3), so
    // that each product reads its weights from DRAM as a model step does;
    // the l1_ceiling shape is one copy, read from L1, repeated.
    const bool in_l1 = sh.out == 4;
    const int64_t copies = in_l1 ? 1 : std::max<int64_t>(2, (int64_t{96} << 20) / (4 * sh.out * sh.in));
    const int64_t reps = in_l1 ? std::max<int64_t>(1, (int64_t{1} << 22) / (sh.out * sh.in)) : copies;
    std::vector<std::vector<float>> f32(copies);
    std::vector<std::vector<uint16_t>> bf16(copies);
    std::vector<std::vector<uint8_t>> q8(copies);
    std::vector<cpu::BlockQ8_0> blocks(static_cast<size_t>(sh.out * sh.in / cpu::kQ8Block));
    cpu::QuantizeRowsQ8_0(w.data(), sh.out, sh.in, blocks.data());
    for (int64_t c = 0; c < copies; ++c) {
      f32[c].resize(w.size());
      cpu::PackRows(w.data(), sh.out, sh.in, f32[c].data());
      bf16[c].resize(static_cast<size_t>(cpu::PackedRowsPadded(sh.out) * sh.in));
      cpu::PackRowsBf16(w.data(), sh.out, sh.in, bf16[c].data());
      q8[c].resize(cpu::PackedQ8_0Bytes(sh.out, sh.in));
      cpu::PackRowsQ8_0(blocks.data(), sh.out, sh.in, q8[c].data());
    }
    std::vector<float> x(static_cast<size_t>(max_rows * sh.in)), y(static_cast<size_t>(max_rows * sh.out));
    for (float& v : x) v = normal(rng);
    for (const char* format : {"f32", "bf16", "q8_0"}) {
      auto products = [&](int64_t n) {
        for (int64_t k = 0; k < reps; ++k) {
          const int64_t c = k % copies;
          if (format[0] == 'f') {
            cpu::MatMulRowsPacked(x.data(), n, sh.in, f32[c].data(), sh.out, y.data(), sh.out, false);
          } else if (format[0] == 'b') {
            cpu::MatMulRowsPackedBf16(x.data(), n, sh.in, bf16[c].data(), sh.out, y.data(), sh.out, false);
          } else {
            cpu::MatMulRowsPackedQ8_0(x.data(), n, sh.in, q8[c].data(), sh.out, y.data(), sh.out, false);
          }
        }
      };
      double one = 0;
      for (int64_t n : rows) {
        products(n);  // warm-up
        std::vector<double> times;
        for (int64_t it = 0; it < iters; ++it) {
          const double t0 = ThreadCpuMs();
          products(n);
          times.push_back((ThreadCpuMs() - t0) / static_cast<double>(reps));
        }
        std::sort(times.begin(), times.end());
        const double ms = times[times.size() / 2];
        if (n == rows.front()) one = ms / static_cast<double>(n);
        const double gflops = 2.0 * static_cast<double>(n * sh.out * sh.in) / (ms * 1e6);
        const double speedup = one * static_cast<double>(n) / ms;
        std::printf("%-6s %-10s %6ld %10.4f %9.1f %7.2fx\n", format, sh.name, (long)n, ms, gflops, speedup);
        out.push_back({{"format", format}, {"shape", sh.name}, {"out", sh.out}, {"in", sh.in}, {"rows", n},
                       {"median_cpu_ms", ms}, {"gflops", gflops}, {"speedup_over_rows_x_first", speedup},
                       {"weights_from", in_l1 ? "L1" : "DRAM"}});
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

// Mean time (ms) of one step of `kind` ("step", "verify" or "draft") for B
// sessions at `context` committed tokens: one batched call against B solo
// calls, over `iters` timed steps after 3 warm-ups. Each step's commits are
// truncated away so the context stays put.
struct BatchTimes {
  double batched_ms = 0;
  double solo_ms = 0;
};

BatchTimes TimeBatch(const lede::model::LlamaModel& m, lede::model::KvCache& cache, const std::string& kind, int64_t B,
                     const std::vector<int32_t>& prompt, int64_t k, int64_t exit_layer, int64_t iters) {
  const bool verify = kind == "verify", draft = kind == "draft";
  const int64_t context = static_cast<int64_t>(prompt.size());
  lede::model::Verifier verifier(m, cache);
  lede::model::Drafter drafter(m, cache);
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
    for (int64_t s = 0; s < B; ++s) (void)cache.Truncate(s, context);
  };
  double batched = 0, solo = 0;
  for (int64_t it = 0; it < iters + 3; ++it) {
    reset();
    auto t0 = Clock::now();
    if (draft) {
      (void)lede::model::RunDrafterBatch(m, cache, drafts);
    } else {
      (void)lede::model::RunVerifierBatch(m, cache, work);
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
  return {batched / iters, solo / iters};
}

int Run(const std::vector<std::string>& args) {
  std::string batches = "1,2,4,8,16,32", json_path;
  int64_t k = 3, exit_layer = 2, context = 128, iters = 50;
  lede::flags::ModelLoadFlags load;
  load.model = "models/lede-tiny";
  load.threads = 1;
  const std::string& model_path = load.model;
  const int64_t& threads = load.threads;
  lede::flags::FlagSet flags;
  lede::flags::AddModelLoadFlags(&flags, &load, lede::flags::kModelPath);
  flags.Add("batches", &batches, "batch sizes (sessions)");
  flags.Add("k", &k, "drafts per verification round");
  flags.Add("exit-layer", &exit_layer, "exit layer of the rounds");
  flags.Add("context", &context, "committed tokens per session before the timed steps");
  flags.Add("iters", &iters, "timed steps per size");
  lede::flags::AddModelLoadFlags(&flags, &load, lede::flags::kThreads);
  flags.Add("json", &json_path, "also write the rows as JSON here");
  std::string kernel_rows, work_kinds = "step,verify,draft";
  flags.Add("work", &work_kinds, "kinds of work to time: step, verify, draft");
  flags.Add("kernel-rows", &kernel_rows, "also time the packed products alone at these row counts (e.g. 1,2,4,8,16,32)");
  lede::flags::AddModelLoadFlags(&flags, &load, lede::flags::kWeights);
  if (lede::Status s = flags.Parse(args); !s.ok()) {
    std::fprintf(stderr, "lede_batch_bench: %s\n%s", std::string(s.message()).c_str(), flags.Usage().c_str());
    return 2;
  }
  auto n_threads = lede::model::loaders::ApplyThreadsFlag(load.threads);  // the batched and the solo calls alike
  auto model_options = lede::model::loaders::ModelOptionsFromFlags(load);
  if (!n_threads.ok() || !model_options.ok()) {
    const lede::Status& s = !n_threads.ok() ? n_threads.status() : model_options.status();
    std::fprintf(stderr, "lede_batch_bench: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  const std::unique_ptr<lede::model::LlamaModel> loaded =
      lede::model::loaders::LoadModelOrExit("lede_batch_bench", model_path, *model_options);
  const lede::model::LlamaModel& m = *loaded;
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
    for (int64_t B : sizes) {
      const BatchTimes t = TimeBatch(m, *cache, kind, B, prompt, k, exit_layer, iters);
      const double batched = t.batched_ms, solo = t.solo_ms;
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
