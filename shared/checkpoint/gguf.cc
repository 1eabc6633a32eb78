// File: shared/checkpoint/gguf.cc
//
// The GGUF reader (contracts in gguf.h): GgufFile::Open / Parse and the
// typed metadata getters. The reader is a cursor over [data, data + size)
// whose every read checks the bytes left first, so a truncated or hostile
// file is refused before anything past its end is touched, and no count
// from the file sizes an allocation beyond what the remaining bytes could
// hold. Beside it: the tensor types' sizes and conversions
// (gguf_tensor_types.cc), the writer (gguf_writer.cc) and the llama
// architecture (gguf_llama.cc).
#include "shared/checkpoint/gguf.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>

#include "shared/checkpoint/internal/gguf_internal.h"
#include "shared/status/status_macros.h"

namespace lede::checkpoint {
namespace internal {

double ShortestDecimal(float v) {
  if (std::isnan(v)) return static_cast<double>(v);
  char buf[32];
  for (int digits = 6; digits <= 9; ++digits) {
    std::snprintf(buf, sizeof(buf), "%.*g", digits, static_cast<double>(v));
    if (std::strtof(buf, nullptr) == v) break;
  }
  return std::strtod(buf, nullptr);
}

std::string NeString(const std::vector<int64_t>& ne) {
  std::string s = "[";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

}  // namespace internal

namespace {

using internal::kMaxDims;
using internal::NeString;
using internal::ShortestDecimal;

// Bounds on what a header may declare, checked before anything is sized by
// it, so that a file whose counts fit its (possibly sparse) apparent size
// still cannot make the reader allocate more than a few hundred MiB:
//  - key and tensor-name lengths as ggml's docs/gguf.md fixes them (a key
//    at most 65535 bytes, a tensor name at most 64);
//  - metadata keys and tensors: 2^16 and 2^18 (llama.cpp files hold a few
//    dozen keys and at most a few thousand tensors), so tensor infos and
//    their index stay under about 100 MiB;
//  - the decoded metadata (each key and value: its bytes, and a
//    std::string, a double per number or a kMetadataRecordBytes record):
//    256 MiB in all, against some 30 MiB for the largest tokenizers (about
//    260k tokens and their merges).
constexpr uint64_t kMaxKeyBytes = 65535;
constexpr uint64_t kMaxTensorNameBytes = 64;
constexpr uint64_t kMaxMetadataKeys = uint64_t{1} << 16;
constexpr uint64_t kMaxTensors = uint64_t{1} << 18;
constexpr uint64_t kMetadataBudgetBytes = uint64_t{256} << 20;
// What one metadata record costs beside its key's and value's bytes: the
// GgufValue and its map node.
constexpr uint64_t kMetadataRecordBytes = sizeof(GgufValue) + 64;
// The smallest encodings: a metadata record (key length, value type, one
// byte of value), a tensor info record (name length, n_dims, one dim, type,
// offset).
constexpr uint64_t kMinMetadataRecordBytes = 8 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;

// Bytes of one scalar of `type`, or 0 for string/array/unknown.
size_t ScalarBytes(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8: case GgufValueType::kInt8: case GgufValueType::kBool: return 1;
    case GgufValueType::kUint16: case GgufValueType::kInt16: return 2;
    case GgufValueType::kUint32: case GgufValueType::kInt32: case GgufValueType::kFloat32: return 4;
    case GgufValueType::kUint64: case GgufValueType::kInt64: case GgufValueType::kFloat64: return 8;
    default: return 0;
  }
}

bool KnownValueType(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::kFloat64); }

const char* ValueTypeName(GgufValueType t) {
  static const char* const kNames[] = {"uint8", "int8",   "uint16", "int16", "uint32", "int32", "float32",
                                       "bool",  "string", "array",  "uint64", "int64", "float64"};
  const auto i = static_cast<uint32_t>(t);
  return i < 13 ? kNames[i] : "unknown";
}

class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size, std::string source)
      : data_(data), size_(size), source_(std::move(source)) {}

  size_t pos() const { return pos_; }
  size_t left() const { return size_ - pos_; }

  Status Need(size_t n, const std::string& what) const {
    if (n > left()) {
      return InvalidArgumentError(source_ + ": truncated: " + what + " needs " + std::to_string(n) +
                                  " bytes at offset " + std::to_string(pos_) + ", " + std::to_string(left()) +
                                  " left");
    }
    return OkStatus();
  }
  template <typename T>
  StatusOr<T> Read(const std::string& what) {
    LEDE_RETURN_IF_ERROR(Need(sizeof(T), what));
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  // A string of at most max_bytes (checked, with the bytes left, before
  // anything is allocated).
  StatusOr<std::string> ReadString(const std::string& what, uint64_t max_bytes) {
    LEDE_ASSIGN_OR_RETURN(uint64_t n, Read<uint64_t>(what + " length"));
    if (n > max_bytes) {
      return InvalidArgumentError(source_ + ": " + what + ": length " + std::to_string(n) + " at offset " +
                                  std::to_string(pos_ - 8) + " exceeds its limit of " + std::to_string(max_bytes) +
                                  " bytes");
    }
    LEDE_RETURN_IF_ERROR(Need(static_cast<size_t>(n), what));
    std::string s(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  std::string source_;
};

StatusOr<double> ReadScalarNumber(Cursor& c, GgufValueType type, const std::string& what, int64_t* as_int,
                                  bool* out_of_range) {
  *out_of_range = false;
  switch (type) {
    case GgufValueType::kUint8: { LEDE_ASSIGN_OR_RETURN(uint8_t v, c.Read<uint8_t>(what)); *as_int = v; return v; }
    case GgufValueType::kInt8: { LEDE_ASSIGN_OR_RETURN(int8_t v, c.Read<int8_t>(what)); *as_int = v; return v; }
    case GgufValueType::kBool: {
      LEDE_ASSIGN_OR_RETURN(uint8_t v, c.Read<uint8_t>(what));
      *as_int = v != 0;
      return v != 0;
    }
    case GgufValueType::kUint16: { LEDE_ASSIGN_OR_RETURN(uint16_t v, c.Read<uint16_t>(what)); *as_int = v; return v; }
    case GgufValueType::kInt16: { LEDE_ASSIGN_OR_RETURN(int16_t v, c.Read<int16_t>(what)); *as_int = v; return v; }
    case GgufValueType::kUint32: { LEDE_ASSIGN_OR_RETURN(uint32_t v, c.Read<uint32_t>(what)); *as_int = v; return v; }
    case GgufValueType::kInt32: { LEDE_ASSIGN_OR_RETURN(int32_t v, c.Read<int32_t>(what)); *as_int = v; return v; }
    case GgufValueType::kUint64: {
      LEDE_ASSIGN_OR_RETURN(uint64_t v, c.Read<uint64_t>(what));
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) *out_of_range = true;
      *as_int = static_cast<int64_t>(v);
      return static_cast<double>(v);
    }
    case GgufValueType::kInt64: {
      LEDE_ASSIGN_OR_RETURN(int64_t v, c.Read<int64_t>(what));
      *as_int = v;
      return static_cast<double>(v);
    }
    case GgufValueType::kFloat32: {
      LEDE_ASSIGN_OR_RETURN(float v, c.Read<float>(what));
      *as_int = 0;
      return ShortestDecimal(v);
    }
    case GgufValueType::kFloat64: { LEDE_ASSIGN_OR_RETURN(double v, c.Read<double>(what)); *as_int = 0; return v; }
    default: return InvalidArgumentError(what + ": not a scalar");
  }
}

bool IsPowerOfTwo(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }

}  // namespace

