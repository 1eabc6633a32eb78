// Fixtures shared by the engine tests: the two real models (golden ids in
// golden_values.h) and a tiny random model written to disk in Hugging Face
// layout.
#ifndef LEDE_TESTS_SHARED_MODEL_MODEL_FIXTURES_H_
#define LEDE_TESTS_SHARED_MODEL_MODEL_FIXTURES_H_

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "shared/model/llama.h"
#include "tests/shared/model/golden_values.h"
#include "tests/testing/test_data.h"

namespace lede::model::testing {

// A 4-layer GQA config small enough for sub-second tests.
inline checkpoint::ModelConfig TinyConfig(bool tied = false) {
  checkpoint::ModelConfig c;
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

inline std::unique_ptr<LlamaModel> LoadOrDie(const std::string& path,
                                             Kernels kernels = Kernels::kFused) {
  ModelOptions options;
  options.kernels = kernels;
  auto m = LlamaModel::Load(path, options);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

}  // namespace lede::model::testing

#endif  // LEDE_TESTS_SHARED_MODEL_MODEL_FIXTURES_H_
