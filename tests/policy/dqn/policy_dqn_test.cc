// Tests of policy/dqn: QNetwork (against a libtorch reference),
// DqnExitController, policy artifacts and the SERVING pointer.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/relu.h>
#include <nlohmann/json.hpp>
#include <ATen/Context.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policy/dqn/artifact.h"
#include "policy/dqn/artifact_store.h"
#include "policy/dqn/dqn_exit_controller.h"
#include "policy/dqn/q_network.h"
#include "shared/file/sha256.h"
#include "shared/model/loaders/checkpoint.h"
#include "shared/storage/object_store.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace lede::policy::dqn {
namespace {

namespace fs = std::filesystem;
using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using Json = nlohmann::json;
constexpr int kIn = speculation::kExitFeatureDim;

at::Tensor ToTensor(const std::vector<float>& v, std::vector<int64_t> shape) {
  at::Tensor t = at::empty(shape, at::kFloat);
  std::copy(v.begin(), v.end(), t.data_ptr<float>());
  return t;
}

// A 1-unit network with q = [0.5, relu(top1_prob)]: exits iff top1_prob > 0.5.
QNetwork ThresholdNetwork() {
  QNetworkWeights w;
  w.hidden = 1;
  w.fc1_weight.assign(kIn, 0.0f);
  w.fc1_weight[3] = 1.0f;  // top1_prob
  w.fc1_bias = {0.0f};
  w.fc2_weight = {1.0f};
  w.fc2_bias = {0.0f};
  w.fc3_weight = {0.0f, 1.0f};
  w.fc3_bias = {0.5f, 0.0f};
  auto net = QNetwork::Create(std::move(w));
  EXPECT_THAT(net, IsOk());
  return *net;
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
}

class ArtifactTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(tmp_.path().empty());
    root_ = tmp_.path().string();
  }

  static Artifact MakeArtifact(const std::string& version, uint64_t seed = 1) {
    PolicyMetadata m;
    m.version = version;
    m.model_fingerprint = "0123456789abcdef";
    m.decision.candidate_layers = {2, 4, 6};
    m.decision.max_draft_len = 6;
    m.decision.top_k = 4;
    m.decision.trace_window = 8;
    m.gamma = 0.99;
    m.n_step = 3;
    m.seed = seed;
    m.training_options = {{"lr", 1e-3}, {"batch_size", 128}};
    m.training_data.first_shard = "a.lexp";
    m.training_data.last_shard = "c.lexp";
    m.training_data.n_shards = 3;
    m.training_data.n_transitions = 1234;
    m.training_data.behaviour_versions = {"explore-0"};
    m.offline_metrics = {{"heldout_td_loss", 0.25}, {"heldout_matched_return", std::nan("")}};
    return Artifact{m, QNetwork::Random(16, seed)};
  }

  std::string Dir(const std::string& name) const { return (fs::path(root_) / name).string(); }

  // Rewrites policy.json of `dir` through `edit`.
  static void EditJson(const std::string& dir, const std::function<void(Json&)>& edit) {
    const std::string path = dir + "/" + kMetadataFile;
    Json j = Json::parse(ReadFile(path));
    edit(j);
    WriteFile(path, j.dump(2));
  }

  // Replaces policy.safetensors of `dir` with `tensors` and updates the
  // checksum, so that only the tensors' content is wrong.
  static void ReplaceWeights(const std::string& dir, const std::map<std::string, at::Tensor>& tensors) {
    const std::string path = dir + "/" + kWeightsFile;
    ASSERT_THAT(model::loaders::WriteSafetensors(path, tensors), IsOk());
    const std::string sha = file::Sha256Hex(ReadFile(path));
    EditJson(dir, [&sha](Json& j) { j["weights_sha256"] = sha; });
  }

  static std::map<std::string, at::Tensor> Tensors(const QNetworkWeights& w) {
    const int64_t h = w.hidden;
    return {{"fc1.weight", ToTensor(w.fc1_weight, {h, kIn})}, {"fc1.bias", ToTensor(w.fc1_bias, {h})},
            {"fc2.weight", ToTensor(w.fc2_weight, {h, h})},   {"fc2.bias", ToTensor(w.fc2_bias, {h})},
            {"fc3.weight", ToTensor(w.fc3_weight, {2, h})},   {"fc3.bias", ToTensor(w.fc3_bias, {2})}};
  }

  lede::testing::TempDir tmp_;
  std::string root_;
};

