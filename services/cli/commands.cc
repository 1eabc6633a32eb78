#include "services/cli/commands.h"

#if LEDE_HAVE_POLICY
#include <filesystem>

#include "policy/dqn/artifact.h"
#include "policy/dqn/dqn_exit_controller.h"
#include "policy/dqn/method_factory.h"
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <limits>
#include <memory>
#include <sstream>
#include <nlohmann/json.hpp>

#include <ATen/Parallel.h>
#include <c10/core/Device.h>

#include "shared/checkpoint/widen.h"
#include "shared/flags/flags.h"
#include "shared/flags/model_flags.h"
#include "shared/model/loaders/model_load_flags.h"
#include "shared/model/cost/cost_model.h"
#include "shared/model/loaders/checkpoint.h"
#include "shared/model/decoding.h"
#include "shared/model/llama.h"
#include "shared/speculation/method.h"
#include "shared/tokenizer/chat_template.h"
#include "shared/tokenizer/gguf_tokenizer.h"
#include "shared/tokenizer/hf_config.h"
#include "shared/tokenizer/model_files.h"
#include "shared/tokenizer/tokenizer.h"
#include "shared/status/status_macros.h"
#include "shared/file/file.h"
#include "shared/model/loaders/load_or_exit.h"

namespace lede::cli {
using flags::FlagSet;
namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

// Flags shared by the subcommands that load a model: the model-loading
// group (shared/flags/model_flags.h), every flag of it.
struct ModelFlags : flags::ModelLoadFlags {
  void AddTo(FlagSet& flags) { flags::AddModelLoadFlags(&flags, this); }

  // The load options, after --threads is set on this thread.
  StatusOr<model::ModelOptions> Options() const {
    std::error_code ec;
    if (!std::filesystem::exists(model, ec)) {
      return NotFoundError("--model: no such file or directory: " + model);
    }
    LEDE_ASSIGN_OR_RETURN(model::ModelOptions o, model::loaders::ModelOptionsFromFlags(*this));
    LEDE_RETURN_IF_ERROR(model::loaders::ApplyThreadsFlag(threads).status());
    return o;
  }
};

int Fail(std::ostream& err, const Status& s, int code) {
  err << "lede: " << model::loaders::OneLineMessage(s) << "\n";
  return code;
}

// Exit code for a model or tokenizer that will not load: always
// model::loaders::kExitLoadFailure (2), whatever the status code (a refused file
// may surface as kInternal from libtorch; load_or_exit.h).
int LoadFailureCode(const Status&) { return model::loaders::kExitLoadFailure; }

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
#endif

// The chat prompt for one user turn (after an optional system turn),
// rendered with the checkpoint's template.
StatusOr<std::string> RenderChatPrompt(const std::string& tokenizer_path, const std::string& template_path,
                                       const std::string& system, const std::string& user,
                                       bool add_generation_prompt) {
  // A GGUF file carries its own template (tokenizer.chat_template).
  const std::string dir = std::filesystem::path(tokenizer_path).extension() == ".gguf"
                              ? tokenizer_path
                              : std::filesystem::path(tokenizer_path).parent_path().string();
  StatusOr<tokenizer::ModelChatTemplate> tmpl = tokenizer::LoadModelChatTemplate(dir, template_path);
  if (tmpl.status().code() == StatusCode::kNotFound && template_path.empty()) {
    return NotFoundError(std::string(tmpl.status().message()) + "; pass --chat-template FILE");
  }
  LEDE_RETURN_IF_ERROR(tmpl.status());
  std::vector<tokenizer::ChatMessage> messages;
  if (!system.empty()) messages.push_back({"system", system});
  messages.push_back({"user", user});
  tokenizer::ChatTemplateOptions o;
  o.add_generation_prompt = add_generation_prompt;
  o.bos_token = tmpl->bos_token;
  o.eos_token = tmpl->eos_token;
  return tmpl->chat_template.Render(messages, o);
}

}  // namespace

// The flags of `lede generate`, with their defaults.
struct GenerateFlags {
  ModelFlags mf;
  std::string prompt, prompt_file, tokenizer_path, policy_dir, mode = "static";
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
    f.Add("exit-layer", &exit_layer, "draft exit layer E in [1, L] (default: L/4, at least 1)");
    f.Add("draft-len", &draft_len, "draft length D");
    f.Add("temperature", &temperature, "0 = greedy");
    f.Add("top-p", &top_p, "nucleus mass in (0, 1]");
    f.Add("seed", &seed, "sampling seed");
  }
};

