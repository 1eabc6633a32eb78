// lede-train-counterfactual: trains LEDE's exit policy on counterfactual
// experience (trainer/counterfactual.h, trainer/dinkelbach.h).
//
// Greedy requests are generated for the tuning split of each prompt set
// (and, optionally, extra prompts such as training-corpus documents), their
// shadow traces computed in one pass each, and the DQN trained by Dinkelbach
// iteration on replays of them; a quarter of the requests (whole requests)
// selects the iterate. Writes a policy artifact (policy/dqn/artifact.h) and
// a report.json beside it.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>

#include "policy/dqn/artifact.h"
#include "shared/flags/flags.h"
#include "shared/flags/model_flags.h"
#include "shared/flags/sampling_flags.h"
#include "shared/model/cost/cost_model.h"
#include "shared/model/cost/cost_profiles.h"
#include "shared/model/decoding.h"
#include "shared/model/loaders/load_or_exit.h"
#include "shared/model/loaders/model_load_flags.h"
#include "shared/tokenizer/model_files.h"
#include "shared/status/status_macros.h"
#include "trainer/corpus.h"
#include "trainer/counterfactual.h"
#include "trainer/dinkelbach.h"
#include "trainer/dqn.h"
#include "trainer/dqn_flags.h"

namespace {

using lede::Status;
using lede::StatusOr;

// The model-loading group (shared/flags/model_flags.h) holds --model and
// --weights; --threads is the DQN group's (tracing and training alike).
struct Flags : lede::flags::ModelLoadFlags {
  std::string prompts, extra_prompts, exclude_prompts, reward = "throughput", cost_model = "accelerator", calibration, candidates = "1,2,3,4,5,6", out,
              version, report;
  int64_t per_set = 48, prompt_tokens = 32, max_prompt_tokens = 192, new_tokens = 128, extra_count = 0,
          max_draft = 4, iterations = 6;
  double selection_fraction = 0.25, epsilon = 0.2, conservative_margin = 0.0, max_profile_slowdown = 0.01;
  // Sampled training requests (--temperature > 0): each prompt's output is
  // drawn --seeds times (seeds 1..N), as lede-bench bench --temperature does.
  lede::flags::SamplingFlags sampling;
  // --seed --epochs --hidden --batch-size --lr --threads (trainer/dqn_flags.h);
  // 16 epochs of 256-transition minibatches per Dinkelbach iteration.
  lede::trainer::DqnFlags dqn{[] {
    lede::trainer::DqnOptions o;
    o.epochs = 16;
    o.batch_size = 256;
    return o;
  }()};
  std::string initial_policy = "static", loads, warm_start, trace_model, cost_profiles;
  double ridge_tokens = lede::model::cost::kDefaultRidgeTokens;
  bool overwrite = false, probe_candidates = false, lookahead_probe = false, rollout = true;
  // With --temperature > 0: each prompt's greedy trace too, so that one
  // policy learns both kinds of traffic (the temperature is in its state).
  bool also_greedy = false;
  bool rho_per_sampling = false;  // DinkelbachOptions::rho_per_sampling
};

int Fail(const Status& s) {
  std::fprintf(stderr, "lede-train-counterfactual: %s\n", std::string(s.message()).c_str());
  return s.code() == lede::StatusCode::kInternal ? 1 : 2;
}

// The measured model's calibration (--calibration, default
// <model>/calibration-cpu.json), read once; empty for the accelerator model.
StatusOr<lede::model::cost::Calibration> ReadCalibration(const Flags& fl) {
  if (fl.cost_model != "measured") return lede::model::cost::Calibration{};
  return lede::model::cost::ReadCalibrationFile(fl.calibration.empty() ? fl.model + "/calibration-cpu.json"
                                                                 : fl.calibration);
}

// The reward's cost model: the accelerator model, or the measured one.
StatusOr<std::unique_ptr<lede::model::cost::CostModel>> MakeCostModel(const Flags& fl, const lede::model::LlamaModel& model,
                                                                const lede::model::cost::Calibration& cal) {
  if (fl.cost_model == "accelerator") return lede::model::cost::MakeAcceleratorCostModel(model.config());
  if (fl.cost_model == "measured") return lede::model::cost::MakeMeasuredCostModel(cal);
  return lede::InvalidArgumentError("--cost-model: want accelerator or measured");
}

// --loads: the cost model of --cost-model at a load (shared/model/cost/cost_model.h).
StatusOr<std::unique_ptr<lede::model::cost::CostModel>> MakeCostModelAtLoad(const Flags& fl,
                                                                     const lede::model::LlamaModel& model,
                                                                     const lede::model::cost::Calibration& cal,
                                                                     int32_t load) {
  if (fl.cost_model == "accelerator") {
    return lede::model::cost::MakeAcceleratorCostModelAtLoad(model.config(), load, fl.ridge_tokens);
  }
  auto cost = lede::model::cost::MakeMeasuredCostModelAtLoad(cal, load);
  if (!cost.ok()) return lede::Status(cost.status().code(), "--loads: " + std::string(cost.status().message()));
  return cost;
}

// --cost-profiles: one entry per profile (DinkelbachOptions::cost_profiles),
//   accelerator          the accelerator model of --model's shape
//   calibration:PATH     the measured model of a `lede calibrate` file
//   PROBE:LAYER:VERIFY   the profile cost model of those features
// each with its features under --max-draft-len (model::cost::CostFeaturesOf;
// a calibration's from its step timings, CostFeaturesOfCalibration).
StatusOr<std::vector<lede::trainer::DinkelbachOptions::CostProfile>> MakeCostProfiles(
    const Flags& fl, const lede::model::LlamaModel& model) {
  std::vector<lede::trainer::DinkelbachOptions::CostProfile> out;
  const int64_t L = model.config().n_layers;
  for (const std::string& entry : lede::flags::SplitList(fl.cost_profiles)) {
    lede::trainer::DinkelbachOptions::CostProfile p;
    p.name = entry;
    const std::string kCalibration = "calibration:";
    if (entry == "accelerator") {
      p.cost = lede::model::cost::MakeAcceleratorCostModel(model.config());
      p.features = lede::model::cost::CostFeaturesOf(*p.cost, L, fl.max_draft);
    } else if (entry.rfind(kCalibration, 0) == 0) {
      auto cal = lede::model::cost::ReadCalibrationFile(entry.substr(kCalibration.size()));
      if (!cal.ok()) return lede::Status(cal.status().code(), "--cost-profiles: " + std::string(cal.status().message()));
      p.cost = lede::model::cost::MakeMeasuredCostModel(*cal);
      p.features = lede::model::cost::CostFeaturesOfCalibration(*cal, L, fl.max_draft);  // as served
    } else {
      auto f = lede::model::cost::ParseCostFeatures(entry);
      if (!f.ok()) return lede::Status(f.status().code(), "--cost-profiles: " + std::string(f.status().message()));
      LEDE_ASSIGN_OR_RETURN(std::unique_ptr<lede::model::cost::CostModel> made,
                            lede::model::cost::MakeProfileCostModel(*f, L));
      p.cost = std::move(made);
      p.features = lede::model::cost::CostFeaturesOf(*p.cost, L, fl.max_draft);
    }
    out.push_back(std::move(p));
  }
  return out;
}

// The training requests: the tuning splits of --prompts, then --extra-prompts
// (both halves) minus those that begin like a prompt of --exclude-prompts.
Status CollectPrompts(const Flags& fl, const lede::tokenizer::Tokenizer& tok, std::vector<std::vector<int32_t>>* prompts,
                      std::vector<std::string>* ids) {
  for (const std::string& path : lede::flags::SplitList(fl.prompts)) {
    auto set = lede::trainer::LoadPromptSet(path, tok, fl.per_set, fl.prompt_tokens, fl.max_prompt_tokens);
    if (!set.ok()) return set.status();
    for (size_t i = 0; i < set->tuning.size(); ++i) {
      prompts->push_back(set->tuning[i]);
      ids->push_back(set->name + ":" + std::to_string(i));
    }
  }
  // Extra prompts that begin like any prompt of --exclude-prompts (the
  // evaluation sets, both splits) are dropped: corpus files hold the
  // documents the evaluation prompts were cut from.
  constexpr size_t kPrefix = 16;
  std::set<std::vector<int32_t>> excluded;
  for (const std::string& path : lede::flags::SplitList(fl.exclude_prompts)) {
    auto set = lede::trainer::LoadPromptSet(path, tok, 1 << 20, fl.prompt_tokens, fl.max_prompt_tokens);
    if (!set.ok()) return set.status();
    for (const auto* half : {&set->tuning, &set->eval}) {
      for (const auto& p : *half) excluded.emplace(p.begin(), p.begin() + std::min(kPrefix, p.size()));
    }
  }
  int64_t n_excluded = 0;
  for (const std::string& path : lede::flags::SplitList(fl.extra_prompts)) {
    // All of an extra file's prompts train (they must not be evaluation data).
    auto set = lede::trainer::LoadPromptSet(path, tok, 2 * fl.extra_count, fl.prompt_tokens, fl.max_prompt_tokens);
    if (!set.ok()) return set.status();
    for (const auto* half : {&set->tuning, &set->eval}) {
      for (const auto& p : *half) {
        if (excluded.count(std::vector<int32_t>(p.begin(), p.begin() + std::min(kPrefix, p.size())))) {
          ++n_excluded;
          continue;
        }
        prompts->push_back(p);
        ids->push_back(set->name + ":x" + std::to_string(ids->size()));
      }
    }
  }
  if (n_excluded > 0) std::fprintf(stderr, "%lld extra prompts dropped (they begin like an excluded prompt)\n",
                                   static_cast<long long>(n_excluded));
  return lede::OkStatus();
}

// training_report.json: the Dinkelbach iterations and the static references.
nlohmann::json TrainingReport(const lede::model::cost::CostModel& cost, const lede::trainer::DinkelbachResult& result,
                              const lede::trainer::StaticChoice& sel_static, size_t n_train, size_t n_selection) {
  nlohmann::json report;
  report["cost_model"] = cost.name();
  report["best_static_train"] = {{"config", result.best_static}, {"speedup", result.best_static_train_speedup}};
  report["initial_policy_train"] = {{"config", result.initial_policy}, {"speedup", result.initial_train_speedup}};
  report["selected_iteration"] = result.selected_iteration;
  report["best_static_selection"] = {{"config", "E=" + std::to_string(sel_static.exit_layer) + " D=" +
                                                    std::to_string(sel_static.draft_len)},
                                     {"speedup", sel_static.speedup}};
  for (const auto& it : result.iterations) {
    report["iterations"].push_back({{"iteration", it.iteration},
                                    {"rho", it.rho},
                                    {"transitions", it.transitions},
                                    {"train_speedup", it.train_speedup},
                                    {"selection_speedup", it.selection_speedup},
                                    {"adopted", it.adopted},
                                    {"group_slowed", it.group_slowed},
                                    {"seconds", it.seconds}});
  }
  report["requests"] = {{"train", n_train}, {"selection", n_selection}};
  if (!result.load_best_static.empty()) report["best_static_train_per_load"] = result.load_best_static;
  for (size_t i = 0; i < result.iterations.size(); ++i) {
    const auto& it = result.iterations[i];
    if (it.load_rho.empty()) continue;
    report["iterations"][i]["load_rho"] = it.load_rho;
    report["iterations"][i]["load_train_speedup"] = it.load_train_speedup;
    report["iterations"][i]["load_selection_speedup"] = it.load_selection_speedup;
  }
  return report;
}

// The Dinkelbach options of the flags, checked before any trace: the warm
// start's artifact is read and every --loads price is made once here.
StatusOr<lede::trainer::DinkelbachOptions> MakeOptions(const Flags& fl, const lede::model::LlamaModel& model,
                                                       const lede::model::cost::Calibration& cal) {
  lede::trainer::DinkelbachOptions o;
  if (fl.reward != "throughput" && fl.reward != "paper") {
    return lede::InvalidArgumentError("--reward: want throughput or paper");
  }
  o.paper_rewards = fl.reward == "paper";
  LEDE_ASSIGN_OR_RETURN(o.spec.candidate_layers, lede::flags::ParseIntList("candidate-layers", fl.candidates));
  o.spec.max_draft_len = static_cast<int32_t>(fl.max_draft);
  o.spec.probe_candidates = fl.probe_candidates;
  o.rollout_targets = fl.rollout;
  o.spec.lookahead_probe = fl.lookahead_probe;
  o.max_iterations = static_cast<int32_t>(fl.iterations);
  o.behaviour_epsilon = fl.epsilon;
  o.conservative_margin = fl.conservative_margin;
  o.max_group_slowdown = fl.max_profile_slowdown;
  o.rho_per_sampling = fl.rho_per_sampling;
  o.initial_policy = fl.initial_policy;
  if (!fl.warm_start.empty()) {
    auto warm = lede::policy::dqn::LoadArtifact(fl.warm_start, model.config().ArchitectureFingerprint());
    if (!warm.ok()) return lede::Status(warm.status().code(), "--warm-start: " + std::string(warm.status().message()));
    if (warm->metadata.decision.candidate_layers != o.spec.candidate_layers ||
        warm->metadata.decision.max_draft_len != o.spec.max_draft_len) {
      return lede::InvalidArgumentError("--warm-start: " + fl.warm_start +
                                        " decides at other candidate layers or another D_max than "
                                        "--candidate-layers and --max-draft-len");
    }
    o.warm_start = std::make_shared<const lede::policy::dqn::QNetwork>(warm->network);
  }
  LEDE_RETURN_IF_ERROR(lede::trainer::ApplyDqnFlags(fl.dqn, lede::trainer::DqnFlagScope::kCore, &o.dqn));
  o.seed = o.dqn.seed;
  o.model_fingerprint = model.config().ArchitectureFingerprint();
  o.dqn.heldout_fraction = 0.0;  // selection runs on whole held-out requests instead
  if (!fl.loads.empty()) {
    LEDE_ASSIGN_OR_RETURN(o.loads, lede::flags::ParseIntList("loads", fl.loads));
    for (int32_t load : o.loads) {  // every price exists before any trace
      LEDE_RETURN_IF_ERROR(MakeCostModelAtLoad(fl, model, cal, std::max(load, 1)).status());
    }
    o.cost_at_load = [&fl, &model, &cal](int32_t load) { return MakeCostModelAtLoad(fl, model, cal, load); };
  }
  LEDE_ASSIGN_OR_RETURN(o.cost_profiles, MakeCostProfiles(fl, model));
  LEDE_RETURN_IF_ERROR(lede::trainer::ValidateDinkelbachOptions(o));
  return o;
}

// The shadow traces of the training requests (CollectPrompts): about
// --selection-fraction of the prompts (every k-th) select the iterate. With
// --temperature > 0 every prompt gives --seeds sampled traces (and with
// --also-greedy its greedy trace first), all on the prompt's side of the
// split.
Status TraceRequests(const Flags& fl, const lede::tokenizer::Tokenizer& tok, lede::model::Engine& engine,
                     int32_t top_k, std::vector<lede::trainer::ShadowTrace>* train,
                     std::vector<lede::trainer::ShadowTrace>* selection) {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> ids;
  LEDE_RETURN_IF_ERROR(CollectPrompts(fl, tok, &prompts, &ids));
  if (prompts.size() < 4) return lede::InvalidArgumentError("--prompts: fewer than 4 training requests");
  const size_t every = std::max<size_t>(2, static_cast<size_t>(std::lround(1.0 / std::max(0.05, fl.selection_fraction))));
  const int64_t first_seed = fl.also_greedy ? 0 : 1;  // "seed 0": the greedy trace
  for (size_t i = 0; i < prompts.size(); ++i) {
    for (int64_t seed = first_seed; seed <= fl.sampling.seeds; ++seed) {
      lede::speculation::SamplingParams sampling;
      if (seed > 0) {
        sampling.temperature = fl.sampling.temperature;
        sampling.top_p = fl.sampling.top_p;
        sampling.seed = static_cast<uint64_t>(seed);
      }
      const std::string id = sampling.greedy() ? ids[i] : ids[i] + "#" + std::to_string(seed);
      LEDE_ASSIGN_OR_RETURN(lede::trainer::ShadowTrace t,
                            lede::trainer::TraceRequest(engine, prompts[i], fl.new_tokens, top_k, id, sampling));
      (i % every == every - 1 ? *selection : *train).push_back(std::move(t));
    }
    std::fprintf(stderr, "\rshadow traces %zu/%zu", i + 1, prompts.size());
  }
  return lede::OkStatus();
}

// --trace-model: the traces are a function of the model's logits only
// (counterfactual.h), so a model that computes the same function as --model
// may compute them at its own speed: the source of a `lede widen` checkpoint
// (whose config.json names the source's fingerprint in its lede_widen
// record) traces at the source's cost, and the cost model, the fingerprint
// and the policy stay --model's. Refused unless --model is such a widening
// of the trace model and the two agree on the first trace: --model's own
// uncached pass over its prompt and output must give the same exit top-1 at
// 99% or more of the layers and positions (float near-ties aside).
Status CheckTraceModel(const Flags& fl, const lede::model::LlamaModel& model, const lede::model::LlamaModel& tracer,
                       const lede::trainer::ShadowTrace& first) {
  std::ifstream in(fl.model + "/config.json");
  const nlohmann::json config = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  const auto widen = config.is_object() ? config.find("lede_widen") : config.end();
  const std::string want = tracer.config().ArchitectureFingerprint();
  if (widen == config.end() || !widen->is_object() || !widen->contains("source_fingerprint") ||
      !(*widen)["source_fingerprint"].is_string() || (*widen)["source_fingerprint"].get<std::string>() != want) {
    return lede::InvalidArgumentError("--trace-model: " + fl.model +
                                      "/config.json has no lede_widen record whose source_fingerprint is " +
                                      fl.trace_model + "'s (" + want + ")");
  }
  if (model.config().n_layers != tracer.config().n_layers) {
    return lede::InvalidArgumentError("--trace-model: another number of layers than --model");
  }
  std::vector<int32_t> output = first.target;
  const bool ended_on_eos = !output.empty() && std::find(first.eos_ids.begin(), first.eos_ids.end(),
                                                         output.back()) != first.eos_ids.end() &&
                            static_cast<int64_t>(output.size()) <= first.max_new_tokens &&
                            output.size() > 1;
  if (ended_on_eos) output.pop_back();
  LEDE_ASSIGN_OR_RETURN(lede::trainer::ShadowTrace own,
                        lede::trainer::ComputeShadowTrace(model, first.prompt, output, ended_on_eos,
                                                          first.max_new_tokens, first.top_k, first.id));
  int64_t same = 0, total = 0;
  for (size_t l = 0; l < own.probes.size() && l < first.probes.size(); ++l) {
    for (size_t t = 0; t < own.probes[l].size() && t < first.probes[l].size(); ++t) {
      same += own.probes[l][t].top1 == first.probes[l][t].top1;
      ++total;
    }
  }
  std::fprintf(stderr, "--trace-model: %s and %s agree on %lld of %lld exit top-1s of the first trace\n",
               fl.model.c_str(), fl.trace_model.c_str(), static_cast<long long>(same), static_cast<long long>(total));
  if (total == 0 || own.probes.size() != first.probes.size() || same < 0.99 * static_cast<double>(total)) {
    return lede::InvalidArgumentError("--trace-model: " + fl.trace_model + " does not compute --model's function");
  }
  return lede::OkStatus();
}

void PrintIteration(const lede::trainer::DinkelbachOptions& o, const lede::trainer::DinkelbachIteration& it) {
  std::fprintf(stderr,
               "iteration %d: rho %.4f, %lld transitions -> train %.4fx, selection %.4fx, %s (%.0f s); "
               "agrees with pi on %.1f%% / %.1f%% / %.1f%% of its round-start / exit-layer / draft-length "
               "decisions\n",
               it.iteration, it.rho, static_cast<long long>(it.transitions), it.train_speedup,
               it.selection_speedup, it.adopted        ? "adopted"
               : it.group_slowed ? "rejected: a load or profile slowed down (pi and rho kept)"
                                 : "rejected (pi and rho kept)", it.seconds,
               100 * it.agreement[0], 100 * it.agreement[1], 100 * it.agreement[2]);
  for (size_t i = 0; i < it.load_rho.size(); ++i) {
    const std::string group = o.cost_profiles.empty() ? it.group_names.at(i) : "profile " + it.group_names.at(i);
    std::fprintf(stderr, "  %s: rho %.4f -> train %.4fx, selection %.4fx\n", group.c_str(), it.load_rho[i],
                 it.load_train_speedup[i], it.load_selection_speedup[i]);
  }
}

// The policy artifact of the selected iterate, its metadata recording how
// it was trained on `n_requests` requests.
lede::policy::dqn::Artifact MakePolicyArtifact(const Flags& fl, const lede::trainer::DinkelbachOptions& o,
                                               const lede::model::cost::CostModel& cost,
                                               const lede::trainer::DinkelbachResult& result, size_t n_requests) {
  lede::policy::dqn::PolicyMetadata meta;
  meta.version = fl.version;
  meta.model_fingerprint = o.model_fingerprint;
  meta.decision = o.spec;
  // A cost-conditioned policy is priced by whatever deployment serves it:
  // retraining prices with the deployment's measured (served) costs.
  meta.reward_cost_model = o.paper_rewards ? "accelerator" : o.cost_profiles.empty() ? cost.name() : "served";
  const lede::trainer::DinkelbachIteration& sel = result.iterations[result.selected_iteration - 1];
  meta.training_options["rho"] = sel.rho;
  meta.training_options["dinkelbach_iterations"] = static_cast<double>(result.iterations.size());
  meta.training_options["selected_iteration"] = result.selected_iteration;
  meta.training_options["new_tokens"] = static_cast<double>(fl.new_tokens);
  meta.training_options["behaviour_epsilon"] = fl.epsilon;
  meta.training_options["rollout_targets"] = fl.rollout ? 1.0 : 0.0;
  meta.training_options["conservative_margin"] = fl.conservative_margin;
  meta.training_options["max_profile_slowdown"] = fl.max_profile_slowdown;
  if (fl.sampling.sampled()) {
    meta.training_options["temperature"] = fl.sampling.temperature;
    meta.training_options["top_p"] = fl.sampling.top_p;
    meta.training_options["seeds"] = static_cast<double>(fl.sampling.seeds);
    meta.training_options["also_greedy"] = fl.also_greedy ? 1.0 : 0.0;
  }
  meta.training_options["initial_policy_calibrated"] = fl.initial_policy == "calibrated" ? 1.0 : 0.0;
  meta.training_data.n_requests = static_cast<int64_t>(n_requests);
  if (!o.loads.empty() && fl.cost_model == "accelerator") meta.training_options["ridge_tokens"] = fl.ridge_tokens;
  if (o.rho_per_sampling) {
    // Groups are no longer one per load or profile: each by its name.
    meta.training_options["rho_per_sampling"] = 1.0;
    for (size_t i = 0; i < sel.group_names.size(); ++i) {
      meta.training_options["group " + sel.group_names[i]] = sel.load_train_speedup[i];
    }
  } else {
    for (size_t i = 0; i < o.loads.size(); ++i) {
      meta.training_options["load_" + std::to_string(o.loads[i])] = sel.load_train_speedup[i];
    }
    for (size_t i = 0; i < o.cost_profiles.size(); ++i) {
      const lede::speculation::CostFeatures& f = o.cost_profiles[i].features;
      char name[96];
      std::snprintf(name, sizeof(name), "profile_%.3f:%.3f:%.3f", f.probe, f.layer, f.verify);
      meta.training_options[name] = sel.load_train_speedup[i];
    }
  }
  lede::policy::dqn::Artifact artifact = lede::trainer::MakeArtifact(result.dqn, o.dqn, meta);
  artifact.metadata.offline_metrics["selection_speedup"] = sel.selection_speedup;
  artifact.metadata.offline_metrics["train_speedup"] = sel.train_speedup;
  artifact.metadata.offline_metrics["best_static_train_speedup"] = result.best_static_train_speedup;
  return artifact;
}

int Run(const Flags& fl) {
  auto threads = lede::model::loaders::ApplyThreadsFlag(fl.dqn.threads);  // tracing and training alike
  if (!threads.ok()) return Fail(threads.status());
  auto tok_path = lede::tokenizer::FindTokenizerFile(fl.model);
  if (!tok_path.ok()) return Fail(tok_path.status());
  auto tok = lede::tokenizer::LoadTokenizer(*tok_path);
  if (!tok.ok()) return Fail(tok.status());
  auto model_options = lede::model::loaders::ModelOptionsFromFlags(fl);
  if (!model_options.ok()) return Fail(model_options.status());
  std::shared_ptr<const lede::model::LlamaModel> model =
      lede::model::loaders::LoadModelOrExit("lede-train-counterfactual", fl.model, *model_options);
  lede::model::KvCacheOptions ko;
  ko.max_draft_len = std::max<int64_t>(8, fl.max_draft);
  auto engine = lede::model::Engine::Create(model, ko);
  if (!engine.ok()) return Fail(engine.status());

  auto calibration = ReadCalibration(fl);
  if (!calibration.ok()) return Fail(calibration.status());
  const lede::model::cost::Calibration& cal = *calibration;
  auto cost_or = MakeCostModel(fl, *model, cal);
  if (!cost_or.ok()) return Fail(cost_or.status());
  std::unique_ptr<lede::model::cost::CostModel> cost = std::move(*cost_or);
  auto options = MakeOptions(fl, *model, cal);
  if (!options.ok()) return Fail(options.status());
  const lede::trainer::DinkelbachOptions& o = *options;
  for (const auto& p : o.cost_profiles) {
    std::fprintf(stderr, "cost profile %s: probe %.3f, layer %.3f, verify %.3f (autoregressive steps)\n",
                 p.name.c_str(), p.features.probe, p.features.layer, p.features.verify);
  }

  // Requests: tuning splits of the prompt sets, then the extra prompts,
  // traced by --model or by --trace-model (CheckTraceModel).
  std::vector<lede::trainer::ShadowTrace> train, selection;
  if (fl.trace_model.empty()) {
    if (Status st = TraceRequests(fl, **tok, **engine, o.spec.top_k, &train, &selection); !st.ok()) return Fail(st);
  } else {
    std::shared_ptr<const lede::model::LlamaModel> tracer_model =
        lede::model::loaders::LoadModelOrExit("lede-train-counterfactual", fl.trace_model, *model_options);
    auto tracer_engine = lede::model::Engine::Create(tracer_model, ko);
    if (!tracer_engine.ok()) return Fail(tracer_engine.status());
    if (Status st = TraceRequests(fl, **tok, **tracer_engine, o.spec.top_k, &train, &selection); !st.ok()) {
      return Fail(st);
    }
    std::fprintf(stderr, "\n");
    if (Status st = CheckTraceModel(fl, *model, *tracer_model, selection.empty() ? train.front() : selection.front());
        !st.ok()) {
      return Fail(st);
    }
  }
  std::fprintf(stderr, "\n%zu training requests, %zu selection requests, cost model %s\n", train.size(),
               selection.size(), cost->name().c_str());
  auto sel_static = lede::trainer::BestStatic(selection, 8, *cost);
  if (!sel_static.ok()) return Fail(sel_static.status());
  std::fprintf(stderr, "best static on the selection requests (for reference): E=%d D=%d %.4fx\n",
               sel_static->exit_layer, sel_static->draft_len, sel_static->speedup);
  auto result = lede::trainer::TrainDinkelbach(
      train, selection, *cost, o, [&o](const lede::trainer::DinkelbachIteration& it) { PrintIteration(o, it); });
  if (!result.ok()) return Fail(result.status());

  const lede::policy::dqn::Artifact artifact =
      MakePolicyArtifact(fl, o, *cost, *result, train.size() + selection.size());
  if (Status s = lede::policy::dqn::SaveArtifact(fl.out, artifact, fl.overwrite); !s.ok()) return Fail(s);

  const nlohmann::json report = TrainingReport(*cost, *result, *sel_static, train.size(), selection.size());
  std::ofstream(fl.out + "/training_report.json") << report.dump(2) << "\n";
  const lede::trainer::DinkelbachIteration& sel = result->iterations[result->selected_iteration - 1];
  std::printf("wrote %s (selected iteration %d: rho %.4f, selection %.4fx; best static on training %s %.4fx; "
              "pi_0 %s %.4fx)\n",
              fl.out.c_str(), result->selected_iteration, sel.rho, sel.selection_speedup, result->best_static.c_str(),
              result->best_static_train_speedup, result->initial_policy.c_str(), result->initial_train_speedup);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags fl;
  lede::flags::FlagSet f;
  lede::flags::AddModelLoadFlags(&f, &fl, lede::flags::kModelPath);
  f.Add("prompts", &fl.prompts, "prompt sets (.jsonl or corpus); their tuning split (first half) trains", true);
  f.Add("prompts-per-set", &fl.per_set, "prompts read per set (as lede-bench bench: half tuning, half evaluation)");
  f.Add("extra-prompts", &fl.extra_prompts, "more training prompts (all of them train; never evaluation data)");
  f.Add("extra-count", &fl.extra_count, "prompts taken from each --extra-prompts file");
  f.Add("exclude-prompts", &fl.exclude_prompts, "prompt sets whose prompts (all of them) no extra prompt may begin like");
  f.Add("prompt-tokens", &fl.prompt_tokens, "tokens of a corpus document used as its prompt");
  f.Add("max-prompt-tokens", &fl.max_prompt_tokens, "longer prompts are cut");
  f.Add("new-tokens", &fl.new_tokens, "tokens generated per training request");
  f.Add("reward", &fl.reward, "throughput (tokens - rho * cost, Dinkelbach) or paper (docs/design.md §2)");
  f.Add("cost-model", &fl.cost_model, "accelerator or measured (rewards and selection)");
  f.Add("calibration", &fl.calibration, "measured cost model JSON (default MODEL/calibration-cpu.json)");
  f.Add("candidate-layers", &fl.candidates, "phase-1 candidate exit layers");
  f.Add("max-draft-len", &fl.max_draft, "D_max");
  f.Add("probe-candidates", &fl.probe_candidates,
        "phase 1 probes each candidate layer (false: exit layer from the history, a head only at l*)");
  f.Add("lookahead-probe", &fl.lookahead_probe,
        "phase 2 decides on the next token's probe (false: on the token just drafted; stopping is free)");
  f.Add("iterations", &fl.iterations, "Dinkelbach iterations at most");
  f.Add("rollout", &fl.rollout, "Q targets from exact rollouts of the current policy (false: n-step TD)");
  f.Add("epsilon", &fl.epsilon, "ε of the exploring behaviours in the replays");
  f.Add("conservative-margin", &fl.conservative_margin,
        "rollout targets prefer the current policy's action by this many tokens per round (0: plain greedy)");
  f.Add("initial-policy", &fl.initial_policy,
        "pi_0 of the policy iteration: static (best static setting) or calibrated (the calibrated stopping rule "
        "tuned on the training requests; an iterate is adopted only if it beats it)");
  f.Add("warm-start", &fl.warm_start,
        "a policy artifact to start from: pi_0 wherever it beats the static choice on the training requests, "
        "and the Q-network's first weights (same candidate layers, D_max and --hidden)");
  f.Add("selection-fraction", &fl.selection_fraction, "share of requests that select the iterate");
  f.Add("loads", &fl.loads,
        "train at these loads (sessions decoding at once, comma-separated; the policy sees the load), each priced "
        "by the cost model at that load; default: alone");
  f.Add("cost-profiles", &fl.cost_profiles,
        "train one cost-conditioned policy across these cost profiles (comma-separated: accelerator, "
        "calibration:PATH of `lede calibrate`, or PROBE:LAYER:VERIFY in autoregressive steps; the policy sees "
        "the profile's features, docs/training.md); default: one cost model, --cost-model");
  lede::flags::AddSamplingFlags(&f, &fl.sampling);  // sampled training requests: docs/training.md "Sampled traffic"
  f.Add("also-greedy", &fl.also_greedy,
        "with --temperature > 0: each prompt's greedy trace too, beside its sampled ones (one policy for both; "
        "the temperature is in its state)");
  f.Add("max-profile-slowdown", &fl.max_profile_slowdown,
        "with --loads or --cost-profiles: adopt an iterate only if no load or profile runs slower than (1 - this) "
        "times the current policy there, in [0, 1)");
  f.Add("rho-per-sampling", &fl.rho_per_sampling,
        "with --also-greedy: the greedy and the sampled requests of each load or profile are groups of their own, "
        "each with its own rho and pi_0, and no group may slow down (--max-profile-slowdown)");
  f.Add("ridge-tokens", &fl.ridge_tokens, "--loads with the accelerator cost model: its roofline ridge in tokens");

  f.Add("trace-model", &fl.trace_model,
        "compute the shadow traces with this model, the source of `lede widen` --model (the same function: "
        "checked), at its speed; the cost model, fingerprint and policy stay --model's");

  lede::trainer::AddDqnFlags(f, &fl.dqn, lede::trainer::DqnFlagScope::kCore);
  lede::flags::AddModelLoadFlags(&f, &fl, lede::flags::kWeights);
  f.Add("out", &fl.out, "artifact directory to write", true);
  f.Add("version", &fl.version, "policy version", true);
  f.Add("overwrite", &fl.overwrite, "replace an existing artifact");
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (lede::flags::WantsHelp(args)) {
    std::printf("usage: lede-train-counterfactual --model DIR --prompts F[,F] --out DIR --version V [flags]\nflags:\n%s",
                f.Usage().c_str());
    return 0;
  }
  if (Status s = f.Parse(args); !s.ok()) {
    std::fprintf(stderr, "lede-train-counterfactual: %s (see --help)\n", std::string(s.message()).c_str());
    return 2;
  }
  if (Status s = lede::flags::CheckSamplingFlags(fl.sampling); !s.ok()) return Fail(s);
  if (fl.also_greedy && !fl.sampling.sampled()) {
    return Fail(lede::InvalidArgumentError("--also-greedy: needs --temperature > 0 (a greedy run traces greedily)"));
  }
  return Run(fl);
}
