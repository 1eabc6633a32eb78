// File: shared/model/internal/checkpoint_internal.h
//
// What the parts of the checkpoint code share (checkpoint.cc: validation,
// dispatch and the tensor glue; checkpoint_safetensors.cc;
// checkpoint_hf.cc; checkpoint_llama2c.cc). Not API: only those files
// include it.
#ifndef LEDE_SHARED_MODEL_INTERNAL_CHECKPOINT_INTERNAL_H_
#define LEDE_SHARED_MODEL_INTERNAL_CHECKPOINT_INTERNAL_H_

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "shared/checkpoint/mapped_file.h"
#include "shared/checkpoint/model_config.h"
#include "shared/model/torch_boundary.h"
#include "shared/status/status.h"

namespace lede::model::internal {

using TensorMap = std::map<std::string, at::Tensor>;

// A float32 CPU tensor of `shape` from `dtype` bytes at `ptr`, which point
// into memory that `owner` keeps alive (a MappedFile or SafetensorsFile).
// F32 with 4-byte alignment is wrapped in place (zero copy; the tensor keeps
// `owner` alive); anything else is copied and converted. keep_dtype: the
// result has `dtype` itself (wrapped in place when aligned, else copied).
at::Tensor TensorFromMapping(const std::shared_ptr<const void>& owner, const uint8_t* ptr,
                             const std::vector<int64_t>& shape, at::ScalarType dtype,
                             bool keep_dtype = false);

// A contiguous CPU tensor of `dtype` (t itself when it already is one).
at::Tensor AsContiguous(const at::Tensor& t, at::ScalarType dtype);

// Appends the bytes of contiguous CPU tensor `t` to `out`.
Status WriteTensorData(checkpoint::AtomicFile& out, const at::Tensor& t);

// kInvalidArgument naming the first required tensor that is missing, not a
// floating-point tensor, or shaped differently from what `c` implies.
// `where` prefixes messages; `origin` (optional) names each tensor's file.
Status CheckTensors(const checkpoint::ModelConfig& c, const TensorMap& tensors, const std::string& where,
                    const std::map<std::string, std::string>* origin);

}  // namespace lede::model::internal

#endif  // LEDE_SHARED_MODEL_INTERNAL_CHECKPOINT_INTERNAL_H_