#if LEDE_HAVE_POLICY
// --mode lede: the policy version (`policy_dir`, default MODEL/policy) built
// by the method factory; sets the loop mode and decision spec of `go`.
StatusOr<std::unique_ptr<speculation::ExitController>> LedeController(const std::string& model_path, std::string policy_dir,
                                                                const c10::Device& device,
                                                                const model::LlamaModel& llama,
                                                                model::GenerateOptions* go) {
  if (policy_dir.empty()) {
    std::filesystem::path p(model_path);
    policy_dir = ((std::filesystem::is_directory(p) ? p : p.parent_path()) / "policy").string();
  }
  LEDE_ASSIGN_OR_RETURN(policy::dqn::Artifact artifact,
                        ChoosePolicy(policy_dir, device, llama.config().ArchitectureFingerprint()));
  policy::dqn::MethodContext context;
  context.n_layers = static_cast<int32_t>(llama.n_layers());
  context.max_draft_len = std::numeric_limits<int32_t>::max();  // the pool is sized from the spec below
  context.artifact = std::make_shared<const policy::dqn::Artifact>(std::move(artifact));
  speculation::MethodSpec spec;
  spec.method = speculation::SpeculationMethod::kLede;
  LEDE_ASSIGN_OR_RETURN(policy::dqn::MethodPlan plan, policy::dqn::PlanMethod(spec, context));
  go->mode = plan.mode;
  go->decision_spec = plan.decision_spec;
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
  if (g.prompt.empty() == g.prompt_file.empty()) {
    return Fail(err, InvalidArgumentError("give one of --prompt and --prompt-file"), kExitUsage);
  }
  if (!g.prompt_file.empty() && (g.samples > 1 || g.chat)) {
    return Fail(err, InvalidArgumentError("--prompt-file: cannot be combined with --samples or --chat"), kExitUsage);
  }
  std::vector<std::string> prompt_texts;
  if (!g.prompt_file.empty()) {
    auto text = file::ReadFile(g.prompt_file);
    if (!text.ok()) return Fail(err, text.status(), kExitUsage);
    std::istringstream lines(*text);
    for (std::string line; std::getline(lines, line);) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (!line.empty()) prompt_texts.push_back(line);
    }
    if (prompt_texts.empty()) {
      return Fail(err, InvalidArgumentError("--prompt-file: " + g.prompt_file + " holds no prompt"), kExitUsage);
    }
  }
  if (g.repeat < 1) return Fail(err, InvalidArgumentError("--repeat: must be >= 1"), kExitUsage);
  if (g.samples < 1) return Fail(err, InvalidArgumentError("--samples: must be >= 1"), kExitUsage);
  if (g.samples > 1 && g.repeat > 1) {
    return Fail(err, InvalidArgumentError("--samples: cannot be combined with --repeat"), kExitUsage);
  }
  StatusOr<speculation::SpeculationMethod> method = speculation::ParseSpeculationMethod(g.mode);
  if (!method.ok() || *method == speculation::SpeculationMethod::kThreshold) {
    return Fail(err, InvalidArgumentError("--mode: want ar, static or lede, got '" + g.mode + "'"), kExitUsage);
  }
  const bool lede_mode = *method == speculation::SpeculationMethod::kLede;
#if !LEDE_HAVE_POLICY
  if (lede_mode) {
    return Fail(err, UnimplementedError("--mode lede: this engine-only build has no policy support"), kExitUsage);
  }
#endif
  auto options = g.mf.Options();
  if (!options.ok()) return Fail(err, options.status(), kExitUsage);

  auto found = tokenizer::ResolveTokenizerFile(g.mf.model, g.tokenizer_path);
  if (!found.ok()) return Fail(err, found.status(), kExitUsage);
  g.tokenizer_path = *found;
  auto tokenizer = tokenizer::LoadTokenizer(g.tokenizer_path);
  if (!tokenizer.ok()) return Fail(err, tokenizer.status(), LoadFailureCode(tokenizer.status()));
  const auto load_start = std::chrono::steady_clock::now();
  auto loaded = model::LlamaModel::Load(g.mf.model, *options);
  if (!loaded.ok()) return Fail(err, loaded.status(), LoadFailureCode(loaded.status()));
  std::shared_ptr<const model::LlamaModel> llama = std::move(*loaded);
  err << std::fixed << std::setprecision(2) << "[load] " << g.mf.model << " in "
      << std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count() << " s\n";
  const int64_t L = llama->n_layers();

  if (prompt_texts.empty()) {
    std::string prompt_text = g.prompt;
    if (g.chat) {
      auto rendered = RenderChatPrompt(g.tokenizer_path, g.chat_template, g.system, g.prompt, true);
      if (!rendered.ok()) return Fail(err, rendered.status(), kExitUsage);
      prompt_text = *rendered;
    }
    prompt_texts.push_back(std::move(prompt_text));
  }
  // A chat template writes BOS itself.
  std::vector<std::vector<int32_t>> prompts;
  size_t longest = 0;
  for (const std::string& text : prompt_texts) {
    auto encoded = (*tokenizer)->Encode(text, /*add_bos=*/!g.chat, /*add_eos=*/false);
    if (!encoded.ok()) {
      return Fail(err, InvalidArgumentError("--prompt: " + std::string(encoded.status().message())), kExitUsage);
    }
    longest = std::max(longest, encoded->size());
    prompts.push_back(std::move(*encoded));
  }

  model::GenerateOptions go;
  go.max_new_tokens = g.max_new_tokens;
  go.sampling.temperature = g.temperature;
  go.sampling.top_p = g.top_p;
  go.sampling.seed = static_cast<uint64_t>(g.seed);
  go.mode = speculation::LoopMode(*method);
  go.exit_layer = g.exit_layer > 0 ? g.exit_layer : std::max<int64_t>(1, L / 4);
  go.draft_len = g.draft_len;

  std::unique_ptr<speculation::ExitController> controller;
