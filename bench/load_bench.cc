// `lede-bench load`: what decoding methods are worth at a load (the
// policy sees the load, docs/design.md §2). Every method is replayed once per prompt
// (exact replays of the greedy trajectories, trainer/counterfactual.h) and
// its rounds are priced by the cost models at each load
// (shared/model/cost/cost_model.h MakeAcceleratorCostModelAtLoad,
// MakeMeasuredCostModelAtLoad): B sessions decoding at once, every
// server step batching the same work of all B. Speed-ups are against
// autoregressive decoding of the same B sessions, batched.
//
// Cost models: accelerator (roofline, --ridge-tokens) and measured (this
// machine's engine, the calibration's batch tables; the engine only, no
// serving overhead).
// Rows per prompt set, cost model and load B (evaluation split):
//   static tuned at B   the best (E, D) over every exit layer 1..L-1 and draft
//                       length 1..--max-draft-len on the tuning split, priced at B
//   static tuned alone  the best (E, D) at B = 1 (what a load-blind server runs)
//   LEDE <version>      each --policy, replayed at B (the policy sees the load;
//                       a policy of lede-features-v3 does not)
//   ... max load C      the same policy under the coordinator's
//                       --speculation-max-load C: autoregressive (1.000x)
//                       at loads above C. C is tuned per cost model on the
//                       tuning split (the policy replayed there at each load):
//                       the printed load that maximizes the summed speed-up
//                       over the printed loads, ties to the larger C; at the
//                       largest load it is no limit ("-").
// Nothing here asserts; it prints numbers and writes --json.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>

#include "bench/lede_bench.h"
#include "policy/dqn/artifact.h"
#include "policy/dqn/method_factory.h"
#include "shared/flags/flags.h"
#include "shared/flags/model_flags.h"
#include "shared/model/loaders/model_load_flags.h"
#include "shared/model/cost/cost_model.h"
#include "shared/model/decoding.h"
#include "shared/model/llama.h"
#include "shared/model/loaders/load_or_exit.h"
#include "shared/status/status_macros.h"
#include "shared/tokenizer/model_files.h"
#include "shared/tokenizer/tokenizer.h"
#include "trainer/corpus.h"
#include "trainer/counterfactual.h"

