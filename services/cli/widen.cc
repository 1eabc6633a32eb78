// `lede widen` (commands.h): a checkpoint embedded function-exactly in a
// wider shape, then optionally `lede calibrate` on it.
#include "services/cli/commands.h"

#include <filesystem>
#include <iomanip>

#include "services/cli/internal/common.h"
#include "shared/checkpoint/widen.h"
#include "shared/flags/flags.h"
#include "shared/flags/model_flags.h"

namespace lede::cli {

using flags::FlagSet;
using internal::Fail;
using internal::kExitFailure;
using internal::kExitOk;
using internal::kExitUsage;

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

}  // namespace lede::cli
