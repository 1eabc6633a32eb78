// libFuzzer target: the GGUF reader (shared/checkpoint/gguf.h,
// GgufFile::Open), its llama mapping (GgufLlamaConfig) and the GGUF
// tokenizer (tokenizer/gguf_tokenizer.h). The input is a whole .gguf file.
// Open() must return a status, never crash; when it accepts a file, every
// tensor must lie inside the file and hold exactly the bytes its type and
// dims imply, and widening a small one must not read out of bounds; the
// counts stay within the reader's bounds (gguf.cc, model_limits.h).
#include <cstdint>
#include <string>
#include <vector>

#include "shared/checkpoint/gguf.h"
#include "shared/checkpoint/model_limits.h"
#include "shared/tokenizer/gguf_tokenizer.h"
#include "tests/fuzz/testing/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using lede::fuzz::Check;
  namespace ck = lede::checkpoint;
  const std::string& path = lede::fuzz::WriteScratch(data, size, ".gguf");
  auto file = ck::GgufFile::Open(path);
  if (!file.ok()) {
    Check(!file.status().message().empty(), "error without a message");
    return 0;
  }
  const ck::GgufFile& f = **file;
  Check(size >= 24, "accepted a file shorter than the GGUF header");
  Check(f.tensors().size() <= (size_t{1} << 18) && f.metadata().size() <= (size_t{1} << 16),
        "more tensors or metadata keys than the reader's bounds accepted");
  for (const ck::GgufTensor& t : f.tensors()) {
    Check(!t.ne.empty() && t.ne.size() <= 4, "rank outside [1, 4] accepted");
    Check(t.name.size() <= 64, "a tensor name longer than 64 bytes accepted");
    int64_t numel = 1;
    for (int64_t d : t.ne) {
      Check(d > 0, "non-positive dim accepted");
      numel *= d;
    }
    Check(t.numel() == numel, "numel() disagrees with the dims");
    Check(t.nbytes == ck::GgmlTypeBytes(t.type, numel), "nbytes disagrees with type and dims");
    Check(t.nbytes <= size, "tensor larger than the file");
    Check(t.data != nullptr && t.offset % f.alignment() == 0, "tensor without data or misaligned accepted");
    if (numel > 0 && numel <= (1 << 14)) {
      std::vector<float> out(static_cast<size_t>(numel));
      Check(ck::DequantizeToF32(t, out.data()).ok(), "DequantizeToF32 failed on an accepted tensor");
    }
  }
  auto config = ck::GgufLlamaConfig(f);
  if (config.ok()) {
    Check(config->Validate().ok(), "GgufLlamaConfig returned an invalid config");
    Check(config->max_seq_len <= lede::model::kMaxContextTokens, "a context past kMaxContextTokens accepted");
    Check(static_cast<size_t>(config->n_layers) * 9 <= f.tensors().size(), "more blocks than the file holds accepted");
  }
  auto json = lede::tokenizer::GgufTokenizerToHfJson(f);
  if (json.ok() && json->json.size() < (1u << 20)) {
    auto tok = lede::tokenizer::LoadGgufTokenizer(f);
    if (tok.ok()) {
      auto ids = (*tok)->Encode("Hello world 123", true, false);
      if (ids.ok()) {
        for (int32_t id : *ids) Check(id >= -1 && id < (*tok)->vocab_size(), "id outside the vocabulary");
      }
    }
  }
  return 0;
}
