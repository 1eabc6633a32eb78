// `lede generate` (commands.h): flags, then the tokenizer and model, the
// prompts, the decoding options and engine, and the generations with their
// stats lines.
#include "services/cli/commands.h"

#if LEDE_HAVE_POLICY
#include "policy/dqn/artifact.h"
#include "policy/dqn/dqn_exit_controller.h"
#include "policy/dqn/method_factory.h"
#endif

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iomanip>
#include <limits>
#include <memory>
#include <sstream>

#include <c10/core/Device.h>

#include "services/cli/internal/common.h"
#include "shared/file/file.h"
#include "shared/flags/flags.h"
#include "shared/model/cost/cost_model.h"
#include "shared/model/cost/cost_profiles.h"
#include "shared/model/decoding.h"
#include "shared/model/llama.h"
#include "shared/speculation/cost_features.h"
#include "shared/speculation/method.h"
#include "shared/status/status_macros.h"
#include "shared/tokenizer/model_files.h"
#include "shared/tokenizer/tokenizer.h"

namespace lede::cli {
namespace {

using flags::FlagSet;
using internal::Fail;
using internal::kExitFailure;
using internal::kExitOk;
using internal::kExitUsage;
using internal::LoadFailureCode;

// The flags of `lede generate`, with their defaults.
struct GenerateFlags {
  internal::ModelFlags mf;
  std::string prompt, prompt_file, tokenizer_path, policy_dir, calibration_path, mode = "static";
  std::string kv_dtype = "bfloat16";  // as lede-model's --kv-dtype
  int64_t max_new_tokens = 128, exit_layer = 0, draft_len = 4, seed = 0, repeat = 1, samples = 1;
  double temperature = 0.0, top_p = 1.0;
  std::string separator, system, chat_template;
  bool chat = false;

