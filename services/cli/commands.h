// File: services/cli/commands.h
//
// The subcommands of the `lede` command line. Each takes the arguments after
// the subcommand name, writes its output to `out` / `err`, and returns the
// process exit code: 0 on success, 2 for bad flags or paths (with a one-line
// error), 1 for a failure while running.
#ifndef LEDE_SERVICES_CLI_COMMANDS_H_
#define LEDE_SERVICES_CLI_COMMANDS_H_

#include <ostream>
#include <string>
#include <vector>

namespace lede::cli {

// lede generate --model PATH --prompt TEXT [--max-new-tokens N]
//   [--mode ar|static] [--exit-layer E] [--draft-len D] [--temperature T]
//   [--top-p P] [--seed S] [--samples N] [--separator LINE] [--tokenizer PATH] [--device cpu|cuda[:i]]
//   [--chat [--system TEXT] [--chat-template FILE]]
//   [--dtype float32|bfloat16|float16] [--threads N]
// Streams the prompt and its continuation, then one stats line: tokens/s,
// acceptance rate, tokens per round, wall time. With --samples N (corpora):
// N texts from one loaded model, seeds S, S+1, ..., each as a single run with
// its seed would print it, each followed by the --separator line if given.
// --chat: the prompt is a user message, rendered with the checkpoint's chat
// template (tokenizer_config.json beside the tokenizer, or --chat-template);
// generation stops at any eos id of generation_config.json / config.json.
int RunGenerate(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// lede calibrate --model PATH [--out FILE] [--repeats N] [--threads N]
// Times one block for 1..16 positions, the LM head and a full step; writes
// the calibration JSON (cost_model.h) to --out or stdout.
int RunCalibrate(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// lede tokenize (--model DIR | --tokenizer FILE) [--chat [--system TEXT]
//   [--chat-template FILE] [--no-generation-prompt] [--show-prompt]]
//   [--bos auto|true|false] [--decode] TEXT
// Prints TEXT's token ids as a JSON list ([128000, 9906, 1917]). --bos auto
// adds BOS when the tokenizer's files ask for it (tokenizer.json's
// post-processor, add_bos_token). --chat renders TEXT as a user message
// (after --system) with the checkpoint's chat template (tokenizer_config.json
// beside the tokenizer, or --chat-template) and tokenizes the result with no
// extra BOS, as transformers' apply_chat_template(tokenize=True) does.
// --decode: TEXT is a JSON list of ids; prints their text.
int RunTokenize(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// lede export --format gguf --weights f32|f16|bf16|q8_0|q4_0|q4_k_m --model PATH --out FILE
//   [--tokenizer FILE]
// Writes the checkpoint at PATH with its tokenizer as a llama GGUF v3 file
// (model::loaders::WriteGgufCheckpoint: llama.cpp's tensor names and Q/K row order;
// tokenizer::AddGgufTokenizerMetadata). Exit 0, 1 on a failed load/write,
// 2 on bad flags.
int RunExport(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// lede widen --model DIR --factor K [--ffn-factor K2] --out DIR2 [--overwrite]
//   [--calibrate [--threads N] [--round-passes N] [--round-max-draft-len N]]
// Writes the function-exact embedding of the checkpoint DIR in the shape
// with hidden size K*d, K times the attention and KV heads (head_dim kept)
// and K2 (default K) times the FFN width (shared/checkpoint/widen.h), with
// the source's tokenizer and generation files; --calibrate then writes
// DIR2/calibration-cpu.json as `lede calibrate` does. Refusals (exit 2) name
// the config field or tensor that cannot be embedded exactly.
int RunWiden(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// Dispatches argv[1] to a subcommand; prints usage for none or "help".
int Main(int argc, char** argv);

}  // namespace lede::cli

#endif  // LEDE_SERVICES_CLI_COMMANDS_H_
