// File: shared/checkpoint/gguf_writer.cc
//
// The GGUF writer (contracts in gguf.h): metadata records serialized as
// they are added, tensor infos and data laid out at Write, all little-endian
// in GGUF v3's layout (gguf.h), alignment 32.
#include "shared/checkpoint/gguf.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "shared/checkpoint/internal/gguf_internal.h"
#include "shared/status/status_macros.h"

namespace lede::checkpoint {

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
  if (shape.empty() || shape.size() > internal::kMaxDims) return InvalidArgumentError("GGUF tensor " + name + ": rank");
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

}  // namespace lede::checkpoint
