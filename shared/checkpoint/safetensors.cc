// File: shared/checkpoint/safetensors.cc
//
// The safetensors reader and writer (contracts in safetensors.h): header
// parsing and validation on a read-only mapping, dtype conversion to float32
// in plain C++, and a streamed atomic writer.
#include "shared/checkpoint/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <utility>

#include "shared/checkpoint/number_formats.h"
#include "shared/status/status_macros.h"

namespace lede::checkpoint {
namespace {

using Json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // as upstream

// What the header's JSON may hold before it is parsed: a DOM node costs
// about 100 bytes against one or two bytes of text, so 100 MiB of "[[[..."
// or of empty objects would take GiBs. A real header nests 3 deep
// ({name: {"shape": [...]}}) and spends about 11 structural characters
// ({ [ : ,) per tensor: 2^21 of them is some 190,000 tensors in one file,
// about 200 MiB parsed.
constexpr int kMaxHeaderDepth = 8;
constexpr uint64_t kMaxHeaderStructure = uint64_t{1} << 21;

// Scans the header text (outside strings) for its nesting depth and its
// count of { [ : , before nlohmann-json builds anything.
Status CheckHeaderStructure(const char* text, uint64_t n, const std::string& path) {
  int depth = 0;
  uint64_t structure = 0;
  bool in_string = false, escaped = false;
  for (uint64_t i = 0; i < n; ++i) {
    const char ch = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (ch == '\\') {
        escaped = true;
      } else if (ch == '"') {
        in_string = false;
      }
      continue;
    }
    switch (ch) {
      case '"': in_string = true; break;
      case '{': case '[':
        if (++depth > kMaxHeaderDepth) {
          return InvalidArgumentError(path + ": safetensors header nests deeper than " +
                                      std::to_string(kMaxHeaderDepth) + " levels");
        }
        ++structure;
        break;
      case '}': case ']': --depth; break;
      case ':': case ',': ++structure; break;
      default: break;
    }
    if (structure > kMaxHeaderStructure) {
      return InvalidArgumentError(path + ": safetensors header holds more than " +
                                  std::to_string(kMaxHeaderStructure) + " JSON values");
    }
  }
  return OkStatus();
}

uint64_t LoadLe64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void StoreLe64(uint64_t v, uint8_t* p) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

bool ParseDtype(const std::string& name, Dtype* out) {
  for (Dtype d : {Dtype::kF32, Dtype::kF16, Dtype::kBF16, Dtype::kF64}) {
    if (name == DtypeName(d)) {
      *out = d;
      return true;
    }
  }
  return false;
}

bool ReadUint(const Json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(v.get<int64_t>());
    return true;
  }
  return false;
}

// A header entry, offsets relative to the data region.
struct Entry {
  std::string name;
  TensorView view;
  uint64_t begin = 0;
  uint64_t end = 0;
};

StatusOr<Entry> ParseEntry(const std::string& file, const std::string& name, const Json& v, uint64_t data_size) {
  const std::string where = file + ": tensor " + name;
  if (!v.is_object()) {
    return InvalidArgumentError(where + ": header entry is not an object");
  }
  Entry e;
  e.name = name;
  auto dt = v.find("dtype");
  if (dt == v.end() || !dt->is_string()) {
    return InvalidArgumentError(where + ": missing or non-string \"dtype\"");
  }
  const std::string dtype = dt->get<std::string>();
  if (!ParseDtype(dtype, &e.view.dtype)) {
    return InvalidArgumentError(where + ": unknown or unsupported dtype \"" + dtype +
                                "\" (readable: F32, F16, BF16, F64)");
  }
  auto sh = v.find("shape");
  if (sh == v.end() || !sh->is_array()) {
    return InvalidArgumentError(where + ": missing or non-array \"shape\"");
  }
  uint64_t numel = 1;
  for (const Json& s : *sh) {
    uint64_t dim = 0;
    if (!ReadUint(s, &dim) || dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return InvalidArgumentError(where + ": shape holds a non-integer or negative size");
    }
    if (__builtin_mul_overflow(numel, dim, &numel)) {
      return InvalidArgumentError(where + ": shape is too large");
    }
    e.view.shape.push_back(static_cast<int64_t>(dim));
  }
  auto off = v.find("data_offsets");
  if (off == v.end() || !off->is_array() || off->size() != 2 || !ReadUint((*off)[0], &e.begin) ||
      !ReadUint((*off)[1], &e.end)) {
    return InvalidArgumentError(where + ": \"data_offsets\" must be two non-negative integers");
  }
  if (e.begin > e.end || e.end > data_size) {
    return InvalidArgumentError(where + ": data_offsets [" + std::to_string(e.begin) + ", " +
                                std::to_string(e.end) + "] out of range (data region is " +
                                std::to_string(data_size) + " bytes)");
  }
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(DtypeSize(e.view.dtype)), &nbytes) ||
      nbytes != e.end - e.begin) {
    return InvalidArgumentError(where + ": shape " + ShapeString(e.view.shape) + " of " + dtype +
                                " does not match its data_offsets length of " + std::to_string(e.end - e.begin) +
                                " bytes");
  }
  e.view.nbytes = static_cast<size_t>(nbytes);
  return e;
}