#if LEDE_HAVE_POLICY
  if (lede_mode) {
    auto made = LedeController(g.mf.model, g.policy_dir, options->device, *llama, &go);
    if (!made.ok()) return Fail(err, made.status(), kExitUsage);
    controller = std::move(*made);
    go.controller = controller.get();
  }
#endif
  model::KvCacheOptions ko;
  ko.n_slots = 1;
  ko.max_draft_len = std::max<int64_t>(16, g.draft_len);
  // Only the positions this run can use: a 128k-context model's full window
  // would be 8 GiB of KV cache for Llama-3.2-1B.
  ko.capacity = std::min<int64_t>(llama->config().max_seq_len,
                                  static_cast<int64_t>(longest) + g.max_new_tokens + ko.max_draft_len + 2);
  auto engine = model::Engine::Create(llama, ko);
  if (!engine.ok()) return Fail(err, engine.status(), kExitFailure);

  for (const std::vector<int32_t>& prompt_ids : prompts) {
    const std::vector<int32_t>* ids = &prompt_ids;
    // The prompt is echoed with the first generated tokens, so that a request
    // the engine refuses prints nothing but its error.
    bool echoed = false;
    auto echo_prompt = [&] {
      if (!echoed) out << (*tokenizer)->Decode(*ids);
      echoed = true;
    };
    for (int64_t run = 0; run < std::max(g.repeat, g.samples); ++run) {
      // Repeats (benchmarks: later runs are warm) print their stats lines only;
      // samples print each text, with their own seeds.
      const bool print_text = run == 0 || g.samples > 1;
      echoed = false;
      go.sampling.seed = static_cast<uint64_t>(g.seed + (g.samples > 1 ? run : 0));
      tokenizer::StreamingDetokenizer detok(**tokenizer, ids->back());
      auto result = (*engine)->Generate(*ids, go, [&](const std::vector<int32_t>& tokens) {
        if (!print_text) return;
        echo_prompt();
        for (int32_t t : tokens) out << detok.Push(t);
        out << std::flush;
      });
      if (!result.ok()) {
        return Fail(err, result.status(),
                    result.status().code() == StatusCode::kInvalidArgument ? kExitUsage : kExitFailure);
      }
      if (print_text) {
        echo_prompt();
        out << detok.Flush() << "\n";
        if (!g.separator.empty()) out << g.separator << "\n";
      }
      std::string label = g.mode;
      if (*method == speculation::SpeculationMethod::kStatic) {
        label += " E=" + std::to_string(go.exit_layer) + " D=" + std::to_string(go.draft_len);
      }
      if (controller) label += " " + controller->name();
      PrintGenerationStats(err, label, result->stats);
    }
  }
  return kExitOk;
}

