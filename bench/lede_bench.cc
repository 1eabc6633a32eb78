#include "bench/lede_bench.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "bench/internal/lede_bench_setup.h"
#include "bench/internal/set_bench.h"
#include "policy/controllers.h"
#include "policy/dqn/artifact.h"
#include "shared/experience/experience.h"
#include "shared/experience/transition.h"
#include "shared/flags/flags.h"
#include "shared/status/status.h"

namespace lede::bench {

using flags::SplitList;
using internal::BenchSampling;
using internal::CommandOutput;
using internal::Common;
using internal::CommonFlags;
using internal::PrintProgress;
using internal::PromptSet;
using internal::Provenance;
using internal::RewardsFor;
using internal::SetBench;
using internal::Setup;
using model::GenerateOptions;

namespace {

// --policy-costs: one or more of SetBench::kPolicyCosts, none repeated.
StatusOr<std::vector<std::string>> ParsePolicyCosts(const std::string& flag) {
  const std::vector<std::string> costs = SplitList(flag);
  for (size_t i = 0; i < costs.size(); ++i) {
    const std::string& p = costs[i];
    if (std::find(std::begin(SetBench::kPolicyCosts), std::end(SetBench::kPolicyCosts), p) ==
            std::end(SetBench::kPolicyCosts) ||
        std::find(costs.begin(), costs.begin() + i, p) != costs.begin() + i) {
      return InvalidArgumentError("--policy-costs: \"" + p + "\" is not served or calibration, or is repeated");
    }
  }
  if (costs.empty()) return InvalidArgumentError("--policy-costs: want served, calibration or both");
  return costs;
}

}  // namespace

int RunBench(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  CommonFlags cf;
  std::string methods_flag = "ar,static,threshold,calibrated,del,adaedl,lede", policies, json_path;
  flags::FlagSet f;
  cf.AddTo(f);
  f.Add("methods", &methods_flag, "comma-separated: ar, static, threshold, calibrated, del, adaedl, lede");
  f.Add("policy", &policies, "LEDE policy artifact directories, comma-separated");
  f.Add("json", &json_path, "write all results as JSON here");
  std::string fixed_static;
  f.Add("static-configs", &fixed_static,
        "extra static rows E:D[,E:D...], not tuned (e.g. the settings tuned on another prompt set)");
  std::string policy_costs_flag = "served";
  f.Add("policy-costs", &policy_costs_flag,
        "what the LEDE policies see of the hardware, comma-separated: served (the step costs this run meters of "
        "itself, as a model service shows them; the calibration's until measured), calibration (the "
        "calibration's); the first gives each policy's rows, the others one more row per policy");
  std::string rounds_path;
  f.Add("rounds-out", &rounds_path,
        "write every timed round of the evaluation here, a JSON object per line (set, method, pass, run and the "
        "round's exit layer, drafts, acceptance and step seconds), for fits of cost models");
  BenchSampling sampling;
  flags::AddSamplingFlags(&f, &sampling);
  if (flags::WantsHelp(args)) {
    out << "usage: lede-bench bench --model DIR --prompts FILE[,FILE...] [flags]\nflags:\n" << f.Usage();
    return 0;
  }
  if (Status s = f.Parse(args); !s.ok()) {
    err << "lede-bench bench: " << s.message() << " (see lede-bench bench --help)\n";
    return 2;
  }
  if (Status s = flags::CheckSamplingFlags(sampling); !s.ok()) {
    err << "lede-bench bench: " << s.message() << "\n";
    return 2;
  }
  const StatusOr<std::vector<std::string>> policy_costs = ParsePolicyCosts(policy_costs_flag);
  if (!policy_costs.ok()) {
    err << "lede-bench bench: " << policy_costs.status().message() << "\n";
    return 2;
  }
  std::ofstream rounds_out;
  if (!rounds_path.empty()) {
    rounds_out.open(rounds_path);
    if (!rounds_out) {
      err << "lede-bench bench: --rounds-out: cannot write " << rounds_path << "\n";
      return 2;
    }
  }
  auto common = Setup(cf);
  if (!common.ok()) {
    err << "lede-bench bench: " << common.status().message() << "\n";
    return common.status().code() == StatusCode::kInternal ? 1 : 2;
  }
  Common& c = *common;
  const std::vector<std::string> methods = SplitList(methods_flag);
  std::vector<policy::dqn::Artifact> artifacts;
  for (const std::string& dir : SplitList(policies)) {
    auto a = policy::dqn::LoadArtifact(dir, c.model->config().ArchitectureFingerprint());
    if (!a.ok()) {
      err << "lede-bench bench: --policy " << dir << ": " << a.status().message() << "\n";
      return 2;
    }
    artifacts.push_back(std::move(*a));
  }
  if (std::find(methods.begin(), methods.end(), "lede") != methods.end() && artifacts.empty()) {
    err << "lede-bench bench: method lede needs --policy\n";
    return 2;
  }
  nlohmann::json report;
  report["model"] = cf.model;
  report["candidate_layers"] = c.spec.candidate_layers;
  report["max_draft_len"] = c.spec.max_draft_len;
  report["new_tokens"] = cf.new_tokens;
  report["policy_costs"] = *policy_costs;
  const std::string started = CommandOutput("date -u +%Y-%m-%dT%H:%M:%SZ");
  for (const PromptSet& set : c.sets) {
    SetBench bench(c, cf, set, methods, sampling, *policy_costs, out, err);
    if (rounds_out.is_open()) bench.WriteRoundsTo(&rounds_out);
    StatusOr<nlohmann::json> set_report = bench.Run(artifacts, fixed_static);
    if (!set_report.ok()) {
      err << "lede-bench bench: " << set_report.status().message() << "\n";
      return set_report.status().code() == StatusCode::kInvalidArgument ? 2 : 1;
    }
    report["sets"][set.name] = *set_report;
  }
  report["provenance"] = Provenance("bench", args);
  report["provenance"]["date"] = started;
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
  f.Add("reward", &reward, "paper (docs/design.md §2) or throughput (tokens minus cost)");
  f.Add("epsilon", &epsilon, "probability of a random action");
  f.Add("seeds", &seeds, "runs per tuning prompt (each with another behaviour policy and seed)");
  f.Add("version", &version, "behaviour policy version recorded in the transitions");
  if (flags::WantsHelp(args)) {
    out << "usage: lede-bench collect --model DIR --prompts FILE[,FILE...] --out DIR [flags]\nflags:\n" << f.Usage();
    return 0;
  }
  if (Status s = f.Parse(args); !s.ok()) {
    err << "lede-bench collect: " << s.message() << " (see lede-bench collect --help)\n";
    return 2;
  }
  if (cost_model != "accelerator" && cost_model != "measured") {
    err << "lede-bench collect: --cost-model: want accelerator or measured\n";
    return 2;
  }
  if (reward != "paper" && reward != "throughput") {
    err << "lede-bench collect: --reward: want paper or throughput\n";
    return 2;
  }
  auto common = Setup(cf);
  if (!common.ok()) {
    err << "lede-bench collect: " << common.status().message() << "\n";
    return 2;
  }
  Common& c = *common;
  const experience::RewardSpec rewards =
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
        err << "lede-bench collect: " << writer.status().message() << "\n";
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
          err << "lede-bench collect: " << r.status().message() << "\n";
          return 1;
        }
        const std::string request_id = set.name + ":" + std::to_string(i) + ":" + std::to_string(seed);
        for (const speculation::RoundTrace& trace : r->traces) {
          for (const experience::Transition& t : experience::ToTransitions(trace, rewards, request_id, version, fingerprint)) {
            if (Status s = (*writer)->Append(t); !s.ok()) {
              err << "lede-bench collect: " << s.message() << "\n";
              return 1;
            }
          }
        }
        PrintProgress(err, set.name + " seed " + std::to_string(seed), i + 1, set.tuning.size());
      }
      total += (*writer)->records();
      if (Status s = (*writer)->Finish(); !s.ok()) {
        err << "lede-bench collect: " << s.message() << "\n";
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
