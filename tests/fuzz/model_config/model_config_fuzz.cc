// libFuzzer target: the Hugging Face config.json parser (shared/checkpoint/
// model_config.h, ParseHfConfig). Any text gives a ModelConfig or an error
// status, never a crash or an exception; an accepted config serializes
// (ToHfConfigJson) and parses back.
#include <cstdint>
#include <string>

#include "shared/checkpoint/model_config.h"
#include "tests/fuzz/testing/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto config = lede::checkpoint::ParseHfConfig(text, "fuzz/config.json");
  if (!config.ok()) {
    lede::fuzz::Check(!config.status().message().empty(), "error without a message");
    return 0;
  }
  const std::string again = lede::checkpoint::ToHfConfigJson(*config);
  auto reparsed = lede::checkpoint::ParseHfConfig(again, "fuzz/config.json (re-serialized)");
  lede::fuzz::Check(reparsed.ok(), "an accepted config does not parse back after ToHfConfigJson");
  return 0;
}