int RunTokenize(const std::vector<std::string>& raw_args, std::ostream& out, std::ostream& err) {
  std::string model, tokenizer_path, template_path, system, text;
  bool chat = false, decode = false, show_prompt = false, no_generation_prompt = false;
  std::string bos = "auto";
  FlagSet flags;
  flags.Add("model", &model, "checkpoint directory (its tokenizer is used)");
  flags.Add("tokenizer", &tokenizer_path, "tokenizer file (tokenizer.json, .model, .bin); overrides --model");
  flags.Add("text", &text, "the text (or give it as the last argument)");
  flags.Add("chat", &chat, "TEXT is a user message: render the chat template, then tokenize (no extra BOS)");
  flags.Add("system", &system, "--chat: a system message before the user message");
  flags.Add("chat-template", &template_path, "--chat: Jinja template file (default: tokenizer_config.json's)");
  flags.Add("no-generation-prompt", &no_generation_prompt, "--chat: leave out the assistant header");
  flags.Add("show-prompt", &show_prompt, "--chat: print the rendered prompt to stderr");
  flags.Add("bos", &bos, "auto (what the tokenizer's files ask for), true or false");
  flags.Add("decode", &decode, "TEXT is a JSON list of ids: print their text");
  if (flags::WantsHelp(raw_args)) {
    out << "usage: lede tokenize (--model DIR | --tokenizer FILE) [--chat] [--decode] TEXT\n"
           "prints the ids as a JSON list (or, with --decode, the text)\nflags:\n"
        << flags.Usage();
    return kExitOk;
  }
  // A trailing argument that is not a flag's value is TEXT.
  static const std::vector<std::string> kValueFlags = {"--model", "--tokenizer", "--text", "--system",
                                                        "--chat-template", "--bos"};
  std::vector<std::string> args;
  std::string positional;
  int n_positional = 0;
  for (size_t i = 0; i < raw_args.size(); ++i) {
    const std::string& a = raw_args[i];
    if (a.rfind("--", 0) == 0) {
      args.push_back(a);
      if (std::find(kValueFlags.begin(), kValueFlags.end(), a) != kValueFlags.end() && i + 1 < raw_args.size()) {
        args.push_back(raw_args[++i]);
      }
    } else {
      positional = a;
      ++n_positional;
    }
  }
  if (Status s = flags.Parse(args); !s.ok()) {
    err << "lede tokenize: " << s.message() << " (see lede tokenize --help)\n";
    return kExitUsage;
  }
  if (n_positional > 1 || (n_positional == 1 && !text.empty())) {
    return Fail(err, InvalidArgumentError("give TEXT once (as --text or as the last argument)"), kExitUsage);
  }
  if (n_positional == 1) text = positional;
  if (model.empty() && tokenizer_path.empty()) {
    return Fail(err, InvalidArgumentError("--model or --tokenizer is required"), kExitUsage);
  }
  if (bos != "auto" && bos != "true" && bos != "false") {
    return Fail(err, InvalidArgumentError("--bos: want auto, true or false, got '" + bos + "'"), kExitUsage);
  }
  auto path = tokenizer::ResolveTokenizerFile(model, tokenizer_path);
  if (!path.ok()) return Fail(err, path.status(), kExitUsage);
  auto tok = tokenizer::LoadTokenizer(*path);
  if (!tok.ok()) return Fail(err, tok.status(), LoadFailureCode(tok.status()));

  if (decode) {
    std::vector<int32_t> ids;
    try {
      ids = nlohmann::json::parse(text).get<std::vector<int32_t>>();
    } catch (const std::exception&) {
      return Fail(err, InvalidArgumentError("--decode: TEXT must be a JSON list of token ids"), kExitUsage);
    }
    for (int32_t id : ids) {
      if (id < 0 || id >= (*tok)->vocab_size()) {
        return Fail(err, InvalidArgumentError("--decode: id " + std::to_string(id) + " is outside [0, " +
                                              std::to_string((*tok)->vocab_size()) + ")"),
                    kExitUsage);
      }
    }
    out << (*tok)->Decode(ids) << "\n";
    return kExitOk;
  }

  bool add_bos = bos == "auto" ? (*tok)->DefaultAddBos() : bos == "true";
  std::string input = text;
  if (chat) {
    auto rendered = RenderChatPrompt(*path, template_path, system, text, !no_generation_prompt);
    if (!rendered.ok()) return Fail(err, rendered.status(), kExitUsage);
    if (show_prompt) err << *rendered << "\n";
    input = *rendered;
    if (bos == "auto") add_bos = false;  // the template writes bos_token itself
  }
  auto ids = (*tok)->Encode(input, add_bos, false);
  if (!ids.ok()) return Fail(err, InvalidArgumentError("TEXT: " + std::string(ids.status().message())), kExitUsage);
  out << nlohmann::json(*ids).dump() << "\n";
  return kExitOk;
}

// The "prompt" of every JSON line of the comma-separated `files`, encoded
// with BOS (the prompt files of lede-bench and the policy trainers).
// Errors: kNotFound for an unreadable file; kInvalidArgument naming the file
// and line for a line that is not JSON or has no string "prompt".
StatusOr<std::vector<std::vector<int32_t>>> ReadPromptIds(const std::string& files,
                                                          const tokenizer::Tokenizer& tok) {
  std::vector<std::vector<int32_t>> prompts;
  for (const std::string& path : flags::SplitList(files)) {
    LEDE_ASSIGN_OR_RETURN(std::string text, file::ReadFile(path));
    std::istringstream lines(text);
    std::string line;
    for (int n = 1; std::getline(lines, line); ++n) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const std::string where = "--prompts: " + path + " line " + std::to_string(n);
      nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!j.is_object() || !j.contains("prompt") || !j["prompt"].is_string()) {
        return InvalidArgumentError(where + ": want a JSON object with a string \"prompt\"");
      }
      auto ids = tok.Encode(j["prompt"].get<std::string>(), /*add_bos=*/true, /*add_eos=*/false);
      if (!ids.ok()) return InvalidArgumentError(where + ": " + std::string(ids.status().message()));
      prompts.push_back(std::move(*ids));
    }
  }
  return prompts;
}

