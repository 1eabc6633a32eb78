// Engine benchmark: prints numbers, asserts nothing.
//
// 1. The roofline of this CPU, measured here: the read bandwidth of a loop
//    over a buffer larger than the last-level cache (DRAM) and over one that
//    fits in it (the small models' weights do), and the GFLOP/s of a BLAS
//    sgemm (OpenBLAS) on the benchmark's threads (bench/cpu_roofline.h).
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

#include "bench/cpu_roofline.h"
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
using lede::bench::Median;
using lede::bench::ReadBandwidthGbs;
using lede::bench::Seconds;
using lede::bench::ThreadCpuSeconds;

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
  const double cpu0 = ThreadCpuSeconds();
  auto r = engine.Generate(prompt, o);
  const double cpu_s = ThreadCpuSeconds() - cpu0;
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

// The flags (usage in the file comment).
struct BenchFlags {
  int64_t n_tokens = 200, repeats = 5;
  lede::flags::ModelLoadFlags load;  // --threads of the model-loading group; 1 by default here
  bool detail = false, after_prefill = false, no_gemv = false, roofline_only = false, isolate = false;
  std::string models = "testdata/models/stories260K,testdata/models/babyllama-tok105/model5000.bin,models/lede-tiny";
  std::string kernels = "eager,fused", weights = "auto", json_path, child_weights;
  BenchFlags() { load.threads = 1; }
};

