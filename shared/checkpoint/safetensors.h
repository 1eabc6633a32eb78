// File: shared/checkpoint/safetensors.h
//
// The safetensors file format, torch-free (docs/design.md §5: model checkpoints
// and policy weights). A file is an 8-byte little-endian header length N, N
// bytes of JSON
//   {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__"},
// then the data region; offsets are relative to the data region. Format:
// https://github.com/huggingface/safetensors (README, "Format").
//
// Reading maps the file read-only and hands out views of its bytes; callers
// convert them (the engine to at::Tensor in shared/model/checkpoint*.cc, the
// policy artifact to std::vector<float> with ToFloat32()). Host byte order is
// assumed little-endian (x86-64, aarch64), as in the files.
//
// Example:
//   LEDE_ASSIGN_OR_RETURN(auto file, checkpoint::SafetensorsFile::Open(path));
//   const checkpoint::TensorView& w = file->tensors().at("fc1.weight");
//   LEDE_ASSIGN_OR_RETURN(std::vector<float> values, checkpoint::ToFloat32(w));
#ifndef LEDE_SHARED_CHECKPOINT_SAFETENSORS_H_
#define LEDE_SHARED_CHECKPOINT_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "shared/checkpoint/mapped_file.h"
#include "shared/status/status.h"

namespace lede::checkpoint {

// The element types LEDE reads (F32, F16, BF16, F64) and writes (F32, F16,
// BF16). Names as in the file ("F32", ...).
enum class Dtype { kF32, kF16, kBF16, kF64 };

// "F32", "F16", "BF16", "F64".
const char* DtypeName(Dtype dtype);
// Bytes per element: 4, 2, 2, 8.
size_t DtypeSize(Dtype dtype);

// "[2, 3]": a shape as error messages print it.
std::string ShapeString(const std::vector<int64_t>& shape);

// One tensor inside a SafetensorsFile: its dtype, shape (outermost first)
// and bytes (little-endian, row-major; `data` may be unaligned). The bytes
// belong to the file's read-only mapping: valid while the SafetensorsFile
// lives, never to be written.
struct TensorView {
  Dtype dtype = Dtype::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;  // = prod(shape) * DtypeSize(dtype)
  int64_t numel() const;
};

// A parsed, validated safetensors file. Immutable after Open(); safe to share
// between threads.
class SafetensorsFile {
 public:
  // Maps `path` and validates its header: every entry has a known dtype, a
  // shape of non-negative sizes whose byte count matches its data_offsets,
  // offsets inside the data region, and non-empty byte ranges are disjoint.
  // Errors (messages name the file and the tensor): kNotFound for a missing
  // file; kPermissionDenied; kInvalidArgument for a file shorter than 8
  // bytes, a header length past the end or over 100 MiB, bad JSON, an unknown
  // dtype, a bad shape or data_offsets, overlapping tensors; kInternal for a
  // failed mmap.
  static StatusOr<std::shared_ptr<const SafetensorsFile>> Open(const std::string& path);

  const std::string& path() const { return path_; }
  // name -> view, in name order ("__metadata__" is not a tensor).
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  std::shared_ptr<const MappedFile> mapping_;
  std::map<std::string, TensorView> tensors_;
};

// The view's values widened (F16, BF16) or narrowed (F64) to float32, in the
// view's row-major order. Never fails for a view from SafetensorsFile; kept
// StatusOr so that a future dtype can be refused (kInvalidArgument).
StatusOr<std::vector<float>> ToFloat32(const TensorView& view);

// One tensor to write: `data` holds prod(shape) * DtypeSize(dtype) bytes,
// little-endian, row-major (the caller keeps it alive during the write).
struct TensorBytes {
  Dtype dtype = Dtype::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;
};

// Writes `tensors` (in name order, contiguous, with "__metadata__"
// {"format": "pt"} and the header padded to 8 bytes) as one .safetensors
// file, atomically (temporary file, fsync, rename).
// Errors: kInvalidArgument for an empty name or "__metadata__", an F64
// tensor, or nbytes that disagree with the shape; kInternal on I/O (the
// destination is then untouched).
Status WriteSafetensors(const std::string& path, const std::map<std::string, TensorBytes>& tensors);

}  // namespace lede::checkpoint

#endif  // LEDE_SHARED_CHECKPOINT_SAFETENSORS_H_