namespace {

// A DQN decision to time where the policy stack is built in; empty otherwise.
std::function<void()> MakeTimedDecision() {
  std::function<void()> decide;
#if LEDE_HAVE_POLICY
  decide = policy::dqn::TimedDecision(policy::dqn::QNetwork::Random(policy::dqn::kDefaultHidden, 1));
#endif
  return decide;
}

// Prints the calibration's headline prices to `err`: the step and verify
// costs, the timed rounds per exit layer, and the batched steps per load.
void PrintCalibrationSummary(const model::cost::Calibration& cal, std::ostream& err) {
  auto measured = model::cost::MakeMeasuredCostModel(cal);
  err << std::fixed << std::setprecision(3) << "step " << cal.step_us << " us; verify(k)/step(1):";
  for (int k : {1, 2, 4, 8, 16}) err << " k=" << k << ":" << cal.block_us[k - 1] / cal.block_us[0];
  err << " (per block, all L blocks / L); decision " << cal.decision_us << " us, probe signals " << cal.signals_us
      << " us\n";
  if (!cal.round_us.empty()) {
    // The measured cost model's price of a round of K drafts at each exit layer.
    err << "rounds timed in context, in autoregressive steps of " << cal.ar_step_us
        << " us: per exit layer E, K = 1..";
    err << cal.round_us[0].size() << ":";
    for (size_t e = 1; e <= cal.round_us.size(); ++e) {
      err << " E=" << e << ":";
      for (size_t k = 1; k <= cal.round_us[0].size(); ++k) {
        model::RoundRecord r;
        r.exit_layer = static_cast<int32_t>(e);
        r.n_drafted = static_cast<int32_t>(k);
        err << (k > 1 ? "/" : "") << measured->RoundCost(r);
      }
    }
    err << "\n";
  }
  if (!cal.batch_sizes.empty()) {
    // What batching does to the prices: a round of 3 drafts at the batch
    // exit layer, in autoregressive steps at each load.
    err << "batched steps at E=" << cal.batch_exit_layer << ", per session in autoregressive steps at that load:";
    for (size_t i = 0; i < cal.batch_sizes.size(); ++i) {
      const int64_t b = cal.batch_sizes[i];
      auto at_load = model::cost::MakeMeasuredCostModelAtLoad(cal, b);
      if (!at_load.ok()) continue;
      model::RoundRecord r;
      r.exit_layer = static_cast<int32_t>(cal.batch_exit_layer);
      r.n_drafted = 3;
      err << " B=" << b << ": round of 3 drafts " << (*at_load)->RoundCost(r) << " (step "
          << cal.batch_step_us[i] / static_cast<double>(b) << " us per session)";
    }
    err << "\n";
  }
}

}  // namespace