bool GgufValue::is_integer() const {
  return type != GgufValueType::kFloat32 && type != GgufValueType::kFloat64 && type != GgufValueType::kBool &&
         type != GgufValueType::kString && type != GgufValueType::kArray;
}
bool GgufValue::is_float() const { return type == GgufValueType::kFloat32 || type == GgufValueType::kFloat64; }

int64_t GgufTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}

std::vector<int64_t> GgufTensor::shape() const { return std::vector<int64_t>(ne.rbegin(), ne.rend()); }

StatusOr<std::shared_ptr<const GgufFile>> GgufFile::Open(const std::string& path) {
  LEDE_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> mapping, MappedFile::Open(path));
  const uint8_t* data = mapping->data();
  const size_t size = mapping->size();
  return Parse(std::move(mapping), data, size, path);
}

namespace {

// Reads one metadata value (type tag and payload) after its key, charging
// its decoded size to *budget (bytes; refused before allocating when it
// would not fit).
StatusOr<GgufValue> ReadMetadataValue(Cursor& c, const std::string& source, const std::string& what,
                                      uint64_t* budget) {
  LEDE_ASSIGN_OR_RETURN(uint32_t type_raw, c.Read<uint32_t>(what + " type"));
  if (!KnownValueType(type_raw)) {
    return InvalidArgumentError(source + ": " + what + ": unknown value type " + std::to_string(type_raw));
  }
  GgufValue v;
  v.type = static_cast<GgufValueType>(type_raw);
  bool out_of_range = false;
  if (v.type == GgufValueType::kString) {
    LEDE_ASSIGN_OR_RETURN(v.str, c.ReadString(what, *budget));
    *budget -= v.str.size();
  } else if (v.type == GgufValueType::kArray) {
    LEDE_ASSIGN_OR_RETURN(uint32_t elem_raw, c.Read<uint32_t>(what + " element type"));
    if (!KnownValueType(elem_raw)) {
      return InvalidArgumentError(source + ": " + what + ": unknown array element type " +
                                  std::to_string(elem_raw));
    }
    v.array_type = static_cast<GgufValueType>(elem_raw);
    if (v.array_type == GgufValueType::kArray) {
      return InvalidArgumentError(source + ": " + what + ": arrays of arrays are not supported");
    }
    LEDE_ASSIGN_OR_RETURN(uint64_t n, c.Read<uint64_t>(what + " array length"));
    const size_t min_elem = v.array_type == GgufValueType::kString ? 8 : ScalarBytes(v.array_type);
    if (n > c.left() / min_elem) {
      return InvalidArgumentError(source + ": " + what + ": array of " + std::to_string(n) +
                                  " elements runs past the end of the file");
    }
    // Decoded: a std::string or a double per element.
    const uint64_t decoded_elem = v.array_type == GgufValueType::kString ? sizeof(std::string) : sizeof(double);
    if (n > *budget / decoded_elem) {
      return InvalidArgumentError(source + ": " + what + ": array of " + std::to_string(n) +
                                  " elements exceeds the metadata limit of " +
                                  std::to_string(kMetadataBudgetBytes >> 20) + " MiB decoded");
    }
    *budget -= n * decoded_elem;
    if (v.array_type == GgufValueType::kString) {
      v.strings.reserve(static_cast<size_t>(n));
      for (uint64_t j = 0; j < n; ++j) {
        LEDE_ASSIGN_OR_RETURN(std::string s, c.ReadString(what + "[" + std::to_string(j) + "]", *budget));
        *budget -= s.size();
        v.strings.push_back(std::move(s));
      }
    } else {
      v.numbers.reserve(static_cast<size_t>(n));
      for (uint64_t j = 0; j < n; ++j) {
        int64_t ignored = 0;
        LEDE_ASSIGN_OR_RETURN(double x, ReadScalarNumber(c, v.array_type, what, &ignored, &out_of_range));
        v.numbers.push_back(x);
      }
      out_of_range = false;  // array elements are doubles: no int64 range to keep
    }
  } else {
    LEDE_ASSIGN_OR_RETURN(double x, ReadScalarNumber(c, v.type, what, &v.i, &out_of_range));
    v.f = x;
    if (out_of_range) {
      return InvalidArgumentError(source + ": " + what + ": value out of the int64 range");
    }
  }
  return v;
}

// Reads tensor info record #k (name, dims, type, offset) and sizes it.
StatusOr<GgufTensor> ReadTensorInfo(Cursor& c, const std::string& source, uint64_t k, uint64_t alignment) {
  GgufTensor t;
  LEDE_ASSIGN_OR_RETURN(t.name, c.ReadString("tensor name #" + std::to_string(k), kMaxTensorNameBytes));
  const std::string what = "tensor " + t.name;
  LEDE_ASSIGN_OR_RETURN(uint32_t n_dims, c.Read<uint32_t>(what + " n_dims"));
  if (n_dims == 0 || n_dims > kMaxDims) {
    return InvalidArgumentError(source + ": " + what + ": " + std::to_string(n_dims) + " dims (supported: 1 to 4)");
  }
  int64_t numel = 1;
  for (uint32_t d = 0; d < n_dims; ++d) {
    LEDE_ASSIGN_OR_RETURN(uint64_t ne, c.Read<uint64_t>(what + " dims"));
    if (ne == 0 || ne > (uint64_t{1} << 40)) {
      return InvalidArgumentError(source + ": " + what + ": dim " + std::to_string(d) + " is " +
                                  std::to_string(ne) + " (must be in [1, 2^40])");
    }
    if (numel > (int64_t{1} << 42) / static_cast<int64_t>(ne)) {
      return InvalidArgumentError(source + ": " + what + ": too many elements");
    }
    numel *= static_cast<int64_t>(ne);
    t.ne.push_back(static_cast<int64_t>(ne));
  }
  LEDE_ASSIGN_OR_RETURN(uint32_t type_raw, c.Read<uint32_t>(what + " type"));
  if (!IsKnownGgmlType(type_raw)) {
    return InvalidArgumentError(source + ": " + what + ": unsupported tensor type " + std::to_string(type_raw) +
                                " (supported: F32, F16, BF16, Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K)");
  }
  t.type = static_cast<GgmlType>(type_raw);
  if (t.ne[0] % GgmlBlockValues(t.type) != 0) {
    return InvalidArgumentError(source + ": " + what + ": " + GgmlTypeName(t.type) + " row length " +
                                std::to_string(t.ne[0]) + " is not a multiple of " +
                                std::to_string(GgmlBlockValues(t.type)));
  }
  LEDE_ASSIGN_OR_RETURN(t.offset, c.Read<uint64_t>(what + " offset"));
  if (t.offset % alignment != 0) {
    return InvalidArgumentError(source + ": " + what + ": offset " + std::to_string(t.offset) +
                                " is not a multiple of the alignment " + std::to_string(alignment));
  }
  t.nbytes = GgmlTypeBytes(t.type, numel);
  return t;
}

// Points each tensor at its bytes in the data section, refusing truncated
// or overlapping tensors.
Status PlaceTensorData(std::vector<GgufTensor>* tensors, const uint8_t* data, size_t size, uint64_t data_start,
                       const std::string& source) {
  std::vector<GgufTensor>& ts = *tensors;
  std::vector<std::pair<uint64_t, size_t>> ranges;  // (offset, index)
  for (size_t k = 0; k < ts.size(); ++k) {
    GgufTensor& t = ts[k];
    const uint64_t avail = size - data_start;
    if (t.offset > avail || t.nbytes > avail - t.offset) {
      return InvalidArgumentError(source + ": truncated: tensor " + t.name + " (" + GgmlTypeName(t.type) + " " +
                                  NeString(t.ne) + ", " + std::to_string(t.nbytes) + " bytes at data offset " +
                                  std::to_string(t.offset) + ") runs past the end of the file");
    }
    t.data = data + data_start + t.offset;
    ranges.emplace_back(t.offset, k);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t k = 1; k < ranges.size(); ++k) {
    const GgufTensor& prev = ts[ranges[k - 1].second];
    const GgufTensor& cur = ts[ranges[k].second];
    if (prev.offset + prev.nbytes > cur.offset) {
      return InvalidArgumentError(source + ": tensors " + prev.name + " and " + cur.name + " overlap");
    }
  }
  return OkStatus();
}

}  // namespace

