// Engine benchmark: prints numbers, asserts nothing.
//
// 1. The roofline of this CPU, measured here: the read bandwidth of a loop
//    over a buffer larger than the last-level cache (DRAM) and over one that
//    fits in it (the small models' weights do), and the GFLOP/s of a BLAS
//    sgemm (OpenBLAS) on the benchmark's threads.
// 2. For each model and each --kernels implementation (eager: libtorch
//    operators; fused: cpu_kernels.h), A/B in one process, interleaved,
//    --repeats runs each, medians: autoregressive and static
//    self-speculation tokens/s, the fused/eager ratio, and the effective
//    GB/s (weight bytes read per second) and GFLOP/s (2 x weights x rows
//    per second; attention not counted) of each run, from its rounds.
// 3. With --detail, the per-block timing table and the static grid (every
//    exit layer, D in {1, 2, 4, 8}) with the cost models' predictions, on
//    the default kernels.
// 2b. --weights f32,bf16,q8_0 repeats every implementation at
//    each weight storage (fused reads the packed format; eager computes with
//    the dequantized weights), GB/s counted at the format's bytes and shown
//    as a share of the measured DRAM read bandwidth of one core (%roof).
//    A model "random:dxFxLxHxHkvxV" is a random-weights model of that shape
//    (RandomInit; e.g. random:960x2560x12x30x10x2048 is lede-tiny widened
//    to 122M parameters, the memory-bound shape).
//    Every run is also written as JSON (--json; default
//    bench/results/engine_bench-<UTC time>.json): command, commit, date,
//    machine, roofline, one row per (model, method, kernels, weights).
// 1b. --roofline-only prints the read bandwidths of 1. as one JSON line,
//    {"dram_read_gb_per_s": X, "llc_read_gb_per_s": Y} (GB = 1e9 bytes,
//    one core, median of the timed passes), and exits: other benchmarks
//    (bench/llamacpp_bench.mjs) take this machine's roofline from here.
// 2c. --isolate (weight memory): each (model, --weights) variant
//    runs in a process of its own (this binary re-run with --child-weights;
//    fused kernels, autoregressive only), --repeats rounds interleaved
//    across the variants: each child loads the model (load seconds, peak
//    RSS after the load: getrusage ru_maxrss), generates --tokens greedy
//    tokens after a short warm-up and reports tok/s, the weight bytes of a
//    step (LlamaModel::packed_weight_bytes) x tok/s as GB/s and its share of
//    the read roofline this process measured, the bytes of weights the
//    model holds (resident_weight_bytes) and the peak RSS at the end.
//    Medians over rounds (peak RSS: the largest). The rows go to the JSON's
//    "isolated" list.
// 4. With --after-prefill, on the default kernels: the latency of each of
//    the first autoregressive steps after a prefill of P tokens (P = 24 and
//    96), median over 15 generations, against the warm steps of the same
//    generations (the cost model times rounds in generations like these).
//
// usage: lede_engine_bench [--models A,B] [--tokens N] [--threads N]
//                          [--repeats N] [--kernels eager,fused] [--detail]
//                          [--after-prefill] [--weights f32,bf16,q8_0]
//                          [--json FILE] [--no-gemv] [--roofline-only] [--isolate]
// (default models: testdata/models/stories260K, babyllama-tok105 and
// models/lede-tiny; threads 1, as the numbers.)
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "shared/flags/flags.h"
#include "shared/flags/model_flags.h"
#include "shared/model/loaders/model_load_flags.h"
#include "shared/model/cost/cost_model.h"
#include "shared/model/cpu/cpu_kernels.h"
#include "shared/model/cpu/cpu_quant_kernels.h"
#include "shared/model/decoding.h"
#include "shared/model/llama.h"
#include "shared/model/loaders/load_or_exit.h"

