#include "bench/lede_bench.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "policy/controllers.h"
#include "policy/dqn/artifact.h"
#include "policy/dqn/dqn_exit_controller.h"
#include "policy/transition.h"
#include "shared/flags/flags.h"
#include "shared/model/cost_model.h"
#include "shared/model/decoding.h"
#include "shared/model/llama.h"
#include "shared/tokenizer/model_files.h"
#include "shared/tokenizer/tokenizer.h"
#include "shared/status/status_macros.h"
#include "trainer/corpus.h"
#include "trainer/exit_eval.h"
#include "trainer/experience.h"

namespace lede::bench {
namespace {

using model::Action;
using model::ExitController;
using model::ExitState;
using model::GenerateOptions;
using model::Phase;

using flags::SplitList;

struct PromptSet {
  std::string name;
  std::vector<std::vector<int32_t>> tuning, eval;
};

// Loads prompts: JSONL fields prompt / turns[0] / text / input, or corpus
// documents. Prompts are cut to max_prompt_tokens (first tokens).
StatusOr<PromptSet> LoadPromptSet(const std::string& path, const tokenizer::Tokenizer& tok, int64_t per_set,
                                  int64_t prompt_tokens, int64_t max_prompt_tokens) {
  PromptSet set;
  set.name = std::filesystem::path(path).stem().stem().string();
  std::vector<std::vector<int32_t>> all;
  if (std::filesystem::path(path).extension() == ".jsonl") {
    std::ifstream in(path);
    if (!in) return NotFoundError("cannot read prompt file " + path);
    std::string line;
    while (std::getline(in, line) && static_cast<int64_t>(all.size()) < per_set) {
      if (line.empty()) continue;
      nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded()) return InvalidArgumentError(path + ": a line is not JSON");
      std::string text;
      if (j.contains("prompt") && j["prompt"].is_string()) text = j["prompt"];
      else if (j.contains("turns") && j["turns"].is_array() && !j["turns"].empty()) text = j["turns"][0];
      else if (j.contains("text") && j["text"].is_string()) text = j["text"];
      else if (j.contains("input") && j["input"].is_string()) text = j["input"];
      if (text.empty()) continue;
      LEDE_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok.Encode(text, true, false));
      if (static_cast<int64_t>(ids.size()) > max_prompt_tokens) ids.resize(max_prompt_tokens);
      all.push_back(std::move(ids));
    }
  } else {
    LEDE_ASSIGN_OR_RETURN(std::vector<std::string> docs, trainer::ReadDocuments(path));
    for (const std::string& doc : docs) {
      if (static_cast<int64_t>(all.size()) >= per_set) break;
      auto ids = tok.Encode(doc, true, false);
      if (!ids.ok() || static_cast<int64_t>(ids->size()) < prompt_tokens + 8) continue;
      all.emplace_back(ids->begin(), ids->begin() + prompt_tokens);
    }
  }
  if (all.size() < 2) return InvalidArgumentError(path + ": fewer than 2 usable prompts");
  const size_t half = all.size() / 2;
  set.tuning.assign(all.begin(), all.begin() + half);
  set.eval.assign(all.begin() + half, all.end());
  return set;
}

using trainer::ControllerFactory;
using trainer::RunPrompts;
using Totals = trainer::PromptTotals;