namespace lede::bench {
namespace {

using Rounds = std::vector<speculation::RoundRecord>;

// --model, --threads (default 1) and --weights: the model-loading group
// (shared/flags/model_flags.h).
struct LoadFlags : flags::ModelLoadFlags {
  LoadFlags() { threads = 1; }
  std::string prompts, calibration, loads = "1,2,4,8,16", policies, json;
  double ridge_tokens = model::cost::kDefaultRidgeTokens;
  int64_t max_draft = 8, per_set = 48, prompt_tokens = 32, max_prompt_tokens = 192, new_tokens = 64;
};

struct StaticRounds {
  int32_t exit_layer, draft_len;
  Rounds tuning, eval;
};

// The best static setting under `cost` on the tuning split.
const StaticRounds& BestOn(const std::vector<StaticRounds>& grid, const model::cost::CostModel& cost) {
  size_t best = 0;
  double best_speedup = -1;
  for (size_t i = 0; i < grid.size(); ++i) {
    const double s = cost.PredictedSpeedup(grid[i].tuning);
    if (s > best_speedup) best = i, best_speedup = s;
  }
  return grid[best];
}

std::string Setting(const StaticRounds& s) {
  return "E=" + std::to_string(s.exit_layer) + " D=" + std::to_string(s.draft_len);
}

// Every static setting (E in [1, L), D in [1, max_draft]) replayed on the
// tuning and the evaluation traces.
StatusOr<std::vector<StaticRounds>> StaticGrid(const std::vector<trainer::ShadowTrace>& tuning,
                                               const std::vector<trainer::ShadowTrace>& eval, int32_t L,
                                               int64_t max_draft) {
  std::vector<StaticRounds> grid;
  for (int32_t e = 1; e < L; ++e) {
    for (int32_t d = 1; d <= max_draft; ++d) {
      trainer::SimulatedMethod s;
      s.mode = speculation::SpeculationMode::kStatic;
      s.exit_layer = e;
      s.draft_len = d;
      StaticRounds r{e, d, {}, {}};
      LEDE_ASSIGN_OR_RETURN(r.tuning, trainer::SimulatedRounds(tuning, s));
      LEDE_ASSIGN_OR_RETURN(r.eval, trainer::SimulatedRounds(eval, s));
      grid.push_back(std::move(r));
    }
  }
  return grid;
}

// The greedy traces of a prompt set's two splits.
struct SetTraces {
  std::vector<trainer::ShadowTrace> tuning, eval;
};

StatusOr<SetTraces> TraceSet(const LoadFlags& lf, model::Engine& engine, const trainer::PromptSet& set) {
  SetTraces traces;
  for (auto [prompts, out] : {std::pair{&set.tuning, &traces.tuning}, std::pair{&set.eval, &traces.eval}}) {
    for (size_t i = 0; i < prompts->size(); ++i) {
      LEDE_ASSIGN_OR_RETURN(trainer::ShadowTrace t, trainer::TraceGreedyRequest(engine, (*prompts)[i], lf.new_tokens,
                                                                              /*top_k=*/4, set.name + ":" +
                                                                                               std::to_string(i)));
      out->push_back(std::move(t));
    }
  }
  return traces;
}

// A policy's rounds on both splits at every load.
struct PolicyRounds {
  std::string version;
  std::map<int64_t, Rounds> eval, tuning;  // by load
};

// Each policy replayed at every load (it sees the load as a feature; a
// load-blind artifact of lede-features-v3 ignores it).
StatusOr<std::vector<PolicyRounds>> ReplayPolicies(const std::vector<policy::dqn::Artifact>& artifacts, int32_t L,
                                                   const std::vector<int64_t>& loads, const SetTraces& traces) {
  std::vector<PolicyRounds> policies;
  for (const policy::dqn::Artifact& a : artifacts) {
    LEDE_ASSIGN_OR_RETURN(policy::dqn::MethodPlan plan,
                          policy::dqn::PlanTrainedPolicy(std::make_shared<const policy::dqn::Artifact>(a), L));
    trainer::SimulatedMethod s;
    s.mode = speculation::SpeculationMode::kAdaptive;
    s.spec = plan.decision_spec;
    PolicyRounds p{a.metadata.version, {}, {}};
    for (int64_t b : loads) {
      for (auto [split, rounds] : {std::pair{&traces.eval, &p.eval}, std::pair{&traces.tuning, &p.tuning}}) {
        std::vector<trainer::ShadowTrace> at_load = *split;
        for (trainer::ShadowTrace& t : at_load) t.load = static_cast<int32_t>(b);
        LEDE_ASSIGN_OR_RETURN((*rounds)[b], trainer::SimulatedRounds(at_load, s, [&plan](int64_t) {
                                return plan.MakeController();
                              }));
      }
    }
    policies.push_back(std::move(p));
  }
  return policies;
}

// The table's title and column heads.
void PrintHeader(const std::string& set_name, size_t n_eval, const std::vector<PolicyRounds>& policies,
                 std::ostream& out) {
  out << "\n" << set_name << " (evaluation split, " << n_eval
      << " prompts): predicted speed-up over autoregressive decoding of the same B sessions\n";
  char line[512];
  std::snprintf(line, sizeof(line), "%-12s %4s  %-20s  %-20s", "cost model", "B", "static tuned at B",
                "static tuned alone");
  out << line;
  for (const PolicyRounds& p : policies) {
    std::snprintf(line, sizeof(line), "  %-22s  %-22s", ("LEDE " + p.version).c_str(), "... max load C");
    out << line;
  }
  out << "\n";
}

// One cost model family at the loads it prices (the measured one: up to the
// largest timed batch size), by load.
using CostsByLoad = std::map<int64_t, std::unique_ptr<model::cost::CostModel>>;

// Each policy's --speculation-max-load C, tuned on the tuning split: the
// load that maximizes the summed speed-up over `family_loads` (1.0 above
// C), ties to the larger C.
std::map<std::string, int64_t> TuneMaxLoads(const std::vector<PolicyRounds>& policies,
                                            const std::vector<int64_t>& family_loads, const CostsByLoad& costs) {
  std::map<std::string, int64_t> max_load;
  for (const PolicyRounds& p : policies) {
    double best = -1;
    for (int64_t c : family_loads) {
      double sum = 0;
      for (int64_t b : family_loads) sum += b <= c ? costs.at(b)->PredictedSpeedup(p.tuning.at(b)) : 1.0;
      if (sum >= best) best = sum, max_load[p.version] = c;
    }
  }
  return max_load;
}

// What one row prices: the static grid, the static setting tuned alone,
// the policies and their tuned max loads.
struct RowInputs {
  const std::vector<StaticRounds>& grid;
  const StaticRounds& at_1;
  const std::vector<PolicyRounds>& policies;
  const std::map<std::string, int64_t>& max_load;
  int64_t largest_load;  // a max load this large is no limit ("-")
};

// Prints the row of `family` at load b and returns it as JSON.
nlohmann::json PrintRow(const std::string& family, int64_t b, const model::cost::CostModel& cost, const RowInputs& in,
                        std::ostream& out) {
  const StaticRounds& at_b = BestOn(in.grid, cost);
  const double speedup_b = cost.PredictedSpeedup(at_b.eval), speedup_1 = cost.PredictedSpeedup(in.at_1.eval);
  nlohmann::json row;
  row["cost_model"] = family;
  row["load"] = b;
  row["static_tuned_at_load"] = {{"setting", Setting(at_b)}, {"speedup", speedup_b}};
  row["static_tuned_alone"] = {{"setting", Setting(in.at_1)}, {"speedup", speedup_1}};
  char line[512], tuned_b[64], tuned_1[64];
  std::snprintf(tuned_b, sizeof(tuned_b), "%s %.3fx", Setting(at_b).c_str(), speedup_b);
  std::snprintf(tuned_1, sizeof(tuned_1), "%s %.3fx", Setting(in.at_1).c_str(), speedup_1);
  std::snprintf(line, sizeof(line), "%-12s %4ld  %-20s  %-20s", family.c_str(), static_cast<long>(b), tuned_b,
                tuned_1);
  out << line;
  for (const PolicyRounds& p : in.policies) {
    const double s = cost.PredictedSpeedup(p.eval.at(b));
    const int64_t c = in.max_load.at(p.version);
    const bool no_limit = c == in.largest_load;
    const double capped = b <= c ? s : 1.0;
    row["lede"][p.version] = s;
    row["lede_max_load"][p.version] = {{"max_load", no_limit ? nlohmann::json() : nlohmann::json(c)},
                                       {"speedup", capped}};
    char speed[32], with_cap[48];
    std::snprintf(speed, sizeof(speed), "%.3fx", s);
    std::snprintf(with_cap, sizeof(with_cap), "%.3fx (C=%s)", capped, no_limit ? "-" : std::to_string(c).c_str());
    std::snprintf(line, sizeof(line), "  %-22s  %-22s", speed, with_cap);
    out << line;
  }
  out << "\n";
  return row;
}

// The rows of one cost model family ("accelerator" or "measured"), each
// printed and appended to report["sets"][set_name].
Status PriceFamily(const std::string& family, const LoadFlags& lf, const model::LlamaModel& m,
                   const model::cost::Calibration& cal, const std::vector<int64_t>& loads,
                   const std::vector<StaticRounds>& grid, const std::vector<PolicyRounds>& policies,
                   const std::string& set_name, std::ostream& out, nlohmann::json* report) {
  // The family at load B, and alone (B = 1: what a load-blind server tunes for).
  auto at = [&](int64_t b) -> StatusOr<std::unique_ptr<model::cost::CostModel>> {
    if (family == "accelerator") return model::cost::MakeAcceleratorCostModelAtLoad(m.config(), b, lf.ridge_tokens);
    return model::cost::MakeMeasuredCostModelAtLoad(cal, b);
  };
  LEDE_ASSIGN_OR_RETURN(std::unique_ptr<model::cost::CostModel> alone, at(1));
  const int64_t max_timed = cal.batch_sizes.back();
  std::vector<int64_t> family_loads;
  CostsByLoad costs;
  for (int64_t b : loads) {
    if (family == "measured" && b > max_timed) continue;  // beyond the timed batch sizes
    family_loads.push_back(b);
    LEDE_ASSIGN_OR_RETURN(costs[b], at(b));
  }
  if (family_loads.empty()) return OkStatus();  // every load beyond the timed batch sizes
  const std::map<std::string, int64_t> max_load = TuneMaxLoads(policies, family_loads, costs);
  const RowInputs in{grid, BestOn(grid, *alone), policies, max_load, family_loads.back()};
  for (int64_t b : family_loads) (*report)["sets"][set_name].push_back(PrintRow(family, b, *costs[b], in, out));
  return OkStatus();
}

Status RunSet(const LoadFlags& lf, const model::LlamaModel& m, model::Engine& engine, const trainer::PromptSet& set,
              const model::cost::Calibration& cal, const std::vector<int64_t>& loads,
              const std::vector<policy::dqn::Artifact>& artifacts, std::ostream& out, std::ostream& err,
              nlohmann::json* report) {
  const int32_t L = static_cast<int32_t>(m.n_layers());
  LEDE_ASSIGN_OR_RETURN(const SetTraces traces, TraceSet(lf, engine, set));
  err << "== " << set.name << ": " << traces.tuning.size() << " tuning / " << traces.eval.size()
      << " evaluation prompts traced\n";
  LEDE_ASSIGN_OR_RETURN(const std::vector<StaticRounds> grid, StaticGrid(traces.tuning, traces.eval, L, lf.max_draft));
  LEDE_ASSIGN_OR_RETURN(const std::vector<PolicyRounds> policies, ReplayPolicies(artifacts, L, loads, traces));
  PrintHeader(set.name, traces.eval.size(), policies, out);
  for (const char* family : {"accelerator", "measured"}) {
    LEDE_RETURN_IF_ERROR(PriceFamily(family, lf, m, cal, loads, grid, policies, set.name, out, report));
  }
  return OkStatus();
}

}  // namespace

int RunLoad(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  LoadFlags lf;
  flags::FlagSet f;
  flags::AddModelLoadFlags(&f, &lf, flags::kModelPath);
  f.Add("prompts", &lf.prompts, "prompt sets: .jsonl or <|doc|> corpus files, comma-separated", true);
  f.Add("calibration", &lf.calibration, "measured cost model JSON with batch tables (lede calibrate)", true);
  f.Add("loads", &lf.loads,
        "sessions decoding at once, comma-separated (measured rows: up to the largest timed batch size)");
  f.Add("ridge-tokens", &lf.ridge_tokens, "accelerator roofline: tokens per pass where compute catches up with "
                                          "the weight reads");
  f.Add("policy", &lf.policies, "LEDE policy artifact directories, comma-separated");
  f.Add("max-draft-len", &lf.max_draft, "longest static draft tuned");
  f.Add("prompts-per-set", &lf.per_set, "prompts read per set (half tuning, half evaluation)");
  f.Add("prompt-tokens", &lf.prompt_tokens, "tokens of a corpus document used as its prompt");
  f.Add("max-prompt-tokens", &lf.max_prompt_tokens, "longer prompts are cut");
  f.Add("new-tokens", &lf.new_tokens, "tokens generated per prompt");
  flags::AddModelLoadFlags(&f, &lf, flags::kThreads | flags::kWeights);
  f.Add("json", &lf.json, "write the rows as JSON here");
  if (flags::WantsHelp(args)) {
    out << "usage: lede-bench load --model DIR --prompts FILE[,FILE...] --calibration FILE [flags]\nflags:\n"
        << f.Usage();
    return 0;
  }
  auto fail = [&](const Status& s, int code) {
    err << "lede-bench load: " << s.message() << "\n";
    return code;
  };
  if (Status s = f.Parse(args); !s.ok()) return fail(s, 2);
  auto loads32 = flags::ParseIntList("loads", lf.loads);
  if (!loads32.ok()) return fail(loads32.status(), 2);
  std::vector<int64_t> loads(loads32->begin(), loads32->end());
  if (loads.empty() || *std::min_element(loads.begin(), loads.end()) < 1) {
    return fail(InvalidArgumentError("--loads: want sizes >= 1"), 2);
  }
  if (lf.max_draft < 1 || lf.max_draft > 16) return fail(InvalidArgumentError("--max-draft-len: want 1..16"), 2);
  if (lf.ridge_tokens <= 0) return fail(InvalidArgumentError("--ridge-tokens: want > 0"), 2);
  if (auto threads = model::loaders::ApplyThreadsFlag(lf.threads); !threads.ok()) return fail(threads.status(), 2);
  auto cal = model::cost::ReadCalibrationFile(lf.calibration);
  if (!cal.ok()) return fail(Status(cal.status().code(), "--calibration: " + std::string(cal.status().message())), 2);
  if (auto c = model::cost::MakeMeasuredCostModelAtLoad(*cal, 1); !c.ok()) {
    return fail(Status(c.status().code(), "--calibration: " + std::string(c.status().message())), 2);
  }
  auto tok_path = tokenizer::FindTokenizerFile(lf.model);
  if (!tok_path.ok()) return fail(tok_path.status(), 2);
  auto tok = tokenizer::LoadTokenizer(*tok_path);
  if (!tok.ok()) return fail(tok.status(), 2);
  auto model_options = model::loaders::ModelOptionsFromFlags(lf);
  if (!model_options.ok()) return fail(model_options.status(), 2);
  std::shared_ptr<const model::LlamaModel> m = model::loaders::LoadModelOrExit("lede_bench load", lf.model, *model_options);
  if (cal->model_fingerprint != m->config().ArchitectureFingerprint()) {
    return fail(InvalidArgumentError("--calibration: calibrated for another model"), 2);
  }
  auto engine = model::Engine::Create(m, model::KvCacheOptions{});
  if (!engine.ok()) return fail(engine.status(), 1);
  std::vector<policy::dqn::Artifact> artifacts;
  for (const std::string& dir : flags::SplitList(lf.policies)) {
    auto a = policy::dqn::LoadArtifact(dir, m->config().ArchitectureFingerprint());
    if (!a.ok()) return fail(Status(a.status().code(), "--policy " + dir + ": " + std::string(a.status().message())), 2);
    artifacts.push_back(std::move(*a));
  }
  nlohmann::json report;
  report["model"] = lf.model;
  report["loads"] = loads;
  report["ridge_tokens"] = lf.ridge_tokens;
  report["new_tokens"] = lf.new_tokens;
  for (const std::string& path : flags::SplitList(lf.prompts)) {
    auto set = trainer::LoadPromptSet(path, **tok, lf.per_set, lf.prompt_tokens, lf.max_prompt_tokens);
    if (!set.ok()) return fail(Status(set.status().code(), "--prompts " + path + ": " + std::string(set.status().message())), 2);
    if (Status s = RunSet(lf, *m, **engine, *set, *cal, loads, artifacts, out, err, &report); !s.ok()) {
      return fail(s, s.code() == StatusCode::kInvalidArgument ? 2 : 1);
    }
  }
  if (!lf.json.empty()) {
    std::ofstream(lf.json) << report.dump(2) << "\n";
    err << "wrote " << lf.json << "\n";
  }
  return 0;
}

}  // namespace lede::bench
