// Tests of trainer/pretrain.h: a tiny LayerSkip run trains, checkpoints,
// resumes from its checkpoint and writes a loadable model with a report;
// continued pretraining starts from a model's weights; mixtures parse.
#include "trainer/pretrain.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "gtest/gtest.h"
#include "shared/model/llama.h"
#include "tests/testing/test_data.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace lede::trainer {
namespace {

using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;

// A two-domain corpus of a few documents each.
void WriteCorpus(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  const std::string story =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
      "One day, she saw a big red ball and wanted to play with it.";
  const std::string code = "def add(a, b):\n    return a + b\n\nclass Box:\n    def __init__(self):\n        self.items = []\n";
  for (const char* split : {"train", "val"}) {
    std::ofstream(dir / (std::string("stories.") + split + ".txt"))
        << story << "\n<|doc|>\n" << story << " The end.\n<|doc|>\n" << story;
    std::ofstream(dir / (std::string("code.") + split + ".txt")) << code << "\n<|doc|>\n" << code << code;
  }
}

PretrainOptions TinyOptions(const std::filesystem::path& root, int64_t steps) {
  PretrainOptions o;
  o.data_dir = (root / "corpus").string();
  o.tokenizer = ::lede::testing::Stories260KDir() + "/tok512.bin";
  o.out_dir = (root / "model").string();
  o.mixture = {{"stories", 0.7}, {"code", 0.3}};
  o.config.dim = 32;
  o.config.hidden_dim = 64;
  o.config.n_layers = 3;
  o.config.n_heads = 4;
  o.config.n_kv_heads = 2;
  o.config.max_seq_len = 64;
  o.batch_size = 2;
  o.seq_len = 16;
  o.steps = steps;
  o.warmup_steps = 1;
  o.checkpoint_every = 2;
  o.eval_tokens = 64;
  o.threads = 1;
  return o;
}

// A run stopped after 2 steps resumes from its checkpoint (weights and
// optimizer state, read back as writable memory) and finishes the schedule.
TEST(PretrainTest, CheckpointsResumesAndWritesModel) {
  ::lede::testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  WriteCorpus(tmp.path() / "corpus");
  ASSERT_THAT(Pretrain(TinyOptions(tmp.path(), 2)), IsOk());
  const std::filesystem::path ckpt = tmp.path() / "model.ckpt";
  ASSERT_TRUE(std::filesystem::exists(ckpt / "state.json"));
  ASSERT_THAT(Pretrain(TinyOptions(tmp.path(), 4)), IsOk());
  nlohmann::json state = nlohmann::json::parse(std::ifstream(ckpt / "state.json"));
  EXPECT_EQ(state["step"].get<int64_t>(), 4);
  nlohmann::json report = nlohmann::json::parse(std::ifstream(tmp.path() / "model" / "report.json"));
  EXPECT_EQ(report["steps"].get<int64_t>(), 4);
  EXPECT_EQ(report["held_out"]["stories"]["perplexity"].size(), 3u);
  auto m = model::LlamaModel::Load((tmp.path() / "model").string(), model::ModelOptions{});
  ASSERT_THAT(m, IsOk());
  EXPECT_EQ((*m)->n_layers(), 3);
  EXPECT_TRUE(std::filesystem::exists(tmp.path() / "model" / "tokenizer.bin") ||
              std::filesystem::exists(tmp.path() / "model" / "tokenizer.model"));
}

// Continued pretraining (init_from) starts from the given model's weights and
// architecture, not a random init: with lr 0 the weights stay exactly those
// of the start model, while the self-distilled early-exit loss runs.
TEST(PretrainTest, InitFromStartsAtTheGivenWeights) {
  ::lede::testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  WriteCorpus(tmp.path() / "corpus");
  ASSERT_THAT(Pretrain(TinyOptions(tmp.path(), 2)), IsOk());
  PretrainOptions o = TinyOptions(tmp.path(), 2);
  o.init_from = (tmp.path() / "model").string();
  o.out_dir = (tmp.path() / "stage2").string();
  o.config.dim = 64;  // ignored: the architecture comes from init_from
  o.lr = 0;
  o.exit_always = 2;
  o.exit_distill = 0.5;
  ASSERT_THAT(Pretrain(o), IsOk());
  auto a = model::LlamaModel::Load((tmp.path() / "model").string(), model::ModelOptions{});
  auto b = model::LlamaModel::Load((tmp.path() / "stage2").string(), model::ModelOptions{});
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  EXPECT_EQ((*b)->config().dim, 32);
  const auto ta = (*a)->NamedTensors(), tb = (*b)->NamedTensors();
  ASSERT_EQ(ta.size(), tb.size());
  for (const auto& [name, t] : ta) EXPECT_TRUE(t.equal(tb.at(name))) << name;
  nlohmann::json report = nlohmann::json::parse(std::ifstream(tmp.path() / "stage2" / "report.json"));
  EXPECT_EQ(report["options"]["init_from"].get<std::string>(), o.init_from);
  EXPECT_EQ(report["options"]["exit_distill"].get<double>(), 0.5);

  // With a learning rate the same run moves away from the start weights.
  o.out_dir = (tmp.path() / "stage2b").string();
  o.checkpoint_dir = (tmp.path() / "stage2b.ckpt").string();
  o.lr = 1e-2;
  ASSERT_THAT(Pretrain(o), IsOk());
  auto c = model::LlamaModel::Load(o.out_dir, model::ModelOptions{});
  ASSERT_THAT(c, IsOk());
  EXPECT_FALSE((*c)->NamedTensors().at("model.layers.0.mlp.down_proj.weight")
                   .equal(ta.at("model.layers.0.mlp.down_proj.weight")));
}

TEST(PretrainTest, RejectsBadDistillWeightAndForeignVocabulary) {
  ::lede::testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  WriteCorpus(tmp.path() / "corpus");
  PretrainOptions o = TinyOptions(tmp.path(), 1);
  o.exit_distill = 1.5;
  EXPECT_THAT(Pretrain(o), StatusIs(StatusCode::kInvalidArgument));
  // lede-tiny's 2048-piece model cannot continue under the 512-piece tokenizer.
  o = TinyOptions(tmp.path(), 1);
  o.init_from = "models/lede-tiny";  // ctest runs in the repository root
  EXPECT_THAT(Pretrain(o), StatusIs(StatusCode::kInvalidArgument));
}

TEST(ParseMixtureTest, ParsesWeightsAndNamesTheBadEntry) {
  auto m = ParseMixture("stories=0.7, code=0.2,tales=0.1");
  ASSERT_THAT(m, IsOk());
  EXPECT_EQ(m->size(), 3u);
  EXPECT_DOUBLE_EQ(m->at("stories"), 0.7);
  EXPECT_DOUBLE_EQ(m->at("tales"), 0.1);
  auto bad = ParseMixture("stories=0.7,code");
  EXPECT_THAT(bad, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_NE(std::string(bad.status().message()).find("'code'"), std::string::npos);
  EXPECT_THAT(ParseMixture("stories=-1"), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseMixture("stories=x"), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseMixture("stories=1,stories=2"), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseMixture("stories=0,code=0"), StatusIs(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace lede::trainer