// Hindsight oracle (DESIGN.md §1): minimal cost of emitting the greedy
// trajectory when every round may pick its exit layer among the candidates
// and its draft length in [1, D_max] knowing the outcome in advance.
// Exit tokens come from one uncached pass over prompt + output; a draft at
// layer l is accepted while the exit's argmax equals the trajectory.
// Returns (tokens, cost) so that callers can pool prompts.
std::pair<double, double> OracleCost(const model::LlamaModel& m, const std::vector<int32_t>& prompt,
                                     const std::vector<int32_t>& output, const std::vector<int32_t>& candidates,
                                     int32_t max_draft, const model::CostModel& cost) {
  c10::InferenceMode guard;
  const int64_t P = static_cast<int64_t>(prompt.size()), N = static_cast<int64_t>(output.size());
  if (N < 2) return {0.0, 0.0};
  std::vector<int64_t> ids(prompt.begin(), prompt.end());
  ids.insert(ids.end(), output.begin(), output.end());
  at::Tensor h = m.Embed(at::tensor(ids, at::kLong).view({1, -1}));
  std::map<int32_t, std::vector<int64_t>> exit_tok;  // layer -> argmax per position
  int64_t done = 0;
  for (int32_t l : candidates) {
    h = m.Forward(h, done, l, 0, nullptr, 0);
    done = l;
    at::Tensor top = m.ExitLogits(h).argmax(-1).view({-1}).contiguous();
    exit_tok[l] = std::vector<int64_t>(top.data_ptr<int64_t>(), top.data_ptr<int64_t>() + top.numel());
  }
  // f[t]: cost of emitting output[t..N) when output[t-1] is pending.
  std::vector<double> f(N + 1, 0.0);
  for (int64_t t = N - 1; t >= 1; --t) {
    double best = cost.Step() + f[t + 1];
    for (int32_t l : candidates) {
      const auto& et = exit_tok[l];
      int64_t run = 0;  // consecutive accepted drafts from t
      while (t + run < N && run < max_draft && et[P + t - 1 + run] == output[t + run]) ++run;
      for (int64_t d = 1; d <= run && t + d + 1 <= N; ++d) {
        best = std::min(best, d * cost.DraftToken(l) + cost.Verify(l, d) + f[t + d + 1]);
      }
    }
    f[t] = best;
  }
  return {static_cast<double>(N - 1), f[1]};
}

// Phase-1 or phase-2 override around another controller (the ablations).
class AblatedController : public ExitController {
 public:
  AblatedController(std::unique_ptr<ExitController> inner, int32_t fixed_exit, int32_t fixed_draft)
      : inner_(std::move(inner)), fixed_exit_(fixed_exit), fixed_draft_(fixed_draft) {}
  std::string name() const override { return "ablated:" + inner_->name(); }
  Action Decide(const ExitState& s) override {
    if (s.phase == Phase::kExitLayer && fixed_exit_ > 0) {
      return s.layer >= fixed_exit_ ? Action::kExit : Action::kContinue;
    }
    if (s.phase == Phase::kDraftLength && fixed_draft_ > 0) {
      return s.draft_pos < fixed_draft_ ? Action::kExit : Action::kContinue;
    }
    return inner_->Decide(s);
  }

 private:
  std::unique_ptr<ExitController> inner_;
  int32_t fixed_exit_, fixed_draft_;
};

struct Common {
  std::shared_ptr<const model::LlamaModel> model;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  std::unique_ptr<model::Engine> engine;
  std::unique_ptr<model::CostModel> accelerator, measured;
  std::vector<PromptSet> sets;
  model::DecisionSpec spec;
};

struct CommonFlags {
  std::string model, prompts, calibration, candidates = "2,3,4,6";
  int64_t max_draft = 8, per_set = 24, prompt_tokens = 32, max_prompt_tokens = 192, new_tokens = 64,
          threads = 0;
  void AddTo(flags::FlagSet& f) {
    f.Add("model", &model, "model directory (Hugging Face layout + tokenizer)", true);
    f.Add("prompts", &prompts, "prompt sets: .jsonl or <|doc|> corpus files, comma-separated", true);
    f.Add("calibration", &calibration, "measured cost model JSON (default: calibrate now)");
    f.Add("candidate-layers", &candidates, "phase-1 candidate exit layers");
    f.Add("max-draft-len", &max_draft, "D_max");
    f.Add("prompts-per-set", &per_set, "prompts read per set (half tuning, half evaluation)");
    f.Add("prompt-tokens", &prompt_tokens, "tokens of a corpus document used as its prompt");
    f.Add("max-prompt-tokens", &max_prompt_tokens, "longer prompts are cut");
    f.Add("new-tokens", &new_tokens, "tokens generated per prompt");
    f.Add("threads", &threads, "intra-op threads (0 = default)");
  }
};