  void AddTo(FlagSet& f) {
    mf.AddTo(f);
    f.Add("prompt", &prompt, "prompt text (or --prompt-file)");
    f.Add("prompt-file", &prompt_file,
          "prompts, one per line (empty lines skipped): each is generated --repeat times in turn, with one "
          "model load (benchmarks); its text is printed once, then --separator");
    f.Add("repeat", &repeat, "generate this many times, one stats line each (benchmarks: later runs are warm)");
    f.Add("samples", &samples,
          "sample this many texts from the prompt in one process, with seeds seed, seed+1, ... (corpora)");
    f.Add("separator", &separator, "a line printed after each text (with --samples or --prompt-file)");
    f.Add("tokenizer", &tokenizer_path, "tokenizer file (default: found beside the model)");
    f.Add("chat", &chat, "the prompt is a user message: render the checkpoint's chat template around it");
    f.Add("system", &system, "--chat: a system message before the user message");
    f.Add("chat-template", &chat_template, "--chat: Jinja template file (default: tokenizer_config.json's)");
    f.Add("max-new-tokens", &max_new_tokens, "tokens to generate");
    f.Add("mode", &mode,
          "ar (autoregressive), static (self-speculative, fixed E and D) or lede (learned exit policy)");
    f.Add("policy", &policy_dir,
          "lede mode: a policy version directory, or a policy root with a SERVING pointer (default: MODEL/policy)");
    f.Add("calibration", &calibration_path,
          "lede mode: a measured cost model (lede calibrate) whose costs a deployment-priced policy sees (default: "
          "a short self-calibration of the loaded model)");
    f.Add("kv-dtype", &kv_dtype,
          "dtype of the KV cache's K and V: bfloat16 (as the model service stores them), float32, or auto (the "
          "compute dtype)");
    f.Add("exit-layer", &exit_layer, "draft exit layer E in [1, L] (default: L/4, at least 1)");
    f.Add("draft-len", &draft_len, "draft length D");
    f.Add("temperature", &temperature, "0 = greedy");
    f.Add("top-p", &top_p, "nucleus mass in (0, 1]");
    f.Add("seed", &seed, "sampling seed");
  }
};

#if LEDE_HAVE_POLICY
// The policy to serve from `policy_dir` (models/<m>/policy): the one whose
// reward cost model fits the hardware. On CUDA (memory-bound decoding) the
// SERVING policy if it was trained with the accelerator cost model, else of
// the versions that were, the one trained on the most requests (a policy of
// one domain, story-*, is not the general one), the last by name among
// equals; elsewhere the SERVING pointer (set by scripts/train_policies.sh to
// the policy measured fastest on this CPU).
StatusOr<policy::dqn::Artifact> ChoosePolicy(const std::string& policy_dir, const c10::Device& device,
                                             const std::string& fingerprint) {
  // A version directory (as lede-train writes it) is used as it is.
  if (std::filesystem::exists(std::filesystem::path(policy_dir) / policy::dqn::kMetadataFile)) {
    return policy::dqn::LoadArtifact(policy_dir, fingerprint);
  }
  if (device.is_cuda()) {
    auto serving = policy::dqn::LoadServingArtifact(policy_dir, fingerprint);
    if (serving.ok() && serving->metadata.reward_cost_model == "accelerator") return serving;
    auto broadest = policy::dqn::LoadBroadestVersion(policy_dir, "accelerator", fingerprint);
    if (broadest.ok()) return broadest;
  }
  return policy::dqn::LoadServingArtifact(policy_dir, fingerprint);
}

// Self-calibration repeats: each kernel is timed this many times (medians);
// on the 5x widening at q8_0 about 2.5 s of the self-calibration's 7.
constexpr int kSelfCalibrationRepeats = 3;
// Tokens of each generation whose steps the self-calibration times in
// context (model::cost::TimeStepsInContext).
constexpr int64_t kSelfCalibrationTokens = 16;

// The cost features a policy priced by the deployment (reward cost model
// "served", docs/training.md "What the policy sees of the hardware") sees in
// process: those of the calibration at `calibration_path`, else of a short
// self-calibration of the loaded model at its weight format and thread
// count: kernel timings for the probe, and the steps of a few short
// generations timed in context as the model services time their served
// steps (experience::ServedCostMeter). One line on `err` says which.
StatusOr<speculation::CostFeatures> InProcessCostFeatures(const std::string& calibration_path,
                                                          const model::LlamaModel& llama, int64_t max_draft_len,
                                                          std::ostream& err) {
  model::cost::Calibration calibration;
  std::string source = calibration_path;
  if (!calibration_path.empty()) {
    LEDE_ASSIGN_OR_RETURN(calibration, model::cost::ReadCalibrationFile(calibration_path));
  } else {
    const auto start = std::chrono::steady_clock::now();
    LEDE_ASSIGN_OR_RETURN(calibration, model::cost::Calibrate(llama, kSelfCalibrationRepeats, nullptr,
                                                              /*round_passes=*/0, max_draft_len));
    // The features come from steps timed in generations, as served
    // (cost_profiles.h CostFeaturesOfCalibration); the probe from the
    // kernel timings above. Every exit layer of the shallow half, whose
    // draft line the features fit (two exit layers alone gave layer
    // features of 0.45-1.02 in three runs on the 5x widening at q8_0).
    std::vector<int64_t> exit_layers;
    for (int64_t e = 1; e <= speculation::MiddleExitLayer(llama.n_layers()); ++e) exit_layers.push_back(e);
    // A context too short for the generations (or a model of two layers)
    // keeps the kernel timings' features, as a calibration without steps in
    // context does, and says so.
    if (exit_layers.size() >= 2) {
      StatusOr<model::cost::ServedStepCosts> steps = model::cost::TimeStepsInContext(
          llama, exit_layers, std::min<int64_t>(3, std::max<int64_t>(1, max_draft_len)), kSelfCalibrationTokens);
      if (steps.ok()) {
        calibration.context_steps = *std::move(steps);
      } else {
        err << "[lede] steps not timed in context (" << steps.status().message()
            << "); the policy sees the features of the kernel timings\n";
      }
    }
    std::ostringstream what;
    what << std::fixed << std::setprecision(1) << "a self-calibration ("
         << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() << " s)";
    source = what.str();
  }
  const speculation::CostFeatures f =
      model::cost::CostFeaturesOfCalibration(calibration, llama.n_layers(), max_draft_len);
  err << std::fixed << std::setprecision(3) << "[lede] policy priced by " << source << ": probe " << f.probe
      << ", layer " << f.layer << ", verify " << f.verify << " (autoregressive steps)\n";
  return f;
}

// --mode lede: the policy version (`policy_dir`, default MODEL/policy) built
// by the method factory; sets the loop mode, decision spec and (for a
// deployment-priced policy) cost features of `go`.
StatusOr<std::unique_ptr<speculation::ExitController>> LedeController(const std::string& model_path, std::string policy_dir,
                                                                const std::string& calibration_path,
                                                                const c10::Device& device,
                                                                const model::LlamaModel& llama,
                                                                model::GenerateOptions* go, std::ostream& err) {
  if (policy_dir.empty()) {
    std::filesystem::path p(model_path);
    policy_dir = ((std::filesystem::is_directory(p) ? p : p.parent_path()) / "policy").string();
  }
  LEDE_ASSIGN_OR_RETURN(policy::dqn::Artifact artifact,
                        ChoosePolicy(policy_dir, device, llama.config().ArchitectureFingerprint()));
  policy::dqn::MethodContext context;
  context.n_layers = static_cast<int32_t>(llama.n_layers());
  context.max_draft_len = std::numeric_limits<int32_t>::max();  // the pool is sized from the spec below
  const bool priced_by_deployment = artifact.metadata.reward_cost_model == "served";
  context.artifact = std::make_shared<const policy::dqn::Artifact>(std::move(artifact));
  speculation::MethodSpec spec;
  spec.method = speculation::SpeculationMethod::kLede;
  LEDE_ASSIGN_OR_RETURN(policy::dqn::MethodPlan plan, policy::dqn::PlanMethod(spec, context));
  go->mode = plan.mode;
  go->decision_spec = plan.decision_spec;
  if (priced_by_deployment || !calibration_path.empty()) {
    LEDE_ASSIGN_OR_RETURN(go->cost_features,
                          InProcessCostFeatures(calibration_path, llama, plan.decision_spec.max_draft_len, err));
  }
  return plan.MakeController();
}
#endif

// One stats line per generation (stderr): tokens, tokens/s, acceptance
// rate, tokens per round, mean exit layer, wall and prefill time.
void PrintGenerationStats(std::ostream& err, const std::string& label, const model::GenerationStats& st) {
  err << std::fixed << std::setprecision(2) << "[" << label << "] " << st.n_generated << " tokens, "
      << st.decode_tokens_per_s() << " tokens/s, acceptance rate " << std::setprecision(3)
      << st.acceptance_rate() << ", " << st.tokens_per_round() << " tokens/round, mean exit layer "
      << std::setprecision(2) << st.mean_exit_layer() << ", wall " << std::setprecision(3)
      << (st.prefill_s + st.decode_s) << " s (prefill " << st.prefill_s << " s)\n";
}

// What the checked flags of `lede generate` ask for.
struct GenerateRequest {
  std::vector<std::string> prompt_texts;  // --prompt-file's prompts; empty with --prompt
  speculation::SpeculationMethod method = speculation::SpeculationMethod::kStatic;
};

// The prompts of --prompt-file `path`: its non-empty lines (a trailing CR
// dropped). Errors: the read error; kInvalidArgument naming --prompt-file
// for a file with no prompt.
StatusOr<std::vector<std::string>> ReadPromptLines(const std::string& path) {
  LEDE_ASSIGN_OR_RETURN(std::string text, file::ReadFile(path));
  std::vector<std::string> prompt_texts;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty()) prompt_texts.push_back(line);
  }
  if (prompt_texts.empty()) return InvalidArgumentError("--prompt-file: " + path + " holds no prompt");
  return prompt_texts;
}

