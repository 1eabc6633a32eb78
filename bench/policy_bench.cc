// lede_policy_bench: the cost of one exit decision of the learned policy
// (DqnExitController::Decide = ExitFeatures + QNetwork::Forward + argmax), in
// ns/decision, for a few hidden widths. The budget is 5 us per decision
// (the drafter asks once per candidate layer and once per drafted token).
// Prints numbers; asserts nothing.
//
// Usage: lede_policy_bench [--decisions N] [--json FILE]
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "policy/dqn/dqn_exit_controller.h"
#include "policy/dqn/q_network.h"
#include "shared/flags/flags.h"
#include "shared/status/status.h"

int main(int argc, char** argv) {
  using lede::speculation::ExitState;
  int64_t n = 2000000;
  std::string json_path;
  lede::flags::FlagSet flags;
  flags.Add("decisions", &n, "timed decisions per width");
  flags.Add("json", &json_path, "also write the rows as JSON here");
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (lede::flags::WantsHelp(args)) {
    std::printf("usage: lede_policy_bench [flags]\nflags:\n%s", flags.Usage().c_str());
    return 0;
  }
  lede::Status parsed = flags.Parse(args);
  if (parsed.ok() && n < 1) parsed = lede::InvalidArgumentError("--decisions must be >= 1");
  if (!parsed.ok()) {
    std::fprintf(stderr, "lede_policy_bench: %s\nflags:\n%s", std::string(parsed.message()).c_str(), flags.Usage().c_str());
    return 2;
  }
  nlohmann::json rows = nlohmann::json::array();
  // A fixed pool of varied states, so the branch predictor cannot learn one.
  std::mt19937_64 rng(0);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<ExitState> states(1024);
  for (ExitState& s : states) {
    s.phase = u(rng) < 0.5f ? lede::speculation::Phase::kExitLayer : lede::speculation::Phase::kDraftLength;
    s.n_layers = 32;
    s.layer = 2 + static_cast<int32_t>(u(rng) * 14);
    s.max_draft_len = 8;
    s.draft_pos = static_cast<int32_t>(u(rng) * 8);
    s.top1_prob = u(rng);
    s.top_k_nll = 4 * u(rng);
    s.entropy = 6 * u(rng);
    s.trace_nll = 3 * u(rng);
  }
  std::printf("%-8s %12s %14s\n", "hidden", "decisions", "ns/decision");
  for (int hidden : {32, 64, 128, 256}) {
    auto net = std::make_shared<const lede::policy::dqn::QNetwork>(
        lede::policy::dqn::QNetwork::Random(hidden, /*seed=*/1));
    lede::policy::dqn::DqnExitController controller(net, "bench");
    int64_t exits = 0;
    for (int64_t i = 0; i < 10000; ++i) exits += static_cast<int>(controller.Decide(states[i & 1023]));  // warm-up
    const auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < n; ++i) exits += static_cast<int>(controller.Decide(states[i & 1023]));
    const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
    std::printf("%-8d %12lld %14.1f   (exit share %.3f)\n", hidden, static_cast<long long>(n), ns / n,
                static_cast<double>(exits) / (n + 10000));
    rows.push_back({{"hidden", hidden}, {"decisions", n}, {"ns_per_decision", ns / n}});
  }
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << nlohmann::json({{"benchmark", "lede_policy_bench"}, {"rows", rows}}).dump(2) << "\n";
    if (!f) {
      std::fprintf(stderr, "lede_policy_bench: cannot write %s\n", json_path.c_str());
      return 1;
    }
  }
  return 0;
}