StatusOr<Common> Setup(const CommonFlags& cf) {
  if (cf.threads > 0) at::set_num_threads(static_cast<int>(cf.threads));
  Common c;
  LEDE_ASSIGN_OR_RETURN(std::string tok_path, tokenizer::FindTokenizerFile(cf.model));
  LEDE_ASSIGN_OR_RETURN(c.tokenizer, tokenizer::LoadTokenizer(tok_path));
  LEDE_ASSIGN_OR_RETURN(auto loaded, model::LlamaModel::Load(cf.model, model::ModelOptions{}));
  c.model = std::move(loaded);
  model::KvCacheOptions ko;
  ko.max_draft_len = std::max<int64_t>(16, cf.max_draft);
  LEDE_ASSIGN_OR_RETURN(c.engine, model::Engine::Create(c.model, ko));
  model::Calibration cal;
  if (!cf.calibration.empty()) {
    LEDE_ASSIGN_OR_RETURN(cal, model::ReadCalibrationFile(cf.calibration));
  } else {
    LEDE_ASSIGN_OR_RETURN(cal, model::Calibrate(*c.model, 30));
  }
  c.accelerator = model::MakeAcceleratorCostModel(c.model->config());
  c.measured = model::MakeMeasuredCostModel(cal);
  LEDE_ASSIGN_OR_RETURN(c.spec.candidate_layers, flags::ParseIntList("candidate-layers", cf.candidates));
  c.spec.max_draft_len = static_cast<int32_t>(cf.max_draft);
  for (const std::string& path : SplitList(cf.prompts)) {
    LEDE_ASSIGN_OR_RETURN(PromptSet set, LoadPromptSet(path, *c.tokenizer, cf.per_set, cf.prompt_tokens,
                                                       cf.max_prompt_tokens));
    c.sets.push_back(std::move(set));
  }
  return c;
}

// The rewards of policy/transition.h under a cost model: "paper" (DESIGN.md
// §2; with the measured model its depth term assumes a typical round of 3
// drafts and 4 tokens) or "throughput" (tokens minus cost).
policy::RewardSpec RewardsFor(const std::string& reward, const model::CostModel& cm, const Common& c) {
  const int32_t L = static_cast<int32_t>(c.model->n_layers());
  std::vector<double> draft_cost;
  for (int32_t l = 0; l <= L; ++l) draft_cost.push_back(l == 0 ? 0.0 : cm.DraftToken(l));
  if (reward == "throughput") {
    std::vector<std::vector<double>> verify(L + 1);
    for (int32_t e = 0; e <= L; ++e) {
      for (int32_t k = 0; k <= c.spec.max_draft_len; ++k) verify[e].push_back(e == 0 ? 0.0 : cm.Verify(e, k));
    }
    return policy::RewardSpec::Throughput(cm.name(), draft_cost, verify, cm.Probe());
  }
  if (cm.name() == "accelerator") return policy::RewardSpec::Paper(L);
  return policy::RewardSpec::FromCosts(cm.name(), draft_cost, cm.Verify(L / 4 + 1, 3), 4.0, cm.Probe());
}

void PrintProgress(std::ostream& err, const std::string& what, size_t done, size_t total) {
  const int width = 20, filled = total ? static_cast<int>(width * done / total) : width;
  err << "\r[" << std::string(filled, '#') << std::string(width - filled, '.') << "] " << done << "/" << total
      << " " << what << "            " << std::flush;
}

}  // namespace