int RunCalibrate(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  ModelFlags mf;
  std::string out_path, prompts_flag;
  int64_t repeats = 50, round_passes = 5, round_max_draft_len = 8, new_tokens = 64;
  FlagSet flags;
  mf.AddTo(flags);
  flags.Add("out", &out_path, "write the calibration JSON here (default: stdout)");
  flags.Add("repeats", &repeats, "timed repetitions per measurement (median)");
  flags.Add("round-passes", &round_passes,
            "interleaved passes timing real speculation rounds at every exit layer and draft length "
            "(0: kernel tables only; a large model on CPU wants 1 or 0)");
  flags.Add("round-max-draft-len", &round_max_draft_len, "draft lengths 1..N of the timed rounds");
  flags.Add("prompts", &prompts_flag,
            "time the rounds in whole generations of these prompts (JSON lines with \"prompt\", comma-separated "
            "files; the workload's training prompts, never evaluation ones; default: one synthetic prompt)");
  flags.Add("new-tokens", &new_tokens, "--prompts: tokens generated per timed generation");
  std::string batch_sizes_flag = "1,2,4,8,16", base_path;
  int64_t batch_exit_layer = 0, batch_context = 128;
  flags.Add("batch-sizes", &batch_sizes_flag,
            "time batched steps of this many sessions (the cost model at a load; \"\" skips them)");
  flags.Add("batch-exit-layer", &batch_exit_layer,
            "exit layer of the batched verifications and draft steps (0: layer 2, or L - 1 when L <= 2)");
  flags.Add("batch-context", &batch_context, "committed tokens per session in the batched steps");
  flags.Add("base", &base_path,
            "start from this calibration JSON (same model) and time only the batch tables, keeping the rest");
  if (flags::WantsHelp(args)) {
    out << "usage: lede calibrate --model PATH [flags]\nflags:\n" << flags.Usage();
    return kExitOk;
  }
  if (Status s = flags.Parse(args); !s.ok()) {
    err << "lede calibrate: " << s.message() << " (see lede calibrate --help)\n";
    return kExitUsage;
  }
  if (repeats < 1) return Fail(err, InvalidArgumentError("--repeats: must be >= 1"), kExitUsage);
  if (round_passes < 0) return Fail(err, InvalidArgumentError("--round-passes: must be >= 0"), kExitUsage);
  if (round_max_draft_len < 1 || round_max_draft_len > 16) {
    return Fail(err, InvalidArgumentError("--round-max-draft-len: must be in [1, 16]"), kExitUsage);
  }
  if (new_tokens < 2) return Fail(err, InvalidArgumentError("--new-tokens: must be >= 2"), kExitUsage);
  std::vector<std::vector<int32_t>> prompts;
  if (!prompts_flag.empty()) {
    auto path = tokenizer::ResolveTokenizerFile(mf.model, "");
    if (!path.ok()) return Fail(err, path.status(), kExitUsage);
    auto tok = tokenizer::LoadTokenizer(*path);
    if (!tok.ok()) return Fail(err, tok.status(), LoadFailureCode(tok.status()));
    auto read = ReadPromptIds(prompts_flag, **tok);
    if (!read.ok()) return Fail(err, read.status(), kExitUsage);
    if (read->empty()) return Fail(err, InvalidArgumentError("--prompts: no prompt in " + prompts_flag), kExitUsage);
    prompts = std::move(*read);
  }
  auto options = mf.Options();
  if (!options.ok()) return Fail(err, options.status(), kExitUsage);
  auto loaded = model::LlamaModel::Load(mf.model, *options);
  if (!loaded.ok()) return Fail(err, loaded.status(), LoadFailureCode(loaded.status()));
  std::function<void()> decide = MakeTimedDecision();
  std::vector<int64_t> batch_sizes;
  if (!batch_sizes_flag.empty()) {
    auto parsed = flags::ParseIntList("batch-sizes", batch_sizes_flag);
    if (!parsed.ok()) return Fail(err, parsed.status(), kExitUsage);
    for (int32_t b : *parsed) batch_sizes.push_back(b);
  }
  StatusOr<model::cost::Calibration> cal = model::cost::Calibration{};
  if (!base_path.empty()) {
    cal = model::cost::ReadCalibrationFile(base_path);
    if (!cal.ok()) return Fail(err, Status(cal.status().code(), "--base: " + std::string(cal.status().message())),
                               kExitUsage);
    if (cal->model_fingerprint != (*loaded)->config().ArchitectureFingerprint()) {
      return Fail(err, InvalidArgumentError("--base: " + base_path + " was calibrated for another model"),
                  kExitUsage);
    }
    if (batch_sizes.empty()) return Fail(err, InvalidArgumentError("--base: wants --batch-sizes"), kExitUsage);
  } else {
    cal = model::cost::Calibrate(**loaded, static_cast<int>(repeats), decide, static_cast<int>(round_passes),
                           round_max_draft_len, prompts, new_tokens);
  }
  if (batch_exit_layer == 0) batch_exit_layer = std::min<int64_t>(2, (*loaded)->config().n_layers - 1);
  if (cal.ok() && !batch_sizes.empty() && batch_exit_layer >= 1) {
    batch_context = std::min<int64_t>(batch_context, (*loaded)->config().max_seq_len - round_max_draft_len - 2);
    if (Status s = model::cost::CalibrateBatches(**loaded, std::max<int>(5, static_cast<int>(repeats) / 2), batch_sizes,
                                           batch_exit_layer, round_max_draft_len, batch_context, &*cal);
        !s.ok()) {
      const int code = s.code() == StatusCode::kInvalidArgument ? kExitUsage : kExitFailure;
      return Fail(err, Status(s.code(), "--batch-sizes / --batch-exit-layer: " + std::string(s.message())), code);
    }
  }
  if (!cal.ok()) {
    if (cal.status().code() == StatusCode::kInvalidArgument) {  // the prompts or --new-tokens do not fit
      return Fail(err, InvalidArgumentError("--prompts / --new-tokens: " + std::string(cal.status().message())),
                  kExitUsage);
    }
    return Fail(err, cal.status(), kExitFailure);
  }
  const std::string json = model::cost::CalibrationToJson(*cal);
  if (out_path.empty()) {
    out << json;
  } else {
    std::ofstream f(out_path);
    if (!(f << json)) return Fail(err, InternalError("cannot write " + out_path), kExitUsage);
    err << "wrote " << out_path << "\n";
  }
  PrintCalibrationSummary(*cal, err);
  return kExitOk;
}