// The plain-C++ forward equals fc3(relu(fc2(relu(fc1(x))))) in libtorch within 1e-5.
TEST(QNetworkTest, ForwardMatchesLibtorchReference) {
  at::manual_seed(0);  // torch::manual_seed
  for (int hidden : {1, 7, 64}) {
    const QNetwork net = QNetwork::Random(hidden, /*seed=*/hidden);
    const QNetworkWeights& w = net.weights();
    const int64_t h = hidden;
    const at::Tensor x = at::randn({200, kIn}).mul(2.0);
    const at::Tensor ref =
        at::linear(at::relu(at::linear(at::relu(at::linear(x, ToTensor(w.fc1_weight, {h, kIn}),
                                                           ToTensor(w.fc1_bias, {h}))),
                                       ToTensor(w.fc2_weight, {h, h}), ToTensor(w.fc2_bias, {h}))),
                   ToTensor(w.fc3_weight, {2, h}), ToTensor(w.fc3_bias, {2}))
            .contiguous();
    const at::Tensor xc = x.contiguous();
    for (int64_t i = 0; i < x.size(0); ++i) {
      float q[kNumActions];
      net.Forward(xc.data_ptr<float>() + i * kIn, q);
      EXPECT_NEAR(q[0], ref[i][0].item<float>(), 1e-5) << "hidden " << hidden << " row " << i;
      EXPECT_NEAR(q[1], ref[i][1].item<float>(), 1e-5) << "hidden " << hidden << " row " << i;
    }
  }
}

// Wrong sizes, non-finite values and out-of-range widths are refused.
TEST(QNetworkTest, CreateRejectsBadWeights) {
  QNetworkWeights good = QNetwork::Random(8, 1).weights();
  EXPECT_THAT(QNetwork::Create(good), IsOk());
  QNetworkWeights w = good;
  w.fc2_weight.pop_back();
  EXPECT_THAT(QNetwork::Create(w), StatusIs(StatusCode::kInvalidArgument));
  w = good;
  w.fc3_bias[1] = std::nanf("");
  EXPECT_THAT(QNetwork::Create(w), StatusIs(StatusCode::kInvalidArgument));
  w = good;
  w.hidden = 0;
  EXPECT_THAT(QNetwork::Create(w), StatusIs(StatusCode::kInvalidArgument));
  w = good;
  w.hidden = kMaxHidden + 1;
  EXPECT_THAT(QNetwork::Create(w), StatusIs(StatusCode::kInvalidArgument));
}

// Random() is a function of (hidden, seed) only.
TEST(QNetworkTest, RandomIsDeterministic) {
  EXPECT_EQ(QNetwork::Random(16, 5).weights().fc2_weight, QNetwork::Random(16, 5).weights().fc2_weight);
  EXPECT_NE(QNetwork::Random(16, 5).weights().fc2_weight, QNetwork::Random(16, 6).weights().fc2_weight);
}

// Decide returns argmax_a Q(ExitFeatures(s), a), ties going to kContinue.
TEST(DqnExitControllerTest, DecidePicksArgmax) {
  DqnExitController c(std::make_shared<const QNetwork>(ThresholdNetwork()), "v7");
  EXPECT_EQ(c.name(), "dqn:v7");
  speculation::ExitState s;
  s.n_layers = 8;
  s.layer = 2;
  s.top1_prob = 0.9f;
  EXPECT_EQ(c.Decide(s), speculation::Action::kExit);
  EXPECT_FLOAT_EQ(c.last_q()[0], 0.5f);
  EXPECT_FLOAT_EQ(c.last_q()[1], 0.9f);
  s.top1_prob = 0.2f;
  EXPECT_EQ(c.Decide(s), speculation::Action::kContinue);
  s.top1_prob = 0.5f;  // q = [0.5, 0.5]: a tie
  EXPECT_EQ(c.Decide(s), speculation::Action::kContinue);
  s.phase = speculation::Phase::kDraftLength;
  s.top1_prob = 0.75f;
  EXPECT_EQ(c.Decide(s), speculation::Action::kExit);
}

