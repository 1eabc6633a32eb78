// File: shared/model/loaders/checkpoint_safetensors.cc
//
// safetensors files as tensors (ReadSafetensors, WriteSafetensors in
// checkpoint.h): the torch-free reader and writer of
// shared/checkpoint/safetensors.h do the file format; this part converts
// their bytes, dtypes and shapes to and from at::Tensor.
#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "shared/checkpoint/safetensors.h"
#include "shared/model/loaders/checkpoint.h"
#include "shared/model/loaders/internal/checkpoint_internal.h"
#include "shared/status/status_macros.h"

namespace lede::model::loaders {
namespace {

using internal::TensorMap;

at::ScalarType ScalarTypeOf(checkpoint::Dtype dtype) {
  switch (dtype) {
    case checkpoint::Dtype::kF32: return at::kFloat;
    case checkpoint::Dtype::kF16: return at::kHalf;
    case checkpoint::Dtype::kBF16: return at::kBFloat16;
    case checkpoint::Dtype::kF64: return at::kDouble;
  }
  return at::kFloat;
}

StatusOr<TensorMap> ReadSafetensorsImpl(const std::string& file, const CheckpointReadOptions& read) {
  LEDE_ASSIGN_OR_RETURN(std::shared_ptr<const checkpoint::SafetensorsFile> st,
                        checkpoint::SafetensorsFile::Open(file));
  return internal::TensorsFromSafetensors(st, read.keep_half_precision);
}

Status WriteSafetensorsImpl(const std::string& file, const TensorMap& tensors,
                            const std::string& dtype_name) {
  at::ScalarType dtype;
  checkpoint::Dtype file_dtype;
  if (dtype_name == "F32") {
    dtype = at::kFloat;
    file_dtype = checkpoint::Dtype::kF32;
  } else if (dtype_name == "F16") {
    dtype = at::kHalf;
    file_dtype = checkpoint::Dtype::kF16;
  } else if (dtype_name == "BF16") {
    dtype = at::kBFloat16;
    file_dtype = checkpoint::Dtype::kBF16;
  } else {
    return InvalidArgumentError(file + ": unsupported safetensors dtype \"" +
                                dtype_name + "\" (use F32, F16 or BF16)");
  }
  std::vector<at::Tensor> data;  // keeps the converted tensors alive
  std::map<std::string, checkpoint::TensorBytes> bytes;
  for (const auto& [name, t] : tensors) {
    if (name.empty() || name == "__metadata__") {
      return InvalidArgumentError(file + ": invalid tensor name \"" + name +
                                  "\"");
    }
    if (!t.defined() || !t.is_floating_point()) {
      return InvalidArgumentError(file + ": tensor " + name +
                                  " is undefined or not floating-point");
    }
    at::Tensor c = internal::AsContiguous(t, dtype);
    bytes[name] = checkpoint::TensorBytes{file_dtype, c.sizes().vec(), c.data_ptr(),
                                          static_cast<size_t>(c.numel()) * c.element_size()};
    data.push_back(std::move(c));
  }
  return checkpoint::WriteSafetensors(file, bytes);
}

}  // namespace

namespace internal {

TensorMap TensorsFromSafetensors(const std::shared_ptr<const checkpoint::SafetensorsFile>& file,
                                 bool keep_half_precision, const std::vector<std::string>* names) {
  TensorMap out;
  auto add = [&](const std::string& name, const checkpoint::TensorView& view) {
    const at::ScalarType dtype = ScalarTypeOf(view.dtype);
    const bool keep = keep_half_precision && (dtype == at::kHalf || dtype == at::kBFloat16);
    out[name] = TensorFromMapping(file, view.data, view.shape, dtype, keep);
  };
  if (names == nullptr) {
    for (const auto& [name, view] : file->tensors()) add(name, view);
    return out;
  }
  for (const std::string& name : *names) {
    auto it = file->tensors().find(name);
    if (it != file->tensors().end()) add(name, it->second);
  }
  return out;
}

}  // namespace internal

StatusOr<std::map<std::string, at::Tensor>> ReadSafetensors(
    const std::string& file, const CheckpointReadOptions& read) {
  return TorchBoundary(file, [&] { return ReadSafetensorsImpl(file, read); });
}

Status WriteSafetensors(const std::string& file,
                        const std::map<std::string, at::Tensor>& tensors,
                        const std::string& dtype_name) {
  return TorchBoundary(
      file, [&] { return WriteSafetensorsImpl(file, tensors, dtype_name); });
}

}  // namespace lede::model::loaders
