// File: bench/internal/lede_bench_setup.h
//
// What `lede-bench bench` and `lede-bench collect` (lede_bench.h) share: the
// flags of the model and the prompt sets, the loaded model with its engine,
// cost models and prompt sets, the rewards of a cost model, the progress
// bar and the provenance of a JSON report. Not API: only bench/ includes it.
#ifndef LEDE_BENCH_INTERNAL_LEDE_BENCH_SETUP_H_
#define LEDE_BENCH_INTERNAL_LEDE_BENCH_SETUP_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "shared/experience/transition.h"
#include "shared/flags/flags.h"
#include "shared/flags/model_flags.h"
#include "shared/model/cost/cost_model.h"
#include "shared/model/decoding.h"
#include "shared/model/llama.h"
#include "shared/speculation/exit_controller.h"
#include "shared/status/status.h"
#include "shared/tokenizer/tokenizer.h"
#include "trainer/corpus.h"

namespace lede::bench::internal {

using trainer::PromptSet;

// The model both subcommands run, loaded once (Setup): its tokenizer, an
// engine, the two cost models (accelerator roofline and this machine's
// measured one), the prompt sets and the decision spec of the flags.
struct Common {
  std::shared_ptr<const model::LlamaModel> model;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  std::unique_ptr<model::Engine> engine;
  std::unique_ptr<model::cost::CostModel> accelerator, measured;
  model::cost::Calibration calibration;  // the measured model's (its features: CostFeaturesOfCalibration)
  std::vector<PromptSet> sets;
  speculation::DecisionSpec spec;
};

// The model-loading group (shared/flags/model_flags.h) gives --model,
// --kernels, --weights and --threads (default 1 here: the recorded tables
// are single-threaded, and one thread's timings are the steadiest).
struct CommonFlags : flags::ModelLoadFlags {
  CommonFlags() { threads = 1; }
  std::string prompts, calibration, candidates = "2,3,4,6";
  int64_t repeats = 3;  // interleaved evaluation passes
  int64_t max_draft = 4, per_set = 48, prompt_tokens = 32, max_prompt_tokens = 192, new_tokens = 64;
  void AddTo(flags::FlagSet& f) {
    flags::AddModelLoadFlags(&f, this, flags::kModelPath | flags::kKernels | flags::kWeights);
    f.Add("prompts", &prompts, "prompt sets: .jsonl or <|doc|> corpus files, comma-separated", true);
    f.Add("calibration", &calibration, "measured cost model JSON (default: calibrate now)");
    f.Add("candidate-layers", &candidates, "phase-1 candidate exit layers");
    f.Add("max-draft-len", &max_draft, "D_max");
    f.Add("prompts-per-set", &per_set, "prompts read per set (half tuning, half evaluation)");
    f.Add("prompt-tokens", &prompt_tokens, "tokens of a corpus document used as its prompt");
    f.Add("max-prompt-tokens", &max_prompt_tokens, "longer prompts are cut");
    f.Add("new-tokens", &new_tokens, "tokens generated per prompt");
    flags::AddModelLoadFlags(&f, this, flags::kThreads);
    f.Add("repeats", &repeats, "interleaved evaluation passes (wall-clock is summed over them)");
  }
};

// Sets --threads, loads the tokenizer, the model and its engine, the
// measured cost model (--calibration, or a calibration run now) and the
// prompt sets. Errors: the failing step's status (kInvalidArgument naming
// the flag for bad flag values).
StatusOr<Common> Setup(const CommonFlags& cf);

// The rewards of shared/experience/transition.h under a cost model: "paper" (docs/design.md
// §2; with the measured model its depth term assumes a typical round of 3
// drafts and 4 tokens) or "throughput" (tokens minus cost).
experience::RewardSpec RewardsFor(const std::string& reward, const model::cost::CostModel& cm, const Common& c);

// Redraws a progress bar on `err`: "[####....] done/total what".
void PrintProgress(std::ostream& err, const std::string& what, size_t done, size_t total);

// A shell command's output, trailing newlines and spaces dropped (empty when
// it cannot run).
std::string CommandOutput(const char* command);

// Where and how a result was measured, for the JSON reports: the command
// line, the commit (and whether the work tree had changes), the UTC date and
// the machine (host name, CPUs, CPU model, load average when the report is
// written: other processes' load makes wall-clock noisy, libtorch threads).
// RunBench sets "date" to the start of the run.
nlohmann::json Provenance(const std::string& subcommand, const std::vector<std::string>& args);

}  // namespace lede::bench::internal

#endif  // LEDE_BENCH_INTERNAL_LEDE_BENCH_SETUP_H_
