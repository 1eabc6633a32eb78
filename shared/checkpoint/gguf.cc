// File: shared/checkpoint/gguf.cc
//
// GGUF reader and writer (contracts in gguf.h). The reader is a cursor over
// [data, data + size) whose every read checks the bytes left first, so a
// truncated or hostile file is refused before anything past its end is
// touched, and no count from the file sizes an allocation beyond what the
// remaining bytes could hold.
#include "shared/checkpoint/gguf.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include "shared/checkpoint/model_limits.h"
#include "shared/status/status_macros.h"

namespace lede::checkpoint {
namespace {

// The shortest decimal that reads back as this float (1e-5f -> 1e-05, not
// 9.99999974738e-06), as a config.json would hold it: a float32 metadata
// value as the reader returns it.
double ShortestDecimal(float v) {
  if (std::isnan(v)) return static_cast<double>(v);
  char buf[32];
  for (int digits = 6; digits <= 9; ++digits) {
    std::snprintf(buf, sizeof(buf), "%.*g", digits, static_cast<double>(v));
    if (std::strtof(buf, nullptr) == v) break;
  }
  return std::strtod(buf, nullptr);
}


constexpr uint32_t kMaxDims = 4;

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

std::string NeString(const std::vector<int64_t>& ne) {
  std::string s = "[";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

}  // namespace

const char* GgmlTypeName(GgmlType type) {
  switch (type) {
    case GgmlType::kF32: return "F32";
    case GgmlType::kF16: return "F16";
    case GgmlType::kQ4_0: return "Q4_0";
    case GgmlType::kQ5_0: return "Q5_0";
    case GgmlType::kQ8_0: return "Q8_0";
    case GgmlType::kQ4_K: return "Q4_K";
    case GgmlType::kQ5_K: return "Q5_K";
    case GgmlType::kQ6_K: return "Q6_K";
    case GgmlType::kBF16: return "BF16";
  }
  return "?";
}

size_t GgmlTypeBytes(GgmlType type, int64_t numel) {
  const auto n = static_cast<size_t>(numel);
  switch (type) {
    case GgmlType::kF32: return n * 4;
    case GgmlType::kF16: case GgmlType::kBF16: return n * 2;
    default: return n / static_cast<size_t>(GgmlBlockValues(type)) * GgmlBlockBytes(type);
  }
}

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

Status DequantizeToF32(const GgufTensor& t, float* out) {
  const int64_t n = t.numel();
  if (t.data == nullptr && n > 0) return InvalidArgumentError("tensor " + t.name + ": no data");
  if (t.nbytes != GgmlTypeBytes(t.type, n)) return InvalidArgumentError("tensor " + t.name + ": byte count");
  const uint8_t* p = t.data;
  switch (t.type) {
    case GgmlType::kF32:
      std::memcpy(out, p, static_cast<size_t>(n) * 4);
      return OkStatus();
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = HalfToFloat(h);
      }
      return OkStatus();
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        const uint32_t bits = static_cast<uint32_t>(h) << 16;
        std::memcpy(out + i, &bits, 4);
      }
      return OkStatus();
    default:
      if (!DequantizeGgmlRow(t.type, p, n, out)) {
        return InvalidArgumentError("tensor " + t.name + ": " + GgmlTypeName(t.type) + " length " +
                                    std::to_string(n));
      }
      return OkStatus();
  }
  return InvalidArgumentError("tensor " + t.name + ": unsupported type");
}