// kInvalidArgument naming the first two tensors whose non-empty byte ranges
// overlap.
Status CheckDisjoint(const std::string& file, const std::vector<Entry>& entries) {
  std::vector<const Entry*> by_offset;
  for (const Entry& e : entries) {
    if (e.end > e.begin) by_offset.push_back(&e);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](const Entry* a, const Entry* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const Entry& prev = *by_offset[i - 1];
    const Entry& cur = *by_offset[i];
    if (cur.begin < prev.end) {
      return InvalidArgumentError(file + ": tensors " + prev.name + " [" + std::to_string(prev.begin) + ", " +
                                  std::to_string(prev.end) + ") and " + cur.name + " [" +
                                  std::to_string(cur.begin) + ", " + std::to_string(cur.end) +
                                  ") have overlapping data_offsets");
    }
  }
  return OkStatus();
}

}  // namespace

const char* DtypeName(Dtype dtype) {
  switch (dtype) {
    case Dtype::kF32: return "F32";
    case Dtype::kF16: return "F16";
    case Dtype::kBF16: return "BF16";
    case Dtype::kF64: return "F64";
  }
  return "?";
}

size_t DtypeSize(Dtype dtype) {
  switch (dtype) {
    case Dtype::kF32: return 4;
    case Dtype::kF16: return 2;
    case Dtype::kBF16: return 2;
    case Dtype::kF64: return 8;
  }
  return 0;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

StatusOr<std::shared_ptr<const SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  LEDE_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> map, MappedFile::Open(path));
  const uint64_t size = map->size();
  if (size < 8) {
    return InvalidArgumentError(path + ": truncated safetensors file: " + std::to_string(size) +
                                " bytes, shorter than the 8-byte header length");
  }
  const uint64_t header_len = LoadLe64(map->data());
  if (header_len > size - 8) {
    return InvalidArgumentError(path + ": safetensors header length " + std::to_string(header_len) +
                                " runs past the end of the file (" + std::to_string(size) + " bytes)");
  }
  if (header_len > kMaxHeaderBytes) {
    return InvalidArgumentError(path + ": safetensors header length " + std::to_string(header_len) +
                                " exceeds the 100 MiB limit");
  }
  const char* text = reinterpret_cast<const char*>(map->data() + 8);
  LEDE_RETURN_IF_ERROR(CheckHeaderStructure(text, header_len, path));
  const Json header = Json::parse(text, text + header_len, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) {
    return InvalidArgumentError(path + ": safetensors header is not valid JSON");
  }
  if (!header.is_object()) {
    return InvalidArgumentError(path + ": safetensors header is not a JSON object");
  }
  const uint64_t data_begin = 8 + header_len;
  const uint64_t data_size = size - data_begin;

  std::vector<Entry> entries;
  for (const auto& item : header.items()) {
    if (item.key() == "__metadata__") continue;
    LEDE_ASSIGN_OR_RETURN(Entry e, ParseEntry(path, item.key(), item.value(), data_size));
    entries.push_back(std::move(e));
  }
  LEDE_RETURN_IF_ERROR(CheckDisjoint(path, entries));

  std::shared_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  for (Entry& e : entries) {
    e.view.data = map->data() + data_begin + e.begin;
    file->tensors_.emplace(e.name, std::move(e.view));
  }
  file->mapping_ = std::move(map);
  return std::shared_ptr<const SafetensorsFile>(std::move(file));
}

StatusOr<std::vector<float>> ToFloat32(const TensorView& view) {
  const size_t n = static_cast<size_t>(view.numel());
  std::vector<float> out(n);
  const uint8_t* p = view.data;
  switch (view.dtype) {
    case Dtype::kF32:
      if (n > 0) std::memcpy(out.data(), p, n * sizeof(float));
      return out;
    case Dtype::kF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, sizeof(h));
        out[i] = HalfToFloat(h);
      }
      return out;
    case Dtype::kBF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, sizeof(h));
        out[i] = Bf16ToFloat(h);
      }
      return out;
    case Dtype::kF64:
      for (size_t i = 0; i < n; ++i) {
        double d;
        std::memcpy(&d, p + 8 * i, sizeof(d));
        out[i] = static_cast<float>(d);
      }
      return out;
  }
  return InvalidArgumentError(std::string("unsupported dtype ") + DtypeName(view.dtype));
}

Status WriteSafetensors(const std::string& path, const std::map<std::string, TensorBytes>& tensors) {
  Json header = Json::object();
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name.empty() || name == "__metadata__") {
      return InvalidArgumentError(path + ": invalid tensor name \"" + name + "\"");
    }
    if (t.dtype == Dtype::kF64) {
      return InvalidArgumentError(path + ": tensor " + name + ": F64 is not written (use F32, F16 or BF16)");
    }
    uint64_t numel = 1;
    for (int64_t s : t.shape) numel *= static_cast<uint64_t>(s < 0 ? 0 : s);
    if (numel * DtypeSize(t.dtype) != t.nbytes || (t.nbytes > 0 && t.data == nullptr)) {
      return InvalidArgumentError(path + ": tensor " + name + ": " + std::to_string(t.nbytes) +
                                  " bytes disagree with shape " + ShapeString(t.shape));
    }
    header[name] = {{"dtype", DtypeName(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.nbytes}}};
    offset += t.nbytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  uint8_t len[8];
  StoreLe64(text.size(), len);

  LEDE_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFile> out, AtomicFile::Create(path));
  LEDE_RETURN_IF_ERROR(out->Append(len, sizeof(len)));
  LEDE_RETURN_IF_ERROR(out->Append(text.data(), text.size()));
  for (const auto& item : tensors) LEDE_RETURN_IF_ERROR(out->Append(item.second.data, item.second.nbytes));
  return out->Commit();
}

}  // namespace lede::checkpoint
