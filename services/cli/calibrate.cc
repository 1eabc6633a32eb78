// `lede calibrate` (commands.h): flags, the prompts of the timed rounds, the
// measured (or --base) calibration, its batch tables, and the JSON with its
// printed summary.
#include "services/cli/commands.h"

#if LEDE_HAVE_POLICY
#include "policy/dqn/dqn_exit_controller.h"
#endif

#include <algorithm>
#include <fstream>
#include <functional>
#include <iomanip>
#include <sstream>

#include <nlohmann/json.hpp>

#include "services/cli/internal/common.h"
#include "shared/file/file.h"
#include "shared/flags/flags.h"
#include "shared/model/cost/cost_model.h"
#include "shared/model/llama.h"
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

// The flags of `lede calibrate`, with their defaults.
struct CalibrateFlags {
  internal::ModelFlags mf;
  std::string out_path, prompts_flag;
  int64_t repeats = 50, round_passes = 5, round_max_draft_len = 8, new_tokens = 64;
  std::string batch_sizes_flag = "1,2,4,8,16", base_path;
  int64_t batch_exit_layer = 0, batch_context = 128;

  void AddTo(FlagSet& flags) {
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
    flags.Add("batch-sizes", &batch_sizes_flag,
              "time batched steps of this many sessions (the cost model at a load; \"\" skips them)");
    flags.Add("batch-exit-layer", &batch_exit_layer,
              "exit layer of the batched verifications and draft steps (0: layer 2, or L - 1 when L <= 2)");
    flags.Add("batch-context", &batch_context, "committed tokens per session in the batched steps");
    flags.Add("base", &base_path,
              "start from this calibration JSON (same model) and time only the batch tables, keeping the rest");
  }
};