StatusOr<std::vector<uint8_t>> QuantizeFromF32(const float* x, int64_t n, GgmlType type) {
  if (n < 0) return InvalidArgumentError("QuantizeFromF32: negative length");
  if (n % GgmlBlockValues(type) != 0) {
    return InvalidArgumentError(std::string(GgmlTypeName(type)) + ": " + std::to_string(n) +
                                " values is not a multiple of " + std::to_string(GgmlBlockValues(type)));
  }
  std::vector<uint8_t> out(GgmlTypeBytes(type, n));
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(out.data(), x, out.size());
      break;
    case GgmlType::kF16:
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = type == GgmlType::kF16 ? FloatToHalf(x[i]) : FloatToBf16(x[i]);
        std::memcpy(out.data() + 2 * i, &h, 2);
      }
      break;
    case GgmlType::kQ8_0:
      for (int64_t b = 0; b < n / kQ8_0BlockValues; ++b) {
        const float* v = x + b * kQ8_0BlockValues;
        float amax = 0.0f;
        for (int64_t j = 0; j < kQ8_0BlockValues; ++j) amax = std::max(amax, std::fabs(v[j]));
        const float d = amax / 127.0f;
        const float inv = d != 0.0f ? 1.0f / d : 0.0f;
        uint8_t* blk = out.data() + b * kQ8_0BlockBytes;
        const uint16_t dh = FloatToHalf(d);
        std::memcpy(blk, &dh, 2);
        for (int64_t j = 0; j < kQ8_0BlockValues; ++j) {
          const float q = std::round(v[j] * inv);
          blk[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f)));
        }
      }
      break;
    default:
      if (!QuantizeGgmlRow(type, x, n, out.data())) {
        return InvalidArgumentError(std::string("cannot quantize to ") + GgmlTypeName(type));
      }
      break;
  }
  return out;
}

// --- Writer --------------------------------------------------------------------

namespace {
template <typename T>
void Put(std::string* s, T v) {
  s->append(reinterpret_cast<const char*>(&v), sizeof(T));
}
void PutString(std::string* s, const std::string& v) {
  Put<uint64_t>(s, v.size());
  s->append(v);
}
}  // namespace

void GgufWriter::AddString(const std::string& key, const std::string& value) {
  PutString(&kv_, key);
  Put<uint32_t>(&kv_, static_cast<uint32_t>(GgufValueType::kString));
  PutString(&kv_, value);
  ++n_kv_;
}
void GgufWriter::AddUint32(const std::string& key, uint32_t value) {
  PutString(&kv_, key);
  Put<uint32_t>(&kv_, static_cast<uint32_t>(GgufValueType::kUint32));
  Put<uint32_t>(&kv_, value);
  ++n_kv_;
}
void GgufWriter::AddInt32(const std::string& key, int32_t value) {
  PutString(&kv_, key);
  Put<uint32_t>(&kv_, static_cast<uint32_t>(GgufValueType::kInt32));
  Put<int32_t>(&kv_, value);
  ++n_kv_;
}
void GgufWriter::AddFloat32(const std::string& key, float value) {
  PutString(&kv_, key);
  Put<uint32_t>(&kv_, static_cast<uint32_t>(GgufValueType::kFloat32));
  Put<float>(&kv_, value);
  ++n_kv_;
}
void GgufWriter::AddFloat64(const std::string& key, double value) {
  PutString(&kv_, key);
  Put<uint32_t>(&kv_, static_cast<uint32_t>(GgufValueType::kFloat64));
  Put<double>(&kv_, value);
  ++n_kv_;
}
void GgufWriter::AddBool(const std::string& key, bool value) {
  PutString(&kv_, key);
  Put<uint32_t>(&kv_, static_cast<uint32_t>(GgufValueType::kBool));
  Put<uint8_t>(&kv_, value ? 1 : 0);
  ++n_kv_;
}
void GgufWriter::AddStringArray(const std::string& key, const std::vector<std::string>& values) {
  PutString(&kv_, key);
  Put<uint32_t>(&kv_, static_cast<uint32_t>(GgufValueType::kArray));
  Put<uint32_t>(&kv_, static_cast<uint32_t>(GgufValueType::kString));
  Put<uint64_t>(&kv_, values.size());
  for (const std::string& v : values) PutString(&kv_, v);
  ++n_kv_;
}
void GgufWriter::AddFloat32Array(const std::string& key, const std::vector<float>& values) {
  PutString(&kv_, key);
  Put<uint32_t>(&kv_, static_cast<uint32_t>(GgufValueType::kArray));
  Put<uint32_t>(&kv_, static_cast<uint32_t>(GgufValueType::kFloat32));
  Put<uint64_t>(&kv_, values.size());
  for (float v : values) Put<float>(&kv_, v);
  ++n_kv_;
}
void GgufWriter::AddInt32Array(const std::string& key, const std::vector<int32_t>& values) {
  PutString(&kv_, key);
  Put<uint32_t>(&kv_, static_cast<uint32_t>(GgufValueType::kArray));
  Put<uint32_t>(&kv_, static_cast<uint32_t>(GgufValueType::kInt32));
  Put<uint64_t>(&kv_, values.size());
  for (int32_t v : values) Put<int32_t>(&kv_, v);
  ++n_kv_;
}

