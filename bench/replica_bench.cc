// lede_replica_bench: the cost of placing one session on a model replica
// (ReplicaSet::Candidates(): order the replicas by their reported load and
// this coordinator's own sessions, plus the bookkeeping of the open and the
// close), in ns per request, for 1 to 64 replicas. No model and no network:
// the channels are never connected, the loads are set by hand. Prints
// numbers; asserts nothing.
//
// Usage: lede_replica_bench [--placements N] [--json FILE]
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "services/coordinator/replica_set.h"
#include "shared/flags/flags.h"
#include "shared/status/status.h"

int main(int argc, char** argv) {
  int64_t n = 200000;
  std::string json_path;
  lede::flags::FlagSet flags;
  flags.Add("placements", &n, "timed placements per size");
  flags.Add("json", &json_path, "also write the rows as JSON here");
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (lede::flags::WantsHelp(args)) {
    std::printf("usage: lede_replica_bench [flags]\nflags:\n%s", flags.Usage().c_str());
    return 0;
  }
  lede::Status parsed = flags.Parse(args);
  if (parsed.ok() && n < 1) parsed = lede::InvalidArgumentError("--placements must be >= 1");
  if (!parsed.ok()) {
    std::fprintf(stderr, "lede_replica_bench: %s\nflags:\n%s", std::string(parsed.message()).c_str(), flags.Usage().c_str());
    return 2;
  }
  nlohmann::json rows = nlohmann::json::array();
  std::printf("%9s %14s %16s\n", "replicas", "ns/placement", "placements/s");
  for (int replicas : {1, 2, 3, 8, 64}) {
    lede::coordinator::ReplicaSetOptions o;
    for (int i = 0; i < replicas; ++i) {
      const std::string a = "127.0.0.1:" + std::to_string(42000 + i);
      o.targets.push_back({a, a});
    }
    o.start_leases = false;
    auto set = lede::coordinator::ReplicaSet::Create(o);
    if (!set.ok()) {
      std::fprintf(stderr, "%s\n", set.status().ToString().c_str());
      return 1;
    }
    std::mt19937 rng(1);
    for (const auto& r : (*set)->All()) r->UpdateLoad(16, rng() % 17, rng() % 3, 0);
    int64_t sink = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < n; ++i) {
      auto candidates = (*set)->Candidates();
      candidates[0]->SessionOpened();
      sink += candidates[0]->sessions();
      candidates[0]->SessionClosed();
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%9d %14.1f %16.0f%s\n", replicas, 1e9 * s / n, n / s, sink == 42 ? " " : "");
    rows.push_back({{"replicas", replicas}, {"ns_per_placement", 1e9 * s / n}, {"placements_per_s", n / s}});
  }
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << nlohmann::json({{"benchmark", "lede_replica_bench"}, {"rows", rows}}).dump(2) << "\n";
    if (!f) {
      std::fprintf(stderr, "lede_replica_bench: cannot write %s\n", json_path.c_str());
      return 1;
    }
  }
  return 0;
}
