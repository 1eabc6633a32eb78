// `lede` (commands.h): hands argv[1] to its subcommand, one file each:
// generate.cc, calibrate.cc, tokenize.cc, export.cc, widen.cc; what they
// share is in internal/common.h.
#include "services/cli/commands.h"

#include <iostream>

#include "services/cli/internal/common.h"

namespace lede::cli {

using internal::kExitOk;
using internal::kExitUsage;

int Main(int argc, char** argv) {
  const std::string usage =
      "usage: lede <command> [flags]\n"
      "commands:\n"
      "  generate   generate text (autoregressive, static self-speculation, or LEDE's learned exits)\n"
      "  calibrate  measure this machine's cost model and write it as JSON\n"
      "  widen      embed a checkpoint function-exactly in a wider shape (the memory-bound regime)\n"
      "  tokenize   print the token ids of a text (or a chat turn) as a JSON list, or decode ids\n"
      "  export     write a checkpoint as a GGUF file for llama.cpp (--format gguf --weights f32|f16|bf16|q8_0|q4_0|q4_k_m)\n"
      "run 'lede <command> --help' for its flags\n";
  if (argc < 2 || std::string(argv[1]) == "help" || std::string(argv[1]) == "--help") {
    std::cout << usage;
    return argc < 2 ? kExitUsage : kExitOk;
  }
  const std::string command = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (command == "generate") return RunGenerate(args, std::cout, std::cerr);
  if (command == "calibrate") return RunCalibrate(args, std::cout, std::cerr);
  if (command == "tokenize") return RunTokenize(args, std::cout, std::cerr);
  if (command == "export") return RunExport(args, std::cout, std::cerr);
  if (command == "widen") return RunWiden(args, std::cout, std::cerr);
  if (command == "bench" || command == "collect") {
    std::cerr << "lede: '" << command << "' is now 'lede-bench " << command << "' (build/bench/lede-bench)\n";
    return kExitUsage;
  }
  std::cerr << "lede: unknown command '" << command << "'\n" << usage;
  return kExitUsage;
}

}  // namespace lede::cli
