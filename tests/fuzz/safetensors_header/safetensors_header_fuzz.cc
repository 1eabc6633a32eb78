// libFuzzer target: the safetensors header parser (shared/checkpoint/
// safetensors.h, SafetensorsFile::Open). The input is a whole .safetensors
// file. Open() must return a status, never crash; when it accepts a file,
// every tensor view must lie inside the file and hold exactly
// numel * dtype-size bytes, and converting a small one must not read out of
// bounds.
#include <cstdint>
#include <string>

#include "shared/checkpoint/safetensors.h"
#include "tests/fuzz/testing/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using lede::fuzz::Check;
  const std::string& path = lede::fuzz::WriteScratch(data, size, ".safetensors");
  auto file = lede::checkpoint::SafetensorsFile::Open(path);
  if (!file.ok()) {
    Check(!file.status().message().empty(), "error without a message");
    return 0;
  }
  Check(size >= 8, "accepted a file shorter than its length prefix");
  for (const auto& [name, view] : (*file)->tensors()) {
    Check(name != "__metadata__", "__metadata__ reported as a tensor");
    int64_t numel = 1;
    for (int64_t d : view.shape) {
      Check(d >= 0, "negative dimension accepted");
      numel *= d;
    }
    Check(view.numel() == numel, "numel() disagrees with the shape");
    Check(view.nbytes == static_cast<size_t>(numel) * lede::checkpoint::DtypeSize(view.dtype),
          "nbytes != numel * dtype size");
    Check(view.nbytes <= size, "tensor larger than the file");
    if (view.nbytes > 0 && view.nbytes <= (1u << 16)) {
      auto values = lede::checkpoint::ToFloat32(view);
      Check(values.ok() && static_cast<int64_t>(values->size()) == numel, "ToFloat32 failed on a valid view");
    }
  }
  return 0;
}
