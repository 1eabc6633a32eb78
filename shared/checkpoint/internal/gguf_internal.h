// File: shared/checkpoint/internal/gguf_internal.h
//
// What the GGUF reader (gguf.cc), writer (gguf_writer.cc) and the llama
// architecture mapping (gguf_llama.cc) share. Internal to lede::checkpoint.
#ifndef LEDE_SHARED_CHECKPOINT_INTERNAL_GGUF_INTERNAL_H_
#define LEDE_SHARED_CHECKPOINT_INTERNAL_GGUF_INTERNAL_H_

#include <cstdint>
#include <string>
#include <vector>

namespace lede::checkpoint::internal {

// The most dims a GGUF tensor may have (read and written).
inline constexpr uint32_t kMaxDims = 4;

// The shortest decimal that reads back as this float (1e-5f -> 1e-05, not
// 9.99999974738e-06), as a config.json would hold it: a float32 metadata
// value as the reader returns it. NaN stays NaN.
double ShortestDecimal(float v);

// ggml-order dims as text for errors: {4096, 32000} -> "[4096, 32000]".
std::string NeString(const std::vector<int64_t>& ne);

}  // namespace lede::checkpoint::internal

#endif  // LEDE_SHARED_CHECKPOINT_INTERNAL_GGUF_INTERNAL_H_
