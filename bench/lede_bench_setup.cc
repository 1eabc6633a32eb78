// The shared parts of `lede-bench bench` and `lede-bench collect`
// (internal/lede_bench_setup.h): loading, rewards, progress, provenance.
#include "bench/internal/lede_bench_setup.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "policy/dqn/dqn_exit_controller.h"
#include "shared/model/loaders/model_load_flags.h"
#include "shared/status/status_macros.h"
#include "shared/tokenizer/model_files.h"

namespace lede::bench::internal {

using flags::SplitList;
using trainer::LoadPromptSet;

StatusOr<Common> Setup(const CommonFlags& cf) {
  LEDE_RETURN_IF_ERROR(model::loaders::ApplyThreadsFlag(cf.threads).status());
  Common c;
  LEDE_ASSIGN_OR_RETURN(std::string tok_path, tokenizer::FindTokenizerFile(cf.model));
  LEDE_ASSIGN_OR_RETURN(c.tokenizer, tokenizer::LoadTokenizer(tok_path));
  LEDE_ASSIGN_OR_RETURN(model::ModelOptions model_options, model::loaders::ModelOptionsFromFlags(cf));
  LEDE_ASSIGN_OR_RETURN(auto loaded, model::LlamaModel::Load(cf.model, model_options));
  c.model = std::move(loaded);
  model::KvCacheOptions ko;
  ko.max_draft_len = std::max<int64_t>(16, cf.max_draft);
  LEDE_ASSIGN_OR_RETURN(c.engine, model::Engine::Create(c.model, ko));
  model::cost::Calibration cal;
  if (!cf.calibration.empty()) {
    LEDE_ASSIGN_OR_RETURN(cal, model::cost::ReadCalibrationFile(cf.calibration));
  } else {
    auto network = std::make_shared<policy::dqn::QNetwork>(policy::dqn::QNetwork::Random(policy::dqn::kDefaultHidden, 1));
    LEDE_ASSIGN_OR_RETURN(cal, model::cost::Calibrate(*c.model, 30, [network] {
      float features[speculation::kExitFeatureDim] = {0.5f};
      float q[policy::dqn::kNumActions];
      network->Forward(features, q);
    }));
  }
  c.accelerator = model::cost::MakeAcceleratorCostModel(c.model->config());
  c.measured = model::cost::MakeMeasuredCostModel(cal);
  c.calibration = cal;
  LEDE_ASSIGN_OR_RETURN(c.spec.candidate_layers, flags::ParseIntList("candidate-layers", cf.candidates));
  c.spec.max_draft_len = static_cast<int32_t>(cf.max_draft);
  for (const std::string& path : SplitList(cf.prompts)) {
    LEDE_ASSIGN_OR_RETURN(PromptSet set, LoadPromptSet(path, *c.tokenizer, cf.per_set, cf.prompt_tokens,
                                                       cf.max_prompt_tokens));
    c.sets.push_back(std::move(set));
  }
  return c;
}

// The rewards of shared/experience/transition.h under a cost model: "paper" (docs/design.md
// §2; with the measured model its depth term assumes a typical round of 3
// drafts and 4 tokens) or "throughput" (tokens minus cost).
experience::RewardSpec RewardsFor(const std::string& reward, const model::cost::CostModel& cm, const Common& c) {
  const int32_t L = static_cast<int32_t>(c.model->n_layers());
  std::vector<double> draft_cost;
  for (int32_t l = 0; l <= L; ++l) draft_cost.push_back(l == 0 ? 0.0 : cm.ControlledDraftToken(l));
  if (reward == "throughput") {
    std::vector<std::vector<double>> verify(L + 1);
    for (int32_t e = 0; e <= L; ++e) {
      for (int32_t k = 0; k <= c.spec.max_draft_len; ++k) verify[e].push_back(e == 0 ? 0.0 : cm.Verify(e, k));
    }
    return experience::RewardSpec::Throughput(cm.name(), draft_cost, verify, cm.ControlledProbe(), cm.Decision());
  }
  if (cm.name() == "accelerator") return experience::RewardSpec::Paper(L);
  return experience::RewardSpec::FromCosts(cm.name(), draft_cost, cm.Verify(L / 4 + 1, 3), 4.0, cm.Probe());
}

void PrintProgress(std::ostream& err, const std::string& what, size_t done, size_t total) {
  const int width = 20, filled = total ? static_cast<int>(width * done / total) : width;
  err << "\r[" << std::string(filled, '#') << std::string(width - filled, '.') << "] " << done << "/" << total
      << " " << what << "            " << std::flush;
}

std::string CommandOutput(const char* command) {
  std::string text;
  if (FILE* p = ::popen(command, "r")) {
    char buf[256];
    while (std::fgets(buf, sizeof(buf), p) != nullptr) text += buf;
    ::pclose(p);
  }
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

nlohmann::json Provenance(const std::string& subcommand, const std::vector<std::string>& args) {
  std::string command = "lede-bench " + subcommand;
  for (const std::string& a : args) command += " " + a;
  std::string cpu_model;
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; cpu_model.empty() && std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      cpu_model = line.substr(line.find(':') + 2);
    }
  }
  return {{"command", command},
          {"commit", CommandOutput("git rev-parse HEAD 2>/dev/null")},
          {"work_tree_changed", !CommandOutput("git status --porcelain --untracked-files=no 2>/dev/null").empty()},
          {"date", CommandOutput("date -u +%Y-%m-%dT%H:%M:%SZ")},
          {"machine",
           {{"host", CommandOutput("hostname 2>/dev/null")},
            {"cpus", CommandOutput("nproc 2>/dev/null")},
            {"cpu_model", cpu_model},
            {"load_average_at_end", CommandOutput("cut -d' ' -f1-3 /proc/loadavg 2>/dev/null")},
            {"torch_threads", at::get_num_threads()}}}};
}

}  // namespace lede::bench::internal
