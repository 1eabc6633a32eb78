// lede-init-policy: the cold start of a policy root (trainer/cold_start.h).
// For a model without a trained exit policy, writes the first policy version
// (a static setting chosen by a short self-calibration on the model, or a
// fixed guess with --self-calibration=false) and points SERVING at it, so
// that LEDE requests work from the first one on. A root that already has a
// SERVING pointer is left alone (exit status 0). scripts/run calls it when
// the model has no policy/ directory.
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "policy/dqn/artifact.h"
#include "shared/flags/flags.h"
#include "shared/flags/model_flags.h"
#include "shared/model/cost/cost_model.h"
#include "shared/model/decoding.h"
#include "shared/model/loaders/load_or_exit.h"
#include "shared/model/loaders/model_load_flags.h"
#include "shared/tokenizer/model_files.h"
#include "shared/tokenizer/tokenizer.h"
#include "trainer/cold_start.h"

namespace {

using lede::Status;

// The longest calibration continuation (tokens); a small model gets it on
// every prompt, a large one fewer (trainer/cold_start.h SizeColdStart).
constexpr int64_t kMaxNewTokens = 48;

// --model, --threads (default 1) and --weights: the model-loading group
// (shared/flags/model_flags.h).
struct Flags : lede::flags::ModelLoadFlags {
  Flags() { threads = 1; }
  std::string policy_root, version = "cold-start-v1", cost_model = "accelerator", calibration;
  bool self_calibration = true;
  int64_t new_tokens = 0, prompts = 0, max_draft = 6;  // 0: sized by the model (SizeColdStart)
  double max_seconds = 20;
};

int Fail(const Status& s) {
  std::fprintf(stderr, "lede-init-policy: %s\n", std::string(s.message()).c_str());
  return s.code() == lede::StatusCode::kInternal ? 1 : 2;
}

int Run(const Flags& fl) {
  if (auto threads = lede::model::loaders::ApplyThreadsFlag(fl.threads); !threads.ok()) return Fail(threads.status());
  if (auto serving = lede::policy::dqn::ResolveServingVersion(fl.policy_root); serving.ok()) {
    std::fprintf(stderr, "msg=\"cold start skipped\" policy_root=%s serving=%s\n", fl.policy_root.c_str(),
                 serving->c_str());
    return 0;
  }
  if (fl.cost_model != "accelerator" && fl.cost_model != "measured") {
    return Fail(lede::InvalidArgumentError("--cost-model: want accelerator or measured"));
  }
  if (fl.max_draft < 1 || fl.max_draft > 16) {
    return Fail(lede::InvalidArgumentError("--max-draft-len: must be in [1, 16], got " + std::to_string(fl.max_draft)));
  }
  if (fl.new_tokens < 0 || fl.prompts < 0) {
    return Fail(lede::InvalidArgumentError("--new-tokens and --prompts: must be >= 0 (0 = sized by the model), got " +
                                           std::to_string(fl.new_tokens) + " and " + std::to_string(fl.prompts)));
  }
  const auto start = std::chrono::steady_clock::now();
  auto model_options = lede::model::loaders::ModelOptionsFromFlags(fl);
  if (!model_options.ok()) return Fail(model_options.status());
  std::shared_ptr<const lede::model::LlamaModel> model =
      lede::model::loaders::LoadModelOrExit("lede-init-policy", fl.model, *model_options);
  const double load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int32_t n_layers = static_cast<int32_t>(model->n_layers());
  lede::trainer::ColdStartChoice choice = lede::trainer::DefaultColdStart(n_layers);
  std::string cost_name = "accelerator";
  if (fl.self_calibration) {
    std::unique_ptr<lede::model::cost::CostModel> cost;
    if (fl.cost_model == "measured") {
      auto cal = lede::model::cost::ReadCalibrationFile(fl.calibration.empty() ? fl.model + "/calibration-cpu.json"
                                                                         : fl.calibration);
      if (!cal.ok()) return Fail(cal.status());
      cost = lede::model::cost::MakeMeasuredCostModel(*cal);
    } else {
      cost = lede::model::cost::MakeAcceleratorCostModel(model->config());
    }
    cost_name = cost->name();
    auto tok_path = lede::tokenizer::FindTokenizerFile(fl.model);
    if (!tok_path.ok()) return Fail(tok_path.status());
    auto tok = lede::tokenizer::LoadTokenizer(*tok_path);
    if (!tok.ok()) return Fail(tok.status());
    const std::vector<std::string>& texts = lede::trainer::ColdStartPrompts();
    lede::trainer::ColdStartSizing sizing = lede::trainer::SizeColdStart(
        lede::trainer::WeightsPerToken(model->config()), n_layers, static_cast<int64_t>(texts.size()), kMaxNewTokens);
    if (fl.new_tokens > 0) sizing.new_tokens = fl.new_tokens;
    if (fl.prompts > 0) sizing.n_prompts = std::min<int64_t>(fl.prompts, static_cast<int64_t>(texts.size()));
    std::string exits = sizing.exit_layers.empty() ? "all" : "";
    for (int32_t e : sizing.exit_layers) exits += (exits.empty() ? "" : ",") + std::to_string(e);
    std::fprintf(stderr, "msg=\"cold start sizing\" weights_per_token=%lld prompts=%lld new_tokens=%lld exit_layers=%s\n",
                 static_cast<long long>(lede::trainer::WeightsPerToken(model->config())),
                 static_cast<long long>(sizing.n_prompts), static_cast<long long>(sizing.new_tokens), exits.c_str());
    std::vector<std::vector<int32_t>> prompts;
    for (int64_t i = 0; i < sizing.n_prompts; ++i) {
      auto ids = (*tok)->Encode(texts[static_cast<size_t>(i)], true, false);
      if (!ids.ok()) return Fail(ids.status());
      prompts.push_back(*std::move(ids));
    }
    // The KV a calibration request needs, not the model's window (a 131,072
    // token window is gigabytes of K/V per slot, zeroed at creation).
    size_t longest = 0;
    for (const auto& p : prompts) longest = std::max(longest, p.size());
    lede::model::KvCacheOptions ko;
    ko.max_draft_len = std::max<int64_t>(8, fl.max_draft);
    ko.capacity = std::min<int64_t>(model->config().max_seq_len,
                                    static_cast<int64_t>(longest) + sizing.new_tokens + ko.max_draft_len + 2);
    auto engine = lede::model::Engine::Create(model, ko);
    if (!engine.ok()) return Fail(engine.status());
    const auto calibration_start = std::chrono::steady_clock::now();
    auto out_of_time = [&] {
      return fl.max_seconds > 0 &&
             std::chrono::duration<double>(std::chrono::steady_clock::now() - calibration_start).count() >
                 fl.max_seconds;
    };
    auto chosen = lede::trainer::ChooseColdStart(**engine, prompts, sizing.new_tokens, static_cast<int32_t>(fl.max_draft),
                                                 *cost, out_of_time, sizing.exit_layers);
    if (!chosen.ok()) return Fail(chosen.status());
    choice = *chosen;
  }
  auto artifact = lede::trainer::ColdStartArtifact(choice, n_layers, model->config().ArchitectureFingerprint(),
                                                   fl.version, cost_name);
  if (!artifact.ok()) return Fail(artifact.status());
  if (Status s = lede::trainer::WriteColdStartPolicy(fl.policy_root, *artifact); !s.ok()) return Fail(s);
  const std::string method = choice.speculate ? "static:E=" + std::to_string(choice.exit_layer) + ",D=" + std::to_string(choice.draft_len) : "autoregressive";
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr,
               "msg=\"cold start policy written\" policy_root=%s version=%s method=%s how=%s cost_model=%s "
               "predicted_speedup=%.4f calibration_requests=%lld calibration_tokens=%lld load_seconds=%.2f seconds=%.2f\n",
               fl.policy_root.c_str(), fl.version.c_str(), method.c_str(),
               choice.how.c_str(), cost_name.c_str(), choice.speedup, static_cast<long long>(choice.n_requests),
               static_cast<long long>(choice.n_tokens), load_seconds, seconds);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags fl;
  lede::flags::FlagSet f;
  lede::flags::AddModelLoadFlags(&f, &fl, lede::flags::kModelPath);
  f.Add("policy-root", &fl.policy_root, "policy root to initialise (left alone if it has a SERVING pointer)", true);
  f.Add("self-calibration", &fl.self_calibration,
        "choose (E, D) by decoding a few built-in prompts on the model (false: E = L/4, D = 3 unmeasured)");
  f.Add("new-tokens", &fl.new_tokens,
        "tokens generated per calibration prompt (0 = sized by the model: fewer on a larger one)");
  f.Add("prompts", &fl.prompts, "built-in calibration prompts decoded (0 = sized by the model, at most 6)");
  f.Add("max-draft-len", &fl.max_draft, "largest draft length tried");
  f.Add("max-seconds", &fl.max_seconds,
        "self-calibration: decode no further prompt after this many seconds (at least one is decoded; 0 = all)");
  f.Add("cost-model", &fl.cost_model, "accelerator, or measured (with --calibration)");
  f.Add("calibration", &fl.calibration, "measured cost model JSON (default MODEL/calibration-cpu.json)");
  f.Add("version", &fl.version, "policy version to write");
  lede::flags::AddModelLoadFlags(&f, &fl, lede::flags::kThreads | lede::flags::kWeights);
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (lede::flags::WantsHelp(args)) {
    std::printf("usage: lede-init-policy --model DIR --policy-root DIR [flags]\nflags:\n%s", f.Usage().c_str());
    return 0;
  }
  if (Status s = f.Parse(args); !s.ok()) {
    std::fprintf(stderr, "lede-init-policy: %s (see --help)\n", std::string(s.message()).c_str());
    return 2;
  }
  return Run(fl);
}
