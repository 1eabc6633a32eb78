// Tests of `lede-bench load` (bench/lede_bench.h RunLoad) on models/lede-tiny
// and its shipped calibration, with policies the tests build (no shipped
// policy): the rows it prints and writes, and the flags it refuses. It
// asserts what the table means, never a speed.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/lede_bench.h"
#include "gtest/gtest.h"
#include "policy/dqn/artifact.h"
#include "policy/dqn/q_network.h"
#include "shared/speculation/exit_controller.h"
#include "tests/testing/temp_dir.h"

namespace lede::bench {
namespace {

constexpr char kModel[] = "models/lede-tiny";
constexpr char kCalibration[] = "models/lede-tiny/calibration-cpu.json";

std::vector<std::string> Flags(const std::string& json, std::vector<std::string> extra = {}) {
  std::vector<std::string> f = {"--model", kModel, "--prompts", "models/lede-tiny/prompts/story.jsonl",
                                "--calibration", kCalibration, "--prompts-per-set", "4", "--new-tokens", "12",
                                "--max-draft-len", "3", "--loads", "1,4,64", "--json", json};
  f.insert(f.end(), extra.begin(), extra.end());
  return f;
}

// A hand-made policy for models/lede-tiny that decides like static E=1 D=4:
// q_exit - q_continue is 1 - 2 * LoadFeature(load) when `load_aware`, else 1
// (a network of width 1 over the load feature). So it speculates at every
// round start (load-aware: only below 16 sessions; autoregressive decoding
// at 256), exits at its first candidate layer (1) and drafts D_max = 4
// tokens, with no probes. Saved as version `version` under `dir`; returns
// its directory.
std::string SaveStaticLikePolicy(const std::filesystem::path& dir, const std::string& version, bool load_aware) {
  policy::dqn::QNetworkWeights w;
  w.hidden = 1;
  w.fc1_weight.assign(speculation::kExitFeatureDim, 0.0f);
  if (load_aware) w.fc1_weight[speculation::kLoadFeature] = 1.0f;  // LoadFeature(load)
  w.fc1_bias = {0.0f};
  w.fc2_weight = {1.0f};
  w.fc2_bias = {0.0f};
  w.fc3_weight = {2.0f, 0.0f};  // q_continue = 2 * LoadFeature(load) (0 when load-blind)
  w.fc3_bias = {0.0f, 1.0f};    // q_exit = 1
  auto network = policy::dqn::QNetwork::Create(w);
  EXPECT_TRUE(network.ok()) << network.status();
  policy::dqn::PolicyMetadata m;
  m.version = version;
  m.model_fingerprint = "07e04f79d11d13b5";  // lede-tiny's (lede-bench refuses another)
  m.decision.candidate_layers = {1, 2, 3, 4, 5, 6};
  m.decision.max_draft_len = 4;
  m.decision.probe_candidates = false;
  m.decision.lookahead_probe = false;
  const std::string out = (dir / version).string();
  if (network.ok()) {
    const Status saved = policy::dqn::SaveArtifact(out, policy::dqn::Artifact{m, *network});
    EXPECT_TRUE(saved.ok()) << saved;
  }
  return out;
}

// `lede-bench load` of `policy` at loads 1 and 256 (32 new tokens): its
// JSON report and printed table.
void RunAloneAndFull(const std::string& policy, nlohmann::json* report, std::string* table) {
  ::lede::testing::TempDir dir;
  const std::string json = (dir.path() / "load.json").string();
  std::vector<std::string> flags = Flags(json, {"--policy", policy});
  for (size_t i = 0; i + 1 < flags.size(); ++i) {
    if (flags[i] == "--loads") flags[i + 1] = "1,256";
    if (flags[i] == "--new-tokens") flags[i + 1] = "32";
  }
  std::ostringstream out, err;
  ASSERT_EQ(RunLoad(flags, out, err), 0) << err.str();
  *report = nlohmann::json::parse(std::ifstream(json));
  *table = out.str();
}

TEST(LoadBenchTest, PricesEveryMethodAtEveryLoad) {
  ::lede::testing::TempDir dir;
  const std::string json = (dir.path() / "load.json").string();
  std::ostringstream out, err;
  const std::string policy = SaveStaticLikePolicy(dir.path(), "static-like-v1", /*load_aware=*/false);
  ASSERT_EQ(RunLoad(Flags(json, {"--policy", policy}), out, err), 0) << err.str();
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(json));
  const nlohmann::json& rows = j.at("sets").at("story");
  // Accelerator at 1, 4 and 64; measured only up to the largest timed batch
  // size (16), so at 1 and 4.
  ASSERT_EQ(rows.size(), 5u) << rows.dump(1);
  for (const nlohmann::json& row : rows) {
    const double tuned_b = row.at("static_tuned_at_load").at("speedup").get<double>();
    const double tuned_1 = row.at("static_tuned_alone").at("speedup").get<double>();
    EXPECT_GT(tuned_b, 0.0);
    EXPECT_GT(row.at("lede").at("static-like-v1").get<double>(), 0.0);
    if (row.at("load") == 1) {
      // At B = 1 both static rows are the same tuning.
      EXPECT_EQ(row.at("static_tuned_at_load").at("setting"), row.at("static_tuned_alone").at("setting"));
      EXPECT_DOUBLE_EQ(tuned_b, tuned_1);
    }
    if (row.at("cost_model") == "accelerator" && row.at("load") != 64) {
      // Below the ridge (256 tokens) a load changes no accelerator price.
      EXPECT_DOUBLE_EQ(tuned_b, tuned_1);
    }
  }
  EXPECT_NE(out.str().find("static tuned at B"), std::string::npos) << out.str();
}

// A load-aware policy sees the load: it speculates alone and decodes
// autoregressively (exactly 1x) at 256 sessions, where the accelerator
// roofline makes a verification of K drafts cost K + 1 steps.
TEST(LoadBenchTest, LoadAwarePolicyStopsSpeculatingUnderFullLoad) {
  ::lede::testing::TempDir dir;
  const std::string policy = SaveStaticLikePolicy(dir.path(), "load-aware-v1", /*load_aware=*/true);
  nlohmann::json j;
  std::string out;
  ASSERT_NO_FATAL_FAILURE(RunAloneAndFull(policy, &j, &out));
  for (const nlohmann::json& row : j.at("sets").at("story")) {
    if (row.at("cost_model") != "accelerator") continue;
    const double lede = row.at("lede").at("load-aware-v1").get<double>();
    if (row.at("load") == 1) {
      EXPECT_GT(lede, 1.2) << row.dump();
    } else if (row.at("load") == 256) {
      EXPECT_DOUBLE_EQ(lede, 1.0) << row.dump();
    }
  }
}

// A load-blind policy keeps speculating at 256 sessions, where it loses to
// autoregressive decoding under the accelerator roofline; the
// --speculation-max-load tuned for it on the tuning split is 1, so at 256 it
// decodes autoregressively (exactly 1x) and alone it is the policy itself.
TEST(LoadBenchTest, TunesASpeculationMaxLoadPerCostModel) {
  ::lede::testing::TempDir dir;
  const std::string policy = SaveStaticLikePolicy(dir.path(), "static-like-v1", /*load_aware=*/false);
  nlohmann::json j;
  std::string out;
  ASSERT_NO_FATAL_FAILURE(RunAloneAndFull(policy, &j, &out));
  int checked = 0;
  for (const nlohmann::json& row : j.at("sets").at("story")) {
    if (row.at("cost_model") != "accelerator") continue;
    const double lede = row.at("lede").at("static-like-v1").get<double>();
    const nlohmann::json& capped = row.at("lede_max_load").at("static-like-v1");
    EXPECT_EQ(capped.at("max_load"), 1) << row.dump();
    if (row.at("load") == 1) {
      EXPECT_GT(lede, 1.2) << row.dump();
      EXPECT_DOUBLE_EQ(capped.at("speedup").get<double>(), lede);
    } else {
      EXPECT_LT(lede, 1.0) << row.dump();
      EXPECT_DOUBLE_EQ(capped.at("speedup").get<double>(), 1.0);
    }
    ++checked;
  }
  EXPECT_EQ(checked, 2);
  EXPECT_NE(out.find("(C=1)"), std::string::npos) << out;
}

// Loads beyond the calibration's largest timed batch size (16) have no
// measured price: with only such loads the table holds the accelerator's
// rows alone, its tuned max load among them.
TEST(LoadBenchTest, LoadsBeyondTheTimedBatchesArePricedByTheAcceleratorAlone) {
  ::lede::testing::TempDir dir;
  const std::string json = (dir.path() / "load.json").string();
  const std::string policy = SaveStaticLikePolicy(dir.path(), "static-like-v1", /*load_aware=*/false);
  std::vector<std::string> flags = Flags(json, {"--policy", policy});
  for (size_t i = 0; i + 1 < flags.size(); ++i) {
    if (flags[i] == "--loads") flags[i + 1] = "32,64";
  }
  std::ostringstream out, err;
  ASSERT_EQ(RunLoad(flags, out, err), 0) << err.str();
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(json));
  const nlohmann::json& rows = j.at("sets").at("story");
  ASSERT_EQ(rows.size(), 2u) << rows.dump(1);
  EXPECT_EQ(rows[0].at("load"), 32);
  EXPECT_EQ(rows[1].at("load"), 64);
  for (const nlohmann::json& row : rows) {
    EXPECT_EQ(row.at("cost_model"), "accelerator") << row.dump();
    EXPECT_TRUE(row.at("lede_max_load").contains("static-like-v1")) << row.dump();
  }
  EXPECT_EQ(out.str().find("measured"), std::string::npos) << out.str();
}