StatusOr<std::shared_ptr<const GgufFile>> GgufFile::Parse(std::shared_ptr<const void> owner, const uint8_t* data,
                                                          size_t size, const std::string& source) {
  std::shared_ptr<GgufFile> f(new GgufFile());
  f->source_ = source;
  f->owner_ = std::move(owner);
  Cursor c(data, size, source);
  if (size < 4 || std::memcmp(data, "GGUF", 4) != 0) {
    return InvalidArgumentError(source + ": not a GGUF file (bad magic; expected \"GGUF\")");
  }
  LEDE_ASSIGN_OR_RETURN(uint32_t magic, c.Read<uint32_t>("magic"));
  (void)magic;
  LEDE_ASSIGN_OR_RETURN(f->version_, c.Read<uint32_t>("version"));
  if (f->version_ != 2 && f->version_ != 3) {
    return InvalidArgumentError(source + ": unsupported GGUF version " + std::to_string(f->version_) +
                                " (supported: 2, 3)");
  }
  LEDE_ASSIGN_OR_RETURN(uint64_t n_tensors, c.Read<uint64_t>("tensor count"));
  LEDE_ASSIGN_OR_RETURN(uint64_t n_kv, c.Read<uint64_t>("metadata count"));
  // Counts beyond what the rest of the file could encode, or beyond the
  // reader's bounds, are refused before any loop or allocation.
  if (n_kv > kMaxMetadataKeys) {
    return InvalidArgumentError(source + ": metadata count " + std::to_string(n_kv) + " exceeds the limit of " +
                                std::to_string(kMaxMetadataKeys));
  }
  if (n_tensors > kMaxTensors) {
    return InvalidArgumentError(source + ": tensor count " + std::to_string(n_tensors) + " exceeds the limit of " +
                                std::to_string(kMaxTensors));
  }
  if (n_kv > c.left() / kMinMetadataRecordBytes) {
    return InvalidArgumentError(source + ": metadata count " + std::to_string(n_kv) + " exceeds the file");
  }
  if (n_tensors > (c.left() - n_kv * kMinMetadataRecordBytes) / kMinTensorInfoBytes) {
    return InvalidArgumentError(source + ": tensor count " + std::to_string(n_tensors) + " exceeds the file");
  }
  // n_kv <= 2^16 records of kMetadataRecordBytes fit the budget.
  uint64_t budget = kMetadataBudgetBytes - n_kv * kMetadataRecordBytes;
  for (uint64_t k = 0; k < n_kv; ++k) {
    LEDE_ASSIGN_OR_RETURN(std::string key, c.ReadString("metadata key #" + std::to_string(k),
                                                        std::min(kMaxKeyBytes, budget)));
    budget -= key.size();
    const std::string what = "metadata key " + key;
    LEDE_ASSIGN_OR_RETURN(GgufValue v, ReadMetadataValue(c, source, what, &budget));
    if (!f->metadata_.emplace(key, std::move(v)).second) {
      return InvalidArgumentError(source + ": duplicate metadata key " + key);
    }
  }
  if (const GgufValue* a = f->Find("general.alignment")) {
    if (!a->is_integer() || a->i <= 0 || !IsPowerOfTwo(static_cast<uint64_t>(a->i)) || a->i > (1 << 20)) {
      return InvalidArgumentError(source + ": metadata key general.alignment must be a power of two up to 2^20");
    }
    f->alignment_ = static_cast<uint64_t>(a->i);
  }
  f->tensors_.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t k = 0; k < n_tensors; ++k) {
    LEDE_ASSIGN_OR_RETURN(GgufTensor t, ReadTensorInfo(c, source, k, f->alignment_));
    const std::string what = "tensor " + t.name;
    if (f->tensor_index_.count(t.name) != 0) return InvalidArgumentError(source + ": duplicate " + what);
    f->tensor_index_[t.name] = f->tensors_.size();
    f->tensors_.push_back(std::move(t));
  }
  const uint64_t data_start = (c.pos() + f->alignment_ - 1) / f->alignment_ * f->alignment_;
  if (!f->tensors_.empty() && data_start > size) {
    return InvalidArgumentError(source + ": truncated: the tensor data section starts past the end of the file");
  }
  LEDE_RETURN_IF_ERROR(PlaceTensorData(&f->tensors_, data, size, data_start, source));
  return std::shared_ptr<const GgufFile>(std::move(f));
}