// The ranges of the numeric flags. Errors: kInvalidArgument naming the flag.
Status CheckCalibrateFlags(const CalibrateFlags& f) {
  if (f.repeats < 1) return InvalidArgumentError("--repeats: must be >= 1");
  if (f.round_passes < 0) return InvalidArgumentError("--round-passes: must be >= 0");
  if (f.round_max_draft_len < 1 || f.round_max_draft_len > 16) {
    return InvalidArgumentError("--round-max-draft-len: must be in [1, 16]");
  }
  if (f.new_tokens < 2) return InvalidArgumentError("--new-tokens: must be >= 2");
  return OkStatus();
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

// A DQN decision to time where the policy stack is built in; empty otherwise.
std::function<void()> MakeTimedDecision() {
  std::function<void()> decide;
#if LEDE_HAVE_POLICY
  decide = policy::dqn::TimedDecision(policy::dqn::QNetwork::Random(policy::dqn::kDefaultHidden, 1));
#endif
  return decide;
}

// The batch sizes of --batch-sizes (none for ""). Errors: kInvalidArgument
// naming --batch-sizes.
StatusOr<std::vector<int64_t>> ParseBatchSizes(const std::string& flag) {
  std::vector<int64_t> batch_sizes;
  if (flag.empty()) return batch_sizes;
  LEDE_ASSIGN_OR_RETURN(auto parsed, flags::ParseIntList("batch-sizes", flag));
  for (int32_t b : parsed) batch_sizes.push_back(b);
  return batch_sizes;
}

// --base: the calibration to add batch tables to. Errors (all exit 2): its
// read error, prefixed "--base: "; kInvalidArgument naming --base when it
// was calibrated for another model or no batch table is asked for.
StatusOr<model::cost::Calibration> ReadBaseCalibration(const std::string& base_path, const model::LlamaModel& llama,
                                                 bool has_batch_sizes) {
  StatusOr<model::cost::Calibration> cal = model::cost::ReadCalibrationFile(base_path);
  if (!cal.ok()) return Status(cal.status().code(), "--base: " + std::string(cal.status().message()));
  if (cal->model_fingerprint != llama.config().ArchitectureFingerprint()) {
    return InvalidArgumentError("--base: " + base_path + " was calibrated for another model");
  }
  if (!has_batch_sizes) return InvalidArgumentError("--base: wants --batch-sizes");
  return cal;
}

// Times the kernel and round tables on this machine (model::cost::Calibrate).
// Errors: kInvalidArgument naming --prompts / --new-tokens when the prompts
// or --new-tokens do not fit; the calibration's other errors as they are.
StatusOr<model::cost::Calibration> MeasureCalibration(const model::LlamaModel& llama, const CalibrateFlags& f,
                                                const std::vector<std::vector<int32_t>>& prompts) {
  StatusOr<model::cost::Calibration> cal =
      model::cost::Calibrate(llama, static_cast<int>(f.repeats), MakeTimedDecision(), static_cast<int>(f.round_passes),
                       f.round_max_draft_len, prompts, f.new_tokens);
  if (cal.status().code() == StatusCode::kInvalidArgument) {
    return InvalidArgumentError("--prompts / --new-tokens: " + std::string(cal.status().message()));
  }
  return cal;
}

// Adds the batch tables (model::cost::CalibrateBatches) of `batch_sizes` to `cal`,
// at --batch-exit-layer (0: layer 2, or L - 1 when L <= 2) with at most
// --batch-context committed tokens; nothing for no batch size or an exit
// layer below 1. Errors: CalibrateBatches', prefixed with the flags' names.
Status AddBatchTables(const model::LlamaModel& llama, const CalibrateFlags& f,
                      const std::vector<int64_t>& batch_sizes, model::cost::Calibration* cal) {
  int64_t batch_exit_layer = f.batch_exit_layer;
  if (batch_exit_layer == 0) batch_exit_layer = std::min<int64_t>(2, llama.config().n_layers - 1);
  if (batch_sizes.empty() || batch_exit_layer < 1) return OkStatus();
  const int64_t batch_context =
      std::min<int64_t>(f.batch_context, llama.config().max_seq_len - f.round_max_draft_len - 2);
  if (Status s = model::cost::CalibrateBatches(llama, std::max<int>(5, static_cast<int>(f.repeats) / 2), batch_sizes,
                                         batch_exit_layer, f.round_max_draft_len, batch_context, cal);
      !s.ok()) {
    return Status(s.code(), "--batch-sizes / --batch-exit-layer: " + std::string(s.message()));
  }
  return OkStatus();
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

// Writes the calibration JSON to --out ("wrote PATH" on `err`) or, without
// it, to `out`. Errors: kInternal naming the file it cannot write.
Status WriteCalibration(const model::cost::Calibration& cal, const std::string& out_path, std::ostream& out,
                        std::ostream& err) {
  const std::string json = model::cost::CalibrationToJson(cal);
  if (out_path.empty()) {
    out << json;
    return OkStatus();
  }
  std::ofstream f(out_path);
  if (!(f << json)) return InternalError("cannot write " + out_path);
  err << "wrote " << out_path << "\n";
  return OkStatus();
}

}  // namespace

int RunCalibrate(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  CalibrateFlags f;
  FlagSet flags;
  f.AddTo(flags);
  if (flags::WantsHelp(args)) {
    out << "usage: lede calibrate --model PATH [flags]\nflags:\n" << flags.Usage();
    return kExitOk;
  }
  if (Status s = flags.Parse(args); !s.ok()) {
    err << "lede calibrate: " << s.message() << " (see lede calibrate --help)\n";
    return kExitUsage;
  }
  if (Status s = CheckCalibrateFlags(f); !s.ok()) return Fail(err, s, kExitUsage);
  std::vector<std::vector<int32_t>> prompts;
  if (!f.prompts_flag.empty()) {
    auto path = tokenizer::ResolveTokenizerFile(f.mf.model, "");
    if (!path.ok()) return Fail(err, path.status(), kExitUsage);
    auto tok = tokenizer::LoadTokenizer(*path);
    if (!tok.ok()) return Fail(err, tok.status(), LoadFailureCode(tok.status()));
    auto read = ReadPromptIds(f.prompts_flag, **tok);
    if (!read.ok()) return Fail(err, read.status(), kExitUsage);
    if (read->empty()) return Fail(err, InvalidArgumentError("--prompts: no prompt in " + f.prompts_flag), kExitUsage);
    prompts = std::move(*read);
  }
  auto options = f.mf.Options();
  if (!options.ok()) return Fail(err, options.status(), kExitUsage);
  auto loaded = model::LlamaModel::Load(f.mf.model, *options);
  if (!loaded.ok()) return Fail(err, loaded.status(), LoadFailureCode(loaded.status()));
  const model::LlamaModel& llama = **loaded;
  auto batch_sizes = ParseBatchSizes(f.batch_sizes_flag);
  if (!batch_sizes.ok()) return Fail(err, batch_sizes.status(), kExitUsage);

  StatusOr<model::cost::Calibration> cal = f.base_path.empty()
                                         ? MeasureCalibration(llama, f, prompts)
                                         : ReadBaseCalibration(f.base_path, llama, !batch_sizes->empty());
  if (!cal.ok()) {
    const bool usage = !f.base_path.empty() || cal.status().code() == StatusCode::kInvalidArgument;
    return Fail(err, cal.status(), usage ? kExitUsage : kExitFailure);
  }
  if (Status s = AddBatchTables(llama, f, *batch_sizes, &*cal); !s.ok()) {
    return Fail(err, s, s.code() == StatusCode::kInvalidArgument ? kExitUsage : kExitFailure);
  }
  if (Status s = WriteCalibration(*cal, f.out_path, out, err); !s.ok()) return Fail(err, s, kExitUsage);
  PrintCalibrationSummary(*cal, err);
  return kExitOk;
}

}  // namespace lede::cli
