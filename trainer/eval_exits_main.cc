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

int Fail(const lede::Status& s, int code) {
  std::fprintf(stderr, "lede-eval-exits: %s\n", std::string(s.message()).c_str());
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace lede;
  std::string data, out_path, calibration_path, draft_lens_flag = "1,2,3,4,6,8", exits_flag;
  int64_t n_prompts = 24, prompt_tokens = 24, new_tokens = 64, eval_tokens = 32768;
  flags::ModelLoadFlags load;
  const std::string& model_path = load.model;
  flags::FlagSet f;
  flags::AddModelLoadFlags(&f, &load, flags::kModelPath);
  f.Add("data", &data, "held-out corpus files, comma-separated (domain = file name)", true);
  f.Add("out", &out_path, "write the JSON report here");
  f.Add("calibration", &calibration_path, "measured cost model JSON (default: calibrate now)");
  f.Add("exit-layers", &exits_flag, "grid exit layers, comma-separated (default: 1..L/2)");
  f.Add("draft-lens", &draft_lens_flag, "grid draft lengths, comma-separated");
  f.Add("prompts", &n_prompts, "prompts per file for the grid");
  f.Add("prompt-tokens", &prompt_tokens, "tokens of each document used as its prompt");
  f.Add("new-tokens", &new_tokens, "tokens generated per prompt");
  f.Add("eval-tokens", &eval_tokens, "held-out tokens per file for the per-layer table");
  flags::AddModelLoadFlags(&f, &load, flags::kThreads | flags::kWeights);
  if (Status s = f.Parse(std::vector<std::string>(argv + 1, argv + argc)); !s.ok()) {
    std::fprintf(stderr, "lede-eval-exits: %s\nflags:\n%s", std::string(s.message()).c_str(), f.Usage().c_str());
    return 2;
  }
  if (auto threads = model::loaders::ApplyThreadsFlag(load.threads); !threads.ok()) return Fail(threads.status(), 2);
  auto tok_path = tokenizer::FindTokenizerFile(model_path);
  if (!tok_path.ok()) return Fail(tok_path.status(), 2);
  auto tokenizer = tokenizer::LoadTokenizer(*tok_path);
  if (!tokenizer.ok()) return Fail(tokenizer.status(), 2);
  auto model_options = model::loaders::ModelOptionsFromFlags(load);
  if (!model_options.ok()) return Fail(model_options.status(), 2);
  std::shared_ptr<const model::LlamaModel> m = model::loaders::LoadModelOrExit("lede-eval-exits", model_path, *model_options);
  const int64_t L = m->n_layers();

  model::cost::Calibration cal;
  if (!calibration_path.empty()) {
    auto parsed = model::cost::ReadCalibrationFile(calibration_path);
    if (!parsed.ok()) return Fail(parsed.status(), 2);
    cal = *parsed;
  } else {
    auto measured = model::cost::Calibrate(*m, 50);
    if (!measured.ok()) return Fail(measured.status(), 1);
    cal = *measured;
  }
  auto accelerator = model::cost::MakeAcceleratorCostModel(m->config());
  auto measured = model::cost::MakeMeasuredCostModel(cal);

  auto exits_parsed = flags::ParseIntList("exit-layers", exits_flag);
  auto draft_parsed = flags::ParseIntList("draft-lens", draft_lens_flag);
  if (!exits_parsed.ok()) return Fail(exits_parsed.status(), 2);
  if (!draft_parsed.ok() || draft_parsed->empty()) {
    return Fail(draft_parsed.ok() ? InvalidArgumentError("--draft-lens: empty") : draft_parsed.status(), 2);
  }
  std::vector<int64_t> exit_layers(exits_parsed->begin(), exits_parsed->end());
  std::vector<int64_t> draft_lens(draft_parsed->begin(), draft_parsed->end());
  if (exit_layers.empty()) {
    for (int64_t e = 1; e <= std::max<int64_t>(1, L / 2); ++e) exit_layers.push_back(e);
  }

  nlohmann::json report;
  report["model"] = model_path;
  report["n_layers"] = L;
  report["head_layer_equivalents"] = model::cost::HeadLayerEquivalents(m->config());
  report["calibration"] = nlohmann::json::parse(model::cost::CalibrationToJson(cal));
  for (const std::string& file : flags::SplitList(data)) {
    const std::string domain = std::filesystem::path(file).stem().stem().string();
    auto docs = trainer::ReadDocuments(file);
    if (!docs.ok()) return Fail(docs.status(), 2);
    auto stream = trainer::EncodeDocuments(**tokenizer, *docs);
    if (!stream.ok()) return Fail(stream.status(), 2);
    auto evaluated = trainer::EvaluateLayers(*m, *stream, 256, eval_tokens);
    if (!evaluated.ok()) return Fail(evaluated.status(), 1);
    const nlohmann::json& layers = *evaluated;
    std::printf("\n== %s: %lld held-out tokens\nlayer  perplexity  top1-agreement-with-L\n", domain.c_str(),
                static_cast<long long>(layers["tokens"].get<int64_t>()));
    for (int64_t l = 0; l < L; ++l) {
      std::printf("%5lld  %10.2f  %8.3f\n", static_cast<long long>(l + 1), layers["perplexity"][l].get<double>(),
                  layers["top1_agreement_with_last"][l].get<double>());
    }
    std::vector<std::vector<int32_t>> prompts;
    for (const std::string& doc : *docs) {
      if (static_cast<int64_t>(prompts.size()) >= n_prompts) break;
      auto ids = (*tokenizer)->Encode(doc, true, false);
      if (!ids.ok() || static_cast<int64_t>(ids->size()) < prompt_tokens + 1) continue;
      prompts.emplace_back(ids->begin(), ids->begin() + prompt_tokens);
    }
    auto grid = trainer::EvaluateStaticGrid(m, prompts, exit_layers, draft_lens, new_tokens, *accelerator, *measured);
    if (!grid.ok()) return Fail(grid.status(), 1);
    std::printf("static self-speculation on %zu prompts x %lld tokens (AR %.0f tokens/s)\n", prompts.size(),
                static_cast<long long>(new_tokens), (*grid)["ar"]["tokens_per_s"].get<double>());
    std::printf("  E   D  accept  tok/round  tok/s  measured  pred.accel  pred.measured  exact\n");
    for (const auto& row : (*grid)["static"]) {
      std::printf("%3lld %3lld  %6.3f  %9.2f  %5.0f  %7.2fx  %9.2fx  %12.2fx  %5.2f\n",
                  static_cast<long long>(row["exit_layer"].get<int64_t>()),
                  static_cast<long long>(row["draft_len"].get<int64_t>()), row["acceptance_rate"].get<double>(),
                  row["tokens_per_round"].get<double>(), row["tokens_per_s"].get<double>(),
                  row["measured_speedup"].get<double>(), row["predicted_speedup_accelerator"].get<double>(),
                  row["predicted_speedup_measured"].get<double>(), row["exact_match_rate"].get<double>());
    }
    report["domains"][domain] = {{"layers", layers}, {"static_grid", *grid}};
  }
  if (!out_path.empty()) {
    std::ofstream(out_path) << report.dump(2) << "\n";
    std::fprintf(stderr, "wrote %s\n", out_path.c_str());
  }
  return 0;
}