int RunWiden(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  std::string model_dir, out_dir;
  int64_t factor = 0, ffn_factor = 0, round_passes = 3, round_max_draft_len = 6;
  flags::ModelLoadFlags calibration;  // --threads of `lede calibrate` (1 here)
  calibration.threads = 1;
  const int64_t& threads = calibration.threads;
  bool overwrite = false, calibrate = false;
  FlagSet flags;
  flags.Add("model", &model_dir, "source Hugging Face Llama checkpoint directory", true);
  flags.Add("factor", &factor, "K: hidden size d -> K*d, attention and KV heads times K (head_dim kept)", true);
  flags.Add("ffn-factor", &ffn_factor, "intermediate_size times this (0: --factor)");
  flags.Add("out", &out_dir, "output checkpoint directory (created)", true);
  flags.Add("overwrite", &overwrite, "replace a checkpoint already in --out");
  flags.Add("calibrate", &calibrate,
            "then run `lede calibrate` on the output and write its calibration-cpu.json (the measured cost model)");
  flags::AddModelLoadFlags(&flags, &calibration, flags::kThreads);  // with --calibrate
  flags.Add("round-passes", &round_passes, "--calibrate: timed passes of real speculation rounds");
  flags.Add("round-max-draft-len", &round_max_draft_len, "--calibrate: draft lengths 1..N of the timed rounds");
  if (flags::WantsHelp(args)) {
    out << "usage: lede widen --model DIR --factor K [--ffn-factor K2] --out DIR2 [flags]\n"
           "Embeds the checkpoint function-exactly in a wider shape (same logits to float rounding):\n"
           "zero-padded hidden size, heads and FFN; RMSNorm weights * sqrt(d/D), rms_norm_eps * d/D.\n"
           "flags:\n"
        << flags.Usage();
    return kExitOk;
  }
  if (Status s = flags.Parse(args); !s.ok()) {
    err << "lede widen: " << s.message() << " (see lede widen --help)\n";
    return kExitUsage;
  }
  if (factor < 1) return Fail(err, InvalidArgumentError("--factor: must be >= 1"), kExitUsage);
  if (ffn_factor < 0) return Fail(err, InvalidArgumentError("--ffn-factor: must be >= 0"), kExitUsage);
  checkpoint::WidenOptions options;
  options.factor = factor;
  options.ffn_factor = ffn_factor;
  options.overwrite = overwrite;
  auto widened = checkpoint::WidenCheckpoint(model_dir, out_dir, options);
  if (!widened.ok()) {
    return Fail(err, widened.status(),
                widened.status().code() == StatusCode::kInternal ? kExitFailure : kExitUsage);
  }
  const checkpoint::ModelConfig& w = widened->widened;
  err << "wrote " << out_dir << ": hidden " << widened->source.dim << " -> " << w.dim << ", heads "
      << widened->source.n_heads << "/" << widened->source.n_kv_heads << " -> " << w.n_heads << "/" << w.n_kv_heads
      << " (head_dim " << w.head_dim() << "), FFN " << widened->source.hidden_dim << " -> " << w.hidden_dim
      << ", parameters " << widened->source_parameters << " -> " << widened->widened_parameters << " ("
      << std::fixed << std::setprecision(1) << widened->widened_parameters * 4.0 / 1e6 << " MB float32); copied";
  for (const std::string& name : widened->copied_files) err << " " << name;
  for (const std::string& name : widened->removed_files) err << "; removed the stale " << name;
  if (!widened->installed_policies.empty()) {
    err << "; installed the policies shipped for this shape into " << out_dir << "/policy:";
    for (const std::string& name : widened->installed_policies) err << " " << name;
  }
  err << "\n";
  if (!calibrate) return kExitOk;
  const std::string cal_path = (std::filesystem::path(out_dir) / "calibration-cpu.json").string();
  return RunCalibrate({"--model", out_dir, "--threads", std::to_string(threads), "--round-passes",
                       std::to_string(round_passes), "--round-max-draft-len", std::to_string(round_max_draft_len),
                       "--out", cal_path},
                      out, err);
}