int RunBench(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  CommonFlags cf;
  std::string methods_flag = "ar,static,threshold,lede", policies, json_path;
  flags::FlagSet f;
  cf.AddTo(f);
  f.Add("methods", &methods_flag, "comma-separated: ar, static, threshold, lede");
  f.Add("policy", &policies, "LEDE policy artifact directories, comma-separated");
  f.Add("json", &json_path, "write all results as JSON here");
  if (flags::WantsHelp(args)) {
    out << "usage: lede bench --model DIR --prompts FILE[,FILE...] [flags]\nflags:\n" << f.Usage();
    return 0;
  }
  if (Status s = f.Parse(args); !s.ok()) {
    err << "lede bench: " << s.message() << " (see lede bench --help)\n";
    return 2;
  }
  auto common = Setup(cf);
  if (!common.ok()) {
    err << "lede bench: " << common.status().message() << "\n";
    return common.status().code() == StatusCode::kInternal ? 1 : 2;
  }
  Common& c = *common;
  std::vector<std::string> methods = SplitList(methods_flag);
  auto has = [&](const std::string& m) { return std::find(methods.begin(), methods.end(), m) != methods.end(); };
  std::vector<policy::dqn::Artifact> artifacts;
  for (const std::string& dir : SplitList(policies)) {
    auto a = policy::dqn::LoadArtifact(dir, c.model->config().ArchitectureFingerprint());
    if (!a.ok()) {
      err << "lede bench: --policy " << dir << ": " << a.status().message() << "\n";
      return 2;
    }
    artifacts.push_back(std::move(*a));
  }
  if (has("lede") && artifacts.empty()) {
    err << "lede bench: method lede needs --policy\n";
    return 2;
  }

  GenerateOptions ar;
  ar.max_new_tokens = cf.new_tokens;
  const std::vector<int32_t>& cands = c.spec.candidate_layers;
  const std::vector<int64_t> draft_grid = {1, 2, 3, 4, 6, 8};
  const std::vector<std::pair<float, float>> threshold_grid = [] {
    std::vector<std::pair<float, float>> g;
    for (float lambda : {0.3f, 0.5f, 0.7f, 0.8f, 0.9f, 0.95f}) {
      for (float tau : {0.3f, 0.5f, 0.7f, 0.9f}) g.emplace_back(lambda, tau);
    }
    return g;
  }();
  const std::vector<const model::CostModel*> cost_models = {c.accelerator.get(), c.measured.get()};
  nlohmann::json report;
  report["model"] = cf.model;
  report["candidate_layers"] = cands;
  report["max_draft_len"] = cf.max_draft;
  report["new_tokens"] = cf.new_tokens;

  for (const PromptSet& set : c.sets) {
    err << "== " << set.name << ": " << set.tuning.size() << " tuning / " << set.eval.size() << " evaluation prompts\n";
    auto ar_tune = RunPrompts(*c.engine, set.tuning, ar, nullptr, nullptr);
    auto ar_eval = RunPrompts(*c.engine, set.eval, ar, nullptr, nullptr);
    if (!ar_tune.ok() || !ar_eval.ok()) {
      err << "lede bench: " << (ar_tune.ok() ? ar_eval.status() : ar_tune.status()).message() << "\n";
      return 1;
    }
    const double ar_tps = ar_eval->tokens_per_s();
    nlohmann::json rows = nlohmann::json::array();
    auto add_row = [&](const std::string& method, const std::string& config, const Totals& t) {
      nlohmann::json row = {{"method", method},
                            {"config", config},
                            {"tokens_per_s", t.tokens_per_s()},
                            {"measured_speedup", t.tokens_per_s() / ar_tps},
                            {"predicted_speedup_accelerator", c.accelerator->PredictedSpeedup(t.rounds)},
                            {"predicted_speedup_measured", c.measured->PredictedSpeedup(t.rounds)},
                            {"acceptance_rate", t.acceptance()},
                            {"tokens_per_round", t.tokens_per_round()},
                            {"mean_exit_layer", t.mean_exit()},
                            {"mean_draft_len", t.mean_draft()},
                            {"exact_match_rate", t.prompts ? static_cast<double>(t.exact) / t.prompts : 0.0}};
      rows.push_back(row);
    };
    if (has("ar")) {
      Totals reference = *ar_eval;
      reference.exact = reference.prompts;  // the reference itself
      add_row("ar", "", reference);
    }

    // Static and threshold: grid search on the tuning split per cost model.
    auto tune = [&](const std::string& method, size_t n_configs,
                    const std::function<GenerateOptions(size_t)>& options_of,
                    const std::function<ControllerFactory(size_t)>& factory_of,
                    const std::function<std::string(size_t)>& label_of) -> Status {
      std::vector<Totals> tuned;
      for (size_t i = 0; i < n_configs; ++i) {
        PrintProgress(err, method + " grid on tuning split", i, n_configs);
        LEDE_ASSIGN_OR_RETURN(Totals t, RunPrompts(*c.engine, set.tuning, options_of(i), factory_of(i), nullptr));
        tuned.push_back(std::move(t));
      }
      PrintProgress(err, method + " grid on tuning split", n_configs, n_configs);
      err << "\n";
      for (const model::CostModel* cm : cost_models) {
        size_t best = 0;
        for (size_t i = 1; i < n_configs; ++i) {
          if (cm->PredictedSpeedup(tuned[i].rounds) > cm->PredictedSpeedup(tuned[best].rounds)) best = i;
        }
        LEDE_ASSIGN_OR_RETURN(Totals t, RunPrompts(*c.engine, set.eval, options_of(best), factory_of(best),
                                                   &ar_eval->outputs));
        add_row(method + " (best " + cm->name() + ")", label_of(best), t);
      }
      return OkStatus();
    };
    if (has("static")) {
      std::vector<std::pair<int64_t, int64_t>> grid;
      for (int32_t e : cands) {
        for (int64_t d : draft_grid) grid.emplace_back(e, d);
      }
      Status s = tune("static", grid.size(),
                      [&](size_t i) {
                        GenerateOptions o = ar;
                        o.mode = model::SpeculationMode::kStatic;
                        o.exit_layer = grid[i].first;
                        o.draft_len = grid[i].second;
                        return o;
                      },
                      [](size_t) { return ControllerFactory(); },
                      [&](size_t i) {
                        return "E=" + std::to_string(grid[i].first) + " D=" + std::to_string(grid[i].second);
                      });
      if (!s.ok()) {
        err << "lede bench: " << s.message() << "\n";
        return 1;
      }
    }
    GenerateOptions adaptive = ar;
    adaptive.mode = model::SpeculationMode::kAdaptive;
    adaptive.decision_spec = c.spec;
    if (has("threshold")) {
      Status s = tune("threshold", threshold_grid.size(), [&](size_t) { return adaptive; },
                      [&](size_t i) -> ControllerFactory {
                        auto [lambda, tau] = threshold_grid[i];
                        return [lambda, tau](int64_t) {
                          return std::make_unique<policy::ThresholdExitController>(lambda, tau);
                        };
                      },
                      [&](size_t i) {
                        char buf[48];
                        std::snprintf(buf, sizeof(buf), "lambda=%.2f tau=%.2f", threshold_grid[i].first,
                                      threshold_grid[i].second);
                        return std::string(buf);
                      });
      if (!s.ok()) {
        err << "lede bench: " << s.message() << "\n";
        return 1;
      }
    }
    if (has("lede")) {
      for (const policy::dqn::Artifact& a : artifacts) {
        auto network = std::make_shared<const policy::dqn::QNetwork>(a.network);
        GenerateOptions o = adaptive;
        o.decision_spec = a.metadata.decision;
        const std::string version = a.metadata.version;
        auto dqn = [network, version](int64_t) -> std::unique_ptr<ExitController> {
          return std::make_unique<policy::dqn::DqnExitController>(network, version);
        };
        auto t = RunPrompts(*c.engine, set.eval, o, dqn, &ar_eval->outputs);
        if (!t.ok()) {
          err << "lede bench: " << t.status().message() << "\n";
          return 1;
        }
        const std::string label = "lede " + a.metadata.version;
        add_row(label, version, *t);
        // Ablations: no dynamic exit (l* fixed at the policy's most used exit
        // layer) and no adaptive length (D fixed at its mean draft length).
        int32_t top_exit = 0;
        int64_t top_count = -1;
        for (auto [l, n] : t->exit_counts) {
          if (n > top_count) top_exit = l, top_count = n;
        }
        const int32_t mean_d = std::max(1, static_cast<int32_t>(std::lround(t->mean_draft())));
        if (top_exit > 0) {
          auto fixed_exit = [dqn, top_exit](int64_t i) -> std::unique_ptr<ExitController> {
            return std::make_unique<AblatedController>(dqn(i), top_exit, 0);
          };
          auto fixed_len = [dqn, mean_d](int64_t i) -> std::unique_ptr<ExitController> {
            return std::make_unique<AblatedController>(dqn(i), 0, mean_d);
          };
          auto te = RunPrompts(*c.engine, set.eval, o, fixed_exit, &ar_eval->outputs);
          auto tl = RunPrompts(*c.engine, set.eval, o, fixed_len, &ar_eval->outputs);
          if (te.ok()) add_row(label + " fixed exit", "l*=" + std::to_string(top_exit), *te);
          if (tl.ok()) add_row(label + " fixed length", "D=" + std::to_string(mean_d), *tl);
        }
      }
    }
    // Hindsight oracle per cost model on the evaluation split.
    nlohmann::json oracle;
    for (const model::CostModel* cm : cost_models) {
      double tokens = 0, cost = 0;
      for (size_t i = 0; i < set.eval.size(); ++i) {
        auto [n, k] = OracleCost(*c.model, set.eval[i], ar_eval->outputs[i], cands, c.spec.max_draft_len, *cm);
        tokens += n;
        cost += k;
      }
      oracle[cm->name()] = cost > 0 ? tokens / cost : 1.0;
    }

    // Table.
    char line[512];
    out << "\n== " << set.name << " (evaluation split: " << set.eval.size() << " prompts x " << cf.new_tokens
        << " tokens; AR " << static_cast<int64_t>(ar_tps) << " tokens/s)\n";
    std::snprintf(line, sizeof(line), "%-34s %-20s %7s %8s %10s %11s %7s %7s %6s %6s %6s\n", "method", "config",
                  "tok/s", "measured", "pred.accel", "pred.measrd", "accept", "tok/rnd", "mean E", "mean D", "exact");
    out << line;
    for (const auto& r : rows) {
      std::snprintf(line, sizeof(line), "%-34s %-20s %7.0f %7.2fx %9.2fx %10.2fx %7.3f %7.2f %6.2f %6.2f %6.2f\n",
                    r["method"].get<std::string>().c_str(), r["config"].get<std::string>().c_str(),
                    r["tokens_per_s"].get<double>(), r["measured_speedup"].get<double>(),
                    r["predicted_speedup_accelerator"].get<double>(), r["predicted_speedup_measured"].get<double>(),
                    r["acceptance_rate"].get<double>(), r["tokens_per_round"].get<double>(),
                    r["mean_exit_layer"].get<double>(), r["mean_draft_len"].get<double>(),
                    r["exact_match_rate"].get<double>());
      out << line;
    }
    std::snprintf(line, sizeof(line), "%-34s %-20s %7s %8s %9.2fx %10.2fx\n", "hindsight oracle", "", "-", "-",
                  oracle["accelerator"].get<double>(), oracle["measured"].get<double>());
    out << line << std::flush;
    report["sets"][set.name] = {{"rows", rows}, {"hindsight_oracle", oracle}, {"ar_tokens_per_s", ar_tps},
                                {"tuning_prompts", set.tuning.size()}, {"eval_prompts", set.eval.size()}};
  }
  if (!json_path.empty()) {
    std::ofstream(json_path) << report.dump(2) << "\n";
    err << "wrote " << json_path << "\n";
  }
  return 0;
}

