// Tests of trainer/pretrain.h: a tiny LayerSkip run trains, checkpoints,
// resumes from its checkpoint and writes a loadable model with a report.
#include "trainer/pretrain.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "gtest/gtest.h"
#include "shared/model/llama.h"
#include "tests/testing/shared_dir.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace lede::trainer {
namespace {

using ::lede::testing::IsOk;

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
  o.tokenizer = ::lede::testing::SharedDir() + "/models/stories260K/tok512.bin";
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

}  // namespace
}  // namespace lede::trainer