namespace {

using namespace lede::model;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

template <typename F>
double Seconds(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// GB/s of summing a buffer of `bytes` (read only), median of `reps` passes;
// *per_cpu_s (optional): the same per second of this thread's CPU time.
double ReadBandwidthGbs(int64_t bytes, int reps, double* per_cpu_s = nullptr) {
  const int64_t n = bytes / 4;
  std::vector<float> a(n, 1.0f), ones(8192, 1.0f);
  volatile float sink = 0;
  std::vector<double> t, c;
  for (int r = 0; r < reps + 1; ++r) {
    const double c0 = ThreadCpuSeconds();
    const double s = Seconds([&] {
      float acc = 0;
      for (int64_t i = 0; i < n; i += 8192) acc += cpu::Dot(a.data() + i, ones.data(), std::min<int64_t>(8192, n - i));
      sink = sink + acc;
    });
    if (r > 0) t.push_back(s), c.push_back(ThreadCpuSeconds() - c0);  // the first pass faults the pages in
  }
  if (per_cpu_s != nullptr) *per_cpu_s = bytes / Median(c) / 1e9;
  return bytes / Median(t) / 1e9;
}

double SgemmGflops(int64_t n, int reps) {
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  std::vector<double> t;
  for (int r = 0; r < reps + 1; ++r) {
    const double s = Seconds([&] { cpu::MatMulNT(a.data(), n, n, b.data(), n, c.data(), false); });
    if (r > 0) t.push_back(s);
  }
  return 2.0 * n * n * n / Median(t) / 1e9;
}

// Weight counts of one block and of the LM head (final norm ignored).
struct Weights {
  double block, head;
};

Weights CountWeights(const lede::checkpoint::ModelConfig& c) {
  const double hd = static_cast<double>(c.head_dim());
  const double qkv = (c.n_heads + 2.0 * c.n_kv_heads) * hd * c.dim;
  const double block = qkv + c.n_heads * hd * c.dim + 3.0 * c.hidden_dim * c.dim + 2.0 * c.dim;
  return {block, static_cast<double>(c.vocab_size) * c.dim};
}

// Weights read and multiply-adds of a generation's decode phase, from its
// rounds: a draft step reads l* blocks and the head for one row; the
// verification reads the deep blocks and the head once for K + 1 rows (and
// the shallow blocks once more for the last draft); an AR step all L.
struct Traffic {
  double bytes = 0, flops = 0;
};

// bytes_per_weight: of the stored matrices (4 for f32, 2 bf16, 34/32 q8_0).
Traffic DecodeTraffic(const GenerationResult& r, const lede::checkpoint::ModelConfig& c, double bytes_per_weight) {
  const Weights w = CountWeights(c);
  const double bw = bytes_per_weight;
  const double L = static_cast<double>(c.n_layers);
  Traffic t;
  for (const RoundRecord& round : r.stats.rounds) {
    const double e = round.exit_layer, k = round.n_drafted;
    if (k == 0) {
      t.bytes += bw * (L * w.block + w.head);
      t.flops += 2 * (L * w.block + w.head);
      continue;
    }
    const double draft = e * w.block + w.head;
    t.bytes += bw * (k * draft + e * w.block + (L - e) * w.block + w.head);
    t.flops += 2 * (k * draft + e * w.block + (k + 1) * ((L - e) * w.block + w.head));
  }
  return t;
}

struct Run {
  // cpu_tps: new tokens per second of this thread's CPU time (prefill
  // included): what a core that is not time-shared would reach, for runs on
  // a busy machine (wall-clock tps counts the time others held the core).
  double tps = 0, cpu_tps = 0, gbs = 0, gflops = 0, accept = 0;
  std::vector<int32_t> tokens;
};

Run Measure(Engine& engine, const std::vector<int32_t>& prompt, const GenerateOptions& o) {
  Run run;
  auto thread_cpu_s = [] {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
  };
  const double cpu0 = thread_cpu_s();
  auto r = engine.Generate(prompt, o);
  const double cpu_s = thread_cpu_s() - cpu0;
  if (!r.ok()) {
    std::fprintf(stderr, "generate failed: %s\n", r.status().ToString().c_str());
    return run;
  }
  const double s = r->stats.decode_s;
  const LlamaModel& m = engine.model();
  const Weights w = CountWeights(m.config());
  // The packed bytes of one full step over its weight count: the format's
  // bytes per weight (4 on the eager path, which reads float32 tensors).
  const double bytes_per_weight =
      m.fused() ? m.packed_weight_bytes() / (m.n_layers() * w.block + w.head) : 4.0;
  const Traffic t = DecodeTraffic(*r, m.config(), bytes_per_weight);
  run.tps = r->stats.decode_tokens_per_s();
  run.cpu_tps = cpu_s > 0 ? r->tokens.size() / cpu_s : 0;
  run.gbs = s > 0 ? t.bytes / s / 1e9 : 0;
  run.gflops = s > 0 ? t.flops / s / 1e9 : 0;
  run.accept = r->stats.acceptance_rate();
  run.tokens = r->tokens;
  return run;
}

struct Method {
  std::string name;
  GenerateOptions options;
};

void DetailTables(const std::shared_ptr<const LlamaModel>& model, int64_t n_tokens);

void AfterPrefillTable(const std::shared_ptr<const LlamaModel>& model);

// "random:dxFxLxHxHkvxV" -> *c (true), or false for a checkpoint path.
bool ParseRandomShape(const std::string& spec, lede::checkpoint::ModelConfig* c) {
  const std::string prefix = "random:";
  if (spec.rfind(prefix, 0) != 0) return false;
  long long d, f, l, h, hkv, v;
  if (std::sscanf(spec.c_str() + prefix.size(), "%lldx%lldx%lldx%lldx%lldx%lld", &d, &f, &l, &h, &hkv, &v) != 6) {
    return false;
  }
  c->dim = d, c->hidden_dim = f, c->n_layers = l, c->n_heads = h, c->n_kv_heads = hkv, c->vocab_size = v;
  c->max_seq_len = 1024;
  c->bos_id = 1;
  c->eos_ids = {2};
  return true;
}

struct Variant {
  Kernels kernels;
  loaders::WeightFormat weights;
};

void BenchModel(const std::string& path, const std::vector<Variant>& variants, int64_t n_tokens, int repeats,
                bool detail, bool after_prefill, double dram_gbs, nlohmann::json* rows) {
  std::vector<std::shared_ptr<const LlamaModel>> models;
  lede::checkpoint::ModelConfig random_shape;
  const bool random = ParseRandomShape(path, &random_shape);
  for (const Variant& v : variants) {
    ModelOptions mo;
    mo.kernels = v.kernels;
    mo.weights = v.weights;
    auto loaded = random ? LlamaModel::RandomInit(random_shape, /*seed=*/1, mo) : LlamaModel::Load(path, mo);
    if (!loaded.ok()) loaders::ExitLoadFailure("lede_engine_bench", loaded.status());
    models.push_back(std::move(*loaded));
  }
  const lede::checkpoint::ModelConfig& c = models[0]->config();
  const int64_t L = c.n_layers;
  const Weights w = CountWeights(c);
  std::printf("\n== %s  (d=%lld, F=%lld, L=%lld, V=%lld, %.2fM weights read per token = %.1f MB at f32, threads=%d)\n",
              path.c_str(), static_cast<long long>(c.dim), static_cast<long long>(c.hidden_dim),
              static_cast<long long>(L), static_cast<long long>(c.vocab_size), (L * w.block + w.head) / 1e6,
              4 * (L * w.block + w.head) / 1e6, at::get_num_threads());
  std::vector<std::unique_ptr<Engine>> engines;
  for (const auto& m : models) {
    KvCacheOptions ko;
    ko.max_draft_len = 16;
    auto e = Engine::Create(m, ko);
    if (!e.ok()) return;
    engines.push_back(std::move(*e));
  }
  std::vector<int32_t> prompt = {static_cast<int32_t>(c.bos_id)};
  GenerateOptions ar;
  ar.max_new_tokens = n_tokens;
  ar.stop_at_eos = false;
  std::vector<Method> methods = {{"ar", ar}};
  for (auto [e, d] : {std::pair<int64_t, int64_t>{std::max<int64_t>(1, L / 4), 4},
                      {std::max<int64_t>(1, L / 2), 2}}) {
    GenerateOptions o = ar;
    o.mode = SpeculationMode::kStatic;
    o.exit_layer = e;
    o.draft_len = d;
    methods.push_back({"static E=" + std::to_string(e) + ",D=" + std::to_string(d), o});
  }
  std::printf("%-16s %-6s %-5s %9s %7s %7s %8s %6s %8s %7s %6s %9s %7s\n", "method", "kernel", "wts", "tok/s", "vs eag",
              "vs f32", "GB/s", "%roof", "GFLOP/s", "accept", "same", "cpu tok/s", "vs f32");
  for (const Method& m : methods) {
    // Interleaved A/B: rep r runs every variant once, in turn.
    std::vector<std::vector<Run>> runs(models.size());
    for (int r = 0; r < repeats; ++r) {
      for (size_t k = 0; k < models.size(); ++k) runs[k].push_back(Measure(*engines[k], prompt, m.options));
    }
    double eager_tps = 0, f32_tps = 0, f32_cpu_tps = 0;
    for (size_t k = 0; k < models.size(); ++k) {
      std::vector<double> tps, gbs, gflops, cpu_tps;
      for (const Run& run : runs[k]) {
        tps.push_back(run.tps), gbs.push_back(run.gbs), gflops.push_back(run.gflops), cpu_tps.push_back(run.cpu_tps);
      }
      const double t = Median(tps), ct = Median(cpu_tps);
      const loaders::WeightFormat f = models[k]->weight_format();
      if (variants[k].kernels == Kernels::kEager && f == loaders::WeightFormat::kF32) eager_tps = t;
      if (variants[k].kernels == Kernels::kFused && f == loaders::WeightFormat::kF32) f32_tps = t, f32_cpu_tps = ct;
      char ratio[16] = "-", ratio32[16] = "-", cpu_ratio32[16] = "-";
      if (eager_tps > 0) std::snprintf(ratio, sizeof(ratio), "%.2fx", t / eager_tps);
      if (f32_tps > 0 && variants[k].kernels == Kernels::kFused) {
        std::snprintf(ratio32, sizeof(ratio32), "%.2fx", t / f32_tps);
        std::snprintf(cpu_ratio32, sizeof(cpu_ratio32), "%.2fx", ct / f32_cpu_tps);
      }
      // Greedy ids against the first variant of the same weight format.
      size_t same_as = k;
      for (size_t j = 0; j < k; ++j) {
        if (models[j]->weight_format() == f) {
          same_as = j;
          break;
        }
      }
      const bool same = runs[k].back().tokens == runs[same_as].back().tokens;
      const double g = Median(gbs);
      std::printf("%-16s %-6s %-5s %9.1f %7s %7s %8.2f %5.0f%% %8.2f %7.3f %6s %9.1f %7s\n", m.name.c_str(),
                  KernelsName(variants[k].kernels), loaders::WeightFormatName(f), t, ratio, ratio32, g,
                  dram_gbs > 0 ? 100 * g / dram_gbs : 0.0, Median(gflops), runs[k].back().accept, same ? "yes" : "NO",
                  ct, cpu_ratio32);
      rows->push_back({{"model", path},
                       {"method", m.name},
                       {"kernels", KernelsName(variants[k].kernels)},
                       {"weights", loaders::WeightFormatName(f)},
                       {"tokens_per_s", t},
                       {"tokens_per_s_runs", tps},
                       {"tokens_per_cpu_s", ct},
                       {"tokens_per_cpu_s_runs", cpu_tps},
                       {"weight_gb_per_s", g},
                       {"share_of_read_roofline", dram_gbs > 0 ? g / dram_gbs : 0.0},
                       {"gflop_per_s", Median(gflops)},
                       {"acceptance", runs[k].back().accept},
                       {"packed_weight_bytes", models[k]->packed_weight_bytes()},
                       {"params_read_per_token", L * w.block + w.head},
                       {"greedy_ids_same_as_first_of_format", same}});
    }
  }
  if (detail) DetailTables(models.back(), n_tokens);
  if (after_prefill) AfterPrefillTable(models.back());
}

// Peak resident set of this process so far, bytes (ru_maxrss is in KiB).
int64_t PeakRssBytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;
}

// --child-weights: one variant in this process (see 2c in the file
// comment); prints one line "child-json {...}" on stdout. Returns the exit
// status.
int RunChild(const std::string& path, loaders::WeightFormat weights, int64_t n_tokens) {
  ModelOptions mo;
  mo.kernels = Kernels::kFused;
  mo.weights = weights;
  // The read roofline of this core now, before the load (its buffer is
  // freed before the model's peak) and again after the decode.
  double roof_cpu_before = 0, roof_cpu_after = 0;
  const double roof_before = ReadBandwidthGbs(256ll << 20, 3, &roof_cpu_before);
  const int64_t rss_before = PeakRssBytes();
  std::unique_ptr<LlamaModel> loaded;
  lede::checkpoint::ModelConfig random_shape;
  const double load_s = Seconds([&] {
    auto m = ParseRandomShape(path, &random_shape) ? LlamaModel::RandomInit(random_shape, /*seed=*/1, mo)
                                                   : LlamaModel::Load(path, mo);
    if (!m.ok()) loaders::ExitLoadFailure("lede_engine_bench", m.status());
    loaded = std::move(*m);
  });
  const int64_t rss_load = PeakRssBytes();
  std::shared_ptr<const LlamaModel> model = std::move(loaded);
  KvCacheOptions ko;
  ko.max_draft_len = 16;
  ko.capacity = std::min<int64_t>(model->config().max_seq_len, n_tokens + 64);
  auto engine = Engine::Create(model, ko);
  if (!engine.ok()) {
    std::fprintf(stderr, "engine: %s\n", engine.status().ToString().c_str());
    return 1;
  }
  std::vector<int32_t> prompt = {static_cast<int32_t>(model->config().bos_id)};
  GenerateOptions ar;
  ar.stop_at_eos = false;
  ar.max_new_tokens = 4;
  Measure(**engine, prompt, ar);  // warm-up: scratch, KV pages
  ar.max_new_tokens = n_tokens;
  const Run run = Measure(**engine, prompt, ar);
  const int64_t rss_peak = PeakRssBytes();
  const int64_t resident = model->resident_weight_bytes(), packed = model->packed_weight_bytes();
  const std::string format = loaders::WeightFormatName(model->weight_format());
  engine->reset();
  model.reset();  // the roofline's buffer does not stack on the model's pages
  const double roof_after = ReadBandwidthGbs(256ll << 20, 3, &roof_cpu_after);
  const nlohmann::json out = {{"weights", format},
                              {"read_roofline_gb_per_s", {roof_before, roof_after}},
                              {"read_roofline_gb_per_cpu_s", {roof_cpu_before, roof_cpu_after}},
                              {"load_s", load_s},
                              {"peak_rss_bytes_before_load", rss_before},
                              {"peak_rss_bytes_after_load", rss_load},
                              {"peak_rss_bytes", rss_peak},
                              {"resident_weight_bytes", resident},
                              {"packed_weight_bytes", packed},
                              {"tokens_per_s", run.tps},
                              {"tokens_per_cpu_s", run.cpu_tps},
                              {"weight_gb_per_s", run.gbs},
                              {"weight_gb_per_cpu_s", run.tps > 0 ? run.gbs * run.cpu_tps / run.tps : 0.0},
                              {"tokens", run.tokens}};
  std::printf("child-json %s\n", out.dump().c_str());
  return 0;
}

// --isolate: the variants of one model, each in a child process, --repeats
// rounds interleaved (2c in the file comment).
void IsolatedRuns(const std::string& exe, const std::string& path, const std::vector<loaders::WeightFormat>& formats,
                  int64_t n_tokens, int64_t threads, int repeats, double dram_gbs, nlohmann::json* rows) {
  std::vector<std::vector<nlohmann::json>> runs(formats.size());
  for (int r = 0; r < repeats; ++r) {
    for (size_t k = 0; k < formats.size(); ++k) {
      const std::string cmd = "'" + exe + "' --models '" + path + "' --tokens " + std::to_string(n_tokens) +
                              " --threads " + std::to_string(threads) + " --child-weights " +
                              loaders::WeightFormatName(formats[k]);
      FILE* p = popen(cmd.c_str(), "r");
      if (p == nullptr) continue;
      std::string line, got;
      char buf[1 << 12];
      while (std::fgets(buf, sizeof(buf), p) != nullptr) {
        line += buf;
        if (!line.empty() && line.back() == '\n') {
          if (line.rfind("child-json ", 0) == 0) got = line.substr(11);
          line.clear();
        }
      }
      if (pclose(p) != 0 || got.empty()) {
        std::fprintf(stderr, "isolated run failed: %s\n", cmd.c_str());
        continue;
      }
      runs[k].push_back(nlohmann::json::parse(got));
    }
  }
  std::printf("\n== %s, each variant in its own process (fused, AR, %lld tokens, %d rounds interleaved)\n",
              path.c_str(), static_cast<long long>(n_tokens), repeats);
  // Shares of the roofline: each run's GB/s over the mean of the read
  // rooflines its own process measured just before the load and after the
  // decode (wall clock; and per CPU second of the thread, which discounts
  // the time other processes held this core).
  std::printf("%-5s %7s %9s %9s %9s %8s %7s %6s %7s %9s %6s %6s\n", "wts", "load s", "RSS load", "peak RSS",
              "wts held", "tok/s", "GB/s", "%roof", "vs f32", "cpu tok/s", "%roofc", "rounds");
  double f32_tps = 0, f32_cpu_tps = 0;
  for (size_t k = 0; k < formats.size(); ++k) {
    if (runs[k].empty()) continue;
    std::vector<double> tps, gbs, load, cpu_tps, share, cpu_share, roof, cpu_roof;
    int64_t peak = 0, peak_load = 0;
    for (const auto& j : runs[k]) {
      tps.push_back(j["tokens_per_s"]), gbs.push_back(j["weight_gb_per_s"]), load.push_back(j["load_s"]);
      cpu_tps.push_back(j["tokens_per_cpu_s"]);
      const double rw = (j["read_roofline_gb_per_s"][0].get<double>() + j["read_roofline_gb_per_s"][1].get<double>()) / 2;
      const double rc =
          (j["read_roofline_gb_per_cpu_s"][0].get<double>() + j["read_roofline_gb_per_cpu_s"][1].get<double>()) / 2;
      roof.push_back(rw), cpu_roof.push_back(rc);
      share.push_back(rw > 0 ? j["weight_gb_per_s"].get<double>() / rw : 0.0);
      cpu_share.push_back(rc > 0 ? j["weight_gb_per_cpu_s"].get<double>() / rc : 0.0);
      peak = std::max<int64_t>(peak, j["peak_rss_bytes"]);
      peak_load = std::max<int64_t>(peak_load, j["peak_rss_bytes_after_load"]);
    }
    const nlohmann::json& last = runs[k].back();
    const double t = Median(tps), g = Median(gbs), ct = Median(cpu_tps);
    if (formats[k] == loaders::WeightFormat::kF32) f32_tps = t, f32_cpu_tps = ct;
    char ratio[32] = "-";
    if (f32_tps > 0) std::snprintf(ratio, sizeof(ratio), "%.2fx", t / f32_tps);
    const std::vector<int32_t> tokens = last["tokens"].get<std::vector<int32_t>>();
    std::printf("%-5s %7.2f %7.2fGi %7.2fGi %7.2fGi %8.2f %7.2f %5.0f%% %7s %9.2f %5.0f%% %6zu\n",
                last["weights"].get<std::string>().c_str(), Median(load), peak_load / 1073741824.0,
                peak / 1073741824.0, last["resident_weight_bytes"].get<int64_t>() / 1073741824.0, t, g,
                100 * Median(share), ratio, ct, 100 * Median(cpu_share), runs[k].size());
    rows->push_back({{"model", path},
                     {"method", "ar"},
                     {"kernels", "fused"},
                     {"weights", last["weights"]},
                     {"rounds", runs[k].size()},
                     {"load_s", Median(load)},
                     {"load_s_runs", load},
                     {"peak_rss_bytes_after_load", peak_load},
                     {"peak_rss_bytes", peak},
                     {"resident_weight_bytes", last["resident_weight_bytes"]},
                     {"packed_weight_bytes", last["packed_weight_bytes"]},
                     {"tokens_per_s", t},
                     {"tokens_per_s_runs", tps},
                     {"tokens_per_cpu_s", ct},
                     {"tokens_per_cpu_s_runs", cpu_tps},
                     {"tokens_per_s_vs_f32", f32_tps > 0 ? t / f32_tps : 0.0},
                     {"tokens_per_cpu_s_vs_f32", f32_cpu_tps > 0 ? ct / f32_cpu_tps : 0.0},
                     {"weight_gb_per_s", g},
                     {"read_roofline_gb_per_s_runs", roof},
                     {"read_roofline_gb_per_cpu_s_runs", cpu_roof},
                     {"share_of_read_roofline", Median(share)},
                     {"share_of_read_roofline_runs", share},
                     {"share_of_read_roofline_per_cpu_s", Median(cpu_share)},
                     {"share_of_read_roofline_per_cpu_s_runs", cpu_share},
                     {"share_of_parent_read_roofline", dram_gbs > 0 ? g / dram_gbs : 0.0},
                     {"greedy_ids", tokens.size() > 16 ? std::vector<int32_t>(tokens.begin(), tokens.begin() + 16)
                                                       : tokens}});
  }
}

void DetailTables(const std::shared_ptr<const LlamaModel>& model, int64_t n_tokens) {
  const lede::checkpoint::ModelConfig& c = model->config();
  const int64_t L = c.n_layers;
  auto cal = cost::Calibrate(*model, 100);
  if (!cal.ok()) {
    std::fprintf(stderr, "calibration failed: %s\n", cal.status().ToString().c_str());
    return;
  }
  std::printf("[%s kernels] full step %.1f us (1 position); verify(k) = L blocks + head on k positions:\n",
              KernelsName(model->options().kernels), cal->step_us);
  std::printf("  k  block us  head us  verify(k)/step(1)\n");
  for (int k = 1; k <= 16; ++k) {
    const double verify = L * cal->block_us[k - 1] + cal->head_us[k - 1];
    std::printf("%3d  %8.1f  %7.1f  %6.2f\n", k, cal->block_us[k - 1], cal->head_us[k - 1], verify / cal->step_us);
  }
  auto accel = cost::MakeAcceleratorCostModel(c);
  auto measured = cost::MakeMeasuredCostModel(*cal);
  KvCacheOptions ko;
  ko.max_draft_len = 16;
  auto engine = Engine::Create(model, ko);
  if (!engine.ok()) return;
  std::vector<int32_t> prompt = {static_cast<int32_t>(c.bos_id)};
  GenerateOptions ar;
  ar.max_new_tokens = n_tokens;
  ar.stop_at_eos = false;
  double ar_tps = 0;
  std::vector<int32_t> ar_tokens;
  for (int rep = 0; rep < 3; ++rep) {  // best of 3 for the baseline so it is never flattered
    auto r = (*engine)->Generate(prompt, ar);
    if (!r.ok()) return;
    ar_tps = std::max(ar_tps, r->stats.decode_tokens_per_s());
    ar_tokens = r->tokens;
  }
  std::printf("%-10s %9s %9s %10s %11s %7s %8s %6s\n", "method", "tok/s", "measured", "pred.accel",
              "pred.measrd", "accept", "tok/rnd", "diverg");
  std::printf("%-10s %9.0f %8.2fx %9.2fx %10.2fx %7s %8s %6s\n", "ar", ar_tps, 1.0, 1.0, 1.0, "-", "1.00", "-");
  for (int64_t e = 1; e < L; ++e) {
    for (int64_t d : {1, 2, 4, 8}) {
      GenerateOptions o = ar;
      o.mode = SpeculationMode::kStatic;
      o.exit_layer = e;
      o.draft_len = d;
      double tps = 0;
      GenerationResult best;
      for (int rep = 0; rep < 2; ++rep) {
        auto r = (*engine)->Generate(prompt, o);
        if (!r.ok()) return;
        if (r->stats.decode_tokens_per_s() > tps) {
          tps = r->stats.decode_tokens_per_s();
          best = *r;
        }
      }
      int diverged = 0;
      for (size_t i = 0; i < std::min(best.tokens.size(), ar_tokens.size()); ++i) {
        if (best.tokens[i] != ar_tokens[i]) {
          diverged = 1;
          break;
        }
      }
      char name[64];
      std::snprintf(name, sizeof(name), "E=%lld,D=%lld", static_cast<long long>(e), static_cast<long long>(d));
      std::printf("%-10s %9.0f %8.2fx %9.2fx %10.2fx %7.3f %8.2f %6d\n", name, tps, tps / ar_tps,
                  accel->PredictedSpeedup(best.stats.rounds), measured->PredictedSpeedup(best.stats.rounds),
                  best.stats.acceptance_rate(), best.stats.tokens_per_round(), diverged);
    }
  }
}

// Per-step latency of the first steps after a prefill (section 4 above).
void AfterPrefillTable(const std::shared_ptr<const LlamaModel>& model) {
  const lede::checkpoint::ModelConfig& c = model->config();
  KvCacheOptions ko;
  ko.max_draft_len = 8;
  auto engine = Engine::Create(model, ko);
  if (!engine.ok()) return;
  constexpr int kSteps = 24, kGenerations = 15;
  std::printf("[%s kernels] autoregressive step i after a prefill of P tokens, us (median of %d generations)\n",
              KernelsName(model->options().kernels), kGenerations);
  std::printf("%5s", "P");
  for (int i = 1; i <= 8; ++i) std::printf(" %6d", i);
  std::printf(" %9s\n", "warm 9-24");
  for (int64_t p : {1, 24, 96}) {
    std::vector<int32_t> prompt = {static_cast<int32_t>(c.bos_id)};
    for (int64_t i = 1; i < p; ++i) prompt.push_back(static_cast<int32_t>((7 + 131 * i) % c.vocab_size));
    GenerateOptions ar;
    ar.max_new_tokens = kSteps;
    ar.stop_at_eos = false;
    std::vector<std::vector<double>> us(kSteps);
    for (int g = 0; g < kGenerations; ++g) {
      auto r = (*engine)->Generate(prompt, ar);
      if (!r.ok()) return;
      for (size_t i = 0; i < r->stats.rounds.size() && i < us.size(); ++i) {
        us[i].push_back(r->stats.rounds[i].latency_s * 1e6);
      }
    }
    std::printf("%5lld", static_cast<long long>(p));
    for (int i = 0; i < 8; ++i) std::printf(" %6.0f", Median(us[i]));
    std::vector<double> warm;
    for (int i = 8; i < kSteps; ++i) warm.insert(warm.end(), us[i].begin(), us[i].end());
    std::printf(" %9.0f\n", Median(warm));
  }
}

// Matrix-vector products of the models' shapes: the vectorized loop against
// OpenBLAS sgemv (the choice MatMulNT makes for one row), ns per call.
void GemvTable() {
  std::printf("\nmatrix-vector [out x in], one row: ns per call (loop over row-major W, over W in\n"
              "the packed layout (cpu::PackRows; - where in %% 8 != 0), cblas_sgemv)\n");
  std::printf("%12s %10s %10s %10s\n", "shape", "loop", "packed", "sgemv");
  for (auto [out, in] : {std::pair<int64_t, int64_t>{128, 64}, {344, 64}, {64, 172}, {512, 64},
                         {320, 192}, {1024, 192}, {192, 512}, {2048, 192}}) {
    std::vector<float> w(out * in, 0.01f), x(in, 1.0f), y(out);
    const int iters = static_cast<int>(std::max<int64_t>(200, 20000000 / (out * in)));
    auto time = [&](auto&& f) {
      std::vector<double> t;
      for (int r = 0; r < 5; ++r) t.push_back(Seconds([&] { for (int i = 0; i < iters; ++i) f(); }) / iters);
      return Median(t) * 1e9;
    };
    const double loop = time([&] { cpu::MatVec(w.data(), out, in, x.data(), y.data(), false); });
    const double blas = time([&] { cpu::MatVecBlas(w.data(), out, in, x.data(), y.data(), false); });
    char shape[48], packed[16] = "-";
    if (cpu::Packable(in)) {
      std::vector<float> p(out * in);
      cpu::PackRows(w.data(), out, in, p.data());
      std::snprintf(packed, sizeof(packed), "%.0f", time([&] {
        cpu::MatMulRowsPacked(x.data(), 1, in, p.data(), out, y.data(), out, false);
      }));
    }
    std::snprintf(shape, sizeof(shape), "%lldx%lld", static_cast<long long>(out), static_cast<long long>(in));
    std::printf("%12s %10.0f %10s %10.0f\n", shape, loop, packed, blas);
  }
  // Few rows (drafts, verification): MatMulRows against cblas_sgemm, which
  // repacks W on every call.
  std::printf("n rows x [1024 x 192]: ns per call (MatMulRows over row-major W, over packed W,\n"
              "cblas_sgemm)\n");
  std::printf("%12s %10s %10s %10s\n", "n", "rows", "packed", "sgemm");
  const int64_t out = 1024, in = 192;
  std::vector<float> w(out * in, 0.01f), x(64 * in, 1.0f), y(64 * out), p(out * in);
  cpu::PackRows(w.data(), out, in, p.data());
  for (int64_t n : {2, 5, 9, 17, 24, 32, 64}) {
    auto time = [&](auto&& f) {
      std::vector<double> t;
      for (int r = 0; r < 5; ++r) t.push_back(Seconds([&] { for (int i = 0; i < 200; ++i) f(); }) / 200);
      return Median(t) * 1e9;
    };
    const double rows = time([&] { cpu::MatMulRows(x.data(), n, in, w.data(), out, y.data(), false); });
    const double packed =
        time([&] { cpu::MatMulRowsPacked(x.data(), n, in, p.data(), out, y.data(), out, false); });
    const double blas = time([&] { cpu::MatMulBlas(x.data(), n, in, w.data(), out, y.data(), false); });
    std::printf("%12lld %10.0f %10.0f %10.0f\n", static_cast<long long>(n), rows, packed, blas);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  int64_t n_tokens = 200, repeats = 5;
  lede::flags::ModelLoadFlags load;  // --threads of the model-loading group; 1 by default here
  load.threads = 1;
  int64_t& threads = load.threads;
  bool detail = false, after_prefill = false;
  std::string models_flag =
      "testdata/models/stories260K,testdata/models/babyllama-tok105/model5000.bin,models/lede-tiny";
  std::string kernels_flag = "eager,fused";
  std::string weights_flag = "auto", json_path;
  bool no_gemv = false, roofline_only = false, isolate = false;
  std::string child_weights;
  lede::flags::FlagSet flags;
  flags.Add("models", &models_flag, "comma-separated model paths (checkpoint directory or llama2.c .bin)");
  flags.Add("tokens", &n_tokens, "new tokens per generation (greedy, prompt = BOS)");
  lede::flags::AddModelLoadFlags(&flags, &load, lede::flags::kThreads);
  flags.Add("repeats", &repeats, "interleaved runs per implementation; medians are printed");
  flags.Add("kernels", &kernels_flag, "comma-separated implementations to compare: eager, fused");
  flags.Add("detail", &detail, "also print the per-block timing table and the static grid");
  flags.Add("after-prefill", &after_prefill, "also print the latency of the first steps after a prefill");
  flags.Add("weights", &weights_flag, "comma-separated weight storages to compare: auto, f32, bf16, q8_0");
  flags.Add("json", &json_path, "write the results here (default bench/results/engine_bench-<UTC time>.json)");
  flags.Add("no-gemv", &no_gemv, "skip the matrix-vector kernel table");
  flags.Add("roofline-only", &roofline_only, "print the read bandwidths (DRAM, LLC) as one JSON line and exit");
  flags.Add("isolate", &isolate,
            "each --weights variant in its own process: load time, peak RSS, AR tok/s (fused only)");
  flags.Add("child-weights", &child_weights, "internal (--isolate): run one variant of the first model here");
  if (lede::flags::WantsHelp(args)) {
    std::printf("usage: lede_engine_bench [flags]\n%s", flags.Usage().c_str());
    return 0;
  }
  if (auto s = flags.Parse(args); !s.ok()) {
    std::fprintf(stderr, "lede_engine_bench: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (roofline_only) {
    const double dram = ReadBandwidthGbs(256ll << 20, 5), llc = ReadBandwidthGbs(16ll << 20, 20);
    std::printf("{\"dram_read_gb_per_s\": %.3f, \"llc_read_gb_per_s\": %.3f}\n", dram, llc);
    return 0;
  }
  std::vector<Kernels> kernels;
  for (const std::string& k : lede::flags::SplitList(kernels_flag)) {
    auto parsed = ParseKernels(k);
    if (!parsed.ok()) {
      std::fprintf(stderr, "lede_engine_bench: --%s\n", std::string(parsed.status().message()).c_str());
      return 2;
    }
    kernels.push_back(*parsed);
  }
  std::vector<Variant> variants;
  for (const std::string& wf : lede::flags::SplitList(weights_flag)) {
    auto parsed = loaders::ParseWeightFormat(wf);
    if (!parsed.ok()) {
      std::fprintf(stderr, "lede_engine_bench: --%s\n", std::string(parsed.status().message()).c_str());
      return 2;
    }
    for (Kernels k : kernels) variants.push_back({k, *parsed});
  }
  if (variants.empty() || repeats < 1 || n_tokens < 1) {
    std::fprintf(stderr, "lede_engine_bench: need --kernels, --repeats >= 1, --tokens >= 1\n");
    return 2;
  }
  auto n_threads = lede::model::loaders::ApplyThreadsFlag(threads);
  if (!n_threads.ok()) {
    std::fprintf(stderr, "lede_engine_bench: %s\n", std::string(n_threads.status().message()).c_str());
    return 2;
  }
  threads = *n_threads;  // children get the resolved count
  c10::InferenceMode inference_mode;
  if (!child_weights.empty()) {
    auto parsed = loaders::ParseWeightFormat(child_weights);
    const auto models = lede::flags::SplitList(models_flag);
    if (!parsed.ok() || models.empty()) {
      std::fprintf(stderr, "lede_engine_bench: --child-weights needs a format and --models\n");
      return 2;
    }
    return RunChild(models[0], *parsed, n_tokens);
  }
  std::printf("LEDE engine benchmark: greedy, prompt = BOS, %lld new tokens, threads=%d, medians of %lld interleaved runs\n",
              static_cast<long long>(n_tokens), at::get_num_threads(), static_cast<long long>(repeats));
  const double dram_gbs = ReadBandwidthGbs(256ll << 20, 5), llc_gbs = ReadBandwidthGbs(16ll << 20, 20);
  const double sgemm = SgemmGflops(512, 10);
  std::printf("roofline: read bandwidth %.1f GB/s (256 MiB, DRAM), %.1f GB/s (16 MiB, last-level cache); "
              "sgemm 512^3 %.1f GFLOP/s\n", dram_gbs, llc_gbs, sgemm);
  std::printf("quantized kernels: %s\n", cpu::QuantIsaName(cpu::BestQuantIsa()));
  if (!no_gemv) GemvTable();
  nlohmann::json rows = nlohmann::json::array(), isolated = nlohmann::json::array();
  for (const std::string& m : lede::flags::SplitList(models_flag)) {
    if (isolate) {
      std::vector<loaders::WeightFormat> formats;
      for (const Variant& v : variants) {
        if (std::find(formats.begin(), formats.end(), v.weights) == formats.end()) formats.push_back(v.weights);
      }
      IsolatedRuns(std::filesystem::read_symlink("/proc/self/exe").string(), m, formats, n_tokens, threads,
                   static_cast<int>(repeats), dram_gbs, &isolated);
      continue;
    }
    BenchModel(m, variants, n_tokens, static_cast<int>(repeats), detail, after_prefill, dram_gbs, &rows);
  }
  // The JSON record: command, commit, date, machine, roofline, rows.
  auto shell = [](const char* cmd) {
    std::string out;
    if (FILE* p = popen(cmd, "r")) {
      char buf[256];
      while (std::fgets(buf, sizeof(buf), p) != nullptr) out += buf;
      pclose(p);
    }
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    return out;
  };
  std::string command = "lede_engine_bench";
  for (const std::string& a : args) command += " " + a;
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  nlohmann::json report = {
      {"command", command},
      {"commit", shell("git rev-parse --short HEAD 2>/dev/null")},
      {"dirty", !shell("git status --porcelain --untracked-files=no 2>/dev/null").empty()},
      {"date", date},
      {"machine",
       {{"cpu", shell("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2")},
        {"cores", shell("nproc")},
        {"quant_isa", cpu::QuantIsaName(cpu::BestQuantIsa())}}},
      {"threads", at::get_num_threads()},
      {"tokens", n_tokens},
      {"repeats", repeats},
      {"roofline", {{"dram_read_gb_per_s", dram_gbs}, {"llc_read_gb_per_s", llc_gbs}, {"sgemm_gflop_per_s", sgemm}}},
      {"rows", rows}};
  if (isolate) report["isolated"] = isolated;
  if (json_path.empty()) {
    char stamp[32];
    std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", std::gmtime(&now));
    json_path = std::string("bench/results/engine_bench-") + stamp + ".json";
  }
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(json_path).parent_path(), ec);
  std::ofstream(json_path) << report.dump(2) << "\n";
  std::printf("wrote %s\n", json_path.c_str());
  return 0;
}
