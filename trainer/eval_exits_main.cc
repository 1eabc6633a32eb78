// lede-eval-exits: how good are a model's early exits?
//
// For each held-out corpus file (--data, comma-separated; documents split by
// <|doc|> lines): per-layer perplexity and top-1 agreement with the last
// layer, and a static self-speculation grid (E x D) on prompts cut from the
// file's documents. Prints tables and writes everything as JSON (--out).
#include <ATen/Parallel.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "shared/flags/flags.h"
#include "shared/flags/model_flags.h"
#include "shared/model/cost/cost_model.h"
#include "shared/model/llama.h"
#include "shared/model/loaders/load_or_exit.h"
#include "shared/model/loaders/model_load_flags.h"
#include "shared/tokenizer/model_files.h"
#include "shared/tokenizer/tokenizer.h"
#include "trainer/corpus.h"
#include "trainer/exit_eval.h"

namespace {

using namespace lede;

int Fail(const Status& s, int code) {
  std::fprintf(stderr, "lede-eval-exits: %s\n", std::string(s.message()).c_str());
  return code;
}

struct EvalFlags {
  std::string data, out_path, calibration_path, draft_lens_flag = "1,2,3,4,6,8", exits_flag;
  int64_t n_prompts = 24, prompt_tokens = 24, new_tokens = 64, eval_tokens = 32768;
  flags::ModelLoadFlags load;
};

// Parses argv into *out; on a bad flag prints it with the usage and returns
// false.
bool ParseEvalFlags(int argc, char** argv, EvalFlags* out) {
  EvalFlags& e = *out;
  flags::FlagSet f;
  flags::AddModelLoadFlags(&f, &e.load, flags::kModelPath);
  f.Add("data", &e.data, "held-out corpus files, comma-separated (domain = file name)", true);
  f.Add("out", &e.out_path, "write the JSON report here");
  f.Add("calibration", &e.calibration_path, "measured cost model JSON (default: calibrate now)");
  f.Add("exit-layers", &e.exits_flag, "grid exit layers, comma-separated (default: 1..L/2)");
  f.Add("draft-lens", &e.draft_lens_flag, "grid draft lengths, comma-separated");
  f.Add("prompts", &e.n_prompts, "prompts per file for the grid");
  f.Add("prompt-tokens", &e.prompt_tokens, "tokens of each document used as its prompt");
  f.Add("new-tokens", &e.new_tokens, "tokens generated per prompt");
  f.Add("eval-tokens", &e.eval_tokens, "held-out tokens per file for the per-layer table");
  flags::AddModelLoadFlags(&f, &e.load, flags::kThreads | flags::kWeights);
  if (Status s = f.Parse(std::vector<std::string>(argv + 1, argv + argc)); !s.ok()) {
    std::fprintf(stderr, "lede-eval-exits: %s\nflags:\n%s", std::string(s.message()).c_str(), f.Usage().c_str());
    return false;
  }
  return true;
}

// The grid's axes: --exit-layers (default 1 .. L/2) and --draft-lens (not
// empty). Errors: kInvalidArgument naming the flag.
struct GridAxes {
  std::vector<int64_t> exit_layers, draft_lens;
};
StatusOr<GridAxes> ParseGridAxes(const EvalFlags& e, int64_t n_layers) {
  auto exits_parsed = flags::ParseIntList("exit-layers", e.exits_flag);
  auto draft_parsed = flags::ParseIntList("draft-lens", e.draft_lens_flag);
  if (!exits_parsed.ok()) return exits_parsed.status();
  if (!draft_parsed.ok() || draft_parsed->empty()) {
    return draft_parsed.ok() ? InvalidArgumentError("--draft-lens: empty") : draft_parsed.status();
  }
  GridAxes axes{std::vector<int64_t>(exits_parsed->begin(), exits_parsed->end()),
                std::vector<int64_t>(draft_parsed->begin(), draft_parsed->end())};
  if (axes.exit_layers.empty()) {
    for (int64_t e = 1; e <= std::max<int64_t>(1, n_layers / 2); ++e) axes.exit_layers.push_back(e);
  }
  return axes;
}

// Per-layer perplexity and top-1 agreement with the last layer (the JSON of
// trainer::EvaluateLayers).
void PrintLayerTable(const std::string& domain, const nlohmann::json& layers, int64_t n_layers) {
  std::printf("\n== %s: %lld held-out tokens\nlayer  perplexity  top1-agreement-with-L\n", domain.c_str(),
              static_cast<long long>(layers["tokens"].get<int64_t>()));
  for (int64_t l = 0; l < n_layers; ++l) {
    std::printf("%5lld  %10.2f  %8.3f\n", static_cast<long long>(l + 1), layers["perplexity"][l].get<double>(),
                layers["top1_agreement_with_last"][l].get<double>());
  }
}

// The first prompt_tokens tokens of each document long enough to continue,
// at most n_prompts of them.
std::vector<std::vector<int32_t>> CutPrompts(const tokenizer::Tokenizer& tokenizer,
                                             const std::vector<std::string>& docs, const EvalFlags& e) {
  std::vector<std::vector<int32_t>> prompts;
  for (const std::string& doc : docs) {
    if (static_cast<int64_t>(prompts.size()) >= e.n_prompts) break;
    auto ids = tokenizer.Encode(doc, true, false);
    if (!ids.ok() || static_cast<int64_t>(ids->size()) < e.prompt_tokens + 1) continue;
    prompts.emplace_back(ids->begin(), ids->begin() + e.prompt_tokens);
  }
  return prompts;
}

// The static self-speculation grid (the JSON of trainer::EvaluateStaticGrid).
void PrintStaticGrid(const nlohmann::json& grid, size_t n_prompts, int64_t new_tokens) {
  std::printf("static self-speculation on %zu prompts x %lld tokens (AR %.0f tokens/s)\n", n_prompts,
              static_cast<long long>(new_tokens), grid["ar"]["tokens_per_s"].get<double>());
  std::printf("  E   D  accept  tok/round  tok/s  measured  pred.accel  pred.measured  exact\n");
  for (const auto& row : grid["static"]) {
    std::printf("%3lld %3lld  %6.3f  %9.2f  %5.0f  %7.2fx  %9.2fx  %12.2fx  %5.2f\n",
                static_cast<long long>(row["exit_layer"].get<int64_t>()),
                static_cast<long long>(row["draft_len"].get<int64_t>()), row["acceptance_rate"].get<double>(),
                row["tokens_per_round"].get<double>(), row["tokens_per_s"].get<double>(),
                row["measured_speedup"].get<double>(), row["predicted_speedup_accelerator"].get<double>(),
                row["predicted_speedup_measured"].get<double>(), row["exact_match_rate"].get<double>());
  }
}

}  // namespace

