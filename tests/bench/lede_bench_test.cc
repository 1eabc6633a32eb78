// Tests of `lede-bench bench` (bench/lede_bench.h RunBench) on
// models/lede-tiny in sampled mode: the flags it refuses, and that a sampled
// run reports its settings and one row per method over every prompt and
// seed, with predictions from the step costs it timed of itself. It
// asserts what the table means, never a speed.
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/lede_bench.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace lede::bench {
namespace {

constexpr char kModel[] = "models/lede-tiny";
constexpr char kCalibration[] = "models/lede-tiny/calibration-cpu.json";

std::vector<std::string> Flags(const std::string& json, std::vector<std::string> extra) {
  std::vector<std::string> f = {"--model", kModel, "--prompts", "models/lede-tiny/prompts/story.jsonl",
                                "--calibration", kCalibration, "--prompts-per-set", "2", "--new-tokens", "8",
                                "--max-draft-len", "3", "--repeats", "1", "--methods", "ar,static",
                                "--json", json};
  f.insert(f.end(), extra.begin(), extra.end());
  return f;
}

// Bad sampling flags, policy costs other than served or calibration, and a
// rounds file that cannot be written exit 2 naming the flag before any model
// is loaded (several seeds of a greedy run would be one run repeated).
TEST(LedeBenchTest, BadFlagsAreRefusedNamingTheFlag) {
  for (auto [flag, value] : std::vector<std::pair<std::string, std::string>>{{"--temperature", "-0.5"},
                                                                             {"--top-p", "0"},
                                                                             {"--top-p", "1.5"},
                                                                             {"--seeds", "0"},
                                                                             {"--seeds", "2"},
                                                                             {"--policy-costs", "accelerator"},
                                                                             {"--policy-costs", "served,served"},
                                                                             {"--rounds-out", "/nonexistent/rounds"}}) {
    std::ostringstream out, err;
    EXPECT_EQ(RunBench(Flags("/dev/null", {flag, value}), out, err), 2) << flag << " " << value;
    EXPECT_NE(err.str().find(flag), std::string::npos) << err.str();
  }
}

// A sampled run (temperature 0.8, 2 seeds) reports its settings, the
// autoregressive row at 1x, and the tuned static row, each over every
// evaluation prompt and seed, with where each row's time went and every
// timed round in the rounds file.
TEST(LedeBenchTest, SampledRunReportsEverySeedOfEveryPrompt) {
  ::lede::testing::TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string json = (dir.path() / "bench.json").string();
  const std::string rounds_path = (dir.path() / "rounds.jsonl").string();
  std::ostringstream out, err;
  ASSERT_EQ(RunBench(Flags(json, {"--temperature", "0.8", "--top-p", "0.95", "--seeds", "2", "--rounds-out",
                                  rounds_path}),
                     out, err),
            0)
      << err.str();
  std::map<std::string, int64_t> rounds_of;  // method -> lines of the rounds file
  std::ifstream rounds_in(rounds_path);
  for (std::string line; std::getline(rounds_in, line);) {
    const nlohmann::json r = nlohmann::json::parse(line);
    ++rounds_of[r["method"].get<std::string>()];
    EXPECT_LE(r["draft_s"].get<double>() + r["verify_s"].get<double>(), r["latency_s"].get<double>() + 1e-9) << line;
    EXPECT_GE(r["n_emitted"].get<int64_t>(), 1) << line;
  }
  std::ifstream in(json);
  const nlohmann::json report = nlohmann::json::parse(in);
  ASSERT_EQ(report["sets"].size(), 1u);
  const nlohmann::json& set = report["sets"].begin().value();
  EXPECT_DOUBLE_EQ(set["temperature"].get<double>(), 0.8);
  EXPECT_NEAR(set["top_p"].get<double>(), 0.95, 1e-9);
  EXPECT_EQ(set["seeds"].get<int64_t>(), 2);
  EXPECT_EQ(set["eval_runs"].get<int64_t>(), 2 * set["eval_prompts"].get<int64_t>());
  bool saw_ar = false, saw_static = false;
  for (const nlohmann::json& row : set["rows"]) {
    const std::string method = row["method"].get<std::string>();
    EXPECT_GT(row["tokens_per_s"].get<double>(), 0.0) << method;
    // Its rounds, each within the decode time, their steps within them.
    const nlohmann::json& seconds = row["step_seconds"];
    EXPECT_EQ(seconds["rounds"].get<int64_t>(), rounds_of[method]) << method;
    EXPECT_GT(seconds["rounds"].get<int64_t>(), 0) << method;
    EXPECT_LE(seconds["round"].get<double>(), seconds["decode"].get<double>()) << method;
    EXPECT_LE(seconds["draft"].get<double>() + seconds["verify"].get<double>(), seconds["round"].get<double>() + 1e-9)
        << method;
    if (method == "ar") {
      saw_ar = true;
      EXPECT_DOUBLE_EQ(row["measured_speedup"].get<double>(), 1.0);
      EXPECT_EQ(row["acceptance_rate"].get<double>(), 0.0);
      // Priced by the run's own steps, an autoregressive step is the unit.
      EXPECT_DOUBLE_EQ(row["predicted_speedup_served"].get<double>(), 1.0);
    }
    if (method.rfind("static", 0) == 0) {
      saw_static = true;
      EXPECT_GE(row["acceptance_rate"].get<double>(), 0.0);
      EXPECT_LE(row["acceptance_rate"].get<double>(), 1.0);
      EXPECT_GT(row["predicted_speedup_served"].get<double>(), 0.0) << "the run timed its own drafts";
    }
  }
  // The step costs the run measured of itself: an autoregressive step, and
  // the drafts of the static row at its exit layer.
  EXPECT_EQ(report["policy_costs"], nlohmann::json::array({"served"}));
  EXPECT_TRUE(set["policy_cost_features"].contains("calibration"));
  const nlohmann::json& steps = set["run_step_costs"];
  ASSERT_FALSE(steps["verify_s"].empty());
  EXPECT_GT(steps["verify_s"][0].get<double>(), 0.0);
  double drafted = 0;
  for (const nlohmann::json& d : steps["draft_step_s"]) drafted += d.get<double>();
  EXPECT_GT(drafted, 0.0);
  // The ceilings priced by those steps too.
  for (const char* ceiling : {"hindsight_oracle", "belief_ceiling_in_sample", "calibrated_ceiling"}) {
    EXPECT_TRUE(set[ceiling].contains("served")) << ceiling;
  }
  EXPECT_GT(set["hindsight_oracle"]["served"].get<double>(), 1.0) << "the oracle drafts what is accepted";
  EXPECT_TRUE(saw_ar);
  EXPECT_TRUE(saw_static);
  EXPECT_NE(out.str().find("sampled: temperature 0.8"), std::string::npos) << out.str();
}

}  // namespace
}  // namespace lede::bench
