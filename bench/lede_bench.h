// File: bench/lede_bench.h
//
// `lede-bench bench` and `lede-bench collect`: the evaluation of LEDE against its
// baselines, and the experience collection its policies are trained on.
//
// Prompt sets: JSON lines with a "prompt", "turns" (first turn), "text" or
// "input" field, or corpus text files with <|doc|> separators (the first
// --prompt-tokens tokens of each document). Each set is split in two: the
// first half is the tuning split (static and threshold grids are searched
// there; LEDE's experience is collected there), the second half the
// evaluation split (every reported number).
//
// Methods: ar (autoregressive, the baseline), static (best (E, D) of the grid
// per cost model), threshold (best (lambda, tau) per cost model), lede (the
// DQN policies given with --policy, one per cost model), and the ablations
// lede-fixed-exit (l* fixed at the policy's most used exit layer, D by the
// policy) and lede-fixed-length (exit by the policy, D fixed at its mean draft
// length). The hindsight oracle (the best exit layer and draft length per
// round, chosen after the fact by dynamic programming over the greedy
// trajectory) is printed per cost model as an upper bound.
#ifndef LEDE_BENCH_LEDE_BENCH_H_
#define LEDE_BENCH_LEDE_BENCH_H_

#include <ostream>
#include <string>
#include <vector>

namespace lede::bench {

// lede-bench bench --model DIR --prompts FILE[,FILE...] [--methods ar,static,threshold,lede]
//   [--policy DIR[,DIR...]] [--candidate-layers 2,3,4,6] [--max-draft-len 8]
//   [--new-tokens N] [--prompts-per-set N] [--json OUT] [--threads N]
// Returns the process exit code (2 for bad flags or paths).
int RunBench(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// lede-bench collect --model DIR --prompts FILE[,...] --out DIR [--cost-model accelerator|measured]
//   [--epsilon E] [--seeds N] ...: runs the tuning split with exploration
// around threshold behaviour policies and writes experience shards.
int RunCollect(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// lede-bench load --model DIR --prompts FILE[,...] --calibration FILE [--loads 1,2,4,8,16]
//   [--ridge-tokens 256] [--policy DIR[,...]] [--max-draft-len 8] [--json OUT]: the
// predicted speed-up of static self-speculation (tuned at each load and tuned
// alone) and of the given policies when B sessions decode at once, under the
// cost models at a load (shared/model/cost/cost_model.h), by exact replay of the
// evaluation split (bench/load_bench.cc). Prints numbers; asserts nothing.
int RunLoad(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace lede::bench

#endif  // LEDE_BENCH_LEDE_BENCH_H_