int main(int argc, char** argv) {
  EvalFlags e;
  if (!ParseEvalFlags(argc, argv, &e)) return 2;
  const std::string& model_path = e.load.model;
  if (auto threads = model::loaders::ApplyThreadsFlag(e.load.threads); !threads.ok()) return Fail(threads.status(), 2);
  auto tok_path = tokenizer::FindTokenizerFile(model_path);
  if (!tok_path.ok()) return Fail(tok_path.status(), 2);
  auto tokenizer = tokenizer::LoadTokenizer(*tok_path);
  if (!tokenizer.ok()) return Fail(tokenizer.status(), 2);
  auto model_options = model::loaders::ModelOptionsFromFlags(e.load);
  if (!model_options.ok()) return Fail(model_options.status(), 2);
  std::shared_ptr<const model::LlamaModel> m = model::loaders::LoadModelOrExit("lede-eval-exits", model_path, *model_options);
  const int64_t L = m->n_layers();

  model::cost::Calibration cal;
  if (!e.calibration_path.empty()) {
    auto parsed = model::cost::ReadCalibrationFile(e.calibration_path);
    if (!parsed.ok()) return Fail(parsed.status(), 2);
    cal = *parsed;
  } else {
    auto measured = model::cost::Calibrate(*m, 50);
    if (!measured.ok()) return Fail(measured.status(), 1);
    cal = *measured;
  }
  auto accelerator = model::cost::MakeAcceleratorCostModel(m->config());
  auto measured = model::cost::MakeMeasuredCostModel(cal);
  auto axes = ParseGridAxes(e, L);
  if (!axes.ok()) return Fail(axes.status(), 2);

  nlohmann::json report;
  report["model"] = model_path;
  report["n_layers"] = L;
  report["head_layer_equivalents"] = model::cost::HeadLayerEquivalents(m->config());
  report["calibration"] = nlohmann::json::parse(model::cost::CalibrationToJson(cal));
  for (const std::string& file : flags::SplitList(e.data)) {
    const std::string domain = std::filesystem::path(file).stem().stem().string();
    auto docs = trainer::ReadDocuments(file);
    if (!docs.ok()) return Fail(docs.status(), 2);
    auto stream = trainer::EncodeDocuments(**tokenizer, *docs);
    if (!stream.ok()) return Fail(stream.status(), 2);
    auto layers = trainer::EvaluateLayers(*m, *stream, 256, e.eval_tokens);
    if (!layers.ok()) return Fail(layers.status(), 1);
    PrintLayerTable(domain, *layers, L);
    const std::vector<std::vector<int32_t>> prompts = CutPrompts(**tokenizer, *docs, e);
    auto grid = trainer::EvaluateStaticGrid(m, prompts, axes->exit_layers, axes->draft_lens, e.new_tokens,
                                            *accelerator, *measured);
    if (!grid.ok()) return Fail(grid.status(), 1);
    PrintStaticGrid(*grid, prompts.size(), e.new_tokens);
    report["domains"][domain] = {{"layers", *layers}, {"static_grid", *grid}};
  }
  if (!e.out_path.empty()) {
    std::ofstream(e.out_path) << report.dump(2) << "\n";
    std::fprintf(stderr, "wrote %s\n", e.out_path.c_str());
  }
  return 0;
}