// Checks the flag combinations of `lede generate` and reads --prompt-file.
// Errors (all exit 2): kInvalidArgument naming the flag; kUnimplemented for
// --mode lede in the engine-only build; --prompt-file's (ReadPromptLines).
StatusOr<GenerateRequest> CheckGenerateFlags(const GenerateFlags& g) {
  if (g.prompt.empty() == g.prompt_file.empty()) {
    return InvalidArgumentError("give one of --prompt and --prompt-file");
  }
  if (!g.prompt_file.empty() && (g.samples > 1 || g.chat)) {
    return InvalidArgumentError("--prompt-file: cannot be combined with --samples or --chat");
  }
  GenerateRequest request;
  if (!g.prompt_file.empty()) {
    LEDE_ASSIGN_OR_RETURN(request.prompt_texts, ReadPromptLines(g.prompt_file));
  }
  if (g.repeat < 1) return InvalidArgumentError("--repeat: must be >= 1");
  if (g.samples < 1) return InvalidArgumentError("--samples: must be >= 1");
  if (g.samples > 1 && g.repeat > 1) return InvalidArgumentError("--samples: cannot be combined with --repeat");
  StatusOr<speculation::SpeculationMethod> method = speculation::ParseSpeculationMethod(g.mode);
  if (!method.ok() || *method == speculation::SpeculationMethod::kThreshold) {
    return InvalidArgumentError("--mode: want ar, static or lede, got '" + g.mode + "'");
  }
  request.method = *method;
  if (!g.calibration_path.empty() && request.method != speculation::SpeculationMethod::kLede) {
    return InvalidArgumentError("--calibration: only --mode lede uses a cost model, got --mode " + g.mode);
  }
#if !LEDE_HAVE_POLICY
  if (request.method == speculation::SpeculationMethod::kLede) {
    return UnimplementedError("--mode lede: this engine-only build has no policy support");
  }
#endif
  return request;
}

