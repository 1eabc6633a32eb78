// libFuzzer target: the llama2.c tokenizer.bin loader (shared/tokenizer/
// llama2c_tokenizer.h, Llama2cTokenizer::Load). The input is a whole
// tokenizer file. Loading gives a tokenizer or an error, never a crash; an
// accepted one encodes and decodes a fixed text with ids in range.
#include <cstdint>
#include <string>

#include "shared/tokenizer/llama2c_tokenizer.h"
#include "tests/fuzz/testing/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using lede::fuzz::Check;
  const std::string& path = lede::fuzz::WriteScratch(data, size, ".bin");
  auto tok = lede::tokenizer::Llama2cTokenizer::Load(path);
  if (!tok.ok()) {
    Check(!tok.status().message().empty(), "error without a message");
    return 0;
  }
  const int32_t vocab = (*tok)->vocab_size();
  Check(vocab >= 3, "accepted fewer than 3 tokens");
  for (const char* text : {"Once upon a time", " \xc3\xa9\xe2\x82\xac\x01", ""}) {
    auto ids = (*tok)->Encode(text, true, true);
    if (!ids.ok()) continue;
    for (int32_t id : *ids) Check(id >= 0 && id < vocab, "Encode produced an id outside [0, vocab_size)");
    (void)(*tok)->Decode(*ids);
  }
  (void)(*tok)->Decode({-1, 0, vocab, vocab - 1});
  return 0;
}