TEST(LoadBenchTest, RefusesBadFlagsNamingThem) {
  ::lede::testing::TempDir dir;
  const std::string json = (dir.path() / "load.json").string();
  // A calibration without batch tables.
  nlohmann::json plain = nlohmann::json::parse(std::ifstream(kCalibration));
  for (const char* key : {"batch_sizes", "batch_exit_layer", "batch_context", "batch_step_us", "batch_verify_us",
                          "batch_draft_us"}) {
    plain.erase(key);
  }
  const std::string plain_path = (dir.path() / "plain.json").string();
  std::ofstream(plain_path) << plain.dump();
  struct Bad {
    std::vector<std::string> extra;
    std::string names;
  };
  for (const Bad& bad : {Bad{{"--loads", "0,4"}, "--loads"}, Bad{{"--ridge-tokens", "0"}, "--ridge-tokens"},
                         Bad{{"--calibration", plain_path}, "--batch-sizes"},
                         Bad{{"--policy", (dir.path() / "none").string()}, "--policy"}}) {
    std::ostringstream out, err;
    EXPECT_EQ(RunLoad(Flags(json, bad.extra), out, err), 2) << err.str();
    EXPECT_NE(err.str().find(bad.names), std::string::npos) << err.str();
  }
}

}  // namespace
}  // namespace lede::bench
