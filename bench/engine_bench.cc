// Engine benchmark: prints numbers, asserts nothing.
//
// For each model: time per block (1..16 positions) and per LM-head call,
// verify(k)/step(1), autoregressive tokens/s, and for a grid of static
// self-speculation settings (exit layer E, draft length D): tokens/s,
// measured wall-clock speed-up over autoregressive, the speed-up predicted by
// the accelerator and measured cost models (cost_model.h), acceptance rate,
// tokens per round, and greedy divergences from autoregressive decoding
// (allowed only at numerical near-ties, DESIGN.md §1).
//
// usage: lede_engine_bench [--tokens N] [--threads N] [MODEL_PATH...]
// (default models: ../shared/models/stories260K and babyllama-tok105)
#include <ATen/Parallel.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "shared/model/cost_model.h"
#include "shared/model/decoding.h"
#include "shared/model/llama.h"

namespace {

using namespace lede::model;

struct Prompt {
  const char* name;
  std::vector<int32_t> ids;
};

int Divergences(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (a[i] != b[i]) return 1;
  }
  return 0;
}

void BenchModel(const std::string& path, int64_t n_tokens) {
  auto loaded = LlamaModel::Load(path, ModelOptions{});
  if (!loaded.ok()) {
    std::fprintf(stderr, "skip %s: %s\n", path.c_str(), loaded.status().ToString().c_str());
    return;
  }
  std::shared_ptr<const LlamaModel> model = std::move(*loaded);
  const ModelConfig& c = model->config();
  const int64_t L = c.n_layers;
  std::printf("\n== %s  (d=%lld, L=%lld, V=%lld, h=%.3f layer-equivalents, threads=%d)\n", path.c_str(),
              static_cast<long long>(c.dim), static_cast<long long>(L), static_cast<long long>(c.vocab_size),
              HeadLayerEquivalents(c), at::get_num_threads());

  auto cal = Calibrate(*model, 100);
  if (!cal.ok()) {
    std::fprintf(stderr, "calibration failed: %s\n", cal.status().ToString().c_str());
    return;
  }
  std::printf("full step %.1f us (1 position); verify(k) = L blocks + head on k positions:\n", cal->step_us);
  std::printf("  k  block us  head us  verify(k)/step(1)\n");
  for (int k = 1; k <= 16; ++k) {
    const double verify = L * cal->block_us[k - 1] + cal->head_us[k - 1];
    std::printf("%3d  %8.1f  %7.1f  %6.2f\n", k, cal->block_us[k - 1], cal->head_us[k - 1], verify / cal->step_us);
  }
  auto accel = MakeAcceleratorCostModel(c);
  auto measured = MakeMeasuredCostModel(*cal);

  KvCacheOptions ko;
  ko.max_draft_len = 16;
  auto engine = Engine::Create(model, ko);
  if (!engine.ok()) return;
  std::vector<int32_t> prompt = {static_cast<int32_t>(c.bos_id)};
  GenerateOptions ar;
  ar.max_new_tokens = n_tokens;
  ar.stop_at_eos = false;
  // Best of 3 for the baseline so it is never flattered.
  double ar_tps = 0;
  std::vector<int32_t> ar_tokens;
  for (int rep = 0; rep < 3; ++rep) {
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
      char name[64];
      std::snprintf(name, sizeof(name), "E=%lld,D=%lld", static_cast<long long>(e), static_cast<long long>(d));
      std::printf("%-10s %9.0f %8.2fx %9.2fx %10.2fx %7.3f %8.2f %6d\n", name, tps, tps / ar_tps,
                  accel->PredictedSpeedup(best.stats.rounds), measured->PredictedSpeedup(best.stats.rounds),
                  best.stats.acceptance_rate(), best.stats.tokens_per_round(), Divergences(best.tokens, ar_tokens));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  int64_t n_tokens = 200;
  std::vector<std::string> models;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--tokens" && i + 1 < argc) {
      n_tokens = std::atoll(argv[++i]);
    } else if (a == "--threads" && i + 1 < argc) {
      at::set_num_threads(std::atoi(argv[++i]));
    } else {
      models.push_back(a);
    }
  }
  if (models.empty()) {
    models = {"../shared/models/stories260K", "../shared/models/babyllama-tok105/model5000.bin"};
  }
  std::printf("LEDE engine benchmark: greedy, prompt = BOS, %lld new tokens; measured = wall-clock vs AR\n",
              static_cast<long long>(n_tokens));
  for (const std::string& m : models) BenchModel(m, n_tokens);
  return 0;
}