// The tokenizer and model `lede generate` runs.
struct LoadedModel {
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  std::shared_ptr<const model::LlamaModel> llama;
};

// Loads the tokenizer file, then the model at `model_path`, and prints the
// model's load time ("[load] PATH in S s") to `err`. Errors: the failing
// load's status.
StatusOr<LoadedModel> LoadTokenizerAndModel(const std::string& tokenizer_path, const std::string& model_path,
                                            const model::ModelOptions& options, std::ostream& err) {
  LoadedModel loaded;
  LEDE_ASSIGN_OR_RETURN(loaded.tokenizer, tokenizer::LoadTokenizer(tokenizer_path));
  const auto load_start = std::chrono::steady_clock::now();
  LEDE_ASSIGN_OR_RETURN(loaded.llama, model::LlamaModel::Load(model_path, options));
  err << std::fixed << std::setprecision(2) << "[load] " << model_path << " in "
      << std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count() << " s\n";
  return loaded;
}

// The token ids of each prompt: `prompt_texts` (--prompt-file's), or
// --prompt alone, rendered as a chat turn with --chat. A chat template
// writes BOS itself, so --chat adds none. Errors (exit 2): the chat
// template's (RenderChatPrompt); kInvalidArgument naming --prompt for a text
// the tokenizer refuses.
StatusOr<std::vector<std::vector<int32_t>>> EncodePrompts(const GenerateFlags& g,
                                                          std::vector<std::string> prompt_texts,
                                                          const tokenizer::Tokenizer& tok) {
  if (prompt_texts.empty()) {
    std::string prompt_text = g.prompt;
    if (g.chat) {
      LEDE_ASSIGN_OR_RETURN(prompt_text, internal::RenderChatPrompt(g.tokenizer_path, g.chat_template, g.system,
                                                                    g.prompt, true));
    }
    prompt_texts.push_back(std::move(prompt_text));
  }
  std::vector<std::vector<int32_t>> prompts;
  for (const std::string& text : prompt_texts) {
    auto encoded = tok.Encode(text, /*add_bos=*/!g.chat, /*add_eos=*/false);
    if (!encoded.ok()) return InvalidArgumentError("--prompt: " + std::string(encoded.status().message()));
    prompts.push_back(std::move(*encoded));
  }
  return prompts;
}

