// lede_replica_bench: the cost of placing one session on a model replica
// (ReplicaSet::Candidates(): order the replicas by their reported load and
// this coordinator's own sessions, plus the bookkeeping of the open and the
// close), in ns per request, for 1 to 64 replicas. No model and no network:
// the channels are never connected, the loads are set by hand. Prints
// numbers; asserts nothing.
//
// Usage: lede_replica_bench [placements per size, default 200000]
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "services/coordinator/replica_set.h"

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 200000;
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
  }
  return 0;
}
