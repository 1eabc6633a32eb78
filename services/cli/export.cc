// `lede export` (commands.h): a checkpoint and its tokenizer as a llama GGUF
// file.
#include "services/cli/commands.h"

#include <filesystem>
#include <system_error>

#include "services/cli/internal/common.h"
#include "shared/flags/flags.h"
#include "shared/model/loaders/checkpoint.h"
#include "shared/tokenizer/gguf_tokenizer.h"
#include "shared/tokenizer/model_files.h"

namespace lede::cli {

using flags::FlagSet;
using internal::Fail;
using internal::kExitFailure;
using internal::kExitOk;
using internal::kExitUsage;
using internal::LoadFailureCode;

int RunExport(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  std::string format = "gguf", weights = "f32", model, out_path, tokenizer_path;
  FlagSet flags;
  flags.Add("format", &format, "output format: gguf");
  flags.Add("weights", &weights, "stored matrix type: f32, f16, bf16, q8_0, or llama.cpp's q4_0 / q4_k_m tensor mix (norms stay f32)");
  flags.Add("model", &model, "checkpoint: Hugging Face directory, llama2.c .bin (or its directory), or .gguf", true);
  flags.Add("out", &out_path, "the file to write", true);
  flags.Add("tokenizer", &tokenizer_path, "tokenizer file (default: the checkpoint's)");
  if (flags::WantsHelp(args)) {
    out << "usage: lede export --format gguf --weights f32|f16|bf16|q8_0|q4_0|q4_k_m --model DIR --out FILE\n"
           "writes the checkpoint and its tokenizer as a llama-architecture GGUF v3 file that llama.cpp runs\n"
           "flags:\n"
        << flags.Usage();
    return kExitOk;
  }
  if (Status s = flags.Parse(args); !s.ok()) {
    err << "lede export: " << s.message() << " (see lede export --help)\n";
    return kExitUsage;
  }
  if (format != "gguf") return Fail(err, InvalidArgumentError("--format: only gguf, got '" + format + "'"), kExitUsage);
  checkpoint::GgmlType type = checkpoint::GgmlType::kF32;
  model::loaders::WeightFormat mix = model::loaders::WeightFormat::kAuto;  // q4_0 / q4_k_m: llama.cpp's tensor mix
  if (weights == "q4_0") {
    mix = model::loaders::WeightFormat::kQ4_0;
  } else if (weights == "q4_k_m") {
    mix = model::loaders::WeightFormat::kQ4_K_M;
  } else if (weights == "f32") {
    type = checkpoint::GgmlType::kF32;
  } else if (weights == "f16") {
    type = checkpoint::GgmlType::kF16;
  } else if (weights == "bf16") {
    type = checkpoint::GgmlType::kBF16;
  } else if (weights == "q8_0") {
    type = checkpoint::GgmlType::kQ8_0;
  } else {
    return Fail(err, InvalidArgumentError("--weights: want f32, f16, bf16, q8_0, q4_0 or q4_k_m, got '" + weights + "'"),
                kExitUsage);
  }
  auto ckpt = model::loaders::LoadCheckpoint(model);
  if (!ckpt.ok()) return Fail(err, ckpt.status(), LoadFailureCode(ckpt.status()));
  auto tok_path = tokenizer::ResolveTokenizerFile(model, tokenizer_path);
  if (!tok_path.ok()) return Fail(err, tok_path.status(), kExitUsage);
  checkpoint::GgufWriter writer;
  auto vocab = tokenizer::ReadVocabForGguf(*tok_path);
  if (!vocab.ok()) return Fail(err, vocab.status(), LoadFailureCode(vocab.status()));
  const auto n_vocab = static_cast<int64_t>(vocab->tokens.size());
  if (n_vocab > ckpt->config.vocab_size) {
    return Fail(err,
                InvalidArgumentError(*tok_path + ": " + std::to_string(n_vocab) + " tokens, more than the model's " +
                                     std::to_string(ckpt->config.vocab_size)),
                kExitFailure);
  }
  for (int64_t i = n_vocab; i < ckpt->config.vocab_size; ++i) {  // embedding rows past the tokenizer
    vocab->tokens.push_back("[PAD" + std::to_string(i) + "]");
    vocab->token_types.push_back(5);  // unused
    if (!vocab->scores.empty()) vocab->scores.push_back(-1e9f);
  }
  tokenizer::AddGgufTokenizerMetadata(*vocab, ckpt->config.bos_id,
                                      ckpt->config.eos_ids.empty() ? -1 : ckpt->config.eos_ids[0], &writer);
  const Status written = mix != model::loaders::WeightFormat::kAuto
                            ? model::loaders::WriteGgufCheckpoint(out_path, ckpt->config, ckpt->tensors, mix, &writer)
                            : model::loaders::WriteGgufCheckpoint(out_path, ckpt->config, ckpt->tensors, type, &writer);
  if (const Status& s = written; !s.ok()) {
    return Fail(err, s, kExitFailure);
  }
  std::error_code ec;
  err << "lede export: wrote " << out_path << " (" << std::filesystem::file_size(out_path, ec) << " bytes, "
      << weights << " matrices, " << vocab->model << " vocabulary of " << vocab->tokens.size() << " tokens)\n";
  return kExitOk;
}

}  // namespace lede::cli
