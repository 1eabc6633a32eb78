// Tests on the shipped demo model models/lede-tiny (issue: demo model): it
// loads, its tokenizer round-trips, and static self-speculation on it is
// lossless (docs/design.md §1) at shallow and deep exits.
#include <memory>

#include "gtest/gtest.h"
#include "shared/model/decoding.h"
#include "shared/model/llama.h"
#include "shared/tokenizer/model_files.h"
#include "shared/tokenizer/tokenizer.h"
#include "tests/testing/status_matchers.h"

namespace lede::model {
namespace {
using ::lede::tokenizer::FindTokenizerFile;
using ::lede::tokenizer::LoadTokenizer;

using ::lede::testing::IsOk;

constexpr char kModelDir[] = "models/lede-tiny";  // relative to the repository root (ctest's working directory)

// The shipped checkpoint loads with its documented architecture and its tokenizer round-trips text.
TEST(LedeTinyTest, LoadsWithTokenizer) {
  auto m = LlamaModel::Load(kModelDir, ModelOptions{});
  ASSERT_THAT(m, IsOk());
  EXPECT_EQ((*m)->n_layers(), 12);  // config.json num_hidden_layers
  auto path = FindTokenizerFile(kModelDir);
  ASSERT_THAT(path, IsOk());
  auto tok = LoadTokenizer(*path);
  ASSERT_THAT(tok, IsOk());
  EXPECT_EQ((*tok)->vocab_size(), (*m)->config().vocab_size);
  const std::string text = "Once upon a time, there was a cat.\n    return x + 1\n";
  auto ids = (*tok)->Encode(text, true, false);
  ASSERT_THAT(ids, IsOk());
  EXPECT_EQ((*tok)->Decode(*ids), text);
}

// Static self-speculation on lede-tiny gives the autoregressive greedy output
// (a divergence only at a numerical near-tie), at E = 1, L/4 and L/2, with
// the given decode-path kernels.
void ExpectStaticSpeculationLossless(Kernels kernels) {
  ModelOptions options;
  options.kernels = kernels;
  auto loaded = LlamaModel::Load(kModelDir, options);
  ASSERT_THAT(loaded, IsOk());
  std::shared_ptr<const LlamaModel> m = std::move(*loaded);
  auto tok = LoadTokenizer(*FindTokenizerFile(kModelDir));
  ASSERT_THAT(tok, IsOk());
  auto engine = Engine::Create(m, KvCacheOptions{});
  ASSERT_THAT(engine, IsOk());
  for (const char* prompt : {"Once upon a time, there was a little", "def parse(text):\n"}) {
    auto ids = (*tok)->Encode(prompt, true, false);
    ASSERT_THAT(ids, IsOk());
    GenerateOptions ar;
    ar.max_new_tokens = 40;
    ar.record_margins = true;
    auto reference = (*engine)->Generate(*ids, ar);
    ASSERT_THAT(reference, IsOk());
    const int64_t L = m->n_layers();
    for (int64_t e : {int64_t{1}, L / 4, L / 2}) {
      GenerateOptions o = ar;
      o.mode = SpeculationMode::kStatic;
      o.exit_layer = e;
      o.draft_len = 4;
      auto spec = (*engine)->Generate(*ids, o);
      ASSERT_THAT(spec, IsOk());
      size_t i = 0;
      while (i < spec->tokens.size() && i < reference->tokens.size() && spec->tokens[i] == reference->tokens[i]) ++i;
      if (i < reference->tokens.size()) {
        ASSERT_LT(i, spec->tokens.size());
        EXPECT_LE(std::min(reference->margins[i], spec->margins[i]), 1e-4) << "E=" << e << " token " << i;
      }
      EXPECT_GT(spec->stats.n_accepted, 0) << "E=" << e;
    }
  }
}

// Lossless on the fused kernels (the default) and on the eager reference.
TEST(LedeTinyTest, StaticSpeculationIsLossless) { ExpectStaticSpeculationLossless(Kernels::kFused); }
TEST(LedeTinyTest, StaticSpeculationIsLosslessEager) { ExpectStaticSpeculationLossless(Kernels::kEager); }

}  // namespace
}  // namespace lede::model