// The decoding options of the flags for a model of `n_layers` layers: the
// default exit layer is L/4 (at least 1). --mode lede's controller and
// decision spec are LedeController's.
model::GenerateOptions GenerateOptionsOf(const GenerateFlags& g, speculation::SpeculationMethod method,
                                         int64_t n_layers) {
  model::GenerateOptions go;
  go.max_new_tokens = g.max_new_tokens;
  go.sampling.temperature = g.temperature;
  go.sampling.top_p = g.top_p;
  go.sampling.seed = static_cast<uint64_t>(g.seed);
  go.mode = speculation::LoopMode(method);
  go.exit_layer = g.exit_layer > 0 ? g.exit_layer : std::max<int64_t>(1, n_layers / 4);
  go.draft_len = g.draft_len;
  return go;
}

// A one-slot engine whose KV cache holds only the positions this run can
// use (the longest prompt, the new tokens and a draft): a 128k-context
// model's full window would be 8 GiB of KV cache for Llama-3.2-1B.
StatusOr<std::unique_ptr<model::Engine>> MakeEngine(std::shared_ptr<const model::LlamaModel> llama,
                                                    const GenerateFlags& g,
                                                    const std::vector<std::vector<int32_t>>& prompts) {
  size_t longest = 0;
  for (const std::vector<int32_t>& ids : prompts) longest = std::max(longest, ids.size());
  model::KvCacheOptions ko;
  ko.n_slots = 1;
  ko.max_draft_len = std::max<int64_t>(16, g.draft_len);
  LEDE_ASSIGN_OR_RETURN(ko.kv_dtype, model::ParseKvDtype(g.kv_dtype, llama->options().dtype, "--kv-dtype"));
  ko.capacity = std::min<int64_t>(llama->config().max_seq_len,
                                  static_cast<int64_t>(longest) + g.max_new_tokens + ko.max_draft_len + 2);
  return model::Engine::Create(std::move(llama), ko);
}

// The label of the stats lines: the mode, static's E and D, the
// controller's name.
std::string StatsLabel(const GenerateFlags& g, speculation::SpeculationMethod method,
                       const model::GenerateOptions& go, const speculation::ExitController* controller) {
  std::string label = g.mode;
  if (method == speculation::SpeculationMethod::kStatic) {
    label += " E=" + std::to_string(go.exit_layer) + " D=" + std::to_string(go.draft_len);
  }
  if (controller) label += " " + controller->name();
  return label;
}