Status GgufWriter::AddTensor(const std::string& name, GgmlType type, const std::vector<int64_t>& shape,
                             const void* data, size_t nbytes) {
  if (shape.empty() || shape.size() > kMaxDims) return InvalidArgumentError("GGUF tensor " + name + ": rank");
  for (const Tensor& t : tensors_) {
    if (t.name == name) return InvalidArgumentError("GGUF tensor " + name + ": duplicate name");
  }
  int64_t numel = 1;
  for (int64_t d : shape) {
    if (d <= 0) return InvalidArgumentError("GGUF tensor " + name + ": non-positive dim");
    numel *= d;
  }
  if (shape.back() % GgmlBlockValues(type) != 0) {
    return InvalidArgumentError("GGUF tensor " + name + ": " + GgmlTypeName(type) + " row length " +
                                std::to_string(shape.back()) + " is not a multiple of " +
                                std::to_string(GgmlBlockValues(type)));
  }
  if (nbytes != GgmlTypeBytes(type, numel)) {
    return InvalidArgumentError("GGUF tensor " + name + ": " + std::to_string(nbytes) + " bytes, expected " +
                                std::to_string(GgmlTypeBytes(type, numel)));
  }
  tensors_.push_back(Tensor{name, type, shape, data, nbytes});
  return OkStatus();
}

Status GgufWriter::AddTensor(const std::string& name, GgmlType type, const std::vector<int64_t>& shape,
                             std::vector<uint8_t> owned_bytes) {
  owned_.push_back(std::move(owned_bytes));
  Status s = AddTensor(name, type, shape, owned_.back().data(), owned_.back().size());
  if (!s.ok()) owned_.pop_back();
  return s;
}

Status GgufWriter::Write(const std::string& path) const {
  constexpr uint64_t kAlign = 32;
  std::string head;
  head.append("GGUF", 4);
  Put<uint32_t>(&head, 3);
  Put<uint64_t>(&head, tensors_.size());
  Put<uint64_t>(&head, n_kv_);
  head += kv_;
  uint64_t offset = 0;
  std::vector<uint64_t> offsets;
  for (const Tensor& t : tensors_) {
    PutString(&head, t.name);
    Put<uint32_t>(&head, static_cast<uint32_t>(t.shape.size()));
    for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) Put<uint64_t>(&head, static_cast<uint64_t>(*it));
    Put<uint32_t>(&head, static_cast<uint32_t>(t.type));
    Put<uint64_t>(&head, offset);
    offsets.push_back(offset);
    offset = (offset + t.nbytes + kAlign - 1) / kAlign * kAlign;
  }
  head.resize((head.size() + kAlign - 1) / kAlign * kAlign, '\0');
  LEDE_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFile> out, AtomicFile::Create(path));
  LEDE_RETURN_IF_ERROR(out->Append(head));
  uint64_t written = 0;
  for (size_t k = 0; k < tensors_.size(); ++k) {
    LEDE_RETURN_IF_ERROR(WriteZeros(*out, static_cast<size_t>(offsets[k] - written)));
    LEDE_RETURN_IF_ERROR(out->Append(tensors_[k].data, tensors_[k].nbytes));
    written = offsets[k] + tensors_[k].nbytes;
  }
  return out->Commit();
}

