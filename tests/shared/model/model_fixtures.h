// Fixtures shared by the engine tests: the two real models and a tiny random
// model written to disk in Hugging Face layout.
#ifndef LEDE_TESTS_SHARED_MODEL_MODEL_FIXTURES_H_
#define LEDE_TESTS_SHARED_MODEL_MODEL_FIXTURES_H_

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "shared/model/llama.h"
#include "tests/testing/shared_dir.h"

namespace lede::model::testing {

// A 4-layer GQA config small enough for sub-second tests.
inline ModelConfig TinyConfig(bool tied = false) {
  ModelConfig c;
  c.dim = 32;
  c.hidden_dim = 64;
  c.n_layers = 4;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.vocab_size = 48;
  c.max_seq_len = 96;
  c.tie_word_embeddings = tied;
  c.eos_ids = {};  // random weights: never stop early
  return c;
}

// Makes a fresh temporary directory (mkdtemp) under $TMPDIR or /tmp.
inline std::string MakeTempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base ? base : "/tmp") + "/lede_test_XXXXXX";
  char* made = mkdtemp(tmpl.data());
  EXPECT_NE(made, nullptr);
  return tmpl;
}

// Random weights (seeded) with a large init so the model is far from
// uniform; written to `dir` in HF layout and loaded back from disk.
inline std::unique_ptr<LlamaModel> WriteAndLoadTinyHf(const std::string& dir, bool tied = false) {
  auto random = LlamaModel::RandomInit(TinyConfig(tied), /*seed=*/7, ModelOptions{}, 0.3);
  EXPECT_TRUE(random.ok()) << random.status();
  EXPECT_TRUE((*random)->SaveHf(dir).ok());
  auto loaded = LlamaModel::Load(dir, ModelOptions{});
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  return std::move(*loaded);
}

inline std::unique_ptr<LlamaModel> LoadOrDie(const std::string& path) {
  auto m = LlamaModel::Load(path, ModelOptions{});
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

// Golden values from ../shared/models/README.md.
inline const std::vector<int32_t> kStoriesPrompt = {1, 403, 407, 261, 378};
inline const std::vector<int32_t> kStoriesGreedy = {
    432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337, 410, 408,
    419, 292, 411, 322, 265, 282, 295, 433, 426, 385, 328, 432, 358, 394, 261, 370, 432, 352};
inline const std::vector<int32_t> kBabyPrompt = {1, 3, 34, 9, 22, 4, 3, 18, 20, 7, 9, 3, 5, 3, 6, 10, 16, 4};
inline const std::vector<int32_t> kBabyGreedy = {25, 3, 6, 8, 4, 13, 4, 3, 17, 5, 12, 3,
                                                 5, 3, 14, 10, 6, 6, 14, 4, 3, 21, 10};

}  // namespace lede::model::testing

#endif  // LEDE_TESTS_SHARED_MODEL_MODEL_FIXTURES_H_
