// File: shared/flags/sampling_flags.h
//
// The sampled-decoding flags, declared once for every offline tool that runs
// prompts under sampling (`lede-bench bench`, `lede-train-counterfactual`):
// --temperature, --top-p and --seeds, each with one help text. A sampled
// run decodes every prompt once per seed 1..seeds (the same seeds for every
// method it compares); a greedy one once. What sampling is and how a replay
// scores it: docs/training.md "Sampled traffic".
//
// Torch-free and model-free, as the rest of shared/flags; a caller turns
// the values into speculation::SamplingParams (shared/speculation/generation.h).
//
// Example:
//   flags::SamplingFlags s;
//   flags::FlagSet fs;
//   flags::AddSamplingFlags(&fs, &s);
//   ... fs.Parse(args) ...
//   if (Status st = flags::CheckSamplingFlags(s); !st.ok()) ...  // exit 2
#ifndef LEDE_SHARED_FLAGS_SAMPLING_FLAGS_H_
#define LEDE_SHARED_FLAGS_SAMPLING_FLAGS_H_

#include <cstdint>

#include "shared/status/status.h"

namespace lede::flags {

class FlagSet;

// The group's values.
struct SamplingFlags {
  double temperature = 0;  // >= 0; 0 = greedy (argmax)
  double top_p = 1;        // nucleus mass in (0, 1], when sampling
  int64_t seeds = 1;       // sampled runs per prompt, seeds 1..seeds; 1 when greedy
  bool sampled() const { return temperature > 0; }
};

// Registers --temperature, --top-p and --seeds on `flags`, bound to `values`.
void AddSamplingFlags(FlagSet* flags, SamplingFlags* values);

// kInvalidArgument naming the flag: a temperature that is negative or not
// finite, top_p outside (0, 1], fewer than one seed, or more than one when
// greedy (greedy runs are the same for every seed: a flag accepted and
// ignored).
Status CheckSamplingFlags(const SamplingFlags& values);

}  // namespace lede::flags

#endif  // LEDE_SHARED_FLAGS_SAMPLING_FLAGS_H_