int RunCollect(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  CommonFlags cf;
  std::string out_dir, cost_model = "accelerator", reward = "paper", version = "explore";
  double epsilon = 0.2;
  int64_t seeds = 4;
  flags::FlagSet f;
  cf.AddTo(f);
  f.Add("out", &out_dir, "experience shard directory", true);
  f.Add("cost-model", &cost_model, "reward cost model: accelerator or measured");
  f.Add("reward", &reward, "paper (DESIGN.md §2) or throughput (tokens minus cost)");
  f.Add("epsilon", &epsilon, "probability of a random action");
  f.Add("seeds", &seeds, "runs per tuning prompt (each with another behaviour policy and seed)");
  f.Add("version", &version, "behaviour policy version recorded in the transitions");
  if (flags::WantsHelp(args)) {
    out << "usage: lede collect --model DIR --prompts FILE[,FILE...] --out DIR [flags]\nflags:\n" << f.Usage();
    return 0;
  }
  if (Status s = f.Parse(args); !s.ok()) {
    err << "lede collect: " << s.message() << " (see lede collect --help)\n";
    return 2;
  }
  if (cost_model != "accelerator" && cost_model != "measured") {
    err << "lede collect: --cost-model: want accelerator or measured\n";
    return 2;
  }
  if (reward != "paper" && reward != "throughput") {
    err << "lede collect: --reward: want paper or throughput\n";
    return 2;
  }
  auto common = Setup(cf);
  if (!common.ok()) {
    err << "lede collect: " << common.status().message() << "\n";
    return 2;
  }
  Common& c = *common;
  const policy::RewardSpec rewards =
      RewardsFor(reward, cost_model == "accelerator" ? *c.accelerator : *c.measured, c);
  std::filesystem::create_directories(out_dir);
  // Behaviour policies: thresholds from eager to cautious, with exploration.
  const std::vector<std::pair<float, float>> behaviours = {{0.5f, 0.5f}, {0.8f, 0.7f}, {0.3f, 0.3f}, {0.9f, 0.9f}};
  const std::string fingerprint = c.model->config().ArchitectureFingerprint();
  int64_t total = 0;
  for (const PromptSet& set : c.sets) {
    for (int64_t seed = 0; seed < seeds; ++seed) {
      const std::string shard = out_dir + "/" + set.name + "-" + cost_model + "-" + std::to_string(seed) + ".lexp";
      auto writer = experience::ShardWriter::Create(shard);
      if (!writer.ok()) {
        err << "lede collect: " << writer.status().message() << "\n";
        return 1;
      }
      auto [lambda, tau] = behaviours[seed % behaviours.size()];
      for (size_t i = 0; i < set.tuning.size(); ++i) {
        policy::ThresholdExitController behaviour(lambda, tau);
        policy::EpsilonGreedyController explore(behaviour, epsilon, static_cast<uint64_t>(seed * 100003 + i));
        GenerateOptions o;
        o.max_new_tokens = cf.new_tokens;
        o.mode = model::SpeculationMode::kAdaptive;
        o.controller = &explore;
        o.decision_spec = c.spec;
        o.record_traces = true;
        auto r = c.engine->Generate(set.tuning[i], o);
        if (!r.ok()) {
          err << "lede collect: " << r.status().message() << "\n";
          return 1;
        }
        const std::string request_id = set.name + ":" + std::to_string(i) + ":" + std::to_string(seed);
        for (const model::RoundTrace& trace : r->traces) {
          for (const policy::Transition& t : policy::ToTransitions(trace, rewards, request_id, version, fingerprint)) {
            if (Status s = (*writer)->Append(t); !s.ok()) {
              err << "lede collect: " << s.message() << "\n";
              return 1;
            }
          }
        }
        PrintProgress(err, set.name + " seed " + std::to_string(seed), i + 1, set.tuning.size());
      }
      total += (*writer)->records();
      if (Status s = (*writer)->Finish(); !s.ok()) {
        err << "lede collect: " << s.message() << "\n";
        return 1;
      }
    }
    err << "\n";
  }
  out << "wrote " << total << " transitions (" << reward << " rewards, " << cost_model << " costs) to " << out_dir
      << "\n";
  return 0;
}

}  // namespace lede::bench