// Generates each prompt max(--repeat, --samples) times in turn: the first
// run (and every --samples run, with seeds seed, seed+1, ...) streams the
// prompt and its continuation to `out`, then --separator; every run prints
// its stats line to `err`. Errors: the first failing generation's status
// (nothing more is run).
Status RunGenerations(model::Engine& engine, const tokenizer::Tokenizer& tok,
                      const std::vector<std::vector<int32_t>>& prompts, model::GenerateOptions go,
                      const GenerateFlags& g, const std::string& label, std::ostream& out, std::ostream& err) {
  for (const std::vector<int32_t>& prompt_ids : prompts) {
    const std::vector<int32_t>* ids = &prompt_ids;
    // The prompt is echoed with the first generated tokens, so that a request
    // the engine refuses prints nothing but its error.
    bool echoed = false;
    auto echo_prompt = [&] {
      if (!echoed) out << tok.Decode(*ids);
      echoed = true;
    };
    for (int64_t run = 0; run < std::max(g.repeat, g.samples); ++run) {
      // Repeats (benchmarks: later runs are warm) print their stats lines only;
      // samples print each text, with their own seeds.
      const bool print_text = run == 0 || g.samples > 1;
      echoed = false;
      go.sampling.seed = static_cast<uint64_t>(g.seed + (g.samples > 1 ? run : 0));
      tokenizer::StreamingDetokenizer detok(tok, ids->back());
      auto result = engine.Generate(*ids, go, [&](const std::vector<int32_t>& tokens) {
        if (!print_text) return;
        echo_prompt();
        for (int32_t t : tokens) out << detok.Push(t);
        out << std::flush;
      });
      if (!result.ok()) return result.status();
      if (print_text) {
        echo_prompt();
        out << detok.Flush() << "\n";
        if (!g.separator.empty()) out << g.separator << "\n";
      }
      PrintGenerationStats(err, label, result->stats);
    }
  }
  return OkStatus();
}

}  // namespace

int RunGenerate(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  GenerateFlags g;
  FlagSet flags;
  g.AddTo(flags);
  if (flags::WantsHelp(args)) {
    out << "usage: lede generate --model PATH (--prompt TEXT | --prompt-file FILE) [flags]\nflags:\n" << flags.Usage();
    return kExitOk;
  }
  if (Status s = flags.Parse(args); !s.ok()) {
    err << "lede generate: " << s.message() << " (see lede generate --help)\n";
    return kExitUsage;
  }
  StatusOr<GenerateRequest> request = CheckGenerateFlags(g);
  if (!request.ok()) return Fail(err, request.status(), kExitUsage);
  auto options = g.mf.Options();
  if (!options.ok()) return Fail(err, options.status(), kExitUsage);

  auto found = tokenizer::ResolveTokenizerFile(g.mf.model, g.tokenizer_path);
  if (!found.ok()) return Fail(err, found.status(), kExitUsage);
  g.tokenizer_path = *found;
  StatusOr<LoadedModel> loaded = LoadTokenizerAndModel(g.tokenizer_path, g.mf.model, *options, err);
  if (!loaded.ok()) return Fail(err, loaded.status(), LoadFailureCode(loaded.status()));
  const tokenizer::Tokenizer& tok = *loaded->tokenizer;
  auto prompts = EncodePrompts(g, std::move(request->prompt_texts), tok);
  if (!prompts.ok()) return Fail(err, prompts.status(), kExitUsage);

  model::GenerateOptions go = GenerateOptionsOf(g, request->method, loaded->llama->n_layers());
  std::unique_ptr<speculation::ExitController> controller;
#if LEDE_HAVE_POLICY
  if (request->method == speculation::SpeculationMethod::kLede) {
    auto made = LedeController(g.mf.model, g.policy_dir, g.calibration_path, options->device, *loaded->llama, &go, err);
    if (!made.ok()) return Fail(err, made.status(), kExitUsage);
    controller = std::move(*made);
    go.controller = controller.get();
  }
#endif
  auto engine = MakeEngine(loaded->llama, g, *prompts);
  if (!engine.ok()) {
    return Fail(err, engine.status(), engine.status().code() == StatusCode::kInvalidArgument ? kExitUsage : kExitFailure);
  }

  const std::string label = StatsLabel(g, request->method, go, controller.get());
  if (Status s = RunGenerations(**engine, tok, *prompts, go, g, label, out, err); !s.ok()) {
    return Fail(err, s, s.code() == StatusCode::kInvalidArgument ? kExitUsage : kExitFailure);
  }
  return kExitOk;
}

}  // namespace lede::cli