// Decide agrees with argmax of Forward on random states of random networks
// (several seeds, so that both actions occur whatever one seed draws).
TEST(DqnExitControllerTest, DecideAgreesWithForwardOnRandomStates) {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  int exits = 0, continues = 0;
  for (int i = 0; i < 2000; ++i) {
    auto net = std::make_shared<const QNetwork>(QNetwork::Random(64, 7 + i / 250));
    DqnExitController c(net, "r");
    speculation::ExitState s;
    s.phase = u(rng) < 0.5f ? speculation::Phase::kExitLayer : speculation::Phase::kDraftLength;
    s.n_layers = 16;
    s.layer = 1 + static_cast<int>(u(rng) * 14);
    s.max_draft_len = 8;
    s.draft_pos = static_cast<int>(u(rng) * 8);
    s.top1_prob = u(rng);
    s.top_k_nll = 8 * u(rng) - 2;
    s.entropy = 8 * u(rng) - 2;
    s.trace_nll = 8 * u(rng) - 2;
    s.lookup_match = u(rng) < 0.5f ? 1.0f : 0.0f;
    s.trigram_seen = u(rng) < 0.5f ? 1.0f : 0.0f;
    s.load = 1 + static_cast<int32_t>(u(rng) * 64);
    s.cost = {u(rng), 2 * u(rng), u(rng)};
    float f[kIn], q[kNumActions];
    speculation::ExitFeatures(s, f);
    net->Forward(f, q);
    const speculation::Action a = c.Decide(s);
    EXPECT_EQ(a, q[1] > q[0] ? speculation::Action::kExit : speculation::Action::kContinue);
    exits += a == speculation::Action::kExit;
    continues += a == speculation::Action::kContinue;
  }
  EXPECT_GT(exits, 0);  // the check is not vacuous
  EXPECT_GT(continues, 0);
}

// Save then Load gives back the same weights, decisions and metadata.
TEST_F(ArtifactTest, RoundTripPreservesWeightsAndMetadata) {
  const Artifact a = MakeArtifact("v1");
  ASSERT_THAT(SaveArtifact(Dir("v1"), a), IsOk());
  EXPECT_TRUE(fs::exists(Dir("v1") + "/policy.safetensors"));
  auto b = LoadArtifact(Dir("v1"), "0123456789abcdef");
  ASSERT_THAT(b, IsOk());
  const QNetworkWeights& wa = a.network.weights();
  const QNetworkWeights& wb = b->network.weights();
  EXPECT_EQ(wb.hidden, 16);
  EXPECT_EQ(wa.fc1_weight, wb.fc1_weight);
  EXPECT_EQ(wa.fc1_bias, wb.fc1_bias);
  EXPECT_EQ(wa.fc2_weight, wb.fc2_weight);
  EXPECT_EQ(wa.fc2_bias, wb.fc2_bias);
  EXPECT_EQ(wa.fc3_weight, wb.fc3_weight);
  EXPECT_EQ(wa.fc3_bias, wb.fc3_bias);
  const PolicyMetadata& m = b->metadata;
  EXPECT_EQ(m.version, "v1");
  EXPECT_EQ(m.model_fingerprint, "0123456789abcdef");
  EXPECT_EQ(m.decision.candidate_layers, (std::vector<int32_t>{2, 4, 6}));
  EXPECT_EQ(m.decision.max_draft_len, 6);
  EXPECT_EQ(m.decision.top_k, 4);
  EXPECT_EQ(m.decision.trace_window, 8);
  EXPECT_EQ(m.reward_cost_model, "accelerator");
  EXPECT_DOUBLE_EQ(m.gamma, 0.99);
  EXPECT_EQ(m.n_step, 3);
  EXPECT_EQ(m.seed, 1u);
  EXPECT_DOUBLE_EQ(m.training_options.at("lr"), 1e-3);
  EXPECT_EQ(m.training_data.first_shard, "a.lexp");
  EXPECT_EQ(m.training_data.last_shard, "c.lexp");
  EXPECT_EQ(m.training_data.n_transitions, 1234);
  EXPECT_EQ(m.training_data.behaviour_versions, std::vector<std::string>{"explore-0"});
  EXPECT_DOUBLE_EQ(m.offline_metrics.at("heldout_td_loss"), 0.25);
  EXPECT_TRUE(std::isnan(m.offline_metrics.at("heldout_matched_return")));
  EXPECT_EQ(m.weights_sha256, file::Sha256Hex(ReadFile(Dir("v1") + "/policy.safetensors")));
  // The JSON names the format and the feature spec.
  const Json j = Json::parse(ReadFile(Dir("v1") + "/policy.json"));
  EXPECT_EQ(j.at("format"), "lede-dqn-v1");
  EXPECT_EQ(j.at("features").at("dim"), kIn);
  EXPECT_EQ(j.at("features").at("names").size(), static_cast<size_t>(kIn));
}