int RunExport(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  std::string format = "gguf", weights = "f32", model, out_path, tokenizer_path;
  FlagSet flags;
  flags.Add("format", &format, "output format: gguf");
  flags.Add("weights", &weights, "stored matrix type: f32, f16, bf16, q8_0, or llama.cpp's q4_0 / q4_k_m tensor mix (norms stay f32)");
  flags.Add("model", &model, "checkpoint: Hugging Face directory, llama2.c .bin (or its directory), or .gguf", true);
  flags.Add("out", &out_path, "the file to write", true);
  flags.Add("tokenizer", &tokenizer_path, "tokenizer file (default: the checkpoint's)");
  if (flags::WantsHelp(args)) {
    out << "usage: lede export --format gguf --weights f32|f16|bf16|q8_0|q4_0|q4_k_m --model DIR --out FILE\n"
           "writes the checkpoint and its tokenizer as a llama-architecture GGUF v3 file that llama.cpp runs\n"
           "flags:\n"
        << flags.Usage();
    return kExitOk;
  }
  if (Status s = flags.Parse(args); !s.ok()) {
    err << "lede export: " << s.message() << " (see lede export --help)\n";
    return kExitUsage;
  }
  if (format != "gguf") return Fail(err, InvalidArgumentError("--format: only gguf, got '" + format + "'"), kExitUsage);
  checkpoint::GgmlType type = checkpoint::GgmlType::kF32;
  model::loaders::WeightFormat mix = model::loaders::WeightFormat::kAuto;  // q4_0 / q4_k_m: llama.cpp's tensor mix
  if (weights == "q4_0") {
    mix = model::loaders::WeightFormat::kQ4_0;
  } else if (weights == "q4_k_m") {
    mix = model::loaders::WeightFormat::kQ4_K_M;
  } else if (weights == "f32") {
    type = checkpoint::GgmlType::kF32;
  } else if (weights == "f16") {
    type = checkpoint::GgmlType::kF16;
  } else if (weights == "bf16") {
    type = checkpoint::GgmlType::kBF16;
  } else if (weights == "q8_0") {
    type = checkpoint::GgmlType::kQ8_0;
  } else {
    return Fail(err, InvalidArgumentError("--weights: want f32, f16, bf16, q8_0, q4_0 or q4_k_m, got '" + weights + "'"),
                kExitUsage);
  }
  auto ckpt = model::loaders::LoadCheckpoint(model);
  if (!ckpt.ok()) return Fail(err, ckpt.status(), LoadFailureCode(ckpt.status()));
  auto tok_path = tokenizer::ResolveTokenizerFile(model, tokenizer_path);
  if (!tok_path.ok()) return Fail(err, tok_path.status(), kExitUsage);
  checkpoint::GgufWriter writer;
  auto vocab = tokenizer::ReadVocabForGguf(*tok_path);
  if (!vocab.ok()) return Fail(err, vocab.status(), LoadFailureCode(vocab.status()));
  const auto n_vocab = static_cast<int64_t>(vocab->tokens.size());
  if (n_vocab > ckpt->config.vocab_size) {
    return Fail(err,
                InvalidArgumentError(*tok_path + ": " + std::to_string(n_vocab) + " tokens, more than the model's " +
                                     std::to_string(ckpt->config.vocab_size)),
                kExitFailure);
  }
  for (int64_t i = n_vocab; i < ckpt->config.vocab_size; ++i) {  // embedding rows past the tokenizer
    vocab->tokens.push_back("[PAD" + std::to_string(i) + "]");
    vocab->token_types.push_back(5);  // unused
    if (!vocab->scores.empty()) vocab->scores.push_back(-1e9f);
  }
  tokenizer::AddGgufTokenizerMetadata(*vocab, ckpt->config.bos_id,
                                      ckpt->config.eos_ids.empty() ? -1 : ckpt->config.eos_ids[0], &writer);
  const Status written = mix != model::loaders::WeightFormat::kAuto
                            ? model::loaders::WriteGgufCheckpoint(out_path, ckpt->config, ckpt->tensors, mix, &writer)
                            : model::loaders::WriteGgufCheckpoint(out_path, ckpt->config, ckpt->tensors, type, &writer);
  if (const Status& s = written; !s.ok()) {
    return Fail(err, s, kExitFailure);
  }
  std::error_code ec;
  err << "lede export: wrote " << out_path << " (" << std::filesystem::file_size(out_path, ec) << " bytes, "
      << weights << " matrices, " << vocab->model << " vocabulary of " << vocab->tokens.size() << " tokens)\n";
  return kExitOk;
}

int Main(int argc, char** argv) {
  const std::string usage =
      "usage: lede <command> [flags]\n"
      "commands:\n"
      "  generate   generate text (autoregressive, static self-speculation, or LEDE's learned exits)\n"
      "  calibrate  measure this machine's cost model and write it as JSON\n"
      "  widen      embed a checkpoint function-exactly in a wider shape (the memory-bound regime)\n"
      "  tokenize   print the token ids of a text (or a chat turn) as a JSON list, or decode ids\n"
      "  export     write a checkpoint as a GGUF file for llama.cpp (--format gguf --weights f32|f16|bf16|q8_0|q4_0|q4_k_m)\n"
      "run 'lede <command> --help' for its flags\n";
  if (argc < 2 || std::string(argv[1]) == "help" || std::string(argv[1]) == "--help") {
    std::cout << usage;
    return argc < 2 ? kExitUsage : kExitOk;
  }
  const std::string command = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (command == "generate") return RunGenerate(args, std::cout, std::cerr);
  if (command == "calibrate") return RunCalibrate(args, std::cout, std::cerr);
  if (command == "tokenize") return RunTokenize(args, std::cout, std::cerr);
  if (command == "export") return RunExport(args, std::cout, std::cerr);
  if (command == "widen") return RunWiden(args, std::cout, std::cerr);
  if (command == "bench" || command == "collect") {
    std::cerr << "lede: '" << command << "' is now 'lede-bench " << command << "' (build/bench/lede-bench)\n";
    return kExitUsage;
  }
  std::cerr << "lede: unknown command '" << command << "'\n" << usage;
  return kExitUsage;
}

}  // namespace lede::cli
