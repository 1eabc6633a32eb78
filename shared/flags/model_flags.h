// File: shared/flags/model_flags.h
//
// The model-loading flags, declared once for every binary that loads a
// checkpoint (lede, lede-model, the trainer's and the benchmarks' mains):
// --model, --device, --dtype, --threads, --kernels, --graphs, --weights, each
// with one help text. A binary registers the ones it honours (a flag that is
// accepted and ignored is a bug) and hands the values to
// model::loaders::ModelOptionsFromFlags (shared/model/loaders/model_load_flags.h), which parses
// the names and applies --threads.
//
// Torch-free and model-free (shared/flags sits below shared/model): the
// names are checked where they are parsed, by the engine.
//
// Example:
//   flags::ModelLoadFlags m;          // defaults: cpu, float32, fused, auto
//   flags::FlagSet fs;
//   flags::AddModelLoadFlags(&fs, &m, flags::kModelPath | flags::kThreads | flags::kWeights);
//   ... fs.Parse(args) ...
//   StatusOr<model::ModelOptions> o = model::loaders::ModelOptionsFromFlags(m);
#ifndef LEDE_SHARED_FLAGS_MODEL_FLAGS_H_
#define LEDE_SHARED_FLAGS_MODEL_FLAGS_H_

#include <cstdint>
#include <string>

#include "shared/status/status.h"

namespace lede::flags {

class FlagSet;

// Which of the group's flags a binary takes (a bit set).
enum ModelLoadFlag : unsigned {
  kModelPath = 1u << 0,  // --model (required unless given a default)
  kDevice = 1u << 1,     // --device
  kDtype = 1u << 2,      // --dtype
  kThreads = 1u << 3,    // --threads
  kKernels = 1u << 4,    // --kernels
  kGraphs = 1u << 5,     // --graphs
  kWeights = 1u << 6,    // --weights
  kAllModelLoadFlags = (1u << 7) - 1,
};

// The group's values. A binary may change a default before registering
// (the default is what --help prints).
struct ModelLoadFlags {
  // Checkpoint: a Hugging Face directory, a llama2.c .bin (or its
  // directory), or a .gguf file.
  std::string model;
  std::string device = "cpu";     // cpu, cuda or cuda:N
  std::string dtype = "float32";  // compute dtype: float32, bfloat16, float16
  // Intra-op threads of every kernel (libtorch, OpenBLAS and the fused
  // kernels) in decode, verification, batched steps and prefill; 0 = every
  // CPU this process may use (ResolveThreads). >= 0.
  int64_t threads = 0;
  std::string kernels = "fused";  // fused (CPU) or eager (libtorch reference)
  std::string graphs = "auto";    // CUDA graphs: auto, on or off
  std::string weights = "auto";   // fused path's matrix storage; auto = the checkpoint's
};

// Registers the flags named in `which` on `flags`, bound to `values`, with
// the group's one help text each.
void AddModelLoadFlags(FlagSet* flags, ModelLoadFlags* values, unsigned which = kAllModelLoadFlags);

// The CPUs this process may run on (sched_getaffinity; what `nproc`
// prints), capped by a container's CPU quota (cgroup v2 cpu.max, rounded
// up), at least 1.
int UsableCpus();

// The thread count a --threads value stands for: `threads` itself when > 0,
// UsableCpus() when 0. Errors: kInvalidArgument naming `flag` for a negative
// value or one above 4096.
StatusOr<int> ResolveThreads(int64_t threads, const std::string& flag = "threads");

// A memory size: "4GiB", "512MiB", "64KiB", "1TiB" (or "4G", "512M", decimal
// "4GB" = 4e9), a plain byte count ("1048576"), or a percentage of
// `available_bytes` ("25%"). Fractions are allowed ("1.5GiB").
// Errors: kInvalidArgument naming `flag` for anything else, a value <= 0, or
// a percentage outside (0, 100].
StatusOr<int64_t> ParseMemorySize(const std::string& flag, const std::string& text, int64_t available_bytes);

// MemAvailable of /proc/meminfo in bytes (the memory a new allocation can
// get without swapping), or less when a container's memory limit (cgroup v2
// memory.max minus memory.current) leaves less. Errors: kUnavailable when
// MemAvailable cannot be read.
StatusOr<int64_t> MemAvailableBytes();

// The container limits the two above apply, from the cgroup v2 files'
// first lines: `cpus` capped by cpu.max ("QUOTA PERIOD" -> ceil(QUOTA /
// PERIOD), "max ..." = no cap), and `available` capped by memory.max minus
// memory.current ("max" or "" = no cap).
int CpusUnderQuota(int cpus, const std::string& cpu_max);
int64_t AvailableUnderLimit(int64_t available, const std::string& memory_max, const std::string& memory_current);

// "4.00 GiB"-style rendering of a byte count for messages.
std::string FormatBytes(int64_t bytes);

}  // namespace lede::flags

#endif  // LEDE_SHARED_FLAGS_MODEL_FLAGS_H_
