#include "shared/flags/sampling_flags.h"

#include <cmath>

#include "shared/flags/flags.h"

namespace lede::flags {

void AddSamplingFlags(FlagSet* flags, SamplingFlags* v) {
  flags->Add("temperature", &v->temperature, "sampling temperature, >= 0 (0 = greedy)");
  flags->Add("top-p", &v->top_p, "nucleus mass in (0, 1] when sampling");
  flags->Add("seeds", &v->seeds, "sampled runs per prompt, seeds 1..N, the same for every method (1 when greedy)");
}

Status CheckSamplingFlags(const SamplingFlags& v) {
  if (!std::isfinite(v.temperature) || v.temperature < 0) return InvalidArgumentError("--temperature: must be >= 0");
  if (!(v.top_p > 0 && v.top_p <= 1)) return InvalidArgumentError("--top-p: must be in (0, 1]");
  if (v.seeds < 1) return InvalidArgumentError("--seeds: must be >= 1");
  if (!v.sampled() && v.seeds != 1) return InvalidArgumentError("--seeds: more than 1 needs --temperature > 0");
  return OkStatus();
}

}  // namespace lede::flags
