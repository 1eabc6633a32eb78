// File: shared/model/loaders/internal/checkpoint_internal.h
//
// What the parts of the checkpoint code share (checkpoint.cc: validation,
// dispatch and the tensor glue; checkpoint_safetensors.cc;
// checkpoint_hf.cc; checkpoint_llama2c.cc). Not API: only those files
// include it.
#ifndef LEDE_SHARED_MODEL_LOADERS_INTERNAL_CHECKPOINT_INTERNAL_H_
#define LEDE_SHARED_MODEL_LOADERS_INTERNAL_CHECKPOINT_INTERNAL_H_

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
#include "shared/checkpoint/safetensors.h"
#include "shared/model/torch_boundary.h"
#include "shared/status/status.h"

namespace lede::model::loaders::internal {

using TensorMap = std::map<std::string, at::Tensor>;

// A float32 CPU tensor of `shape` from `dtype` bytes at `ptr`, which point
// into memory that `owner` keeps alive (a MappedFile or SafetensorsFile).
// F32 with 4-byte alignment is wrapped in place (zero copy; the tensor keeps
// `owner` alive); anything else is copied and converted. keep_dtype: the
// result has `dtype` itself (wrapped in place when aligned, else copied).
at::Tensor TensorFromMapping(const std::shared_ptr<const void>& owner, const uint8_t* ptr,
                             const std::vector<int64_t>& shape, at::ScalarType dtype,
                             bool keep_dtype = false);

// The tensors of an opened safetensors file named in `names` (every one
// when null; a name the file lacks is skipped) under their names: float32,
// or with keep_half_precision the file's F16 / BF16, by TensorFromMapping.
TensorMap TensorsFromSafetensors(const std::shared_ptr<const checkpoint::SafetensorsFile>& file,
                                 bool keep_half_precision, const std::vector<std::string>* names = nullptr);

// A contiguous CPU tensor of `dtype` (t itself when it already is one).
at::Tensor AsContiguous(const at::Tensor& t, at::ScalarType dtype);

// Appends the bytes of contiguous CPU tensor `t` to `out`.
Status WriteTensorData(checkpoint::AtomicFile& out, const at::Tensor& t);

// kInvalidArgument naming the first required tensor that is missing, not a
// floating-point tensor, or shaped differently from what `c` implies.
// `where` prefixes messages; `origin` (optional) names each tensor's file.
Status CheckTensors(const checkpoint::ModelConfig& c, const TensorMap& tensors, const std::string& where,
                    const std::map<std::string, std::string>* origin);

// The shape of each tensor a checkpoint's files declare (read from their
// headers, nothing converted), by HF name.
using ShapeMap = std::map<std::string, std::vector<int64_t>>;

// CheckTensors over declared shapes, before any tensor is converted or
// wrapped. A layer count the files cannot hold (9 tensors per layer) is
// refused first, naming `layers_key` (the config's own key, e.g.
// "num_hidden_layers"), before anything is sized by it.
Status CheckTensorShapes(const checkpoint::ModelConfig& c, const ShapeMap& shapes, const std::string& where,
                         const std::map<std::string, std::string>* origin, const std::string& layers_key);

}  // namespace lede::model::loaders::internal

#endif  // LEDE_SHARED_MODEL_LOADERS_INTERNAL_CHECKPOINT_INTERNAL_H_