const GgufValue* GgufFile::Find(const std::string& key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

const GgufTensor* GgufFile::FindTensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {
Status Missing(const GgufFile& f, const std::string& key) {
  return NotFoundError(f.source() + ": missing metadata key " + key);
}
Status WrongType(const GgufFile& f, const std::string& key, const GgufValue& v, const char* want) {
  std::string got = ValueTypeName(v.type);
  if (v.type == GgufValueType::kArray) got += std::string(" of ") + ValueTypeName(v.array_type);
  return InvalidArgumentError(f.source() + ": metadata key " + key + " is " + got + ", expected " + want);
}
}  // namespace

StatusOr<int64_t> GgufFile::GetInt(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(*this, key);
  if (!v->is_integer()) return WrongType(*this, key, *v, "an integer");
  return v->i;
}

StatusOr<double> GgufFile::GetFloat(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(*this, key);
  if (!v->is_float() && !v->is_integer()) return WrongType(*this, key, *v, "a number");
  return v->f;
}

StatusOr<bool> GgufFile::GetBool(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(*this, key);
  if (v->type != GgufValueType::kBool) return WrongType(*this, key, *v, "a bool");
  return v->i != 0;
}

StatusOr<std::string> GgufFile::GetString(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(*this, key);
  if (v->type != GgufValueType::kString) return WrongType(*this, key, *v, "a string");
  return v->str;
}

StatusOr<std::vector<std::string>> GgufFile::GetStringArray(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(*this, key);
  if (v->type != GgufValueType::kArray || v->array_type != GgufValueType::kString) {
    return WrongType(*this, key, *v, "an array of strings");
  }
  return v->strings;
}

StatusOr<std::vector<double>> GgufFile::GetNumberArray(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return Missing(*this, key);
  if (v->type != GgufValueType::kArray || v->array_type == GgufValueType::kString) {
    return WrongType(*this, key, *v, "an array of numbers");
  }
  return v->numbers;
}

}  // namespace lede::checkpoint