// Parses `args` into *b. Returns -1 to go on, else the exit status: 0 after
// printing the usage (--help), 2 after printing a bad flag.
int ParseBenchFlags(const std::vector<std::string>& args, BenchFlags* b) {
  lede::flags::FlagSet flags;
  flags.Add("models", &b->models, "comma-separated model paths (checkpoint directory or llama2.c .bin)");
  flags.Add("tokens", &b->n_tokens, "new tokens per generation (greedy, prompt = BOS)");
  lede::flags::AddModelLoadFlags(&flags, &b->load, lede::flags::kThreads);
  flags.Add("repeats", &b->repeats, "interleaved runs per implementation; medians are printed");
  flags.Add("kernels", &b->kernels, "comma-separated implementations to compare: eager, fused");
  flags.Add("detail", &b->detail, "also print the per-block timing table and the static grid");
  flags.Add("after-prefill", &b->after_prefill, "also print the latency of the first steps after a prefill");
  flags.Add("weights", &b->weights, "comma-separated weight storages to compare: auto, f32, bf16, q8_0");
  flags.Add("json", &b->json_path, "write the results here (default bench/results/engine_bench-<UTC time>.json)");
  flags.Add("no-gemv", &b->no_gemv, "skip the matrix-vector kernel table");
  flags.Add("roofline-only", &b->roofline_only, "print the read bandwidths (DRAM, LLC) as one JSON line and exit");
  flags.Add("isolate", &b->isolate,
            "each --weights variant in its own process: load time, peak RSS, AR tok/s (fused only)");
  flags.Add("child-weights", &b->child_weights, "internal (--isolate): run one variant of the first model here");
  if (lede::flags::WantsHelp(args)) {
    std::printf("usage: lede_engine_bench [flags]\n%s", flags.Usage().c_str());
    return 0;
  }
  if (auto s = flags.Parse(args); !s.ok()) {
    std::fprintf(stderr, "lede_engine_bench: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  return -1;
}

// Every --kernels implementation at every --weights storage, weights outer.
// Errors: kInvalidArgument from ParseKernels / loaders::ParseWeightFormat, naming the
// flag.
lede::StatusOr<std::vector<Variant>> ParseVariants(const BenchFlags& b) {
  std::vector<Kernels> kernels;
  for (const std::string& k : lede::flags::SplitList(b.kernels)) {
    auto parsed = ParseKernels(k);
    if (!parsed.ok()) return parsed.status();
    kernels.push_back(*parsed);
  }
  std::vector<Variant> variants;
  for (const std::string& wf : lede::flags::SplitList(b.weights)) {
    auto parsed = loaders::ParseWeightFormat(wf);
    if (!parsed.ok()) return parsed.status();
    for (Kernels k : kernels) variants.push_back({k, *parsed});
  }
  return variants;
}

// The roofline of section 1, measured once and printed.
struct Roofline {
  double dram_gbs = 0, llc_gbs = 0, sgemm_gflops = 0;
};
Roofline MeasureRoofline() {
  Roofline r;
  r.dram_gbs = ReadBandwidthGbs(256ll << 20, 5);
  r.llc_gbs = ReadBandwidthGbs(16ll << 20, 20);
  r.sgemm_gflops = lede::bench::SgemmGflops(512, 10);
  std::printf("roofline: read bandwidth %.1f GB/s (256 MiB, DRAM), %.1f GB/s (16 MiB, last-level cache); "
              "sgemm 512^3 %.1f GFLOP/s\n", r.dram_gbs, r.llc_gbs, r.sgemm_gflops);
  return r;
}

// The benchmark of one model: every variant in this process, or with
// --isolate each weight format in a child process (section 2c).
void BenchOneModel(const std::string& model, const BenchFlags& b, const std::vector<Variant>& variants,
                   const Roofline& roof, nlohmann::json* rows, nlohmann::json* isolated) {
  if (!b.isolate) {
    BenchModel(model, variants, b.n_tokens, static_cast<int>(b.repeats), b.detail, b.after_prefill, roof.dram_gbs,
               rows);
    return;
  }
  std::vector<loaders::WeightFormat> formats;
  for (const Variant& v : variants) {
    if (std::find(formats.begin(), formats.end(), v.weights) == formats.end()) formats.push_back(v.weights);
  }
  IsolatedRuns(std::filesystem::read_symlink("/proc/self/exe").string(), model, formats, b.n_tokens, b.load.threads,
               static_cast<int>(b.repeats), roof.dram_gbs, isolated);
}

// The output of a shell command, trailing newlines and spaces removed.
std::string Shell(const char* cmd) {
  std::string out;
  if (FILE* p = popen(cmd, "r")) {
    char buf[256];
    while (std::fgets(buf, sizeof(buf), p) != nullptr) out += buf;
    pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

// Writes the JSON record (command, commit, date, machine, roofline, rows;
// "isolated" with --isolate) to --json or bench/results/engine_bench-<UTC
// time>.json.
void WriteRecord(const std::vector<std::string>& args, const BenchFlags& b, const Roofline& roof,
                 const nlohmann::json& rows, const nlohmann::json& isolated) {
  std::string command = "lede_engine_bench";
  for (const std::string& a : args) command += " " + a;
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  nlohmann::json report = {
      {"command", command},
      {"commit", Shell("git rev-parse --short HEAD 2>/dev/null")},
      {"dirty", !Shell("git status --porcelain --untracked-files=no 2>/dev/null").empty()},
      {"date", date},
      {"machine",
       {{"cpu", Shell("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2")},
        {"cores", Shell("nproc")},
        {"quant_isa", cpu::QuantIsaName(cpu::BestQuantIsa())}}},
      {"threads", at::get_num_threads()},
      {"tokens", b.n_tokens},
      {"repeats", b.repeats},
      {"roofline",
       {{"dram_read_gb_per_s", roof.dram_gbs},
        {"llc_read_gb_per_s", roof.llc_gbs},
        {"sgemm_gflop_per_s", roof.sgemm_gflops}}},
      {"rows", rows}};
  if (b.isolate) report["isolated"] = isolated;
  std::string json_path = b.json_path;
  if (json_path.empty()) {
    char stamp[32];
    std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", std::gmtime(&now));
    json_path = std::string("bench/results/engine_bench-") + stamp + ".json";
  }
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(json_path).parent_path(), ec);
  std::ofstream(json_path) << report.dump(2) << "\n";
  std::printf("wrote %s\n", json_path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  BenchFlags b;
  if (int status = ParseBenchFlags(args, &b); status >= 0) return status;
  if (b.roofline_only) {
    const double dram = ReadBandwidthGbs(256ll << 20, 5), llc = ReadBandwidthGbs(16ll << 20, 20);
    std::printf("{\"dram_read_gb_per_s\": %.3f, \"llc_read_gb_per_s\": %.3f}\n", dram, llc);
    return 0;
  }
  auto variants = ParseVariants(b);
  if (!variants.ok()) {
    std::fprintf(stderr, "lede_engine_bench: --%s\n", std::string(variants.status().message()).c_str());
    return 2;
  }
  if (variants->empty() || b.repeats < 1 || b.n_tokens < 1) {
    std::fprintf(stderr, "lede_engine_bench: need --kernels, --repeats >= 1, --tokens >= 1\n");
    return 2;
  }
  auto n_threads = lede::model::loaders::ApplyThreadsFlag(b.load.threads);
  if (!n_threads.ok()) {
    std::fprintf(stderr, "lede_engine_bench: %s\n", std::string(n_threads.status().message()).c_str());
    return 2;
  }
  b.load.threads = *n_threads;  // children get the resolved count
  c10::InferenceMode inference_mode;
  if (!b.child_weights.empty()) {
    auto parsed = loaders::ParseWeightFormat(b.child_weights);
    const auto models = lede::flags::SplitList(b.models);
    if (!parsed.ok() || models.empty()) {
      std::fprintf(stderr, "lede_engine_bench: --child-weights needs a format and --models\n");
      return 2;
    }
    return RunChild(models[0], *parsed, b.n_tokens);
  }
  std::printf("LEDE engine benchmark: greedy, prompt = BOS, %lld new tokens, threads=%d, medians of %lld interleaved runs\n",
              static_cast<long long>(b.n_tokens), at::get_num_threads(), static_cast<long long>(b.repeats));
  const Roofline roof = MeasureRoofline();
  std::printf("quantized kernels: %s\n", cpu::QuantIsaName(cpu::BestQuantIsa()));
  if (!b.no_gemv) lede::bench::PrintGemvTable();
  nlohmann::json rows = nlohmann::json::array(), isolated = nlohmann::json::array();
  for (const std::string& m : lede::flags::SplitList(b.models)) {
    BenchOneModel(m, b, *variants, roof, &rows, &isolated);
  }
  WriteRecord(args, b, roof, rows, isolated);
  return 0;
}
