// `lede-bench`: LEDE against its baselines (`lede-bench bench`) and the
// experience collection its policies are trained on (`lede-bench collect`);
// bench/lede_bench.h has the flags of each. Its own executable, so that the
// `lede` command line links no trainer code.
#include <iostream>
#include <string>
#include <vector>

#include "bench/lede_bench.h"

int main(int argc, char** argv) {
  const std::string usage =
      "usage: lede-bench <command> [flags]\n"
      "commands:\n"
      "  bench      LEDE against autoregressive, static and threshold baselines\n"
      "  collect    run exploration policies and write experience shards\n"
      "  load       what each method is worth when many sessions decode at once (cost models at a load)\n"
      "run 'lede-bench <command> --help' for its flags\n";
  if (argc < 2 || std::string(argv[1]) == "help" || std::string(argv[1]) == "--help") {
    std::cout << usage;
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  if (command == "bench") return lede::bench::RunBench(args, std::cout, std::cerr);
  if (command == "collect") return lede::bench::RunCollect(args, std::cout, std::cerr);
  if (command == "load") return lede::bench::RunLoad(args, std::cout, std::cerr);
  std::cerr << "lede-bench: unknown command '" << command << "'\n" << usage;
  return 2;
}
