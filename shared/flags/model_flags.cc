#include "shared/flags/model_flags.h"

#include <sched.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "shared/flags/flags.h"

namespace lede::flags {

void AddModelLoadFlags(FlagSet* flags, ModelLoadFlags* v, unsigned which) {
  if (which & kModelPath) {
    flags->Add("model", &v->model,
               "checkpoint: Hugging Face directory, llama2.c .bin (or its directory), or .gguf file",
               /*required=*/v->model.empty());
  }
  if (which & kDevice) flags->Add("device", &v->device, "cpu, cuda or cuda:N");
  if (which & kDtype) flags->Add("dtype", &v->dtype, "compute dtype: float32, bfloat16 or float16");
  if (which & kThreads) {
    flags->Add("threads", &v->threads,
               "intra-op threads of every kernel (libtorch, OpenBLAS, fused) in decode, verification, batched "
               "steps and prefill (0 = every CPU this process may use)");
  }
  if (which & kKernels) {
    flags->Add("kernels", &v->kernels, "decode-path kernels: fused (CPU) or eager (libtorch reference)");
  }
  if (which & kGraphs) {
    flags->Add("graphs", &v->graphs, "decode steps as captured CUDA graphs: auto (on for CUDA), on or off");
  }
  if (which & kWeights) {
    flags->Add("weights", &v->weights,
               "matrix storage of the fused CPU path: auto (the checkpoint's), f32, bf16, q8_0, q4_0, q4_k_m or gguf "
               "(keep a GGUF file's own block types)");
  }
}

namespace {

// The first line of a small file ("" when it cannot be read).
std::string FirstLineOf(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// A cgroup v2 limit file's number; 0 for "max", a missing file or garbage.
int64_t CgroupNumber(const std::string& text) {
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  return end != text.c_str() && v > 0 ? static_cast<int64_t>(v) : 0;
}

}  // namespace

int UsableCpus() {
  int n = 1;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) n = CPU_COUNT(&set);
  return CpusUnderQuota(n, FirstLineOf("/sys/fs/cgroup/cpu.max"));
}

int CpusUnderQuota(int cpus, const std::string& cpu_max) {
  std::istringstream fields(cpu_max);
  std::string quota, period;
  if (fields >> quota >> period) {
    const int64_t q = CgroupNumber(quota), p = CgroupNumber(period);
    if (q > 0 && p > 0) return static_cast<int>(std::min<int64_t>(cpus, std::max<int64_t>(1, (q + p - 1) / p)));
  }
  return cpus;
}

int64_t AvailableUnderLimit(int64_t available, const std::string& memory_max, const std::string& memory_current) {
  const int64_t limit = CgroupNumber(memory_max);
  if (limit <= 0) return available;
  return std::min(available, std::max<int64_t>(0, limit - CgroupNumber(memory_current)));
}

StatusOr<int> ResolveThreads(int64_t threads, const std::string& flag) {
  constexpr int64_t kMaxThreads = 4096;
  if (threads < 0 || threads > kMaxThreads) {
    return InvalidArgumentError("--" + flag + ": must be in [0, " + std::to_string(kMaxThreads) +
                                "] (0 = every CPU this process may use), got " + std::to_string(threads));
  }
  return threads == 0 ? UsableCpus() : static_cast<int>(threads);
}

StatusOr<int64_t> ParseMemorySize(const std::string& flag, const std::string& text, int64_t available_bytes) {
  const auto bad = [&](const std::string& why) {
    return InvalidArgumentError("--" + flag + ": '" + text + "' " + why +
                                " (want e.g. 4GiB, 512MiB, 2000000000 or 25%)");
  };
  std::string t;
  for (char c : text) {
    if (!std::isspace(static_cast<unsigned char>(c))) t += c;
  }
  if (t.empty()) return bad("is empty");
  const char* begin = t.c_str();
  char* end = nullptr;
  const double number = std::strtod(begin, &end);
  if (end == begin || !std::isfinite(number)) return bad("is not a size");
  std::string unit(end);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double bytes = 0;
  if (unit == "%") {
    if (!(number > 0 && number <= 100)) return bad("is not a percentage in (0, 100]");
    bytes = static_cast<double>(available_bytes) * number / 100.0;
  } else {
    static const struct {
      const char* name;
      double scale;
    } kUnits[] = {{"", 1},         {"b", 1},          {"k", 1024.0},     {"kib", 1024.0},
                  {"kb", 1e3},     {"m", 1048576.0},  {"mib", 1048576.0}, {"mb", 1e6},
                  {"g", 1073741824.0}, {"gib", 1073741824.0}, {"gb", 1e9},
                  {"t", 1099511627776.0}, {"tib", 1099511627776.0}, {"tb", 1e12}};
    bool found = false;
    for (const auto& u : kUnits) {
      if (unit == u.name) {
        bytes = number * u.scale;
        found = true;
        break;
      }
    }
    if (!found) return bad("has an unknown unit '" + std::string(end) + "'");
  }
  if (!(bytes >= 1) || bytes > 9.0e18) return bad("is not a positive size");
  return static_cast<int64_t>(bytes);
}

StatusOr<int64_t> MemAvailableBytes() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  int64_t available = 0;
  while (std::getline(in, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream fields(line.substr(13));
    int64_t kib = 0;
    if (fields >> kib && kib > 0) available = kib * 1024;
    break;
  }
  if (available <= 0) return UnavailableError("MemAvailable: not found in /proc/meminfo");
  // A container's memory limit (cgroup v2 memory.max), which /proc/meminfo
  // does not show: what is left under it counts, if less.
  return AvailableUnderLimit(available, FirstLineOf("/sys/fs/cgroup/memory.max"),
                             FirstLineOf("/sys/fs/cgroup/memory.current"));
}

std::string FormatBytes(int64_t bytes) {
  char buf[64];
  const double b = static_cast<double>(bytes);
  if (b >= 1073741824.0) {
    std::snprintf(buf, sizeof(buf), "%.2f GiB", b / 1073741824.0);
  } else if (b >= 1048576.0) {
    std::snprintf(buf, sizeof(buf), "%.1f MiB", b / 1048576.0);
  } else {
    std::snprintf(buf, sizeof(buf), "%lld bytes", static_cast<long long>(bytes));
  }
  return buf;
}

}  // namespace lede::flags