// --- The llama architecture -------------------------------------------------------

namespace {

struct NamePair {
  const char* gguf;
  const char* hf;
};
constexpr NamePair kLayerNames[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
};
constexpr NamePair kGlobalNames[] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};

// "<prefix><digits>.<rest>" -> (layer, rest), or layer -1.
std::pair<int64_t, std::string> SplitLayer(const std::string& name, const std::string& prefix) {
  if (name.compare(0, prefix.size(), prefix) != 0) return {-1, ""};
  size_t i = prefix.size(), j = i;
  while (j < name.size() && j - i < 6 && name[j] >= '0' && name[j] <= '9') ++j;
  if (j == i || j >= name.size() || name[j] != '.') return {-1, ""};
  return {std::stoll(name.substr(i, j - i)), name.substr(j + 1)};
}

}  // namespace

std::string GgufToHfName(const std::string& gguf_name) {
  for (const NamePair& p : kGlobalNames) {
    if (gguf_name == p.gguf) return p.hf;
  }
  auto [layer, rest] = SplitLayer(gguf_name, "blk.");
  if (layer < 0) return "";
  for (const NamePair& p : kLayerNames) {
    if (rest == p.gguf) return "model.layers." + std::to_string(layer) + "." + p.hf;
  }
  return "";
}

std::string HfToGgufName(const std::string& hf_name) {
  for (const NamePair& p : kGlobalNames) {
    if (hf_name == p.hf) return p.gguf;
  }
  auto [layer, rest] = SplitLayer(hf_name, "model.layers.");
  if (layer < 0) return "";
  for (const NamePair& p : kLayerNames) {
    if (rest == p.hf) return "blk." + std::to_string(layer) + "." + p.gguf;
  }
  return "";
}