// A saved version is immutable unless overwriting is asked for.
TEST_F(ArtifactTest, SavingOverAnExistingVersionIsAlreadyExists) {
  ASSERT_THAT(SaveArtifact(Dir("v1"), MakeArtifact("v1", 1)), IsOk());
  EXPECT_THAT(SaveArtifact(Dir("v1"), MakeArtifact("v1", 2)), StatusIs(StatusCode::kAlreadyExists));
  EXPECT_THAT(SaveArtifact(Dir("v1"), MakeArtifact("v1", 2), /*overwrite=*/true), IsOk());
  auto b = LoadArtifact(Dir("v1"));
  ASSERT_THAT(b, IsOk());
  EXPECT_EQ(b->metadata.seed, 2u);
}

// Bad version names and decision specs are refused before anything is written.
TEST_F(ArtifactTest, SaveRejectsBadVersionAndSpec) {
  EXPECT_THAT(SaveArtifact(Dir("x"), MakeArtifact("../evil")), StatusIs(StatusCode::kInvalidArgument));
  Artifact a = MakeArtifact("v1");
  a.metadata.decision.candidate_layers = {4, 2};
  EXPECT_THAT(SaveArtifact(Dir("x"), a), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_FALSE(fs::exists(Dir("x") + "/policy.json"));
}

// One flipped byte in the weights is a checksum mismatch.
TEST_F(ArtifactTest, CorruptedWeightsAreChecksumMismatch) {
  ASSERT_THAT(SaveArtifact(Dir("v1"), MakeArtifact("v1")), IsOk());
  const std::string path = Dir("v1") + "/policy.safetensors";
  std::string bytes = ReadFile(path);
  bytes[bytes.size() - 3] ^= 0x10;
  WriteFile(path, bytes);
  EXPECT_THAT(LoadArtifact(Dir("v1")), StatusIs(StatusCode::kInvalidArgument));
}

// Tensors of the wrong shape, missing or extra tensors, and a hidden size
// that disagrees with the tensors are refused even with a valid checksum.
TEST_F(ArtifactTest, WrongShapesAreInvalidArgument) {
  const Artifact a = MakeArtifact("v1");
  ASSERT_THAT(SaveArtifact(Dir("v1"), a), IsOk());
  ASSERT_THAT(LoadArtifact(Dir("v1")), IsOk());

  auto tensors = Tensors(a.network.weights());
  tensors["fc2.weight"] = at::empty({16, 17}, at::kFloat).fill_(0.1);
  ReplaceWeights(Dir("v1"), tensors);
  EXPECT_THAT(LoadArtifact(Dir("v1")), StatusIs(StatusCode::kInvalidArgument));

  tensors = Tensors(a.network.weights());
  tensors.erase("fc3.bias");
  ReplaceWeights(Dir("v1"), tensors);
  EXPECT_THAT(LoadArtifact(Dir("v1")), StatusIs(StatusCode::kInvalidArgument));

  tensors = Tensors(a.network.weights());
  tensors["fc4.weight"] = at::empty({2, 2}, at::kFloat).fill_(0);
  ReplaceWeights(Dir("v1"), tensors);
  EXPECT_THAT(LoadArtifact(Dir("v1")), StatusIs(StatusCode::kInvalidArgument));

  ReplaceWeights(Dir("v1"), Tensors(a.network.weights()));
  ASSERT_THAT(LoadArtifact(Dir("v1")), IsOk());
  EditJson(Dir("v1"), [](Json& j) { j["network"]["hidden"] = 32; });
  EXPECT_THAT(LoadArtifact(Dir("v1")), StatusIs(StatusCode::kInvalidArgument));
}

// An artifact trained on other features (dim or names) is refused.
TEST_F(ArtifactTest, WrongFeatureSpecIsInvalidArgument) {
  ASSERT_THAT(SaveArtifact(Dir("v1"), MakeArtifact("v1")), IsOk());
  EditJson(Dir("v1"), [](Json& j) { j["features"]["dim"] = kIn + 1; });
  EXPECT_THAT(LoadArtifact(Dir("v1")), StatusIs(StatusCode::kInvalidArgument));

  ASSERT_THAT(SaveArtifact(Dir("v2"), MakeArtifact("v2")), IsOk());
  EditJson(Dir("v2"), [](Json& j) { j["features"]["names"][3] = "top2_prob"; });
  EXPECT_THAT(LoadArtifact(Dir("v2")), StatusIs(StatusCode::kInvalidArgument));

  ASSERT_THAT(SaveArtifact(Dir("v3"), MakeArtifact("v3")), IsOk());
  EditJson(Dir("v3"), [](Json& j) { j["format"] = "lede-dqn-v0"; });
  EXPECT_THAT(LoadArtifact(Dir("v3")), StatusIs(StatusCode::kInvalidArgument));

  ASSERT_THAT(SaveArtifact(Dir("v4"), MakeArtifact("v4")), IsOk());
  WriteFile(Dir("v4") + "/policy.json", "{ not json");
  EXPECT_THAT(LoadArtifact(Dir("v4")), StatusIs(StatusCode::kInvalidArgument));
}

// A policy of lede-features-v3 (trained before the load feature), v4
// (before the cost profile) or v5 (before the temperature) is read with a
// zero weight on what it lacks: its Q-values are what they were, at any
// load, cost profile and temperature. Another spec is refused, naming it
// and the spec this build computes.
TEST_F(ArtifactTest, OlderSpecsReadWithZeroWeightsOnWhatTheyLack) {
  for (const auto& [spec, dim] : std::vector<std::pair<std::string, int>>{{"lede-features-v3", 13},
                                                                            {"lede-features-v4", 14},
                                                                            {"lede-features-v5", 17}}) {
    SCOPED_TRACE(spec);
    const std::string dir = Dir(spec);
    const Artifact a = MakeArtifact("v3");
    ASSERT_THAT(SaveArtifact(dir, a), IsOk());
    const QNetworkWeights& w = a.network.weights();
    std::map<std::string, at::Tensor> tensors = Tensors(w);
    tensors["fc1.weight"] = tensors["fc1.weight"].slice(/*dim=*/1, 0, dim).contiguous();
    ReplaceWeights(dir, tensors);
    EditJson(dir, [spec = spec, dim = dim](Json& j) {
      j["features"]["spec"] = spec;
      j["features"]["dim"] = dim;
      Json names = Json::array();
      for (int c = 0; c < dim; ++c) names.push_back(j["features"]["names"][c]);
      j["features"]["names"] = names;
    });
    auto loaded = LoadArtifact(dir);
    ASSERT_THAT(loaded, IsOk());
    const QNetworkWeights& got = loaded->network.weights();
    ASSERT_EQ(got.fc1_weight.size(), w.fc1_weight.size());
    for (int32_t r = 0; r < w.hidden; ++r) {
      for (int c = 0; c < dim; ++c) EXPECT_EQ(got.fc1_weight[r * kIn + c], w.fc1_weight[r * kIn + c]);
      for (int c = dim; c < kIn; ++c) EXPECT_EQ(got.fc1_weight[r * kIn + c], 0.0f) << "row " << r << " col " << c;
    }
    speculation::ExitState s;
    s.phase = speculation::Phase::kDraftLength;
    s.layer = 2;
    s.n_layers = 12;
    s.top1_prob = 0.7f;
    float f_old[kIn], f_new[kIn], q_old[kNumActions], q_new[kNumActions];
    s.load = 1;
    speculation::ExitFeatures(s, f_old);
    s.temperature = 0.8f;
    if (dim <= 14) s.cost = {0.2f, 1.1f, 0.4f};  // v3 and v4 lack the cost profile too
    if (dim == 13) s.load = 64;                   // v3 lacks the load too
    speculation::ExitFeatures(s, f_new);
    ASSERT_NE(f_old[kIn - 1], f_new[kIn - 1]);
    loaded->network.Forward(f_old, q_old);
    loaded->network.Forward(f_new, q_new);
    for (int k = 0; k < kNumActions; ++k) EXPECT_EQ(q_old[k], q_new[k]);
  }

  ASSERT_THAT(SaveArtifact(Dir("v9"), MakeArtifact("v9")), IsOk());
  EditJson(Dir("v9"), [](Json& j) { j["features"]["spec"] = "lede-features-v9"; });
  EXPECT_THAT(LoadArtifact(Dir("v9")), StatusIs(StatusCode::kInvalidArgument,
                                                ::testing::AllOf(::testing::HasSubstr("lede-features-v9"), ::testing::HasSubstr("lede-features-v4"))));
}

// A missing directory, policy.json or policy.safetensors is NOT_FOUND.
TEST_F(ArtifactTest, MissingFilesAreNotFound) {
  EXPECT_THAT(LoadArtifact(Dir("nope")), StatusIs(StatusCode::kNotFound));
  ASSERT_THAT(SaveArtifact(Dir("v1"), MakeArtifact("v1")), IsOk());
  fs::remove(Dir("v1") + "/policy.safetensors");
  EXPECT_THAT(LoadArtifact(Dir("v1")), StatusIs(StatusCode::kNotFound));
  ASSERT_THAT(SaveArtifact(Dir("v2"), MakeArtifact("v2")), IsOk());
  fs::remove(Dir("v2") + "/policy.json");
  EXPECT_THAT(LoadArtifact(Dir("v2")), StatusIs(StatusCode::kNotFound));
}

// A policy trained for another model is refused when the serving model's fingerprint is given.
TEST_F(ArtifactTest, FingerprintMismatchIsInvalidArgument) {
  ASSERT_THAT(SaveArtifact(Dir("v1"), MakeArtifact("v1")), IsOk());
  EXPECT_THAT(LoadArtifact(Dir("v1"), "fedcba9876543210"), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(LoadArtifact(Dir("v1"), "0123456789abcdef"), IsOk());
  EXPECT_THAT(LoadArtifact(Dir("v1")), IsOk());
}

// For a host whose hardware calls for another cost model than SERVING's: of
// the versions trained with that cost model, the one trained on the most
// requests, the last by name among equals; versions of other cost models,
// or that do not load, are passed over.
TEST_F(ArtifactTest, BroadestVersionIsTheOneTrainedOnTheMostRequests) {
  const std::string model_dir = Dir("tiny");
  auto save = [&](const std::string& version, const std::string& cost_model, int64_t requests) {
    Artifact a = MakeArtifact(version);
    a.metadata.reward_cost_model = cost_model;
    a.metadata.training_data.n_requests = requests;
    ASSERT_THAT(SaveArtifact(VersionDir(model_dir, version), a), IsOk());
  };
  EXPECT_THAT(LoadBroadestVersion(model_dir, "accelerator"), StatusIs(StatusCode::kNotFound));
  save("acc-v5", "accelerator", 900);
  save("acc-v6", "accelerator", 900);
  save("story-acc-v5", "accelerator", 450);  // last by name, fewer requests
  save("meas-v8", "measured", 5000);
  std::filesystem::create_directories(VersionDir(model_dir, "unfinished-v9"));  // no policy.json
  auto a = LoadBroadestVersion(model_dir, "accelerator");
  ASSERT_THAT(a, IsOk());
  EXPECT_EQ(a->metadata.version, "acc-v6");
  auto m = LoadBroadestVersion(model_dir, "measured", "0123456789abcdef");
  ASSERT_THAT(m, IsOk());
  EXPECT_EQ(m->metadata.version, "meas-v8");
  EXPECT_THAT(LoadBroadestVersion(model_dir, "measured", "fedcba9876543210"), StatusIs(StatusCode::kNotFound));
}

// Publishing moves SERVING atomically to a valid version; resolving reads it back.
TEST_F(ArtifactTest, ServingPointerPublishAndResolve) {
  const std::string model_dir = Dir("stories");
  EXPECT_THAT(ResolveServingVersion(model_dir), StatusIs(StatusCode::kNotFound));
  ASSERT_THAT(SaveArtifact(VersionDir(model_dir, "v1"), MakeArtifact("v1", 1)), IsOk());
  ASSERT_THAT(SaveArtifact(VersionDir(model_dir, "v2"), MakeArtifact("v2", 2)), IsOk());

  ASSERT_THAT(PublishServingVersion(model_dir, "v1"), IsOk());
  auto v = ResolveServingVersion(model_dir);
  ASSERT_THAT(v, IsOk());
  EXPECT_EQ(*v, "v1");

  ASSERT_THAT(PublishServingVersion(model_dir, "v2", "0123456789abcdef"), IsOk());
  auto a = LoadServingArtifact(model_dir, "0123456789abcdef");
  ASSERT_THAT(a, IsOk());
  EXPECT_EQ(a->metadata.version, "v2");
  EXPECT_EQ(a->metadata.seed, 2u);

  // Refused publications leave the pointer where it was.
  EXPECT_THAT(PublishServingVersion(model_dir, "v3"), StatusIs(StatusCode::kNotFound));
  EXPECT_THAT(PublishServingVersion(model_dir, "v1", "fedcba9876543210"),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(PublishServingVersion(model_dir, "../v1"), StatusIs(StatusCode::kInvalidArgument));
  fs::copy(VersionDir(model_dir, "v1"), VersionDir(model_dir, "v1-copy"));  // names version "v1"
  EXPECT_THAT(PublishServingVersion(model_dir, "v1-copy"), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_EQ(*ResolveServingVersion(model_dir), "v2");
  for (const auto& entry : fs::directory_iterator(model_dir)) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos) << entry.path();
  }

  WriteFile(model_dir + "/SERVING", "../../etc\n");
  EXPECT_THAT(ResolveServingVersion(model_dir), StatusIs(StatusCode::kInvalidArgument));
}

// ------------------------------------------------- through an object store

// A publisher's policy root, a store (a local directory behind the same
// ObjectStore interface as S3) and a reader's mirror.
class ArtifactStoreTest : public ArtifactTest {
 protected:
  void SetUp() override {
    ArtifactTest::SetUp();
    auto store = storage::OpenObjectStore(Dir("store"));
    ASSERT_THAT(store, IsOk());
    store_ = std::move(*store);
    fs::create_directories(Dir("mirror"));
  }
  std::string Publisher(const std::string& version) const { return VersionDir(Dir("publisher"), version); }
  // Hidden leftovers (download directories) in the mirror.
  int HiddenEntries() const {
    int n = 0;
    for (const auto& e : fs::directory_iterator(Dir("mirror"))) n += e.path().filename().string()[0] == '.';
    return n;
  }
  std::unique_ptr<storage::ObjectStore> store_;
};

TEST_F(ArtifactStoreTest, PublishedVersionIsMirroredAndServed) {
  ASSERT_THAT(SaveArtifact(Publisher("v1"), MakeArtifact("v1")), IsOk());
  WriteFile(Publisher("v1") + "/report.json", "{}");
  ASSERT_THAT(UploadVersion(*store_, Dir("publisher"), "v1", /*set_serving=*/true), IsOk());
  StatusOr<std::string> v = MirrorServingVersion(*store_, Dir("mirror"));
  ASSERT_THAT(v, IsOk());
  EXPECT_EQ(*v, "v1");
  StatusOr<Artifact> served = LoadServingArtifact(Dir("mirror"));
  ASSERT_THAT(served, IsOk());
  EXPECT_EQ(served->metadata.version, "v1");
  EXPECT_TRUE(fs::exists(VersionDir(Dir("mirror"), "v1") + "/report.json"));
  // A second mirror pass with nothing new changes nothing and succeeds.
  EXPECT_THAT(MirrorServingVersion(*store_, Dir("mirror")), IsOk());

  // The next version replaces it.
  ASSERT_THAT(SaveArtifact(Publisher("v2"), MakeArtifact("v2", 2)), IsOk());
  ASSERT_THAT(UploadVersion(*store_, Dir("publisher"), "v2", /*set_serving=*/true), IsOk());
  ASSERT_THAT(MirrorServingVersion(*store_, Dir("mirror")), IsOk());
  EXPECT_EQ(*ResolveServingVersion(Dir("mirror")), "v2");
  EXPECT_EQ(HiddenEntries(), 0);
}

// SERVING moves only when asked, after the files.
TEST_F(ArtifactStoreTest, UploadWithoutServingLeavesThePointer) {
  ASSERT_THAT(SaveArtifact(Publisher("v1"), MakeArtifact("v1")), IsOk());
  ASSERT_THAT(UploadVersion(*store_, Dir("publisher"), "v1", /*set_serving=*/false), IsOk());
  EXPECT_THAT(store_->Get(kServingFile), StatusIs(StatusCode::kNotFound));
  EXPECT_THAT(MirrorServingVersion(*store_, Dir("mirror")), StatusIs(StatusCode::kNotFound));
}

// A version whose policy.json has not arrived (an upload in progress, or
// a SERVING written out of order) is not served; the mirror keeps serving
// what it had and keeps no partial download.
TEST_F(ArtifactStoreTest, UnfinishedUploadIsNotServed) {
  ASSERT_THAT(SaveArtifact(Publisher("v1"), MakeArtifact("v1")), IsOk());
  ASSERT_THAT(UploadVersion(*store_, Dir("publisher"), "v1", true), IsOk());
  ASSERT_THAT(MirrorServingVersion(*store_, Dir("mirror")), IsOk());
  ASSERT_THAT(SaveArtifact(Publisher("v2"), MakeArtifact("v2", 2)), IsOk());
  ASSERT_THAT(store_->Put("v2/" + std::string(kWeightsFile), ReadFile(Publisher("v2") + "/" + kWeightsFile)), IsOk());
  ASSERT_THAT(store_->Put(kServingFile, "v2\n"), IsOk());
  EXPECT_THAT(MirrorServingVersion(*store_, Dir("mirror")), StatusIs(StatusCode::kNotFound));
  EXPECT_EQ(*ResolveServingVersion(Dir("mirror")), "v1");
  EXPECT_FALSE(fs::exists(VersionDir(Dir("mirror"), "v2")));
  EXPECT_EQ(HiddenEntries(), 0);
}

// Weights that do not match policy.json's checksum (a version re-uploaded
// over itself, or a corrupt object) fail validation and are not mirrored.
TEST_F(ArtifactStoreTest, TornVersionIsRefused) {
  ASSERT_THAT(SaveArtifact(Publisher("v1"), MakeArtifact("v1")), IsOk());
  ASSERT_THAT(UploadVersion(*store_, Dir("publisher"), "v1", true), IsOk());
  ASSERT_THAT(MirrorServingVersion(*store_, Dir("mirror")), IsOk());
  ASSERT_THAT(SaveArtifact(Publisher("v2"), MakeArtifact("v2", 2)), IsOk());
  ASSERT_THAT(store_->Put("v2/" + std::string(kWeightsFile), ReadFile(Publisher("v1") + "/" + kWeightsFile)), IsOk());
  ASSERT_THAT(store_->Put("v2/" + std::string(kMetadataFile), ReadFile(Publisher("v2") + "/" + kMetadataFile)), IsOk());
  ASSERT_THAT(store_->Put(kServingFile, "v2\n"), IsOk());
  EXPECT_THAT(MirrorServingVersion(*store_, Dir("mirror")), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_EQ(*ResolveServingVersion(Dir("mirror")), "v1");
  EXPECT_FALSE(fs::exists(VersionDir(Dir("mirror"), "v2")));
  EXPECT_EQ(HiddenEntries(), 0);
}

// Nothing is uploaded for a local version that does not load, and a SERVING
// that names no valid version is refused.
TEST_F(ArtifactStoreTest, BadVersionsAreRefused) {
  EXPECT_THAT(UploadVersion(*store_, Dir("publisher"), "v9", true), StatusIs(StatusCode::kNotFound));
  EXPECT_THAT(UploadVersion(*store_, Dir("publisher"), "../x", true), StatusIs(StatusCode::kInvalidArgument));
  StatusOr<std::vector<storage::ObjectInfo>> objects = store_->List("");
  ASSERT_THAT(objects, IsOk());
  EXPECT_TRUE(objects->empty());
  ASSERT_THAT(store_->Put(kServingFile, "../etc\n"), IsOk());
  EXPECT_THAT(MirrorServingVersion(*store_, Dir("mirror")), StatusIs(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace lede::policy::dqn
