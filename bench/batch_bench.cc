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
// usage: lede_batch_bench [--model models/lede-tiny] [--batches 1,2,4,8,16,32]
//                         [--k 3] [--exit-layer 2] [--context 128] [--iters 50] [--threads 1]
//                         [--json FILE]
#include <chrono>
#include <cstdio>
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
#include "shared/model/decoding.h"
#include "shared/model/kv_cache.h"
#include "shared/model/llama.h"

namespace {

using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

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
  std::printf("%s, context %ld, K=%ld at E=%ld, %ld threads (at::get_num_threads %d); ms per step\n",
              model_path.c_str(), (long)context, (long)k, (long)exit_layer, (long)threads, at::get_num_threads());
  std::printf("%6s %-7s %10s %10s %8s\n", "B", "work", "batched", "solo x B", "speedup");
  nlohmann::json rows = nlohmann::json::array();
  for (const char* kind : {"step", "verify", "draft"}) {
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
                               {"rows", rows}});
}

}  // namespace

int main(int argc, char** argv) { return Run(std::vector<std::string>(argv + 1, argv + argc)); }
