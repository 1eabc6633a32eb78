// libFuzzer target: a Hugging Face checkpoint's JSON files, config.json
// (shared/checkpoint/model_config.h, ParseHfConfig) and
// generation_config.json (shared/tokenizer/hf_config.h, ParseGenerationIds),
// both read from the same input. Any text gives a value or an error status,
// never a crash or an exception. An accepted config is valid, keeps every
// count within model_limits.h (what the loaders size allocations by), and
// serializes (ToHfConfigJson) and parses back to the same architecture.
#include <cstdint>
#include <string>

#include "shared/checkpoint/model_config.h"
#include "shared/checkpoint/model_limits.h"
#include "shared/tokenizer/hf_config.h"
#include "tests/fuzz/testing/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using lede::fuzz::Check;
  namespace m = lede::model;
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto ids = lede::tokenizer::ParseGenerationIds(text, "fuzz/generation_config.json");
  if (!ids.ok()) Check(!ids.status().message().empty(), "generation ids: error without a message");
  auto config = m::ParseHfConfig(text, "fuzz/config.json");
  if (!config.ok()) {
    Check(!config.status().message().empty(), "error without a message");
    return 0;
  }
  const m::ModelConfig& c = *config;
  Check(c.Validate().ok(), "an accepted config does not validate");
  Check(c.max_seq_len <= m::kMaxContextTokens, "a context window past kMaxContextTokens accepted");
  Check(c.n_layers <= m::kMaxLayers, "a layer count past kMaxLayers accepted");
  Check(c.dim <= m::kMaxModelDim && c.hidden_dim <= m::kMaxModelDim && c.n_heads <= m::kMaxModelDim,
        "a dimension past kMaxModelDim accepted");
  Check(c.vocab_size <= m::kMaxVocabSize, "a vocabulary past kMaxVocabSize accepted");
  const std::string again = m::ToHfConfigJson(c);
  auto reparsed = m::ParseHfConfig(again, "fuzz/config.json (re-serialized)");
  Check(reparsed.ok(), "an accepted config does not parse back after ToHfConfigJson");
  Check(reparsed->ArchitectureFingerprint() == c.ArchitectureFingerprint(),
        "an accepted config changes architecture through ToHfConfigJson");
  return 0;
}