std::vector<float> Llama3RopeFreqFactors(const model::ModelConfig& c) {
  const model::RopeScaling& s = c.rope_scaling;
  const int64_t hd = c.head_dim(), half = hd / 2;
  const double old_ctx = static_cast<double>(s.original_max_position_embeddings);
  const double low_wavelen = old_ctx / s.low_freq_factor, high_wavelen = old_ctx / s.high_freq_factor;
  std::vector<float> out(static_cast<size_t>(half), 1.0f);
  for (int64_t i = 0; i < half; ++i) {
    const double inv = std::pow(c.rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(hd));
    const double wavelen = 2.0 * M_PI / inv;
    if (wavelen < high_wavelen) continue;
    if (wavelen > low_wavelen) {
      out[i] = static_cast<float>(s.factor);
    } else {
      const double smooth = (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      out[i] = static_cast<float>(1.0 / ((1.0 - smooth) / s.factor + smooth));
    }
  }
  return out;
}

namespace {

// Finds Llama-3 scaling parameters that reproduce rope_freqs.weight.
Status MatchLlama3Scaling(const GgufTensor& t, const std::string& src, model::ModelConfig* c) {
  const int64_t half = c->head_dim() / 2;
  if (t.ne != std::vector<int64_t>{half}) {
    return InvalidArgumentError(src + ": tensor rope_freqs.weight has dims " + NeString(t.ne) + ", expected [" +
                                std::to_string(half) + "] (head dim / 2)");
  }
  std::vector<float> given(static_cast<size_t>(half));
  LEDE_RETURN_IF_ERROR(DequantizeToF32(t, given.data()));
  const float factor = *std::max_element(given.begin(), given.end());
  if (!(factor >= 1.0f) || !std::isfinite(factor)) {
    return InvalidArgumentError(src + ": tensor rope_freqs.weight: factors must be finite and at least 1");
  }
  model::ModelConfig trial = *c;
  trial.rope_scaling.type = model::RopeScaling::Type::kLlama3;
  trial.rope_scaling.factor = factor;
  for (int64_t orig : {8192, 4096, 2048, 16384, 32768, 131072}) {
    for (double low : {1.0, 2.0}) {
      for (double high : {4.0, 8.0, 2.0}) {
        trial.rope_scaling.low_freq_factor = low;
        trial.rope_scaling.high_freq_factor = high;
        trial.rope_scaling.original_max_position_embeddings = orig;
        const std::vector<float> want = Llama3RopeFreqFactors(trial);
        bool same = true;
        for (int64_t i = 0; i < half && same; ++i) same = std::fabs(want[i] - given[i]) <= 1e-4f * given[i];
        if (same) {
          c->rope_scaling = trial.rope_scaling;
          return OkStatus();
        }
      }
    }
  }
  return InvalidArgumentError(src + ": tensor rope_freqs.weight matches no Llama-3 RoPE scaling (factor " +
                              std::to_string(factor) + "; per-frequency factors of another shape are not supported)");
}

}  // namespace

namespace {

// Reads a metadata integer that must be in [1, max] (model_config.h's
// bounds).
StatusOr<int64_t> PositiveInt(const GgufFile& f, const std::string& key, int64_t max) {
  const std::string& src = f.source();
  LEDE_ASSIGN_OR_RETURN(int64_t v, f.GetInt(key));
  if (v <= 0 || v > max) {
    return InvalidArgumentError(src + ": metadata key " + key + " is " + std::to_string(v) + ", outside [1, " +
                                std::to_string(max) + "]");
  }
  return v;
}

// Reads the llama dims, norm epsilon and rope settings and checks they agree.
Status ReadLlamaHyperparams(const GgufFile& f, model::ModelConfig* c) {
  const std::string& src = f.source();
  LEDE_ASSIGN_OR_RETURN(c->dim, PositiveInt(f, "llama.embedding_length", model::kMaxModelDim));
  LEDE_ASSIGN_OR_RETURN(c->hidden_dim, PositiveInt(f, "llama.feed_forward_length", model::kMaxModelDim));
  LEDE_ASSIGN_OR_RETURN(c->n_layers, PositiveInt(f, "llama.block_count", model::kMaxLayers));
  LEDE_ASSIGN_OR_RETURN(c->n_heads, PositiveInt(f, "llama.attention.head_count", model::kMaxModelDim));
  c->n_kv_heads = c->n_heads;
  if (f.Find("llama.attention.head_count_kv") != nullptr) {
    LEDE_ASSIGN_OR_RETURN(c->n_kv_heads, PositiveInt(f, "llama.attention.head_count_kv", model::kMaxModelDim));
  }
  LEDE_ASSIGN_OR_RETURN(c->max_seq_len, PositiveInt(f, "llama.context_length", model::kMaxContextTokens));
  LEDE_ASSIGN_OR_RETURN(c->rms_norm_eps, f.GetFloat("llama.attention.layer_norm_rms_epsilon"));
  if (!(c->rms_norm_eps > 0.0 && c->rms_norm_eps < 1.0)) {
    return InvalidArgumentError(src + ": metadata key llama.attention.layer_norm_rms_epsilon must be in (0, 1)");
  }
  if (f.Find("llama.rope.freq_base") != nullptr) {
    LEDE_ASSIGN_OR_RETURN(c->rope_theta, f.GetFloat("llama.rope.freq_base"));
    if (!(c->rope_theta > 1.0)) {
      return InvalidArgumentError(src + ": metadata key llama.rope.freq_base must be above 1");
    }
  }
  // This project's exact copies (written by `lede export` when the float32
  // keys cannot hold the checkpoint's values): used when they agree with
  // the llama.cpp keys to float32 precision.
  for (const auto& [key, value] : {std::pair{kExactRmsNormEpsKey, &c->rms_norm_eps},
                                   std::pair{kExactRopeThetaKey, &c->rope_theta}}) {
    if (f.Find(key) == nullptr) continue;
    LEDE_ASSIGN_OR_RETURN(double exact, f.GetFloat(key));
    if (static_cast<float>(exact) != static_cast<float>(*value)) {
      return InvalidArgumentError(src + ": metadata key " + key + " contradicts its llama.* float32 key");
    }
    *value = exact;
  }
  if (c->dim % c->n_heads != 0 || c->n_heads % c->n_kv_heads != 0 || (c->dim / c->n_heads) % 2 != 0) {
    return InvalidArgumentError(src + ": metadata keys llama.embedding_length (" + std::to_string(c->dim) +
                                "), llama.attention.head_count (" + std::to_string(c->n_heads) +
                                ") and head_count_kv (" + std::to_string(c->n_kv_heads) + ") are inconsistent");
  }
  for (const char* key : {"llama.rope.dimension_count", "llama.attention.key_length",
                          "llama.attention.value_length"}) {
    if (f.Find(key) == nullptr) continue;
    LEDE_ASSIGN_OR_RETURN(int64_t v, f.GetInt(key));
    if (v != c->head_dim()) {
      return InvalidArgumentError(src + ": metadata key " + std::string(key) + " is " + std::to_string(v) +
                                  ", expected the head dim " + std::to_string(c->head_dim()) +
                                  " (partial rotary and other head sizes are not supported)");
    }
  }
  if (f.Find("llama.rope.scaling.type") != nullptr) {
    LEDE_ASSIGN_OR_RETURN(std::string type, f.GetString("llama.rope.scaling.type"));
    if (type == "linear") {
      c->rope_scaling.type = model::RopeScaling::Type::kLinear;
      LEDE_ASSIGN_OR_RETURN(c->rope_scaling.factor, f.GetFloat("llama.rope.scaling.factor"));
      if (!(c->rope_scaling.factor > 0.0)) {
        return InvalidArgumentError(src + ": metadata key llama.rope.scaling.factor must be positive");
      }
    } else if (type != "none" && !(type == "llama3" && f.FindTensor("rope_freqs.weight") != nullptr)) {
      return InvalidArgumentError(src + ": metadata key llama.rope.scaling.type is \"" + type +
                                  "\" (supported: none, linear)");
    }
  }
  return OkStatus();
}

// Reads the vocabulary size, tied embeddings and the special token ids.
Status ReadLlamaVocab(const GgufFile& f, model::ModelConfig* c) {
  const std::string& src = f.source();
  const GgufTensor* embd = f.FindTensor("token_embd.weight");
  if (embd == nullptr) return InvalidArgumentError(src + ": missing tensor token_embd.weight");
  if (f.Find("llama.vocab_size") != nullptr) {
    LEDE_ASSIGN_OR_RETURN(c->vocab_size, PositiveInt(f, "llama.vocab_size", model::kMaxVocabSize));
  } else if (f.Find("tokenizer.ggml.tokens") != nullptr) {
    const GgufValue* tokens = f.Find("tokenizer.ggml.tokens");
    if (tokens->type != GgufValueType::kArray || tokens->array_type != GgufValueType::kString) {
      return InvalidArgumentError(src + ": metadata key tokenizer.ggml.tokens is not an array of strings");
    }
    c->vocab_size = static_cast<int64_t>(tokens->strings.size());
    if (c->vocab_size < 1 || c->vocab_size > model::kMaxVocabSize) {
      return InvalidArgumentError(src + ": metadata key tokenizer.ggml.tokens has " + std::to_string(c->vocab_size) +
                                  " tokens, outside [1, " + std::to_string(model::kMaxVocabSize) + "]");
    }
  } else {
    c->vocab_size = embd->ne.size() == 2 ? embd->ne[1] : 0;
  }
  if (const GgufValue* tokens = f.Find("tokenizer.ggml.tokens")) {
    if (static_cast<int64_t>(tokens->strings.size()) != c->vocab_size) {
      return InvalidArgumentError(src + ": metadata key tokenizer.ggml.tokens has " +
                                  std::to_string(tokens->strings.size()) + " tokens but the vocabulary size is " +
                                  std::to_string(c->vocab_size));
    }
  }
  c->rope_style = model::RopeStyle::kAdjacentPairs;
  c->tie_word_embeddings = f.FindTensor("output.weight") == nullptr;
  c->bos_id = 1;
  c->eos_ids = {2};
  auto token_id = [&](const std::string& key, int64_t* out) -> Status {
    LEDE_ASSIGN_OR_RETURN(*out, f.GetInt(key));
    if (*out < 0 || *out >= c->vocab_size) {
      return InvalidArgumentError(src + ": metadata key " + key + " is " + std::to_string(*out) +
                                  ", outside the vocabulary [0, " + std::to_string(c->vocab_size) + ")");
    }
    return OkStatus();
  };
  int64_t id = 0;
  if (f.Find("tokenizer.ggml.bos_token_id") != nullptr) {
    LEDE_RETURN_IF_ERROR(token_id("tokenizer.ggml.bos_token_id", &id));
    c->bos_id = static_cast<int32_t>(id);
  }
  if (f.Find("tokenizer.ggml.eos_token_id") != nullptr) {
    LEDE_RETURN_IF_ERROR(token_id("tokenizer.ggml.eos_token_id", &id));
    c->eos_ids = {static_cast<int32_t>(id)};
  }
  for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    if (f.Find(key) == nullptr) continue;
    LEDE_RETURN_IF_ERROR(token_id(key, &id));
    if (std::find(c->eos_ids.begin(), c->eos_ids.end(), id) == c->eos_ids.end()) {
      c->eos_ids.push_back(static_cast<int32_t>(id));
    }
  }
  return OkStatus();
}

// Checks that every tensor the config needs is present with the right dims.
Status CheckLlamaTensors(const GgufFile& f, const model::ModelConfig& c) {
  const std::string& src = f.source();
  // Every tensor the config needs, with dims in ggml order (ne[0] = in).
  // Nine tensors per block: a block count the file cannot hold is refused
  // before the list below is sized by it.
  if (c.n_layers > static_cast<int64_t>(f.tensors().size() / 9)) {
    return InvalidArgumentError(src + ": metadata key llama.block_count is " + std::to_string(c.n_layers) +
                                ", but the file holds " + std::to_string(f.tensors().size()) +
                                " tensors (each block needs 9)");
  }
  const int64_t d = c.dim, q = c.n_heads * c.head_dim(), kv = c.kv_dim(), h = c.hidden_dim;
  std::vector<std::pair<std::string, std::vector<int64_t>>> need = {{"token_embd.weight", {d, c.vocab_size}},
                                                                    {"output_norm.weight", {d}}};
  if (!c.tie_word_embeddings) need.push_back({"output.weight", {d, c.vocab_size}});
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    need.push_back({p + "attn_norm.weight", {d}});
    need.push_back({p + "attn_q.weight", {d, q}});
    need.push_back({p + "attn_k.weight", {d, kv}});
    need.push_back({p + "attn_v.weight", {d, kv}});
    need.push_back({p + "attn_output.weight", {q, d}});
    need.push_back({p + "ffn_norm.weight", {d}});
    need.push_back({p + "ffn_gate.weight", {d, h}});
    need.push_back({p + "ffn_up.weight", {d, h}});
    need.push_back({p + "ffn_down.weight", {h, d}});
  }
  for (const auto& [name, ne] : need) {
    const GgufTensor* t = f.FindTensor(name);
    if (t == nullptr) return InvalidArgumentError(src + ": missing tensor " + name);
    if (t->ne != ne) {
      return InvalidArgumentError(src + ": tensor " + name + " has dims " + NeString(t->ne) + ", but the metadata " +
                                  "(llama.embedding_length " + std::to_string(d) + ", feed_forward_length " +
                                  std::to_string(h) + ", head_count " + std::to_string(c.n_heads) +
                                  ", head_count_kv " + std::to_string(c.n_kv_heads) + ", vocabulary " +
                                  std::to_string(c.vocab_size) + ") says " + NeString(ne));
    }
  }
  return OkStatus();
}

}  // namespace

