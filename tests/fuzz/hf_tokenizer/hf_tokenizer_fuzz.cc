// libFuzzer target: the tokenizer.json loader (shared/tokenizer/
// hf_tokenizer.h, HfTokenizer::FromJson) and tokenizer_config.json
// (hf_config.h, ParseHfTokenizerConfig). The input is
//   <tokenizer_config.json text> '\0' <tokenizer.json text>
// (no '\0': all of it is tokenizer.json, the config empty). Loading gives a
// tokenizer or an error, never a crash; an accepted tokenizer encodes a
// fixed text and decodes the ids without crashing, and its ids are in range.
#include <cstdint>
#include <string>
#include <vector>

#include "shared/tokenizer/hf_config.h"
#include "shared/tokenizer/hf_tokenizer.h"
#include "tests/fuzz/testing/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using lede::fuzz::Check;
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  lede::tokenizer::HfTokenizerConfig config;
  std::string json = input;
  if (nul != std::string::npos) {
    auto parsed = lede::tokenizer::ParseHfTokenizerConfig(input.substr(0, nul), "fuzz/tokenizer_config.json");
    if (parsed.ok()) config = *parsed;
    json = input.substr(nul + 1);
  }
  auto tok = lede::tokenizer::HfTokenizer::FromJson(json, "fuzz/tokenizer.json", config);
  if (!tok.ok()) {
    Check(!tok.status().message().empty(), "error without a message");
    return 0;
  }
  const int32_t vocab = (*tok)->vocab_size();
  Check(vocab >= 0, "negative vocab_size");
  for (const char* text : {"Hello, world! 123", " a\tb\n\xc3\xa9\xe2\x82\xac", ""}) {
    auto ids = (*tok)->Encode(text, true, true);
    if (!ids.ok()) continue;
    for (int32_t id : *ids) Check(id >= 0 && id < vocab, "Encode produced an id outside [0, vocab_size)");
    (void)(*tok)->Decode(*ids);
  }
  (void)(*tok)->Decode({-1, 0, vocab, vocab - 1, 1 << 30});
  return 0;
}