StatusOr<model::ModelConfig> GgufLlamaConfig(const GgufFile& f) {
  const std::string& src = f.source();
  LEDE_ASSIGN_OR_RETURN(std::string arch, f.GetString("general.architecture"));
  if (arch != "llama") {
    return InvalidArgumentError(src + ": metadata key general.architecture is \"" + arch +
                                "\" (supported: llama)");
  }
  model::ModelConfig c;
  LEDE_RETURN_IF_ERROR(ReadLlamaHyperparams(f, &c));
  if (const GgufTensor* freqs = f.FindTensor("rope_freqs.weight")) {
    LEDE_RETURN_IF_ERROR(MatchLlama3Scaling(*freqs, src, &c));
  }
  LEDE_RETURN_IF_ERROR(ReadLlamaVocab(f, &c));
  LEDE_RETURN_IF_ERROR(c.Validate());
  LEDE_RETURN_IF_ERROR(CheckLlamaTensors(f, c));
  return c;
}

Status AddLlamaMetadata(const model::ModelConfig& c, const std::string& name, GgufWriter* w) {
  LEDE_RETURN_IF_ERROR(c.Validate());
  w->AddString("general.architecture", "llama");
  w->AddString("general.name", name);
  w->AddUint32("general.alignment", 32);
  w->AddUint32("llama.context_length", static_cast<uint32_t>(c.max_seq_len));
  w->AddUint32("llama.embedding_length", static_cast<uint32_t>(c.dim));
  w->AddUint32("llama.block_count", static_cast<uint32_t>(c.n_layers));
  w->AddUint32("llama.feed_forward_length", static_cast<uint32_t>(c.hidden_dim));
  w->AddUint32("llama.rope.dimension_count", static_cast<uint32_t>(c.head_dim()));
  w->AddUint32("llama.attention.head_count", static_cast<uint32_t>(c.n_heads));
  w->AddUint32("llama.attention.head_count_kv", static_cast<uint32_t>(c.n_kv_heads));
  w->AddFloat32("llama.attention.layer_norm_rms_epsilon", static_cast<float>(c.rms_norm_eps));
  w->AddFloat32("llama.rope.freq_base", static_cast<float>(c.rope_theta));
  // A value the float32 key cannot give back exactly (a widened checkpoint's
  // eps * d/D) travels exactly too, so that the file's architecture
  // fingerprint is its source's (policies and calibrations are keyed by it).
  for (const auto& [key, value] : {std::pair{kExactRmsNormEpsKey, c.rms_norm_eps},
                                   std::pair{kExactRopeThetaKey, c.rope_theta}}) {
    if (ShortestDecimal(static_cast<float>(value)) != value) w->AddFloat64(key, value);
  }
  w->AddUint32("llama.vocab_size", static_cast<uint32_t>(c.vocab_size));
  if (c.rope_scaling.type == model::RopeScaling::Type::kLinear) {
    w->AddString("llama.rope.scaling.type", "linear");
    w->AddFloat32("llama.rope.scaling.factor", static_cast<float>(c.rope_scaling.factor));
  }
  if (c.rope_scaling.type == model::RopeScaling::Type::kLlama3) {
    const std::vector<float> factors = Llama3RopeFreqFactors(c);
    std::vector<uint8_t> bytes(factors.size() * 4);
    std::memcpy(bytes.data(), factors.data(), bytes.size());
    LEDE_RETURN_IF_ERROR(w->AddTensor("rope_freqs.weight", GgmlType::kF32, {static_cast<int64_t>(factors.size())},
                                      std::move(bytes)));
  }
  return OkStatus();
}

}  // namespace lede::checkpoint
