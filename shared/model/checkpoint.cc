// File: shared/model/checkpoint.cc
//
// Checkpoint readers and writers (contracts in checkpoint.h).
//
// safetensors: 8-byte little-endian header length N, N bytes of JSON
//   {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__"},
//   then the data region; offsets are relative to the data region.
// llama2.c v0: 7 int32 header, float32 arrays (../shared/models/README.md).
//
// Files are memory-mapped read-only (MAP_PRIVATE, PROT_READ). Float32 data is
// wrapped in place with at::from_blob; the deleter of each such tensor holds a
// shared_ptr to the mapping, so the mapping lives as long as any tensor does.
// Writing into a mapped tensor faults (SIGSEGV): loaded tensors are read-only.
//
// Host byte order is assumed little-endian (x86-64, aarch64), as in the files.
//
// Every Status-returning function catches libtorch / std exceptions once, at
// its top (TorchBoundary), and returns kInternal (kResourceExhausted for
// std::bad_alloc); nothing throws out of this file.
#include "shared/model/checkpoint.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <new>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "shared/file/file.h"
#include "shared/model/torch_boundary.h"
#include "shared/status/status_macros.h"
#include "shared/tokenizer/hf_config.h"

namespace lede::model {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using TensorMap = std::map<std::string, at::Tensor>;

constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;  // as upstream
constexpr int64_t kLlama2cHeaderBytes = 7 * sizeof(int32_t);

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string ErrnoString(int err) { return std::strerror(err); }

// ---------------------------------------------------------------------------
// Read-only memory mapping of a whole file. Immutable after Open; shared by
// the tensors that wrap it.
class MappedFile {
 public:
  // Errors: kNotFound if `path` does not exist; kInvalidArgument if it is not
  // a regular file; kPermissionDenied; kInternal if mmap fails.
  static StatusOr<std::shared_ptr<const MappedFile>> Open(
      const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      if (err == ENOENT || err == ENOTDIR) {
        return NotFoundError(path + ": no such file");
      }
      if (err == EACCES) {
        return Status(StatusCode::kPermissionDenied,
                      path + ": " + ErrnoString(err));
      }
      return InternalError(path + ": open failed: " + ErrnoString(err));
    }
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      return InternalError(path + ": fstat failed: " + ErrnoString(err));
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      return InvalidArgumentError(path + ": not a regular file");
    }
    const size_t size = static_cast<size_t>(st.st_size);
    void* data = nullptr;
    if (size > 0) {
      data = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
      if (data == MAP_FAILED) {
        const int err = errno;
        ::close(fd);
        return InternalError(path + ": mmap failed: " + ErrnoString(err));
      }
    }
    ::close(fd);  // the mapping stays valid
    return std::shared_ptr<const MappedFile>(new MappedFile(data, size));
  }

  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile() {
    if (data_ != nullptr) ::munmap(data_, size_);
  }

  const uint8_t* data() const { return static_cast<const uint8_t*>(data_); }
  size_t size() const { return size_; }

 private:
  MappedFile(void* data, size_t size) : data_(data), size_(size) {}
  void* data_;
  size_t size_;
};

// A float32 CPU tensor of `shape` from `dtype` bytes at `ptr` inside `file`.
// F32 with 4-byte alignment is wrapped in place (zero copy; the tensor keeps
// the mapping alive); anything else is copied and converted.
at::Tensor TensorFromMapping(const std::shared_ptr<const MappedFile>& file,
                             const uint8_t* ptr,
                             const std::vector<int64_t>& shape,
                             at::ScalarType dtype) {
  const auto options = at::TensorOptions().dtype(dtype).device(at::kCPU);
  void* data = const_cast<uint8_t*>(ptr);  // never written: PROT_READ mapping
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  if (numel == 0) return at::empty(shape, at::kFloat);
  const size_t elem = at::elementSize(dtype);
  const bool aligned = reinterpret_cast<uintptr_t>(ptr) % elem == 0;
  if (dtype == at::kFloat && aligned) {
    std::shared_ptr<const MappedFile> keep = file;
    return at::from_blob(
        data, shape, [keep](void*) mutable { keep.reset(); }, options);
  }
  at::Tensor src;
  if (aligned) {
    src = at::from_blob(data, shape, options);  // borrowed; converted below
  } else {
    src = at::empty(shape, options);
    std::memcpy(src.data_ptr(), ptr, static_cast<size_t>(numel) * elem);
  }
  return src.to(at::kFloat);  // a new buffer: src's dtype differs or src owns
}

uint64_t LoadLe64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void StoreLe64(uint64_t v, uint8_t* p) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}


// ---------------------------------------------------------------------------
// Writing: shared/file's atomic write (a temporary file beside the
// destination, fsync, rename over it, fsync of the directory).
using AtomicFile = file::AtomicFileWriter;

Status WriteZeros(AtomicFile& out, size_t n) {
  static const std::vector<uint8_t> zeros(1 << 16, 0);
  while (n > 0) {
    const size_t k = std::min(n, zeros.size());
    LEDE_RETURN_IF_ERROR(out.Append(zeros.data(), k));
    n -= k;
  }
  return OkStatus();
}

Status WriteTextFileAtomically(const std::string& path,
                               const std::string& text) {
  return file::WriteFileAtomically(path, text);
}

// A contiguous CPU tensor of `dtype` (t itself when it already is one).
at::Tensor AsContiguous(const at::Tensor& t, at::ScalarType dtype) {
  return t.to(at::kCPU, dtype).contiguous();
}

Status WriteTensorData(AtomicFile& out, const at::Tensor& t) {
  return out.Append(t.data_ptr(),
                   static_cast<size_t>(t.numel()) * t.element_size());
}

// ---------------------------------------------------------------------------
// The tensors a config requires, with their shapes (checkpoint.h).
struct RequiredTensor {
  std::string name;
  std::vector<int64_t> shape;
};

std::vector<RequiredTensor> RequiredTensors(const ModelConfig& c) {
  const int64_t d = c.dim, q = c.n_heads * c.head_dim(), kv = c.kv_dim();
  std::vector<RequiredTensor> r;
  r.push_back({"model.embed_tokens.weight", {c.vocab_size, d}});
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    r.push_back({p + "input_layernorm.weight", {d}});
    r.push_back({p + "self_attn.q_proj.weight", {q, d}});
    r.push_back({p + "self_attn.k_proj.weight", {kv, d}});
    r.push_back({p + "self_attn.v_proj.weight", {kv, d}});
    r.push_back({p + "self_attn.o_proj.weight", {d, q}});
    r.push_back({p + "post_attention_layernorm.weight", {d}});
    r.push_back({p + "mlp.gate_proj.weight", {c.hidden_dim, d}});
    r.push_back({p + "mlp.up_proj.weight", {c.hidden_dim, d}});
    r.push_back({p + "mlp.down_proj.weight", {d, c.hidden_dim}});
  }
  r.push_back({"model.norm.weight", {d}});
  if (!c.tie_word_embeddings)
    r.push_back({"lm_head.weight", {c.vocab_size, d}});
  return r;
}

// kInvalidArgument naming the first required tensor that is missing, not a
// floating-point tensor, or shaped differently from what `c` implies.
// `where` prefixes messages; `origin` (optional) names each tensor's file.
Status CheckTensors(const ModelConfig& c, const TensorMap& tensors,
                    const std::string& where,
                    const std::map<std::string, std::string>* origin) {
  for (const RequiredTensor& req : RequiredTensors(c)) {
    auto it = tensors.find(req.name);
    if (it == tensors.end() || !it->second.defined()) {
      std::string msg = where + ": missing tensor " + req.name;
      if (req.name == "lm_head.weight") {
        msg += " (tie_word_embeddings is false)";
      }
      return InvalidArgumentError(msg);
    }
    std::string file = where;
    if (origin != nullptr) {
      auto o = origin->find(req.name);
      if (o != origin->end()) file = o->second;
    }
    if (!it->second.is_floating_point()) {
      return InvalidArgumentError(file + ": tensor " + req.name +
                                  " is not a floating-point tensor");
    }
    const std::vector<int64_t> actual = it->second.sizes().vec();
    if (actual != req.shape) {
      return InvalidArgumentError(
          file + ": tensor " + req.name + " has shape " + ShapeString(actual) +
          ", expected " + ShapeString(req.shape) + " from the model config");
    }
  }
  return OkStatus();
}

// ---------------------------------------------------------------------------
// safetensors

struct SafetensorsDtype {
  const char* name;
  at::ScalarType type;
};
constexpr SafetensorsDtype kReadableDtypes[] = {
    {"F32", at::kFloat},
    {"F16", at::kHalf},
    {"BF16", at::kBFloat16},
    {"F64", at::kDouble},
};

struct TensorEntry {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin;
  uint64_t end;
};

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

StatusOr<TensorEntry> ParseEntry(const std::string& file,
                                 const std::string& name, const Json& v,
                                 uint64_t data_size) {
  const std::string where = file + ": tensor " + name;
  if (!v.is_object()) {
    return InvalidArgumentError(where + ": header entry is not an object");
  }
  TensorEntry e{name, at::kFloat, {}, 0, 0};
  auto dt = v.find("dtype");
  if (dt == v.end() || !dt->is_string()) {
    return InvalidArgumentError(where + ": missing or non-string \"dtype\"");
  }
  const std::string dtype = dt->get<std::string>();
  bool known = false;
  for (const SafetensorsDtype& d : kReadableDtypes) {
    if (dtype == d.name) {
      e.dtype = d.type;
      known = true;
    }
  }
  if (!known) {
    return InvalidArgumentError(where + ": unknown or unsupported dtype \"" +
                                dtype + "\" (readable: F32, F16, BF16, F64)");
  }
  auto sh = v.find("shape");
  if (sh == v.end() || !sh->is_array()) {
    return InvalidArgumentError(where + ": missing or non-array \"shape\"");
  }
  uint64_t numel = 1;
  for (const Json& s : *sh) {
    uint64_t dim = 0;
    if (!ReadUint(s, &dim) ||
        dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return InvalidArgumentError(
          where + ": shape holds a non-integer or negative size");
    }
    if (__builtin_mul_overflow(numel, dim, &numel)) {
      return InvalidArgumentError(where + ": shape is too large");
    }
    e.shape.push_back(static_cast<int64_t>(dim));
  }
  auto off = v.find("data_offsets");
  if (off == v.end() || !off->is_array() || off->size() != 2 ||
      !ReadUint((*off)[0], &e.begin) || !ReadUint((*off)[1], &e.end)) {
    return InvalidArgumentError(
        where + ": \"data_offsets\" must be two non-negative integers");
  }
  if (e.begin > e.end || e.end > data_size) {
    return InvalidArgumentError(
        where + ": data_offsets [" + std::to_string(e.begin) + ", " +
        std::to_string(e.end) + "] out of range (data region is " +
        std::to_string(data_size) + " bytes)");
  }
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(
          numel, static_cast<uint64_t>(at::elementSize(e.dtype)), &nbytes) ||
      nbytes != e.end - e.begin) {
    return InvalidArgumentError(where + ": shape " + ShapeString(e.shape) +
                                " of " + dtype +
                                " does not match its data_offsets length of " +
                                std::to_string(e.end - e.begin) + " bytes");
  }
  return e;
}

StatusOr<TensorMap> ReadSafetensorsImpl(const std::string& file) {
  LEDE_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> map,
                        MappedFile::Open(file));
  const uint64_t size = map->size();
  if (size < 8) {
    return InvalidArgumentError(
        file + ": truncated safetensors file: " + std::to_string(size) +
        " bytes, shorter than the 8-byte header length");
  }
  const uint64_t header_len = LoadLe64(map->data());
  if (header_len > size - 8) {
    return InvalidArgumentError(
        file + ": safetensors header length " + std::to_string(header_len) +
        " runs past the end of the file (" + std::to_string(size) + " bytes)");
  }
  if (header_len > kMaxSafetensorsHeaderBytes) {
    return InvalidArgumentError(file + ": safetensors header length " +
                                std::to_string(header_len) +
                                " exceeds the 100 MiB limit");
  }
  const char* text = reinterpret_cast<const char*>(map->data() + 8);
  Json header = Json::parse(text, text + header_len, /*cb=*/nullptr,
                            /*allow_exceptions=*/false);
  if (header.is_discarded()) {
    return InvalidArgumentError(file +
                                ": safetensors header is not valid JSON");
  }
  if (!header.is_object()) {
    return InvalidArgumentError(file +
                                ": safetensors header is not a JSON object");
  }
  const uint64_t data_begin = 8 + header_len;
  const uint64_t data_size = size - data_begin;

  std::vector<TensorEntry> entries;
  for (const auto& item : header.items()) {
    if (item.key() == "__metadata__") continue;
    LEDE_ASSIGN_OR_RETURN(
        TensorEntry e, ParseEntry(file, item.key(), item.value(), data_size));
    entries.push_back(std::move(e));
  }

  // Non-empty byte ranges must be disjoint.
  std::vector<const TensorEntry*> by_offset;
  for (const TensorEntry& e : entries) {
    if (e.end > e.begin) by_offset.push_back(&e);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorEntry* a, const TensorEntry* b) {
              return a->begin < b->begin;
            });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorEntry& prev = *by_offset[i - 1];
    const TensorEntry& cur = *by_offset[i];
    if (cur.begin < prev.end) {
      return InvalidArgumentError(
          file + ": tensors " + prev.name + " [" + std::to_string(prev.begin) +
          ", " + std::to_string(prev.end) + ") and " + cur.name + " [" +
          std::to_string(cur.begin) + ", " + std::to_string(cur.end) +
          ") have overlapping data_offsets");
    }
  }

  TensorMap out;
  for (const TensorEntry& e : entries) {
    out[e.name] = TensorFromMapping(map, map->data() + data_begin + e.begin,
                                    e.shape, e.dtype);
  }
  return out;
}

Status WriteSafetensorsImpl(const std::string& file, const TensorMap& tensors,
                            const std::string& dtype_name) {
  at::ScalarType dtype;
  if (dtype_name == "F32") {
    dtype = at::kFloat;
  } else if (dtype_name == "F16") {
    dtype = at::kHalf;
  } else if (dtype_name == "BF16") {
    dtype = at::kBFloat16;
  } else {
    return InvalidArgumentError(file + ": unsupported safetensors dtype \"" +
                                dtype_name + "\" (use F32, F16 or BF16)");
  }
  Json header = Json::object();
  header["__metadata__"] = {{"format", "pt"}};
  std::vector<at::Tensor> data;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name.empty() || name == "__metadata__") {
      return InvalidArgumentError(file + ": invalid tensor name \"" + name +
                                  "\"");
    }
    if (!t.defined() || !t.is_floating_point()) {
      return InvalidArgumentError(file + ": tensor " + name +
                                  " is undefined or not floating-point");
    }
    at::Tensor c = AsContiguous(t, dtype);
    const uint64_t nbytes = static_cast<uint64_t>(c.numel()) * c.element_size();
    header[name] = {{"dtype", dtype_name},
                    {"shape", c.sizes().vec()},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    data.push_back(std::move(c));
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  uint8_t len[8];
  StoreLe64(text.size(), len);

  LEDE_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFile> out,
                        AtomicFile::Create(file));
  LEDE_RETURN_IF_ERROR(out->Append(len, sizeof(len)));
  LEDE_RETURN_IF_ERROR(out->Append(text.data(), text.size()));
  for (const at::Tensor& t : data)
    LEDE_RETURN_IF_ERROR(WriteTensorData(*out, t));
  return out->Commit();
}

// ---------------------------------------------------------------------------
// Hugging Face directories

// Rejects shard names that would leave the checkpoint directory.
bool IsPlainRelativePath(const std::string& name) {
  if (name.empty()) return false;
  const fs::path p(name);
  if (p.is_absolute()) return false;
  for (const fs::path& part : p) {
    if (part == "..") return false;
  }
  return true;
}

Status LoadShards(const std::string& dir, const std::string& index_path,
                  TensorMap* tensors,
                  std::map<std::string, std::string>* origin) {
  LEDE_ASSIGN_OR_RETURN(std::string text, file::ReadFile(index_path));
  Json index = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (index.is_discarded()) {
    return InvalidArgumentError(index_path + ": invalid JSON");
  }
  if (!index.is_object() || !index.contains("weight_map") ||
      !index["weight_map"].is_object()) {
    return InvalidArgumentError(index_path +
                                ": missing or non-object field \"weight_map\"");
  }
  std::map<std::string, std::vector<std::string>> names_by_shard;
  for (const auto& item : index["weight_map"].items()) {
    if (!item.value().is_string() ||
        !IsPlainRelativePath(item.value().get<std::string>())) {
      return InvalidArgumentError(index_path + ": weight_map entry for " +
                                  item.key() + " is not a relative file name");
    }
    names_by_shard[item.value().get<std::string>()].push_back(item.key());
  }
  for (const auto& [shard, names] : names_by_shard) {
    const std::string shard_path = (fs::path(dir) / shard).string();
    LEDE_ASSIGN_OR_RETURN(TensorMap shard_tensors, ReadSafetensors(shard_path));
    for (const std::string& name : names) {
      auto it = shard_tensors.find(name);
      if (it == shard_tensors.end()) {
        return InvalidArgumentError(
            index_path + ": tensor " + name +
            " is listed in weight_map but missing from " + shard_path);
      }
      (*tensors)[name] = it->second;
      (*origin)[name] = shard_path;
    }
  }
  return OkStatus();
}

StatusOr<Checkpoint> LoadHfCheckpointImpl(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return NotFoundError(dir + ": no such directory");
  if (!fs::is_directory(dir, ec)) {
    return InvalidArgumentError(dir + ": not a directory");
  }
  const std::string config_path = (fs::path(dir) / "config.json").string();
  if (!fs::exists(config_path, ec)) {
    return NotFoundError(dir + ": no config.json");
  }
  LEDE_ASSIGN_OR_RETURN(std::string config_text, file::ReadFile(config_path));
  Checkpoint ckpt;
  LEDE_ASSIGN_OR_RETURN(ckpt.config, ParseHfConfig(config_text, config_path));
  ckpt.source = dir;
  // generation_config.json's bos/eos ids win over config.json's (Llama-3.1
  // stops on several eos ids that only generation_config.json lists).
  const std::string generation_path = (fs::path(dir) / "generation_config.json").string();
  if (fs::exists(generation_path, ec)) {
    LEDE_ASSIGN_OR_RETURN(std::string generation_text, file::ReadFile(generation_path));
    LEDE_ASSIGN_OR_RETURN(tokenizer::GenerationIds ids,
                          tokenizer::ParseGenerationIds(generation_text, generation_path));
    if (ids.bos_id) ckpt.config.bos_id = *ids.bos_id;
    if (!ids.eos_ids.empty()) ckpt.config.eos_ids = ids.eos_ids;
  }

  std::map<std::string, std::string> origin;
  const std::string single = (fs::path(dir) / "model.safetensors").string();
  const std::string index =
      (fs::path(dir) / "model.safetensors.index.json").string();
  if (fs::exists(single, ec)) {
    LEDE_ASSIGN_OR_RETURN(ckpt.tensors, ReadSafetensors(single));
    for (const auto& item : ckpt.tensors) origin[item.first] = single;
  } else if (fs::exists(index, ec)) {
    LEDE_RETURN_IF_ERROR(LoadShards(dir, index, &ckpt.tensors, &origin));
  } else {
    return NotFoundError(
        dir + ": no model.safetensors or model.safetensors.index.json");
  }
  // Tied: the model reuses the embedding; a stored copy is dropped so that
  // "absent when tied" holds (checkpoint.h).
  if (ckpt.config.tie_word_embeddings) ckpt.tensors.erase("lm_head.weight");
  LEDE_RETURN_IF_ERROR(CheckTensors(ckpt.config, ckpt.tensors, dir, &origin));
  return ckpt;
}

Status WriteHfCheckpointImpl(const std::string& dir, const ModelConfig& config,
                             const TensorMap& tensors) {
  LEDE_RETURN_IF_ERROR(config.Validate());
  LEDE_RETURN_IF_ERROR(CheckTensors(config, tensors, dir, nullptr));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    return InternalError(dir + ": cannot create directory: " + ec.message());
  TensorMap to_write = tensors;
  if (config.tie_word_embeddings) to_write.erase("lm_head.weight");
  LEDE_RETURN_IF_ERROR(WriteSafetensors(
      (fs::path(dir) / "model.safetensors").string(), to_write, "F32"));
  // config.json last: its presence marks a complete checkpoint directory.
  return WriteTextFileAtomically((fs::path(dir) / "config.json").string(),
                                 ToHfConfigJson(config));
}

// ---------------------------------------------------------------------------
// llama2.c version 0

struct Llama2cLayout {
  int64_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
  bool tied;
  int64_t head_dim() const { return dim / n_heads; }
  int64_t kv_dim() const { return head_dim() * n_kv_heads; }
  // Number of float32 values after the header.
  int64_t n_floats() const {
    const int64_t L = n_layers, d = dim, kv = kv_dim(), f = hidden_dim;
    int64_t n = vocab_size * d;                   // token_embedding
    n += L * d;                                   // rms_att
    n += L * d * d + 2 * L * kv * d + L * d * d;  // wq, wk, wv, wo
    n += L * d;                                   // rms_ffn
    n += 3 * L * f * d;                           // w1, w2, w3
    n += d;                                       // rms_final
    n += seq_len * head_dim();                    // freq_cis_real + imag
    if (!tied) n += vocab_size * d;               // wcls
    return n;
  }
};

// Bounds that keep n_floats() far from int64 overflow and reject garbage.
Status CheckLlama2cHeader(const std::string& file, const int64_t h[7]) {
  static const char* const kNames[7] = {"dim",     "hidden_dim", "n_layers",
                                        "n_heads", "n_kv_heads", "vocab_size",
                                        "seq_len"};
  static const int64_t kMax[7] = {1 << 16, 1 << 20, 1 << 12, 1 << 12,
                                  1 << 12, 1 << 24, 1 << 24};
  for (int i = 0; i < 7; ++i) {
    const int64_t v = (i == 5) ? std::abs(h[i]) : h[i];
    if (v <= 0 || v > kMax[i]) {
      return InvalidArgumentError(file + ": implausible llama2.c header: " +
                                  kNames[i] + " = " + std::to_string(h[i]));
    }
  }
  if (h[0] % h[3] != 0 || (h[0] / h[3]) % 2 != 0 || h[3] % h[4] != 0) {
    return InvalidArgumentError(file + ": inconsistent llama2.c header: dim " +
                                std::to_string(h[0]) + ", n_heads " +
                                std::to_string(h[3]) + ", n_kv_heads " +
                                std::to_string(h[4]));
  }
  return OkStatus();
}

StatusOr<Checkpoint> LoadLlama2cCheckpointImpl(const std::string& file) {
  LEDE_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> map,
                        MappedFile::Open(file));
  const int64_t size = static_cast<int64_t>(map->size());
  if (size < kLlama2cHeaderBytes) {
    return InvalidArgumentError(
        file + ": truncated llama2.c checkpoint: " + std::to_string(size) +
        " bytes, expected at least the 28-byte header");
  }
  int32_t raw[7];
  std::memcpy(raw, map->data(), sizeof(raw));
  int64_t h[7];
  for (int i = 0; i < 7; ++i) h[i] = raw[i];
  LEDE_RETURN_IF_ERROR(CheckLlama2cHeader(file, h));
  const Llama2cLayout lay{h[0], h[1],           h[2], h[3],
                          h[4], std::abs(h[5]), h[6], h[5] > 0};
  const int64_t expected = kLlama2cHeaderBytes + 4 * lay.n_floats();
  if (size != expected) {
    return InvalidArgumentError(
        file + ": " + (size < expected ? "truncated" : "oversized") +
        " llama2.c checkpoint: the header implies " + std::to_string(expected) +
        " bytes, the file has " + std::to_string(size));
  }

  Checkpoint ckpt;
  ckpt.source = file;
  ModelConfig& c = ckpt.config;
  c.dim = lay.dim;
  c.hidden_dim = lay.hidden_dim;
  c.n_layers = lay.n_layers;
  c.n_heads = lay.n_heads;
  c.n_kv_heads = lay.n_kv_heads;
  c.vocab_size = lay.vocab_size;
  c.max_seq_len = lay.seq_len;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.rope_scaling = RopeScaling();
  c.rope_style = RopeStyle::kAdjacentPairs;
  c.tie_word_embeddings = lay.tied;
  c.bos_id = 1;
  c.eos_ids = {2};
  Status valid = c.Validate();
  if (!valid.ok()) {
    return InvalidArgumentError(file + ": " + std::string(valid.message()));
  }

  // One zero-copy view over all floats; every tensor is a view of it.
  at::Tensor all = TensorFromMapping(map, map->data() + kLlama2cHeaderBytes,
                                     {lay.n_floats()}, at::kFloat);
  int64_t pos = 0;
  auto take = [&](std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    at::Tensor t = all.narrow(0, pos, n).view(shape);
    pos += n;
    return t;
  };
  const int64_t L = lay.n_layers, d = lay.dim, kv = lay.kv_dim(),
                f = lay.hidden_dim;
  TensorMap& t = ckpt.tensors;
  t["model.embed_tokens.weight"] = take({lay.vocab_size, d});
  auto per_layer = [&](const std::string& suffix, at::Tensor stacked) {
    for (int64_t i = 0; i < L; ++i) {
      t["model.layers." + std::to_string(i) + "." + suffix] = stacked[i];
    }
  };
  per_layer("input_layernorm.weight", take({L, d}));
  per_layer("self_attn.q_proj.weight", take({L, d, d}));
  per_layer("self_attn.k_proj.weight", take({L, kv, d}));
  per_layer("self_attn.v_proj.weight", take({L, kv, d}));
  per_layer("self_attn.o_proj.weight", take({L, d, d}));
  per_layer("post_attention_layernorm.weight", take({L, d}));
  per_layer("mlp.gate_proj.weight", take({L, f, d}));
  per_layer("mlp.down_proj.weight", take({L, d, f}));
  per_layer("mlp.up_proj.weight", take({L, f, d}));
  t["model.norm.weight"] = take({d});
  take({lay.seq_len * lay.head_dim()});  // legacy freq_cis_real/imag: skipped
  if (!lay.tied) t["lm_head.weight"] = take({lay.vocab_size, d});
  if (pos != lay.n_floats()) {
    return InternalError(file + ": llama2.c layout accounting is off");
  }
  LEDE_RETURN_IF_ERROR(CheckTensors(c, t, file, nullptr));
  return ckpt;
}

Status WriteLlama2cCheckpointImpl(const std::string& file,
                                  const ModelConfig& config,
                                  const TensorMap& tensors) {
  LEDE_RETURN_IF_ERROR(config.Validate());
  // llama2.c v0 fixes these; writing anything else would change the model.
  if (std::abs(config.rms_norm_eps - 1e-5) > 1e-12 ||
      config.rope_theta != 10000.0 ||
      config.rope_scaling.type != RopeScaling::Type::kNone) {
    return InvalidArgumentError(
        file +
        ": llama2.c checkpoints require rms_norm_eps 1e-5, rope_theta "
        "10000 and no rope_scaling");
  }
  const int64_t h64[7] = {
      config.dim,        config.hidden_dim, config.n_layers,   config.n_heads,
      config.n_kv_heads, config.vocab_size, config.max_seq_len};
  LEDE_RETURN_IF_ERROR(CheckLlama2cHeader(file, h64));
  LEDE_RETURN_IF_ERROR(CheckTensors(config, tensors, file, nullptr));

  int32_t header[7];
  for (int i = 0; i < 7; ++i) header[i] = static_cast<int32_t>(h64[i]);
  if (!config.tie_word_embeddings) header[5] = -header[5];

  LEDE_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFile> out,
                        AtomicFile::Create(file));
  LEDE_RETURN_IF_ERROR(out->Append(header, sizeof(header)));
  auto write = [&](const std::string& name) -> Status {
    return WriteTensorData(*out, AsContiguous(tensors.at(name), at::kFloat));
  };
  auto write_layers = [&](const std::string& suffix) -> Status {
    for (int64_t i = 0; i < config.n_layers; ++i) {
      LEDE_RETURN_IF_ERROR(
          write("model.layers." + std::to_string(i) + "." + suffix));
    }
    return OkStatus();
  };
  LEDE_RETURN_IF_ERROR(write("model.embed_tokens.weight"));
  for (const char* suffix :
       {"input_layernorm.weight", "self_attn.q_proj.weight",
        "self_attn.k_proj.weight", "self_attn.v_proj.weight",
        "self_attn.o_proj.weight", "post_attention_layernorm.weight",
        "mlp.gate_proj.weight", "mlp.down_proj.weight", "mlp.up_proj.weight"}) {
    LEDE_RETURN_IF_ERROR(write_layers(suffix));
  }
  LEDE_RETURN_IF_ERROR(write("model.norm.weight"));
  // Legacy freq_cis_real and freq_cis_imag, [seq_len, head_dim/2] each.
  LEDE_RETURN_IF_ERROR(WriteZeros(*out, static_cast<size_t>(
      2 * config.max_seq_len * (config.head_dim() / 2) * sizeof(float))));
  if (!config.tie_word_embeddings)
    LEDE_RETURN_IF_ERROR(write("lm_head.weight"));
  return out->Commit();
}

// ---------------------------------------------------------------------------
// Dispatch

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

StatusOr<Checkpoint> LoadCheckpointImpl(const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st))
    return NotFoundError(path + ": no such file or directory");
  if (fs::is_directory(st)) {
    if (fs::exists(fs::path(path) / "config.json", ec)) {
      return LoadHfCheckpoint(path);
    }
    std::vector<std::string> bins;
    for (const fs::directory_entry& e : fs::directory_iterator(path, ec)) {
      const std::string name = e.path().filename().string();
      if (EndsWith(name, ".bin") && name.rfind("tok", 0) != 0 &&
          e.is_regular_file(ec)) {
        bins.push_back(e.path().string());
      }
    }
    if (ec)
      return InternalError(path + ": cannot list directory: " + ec.message());
    if (bins.size() == 1) return LoadLlama2cCheckpoint(bins[0]);
    if (bins.empty()) {
      return NotFoundError(path +
                           ": no config.json and no llama2.c model .bin file");
    }
    std::sort(bins.begin(), bins.end());
    std::string list;
    for (const std::string& b : bins)
      list += " " + fs::path(b).filename().string();
    return InvalidArgumentError(
        path + ": ambiguous: several llama2.c .bin files:" + list);
  }
  if (EndsWith(path, ".bin")) return LoadLlama2cCheckpoint(path);
  if (fs::path(path).filename() == "config.json") {
    return LoadHfCheckpoint(fs::path(path).parent_path().string());
  }
  return InvalidArgumentError(
      path +
      ": not a checkpoint (expected a Hugging Face directory with "
      "config.json, a llama2.c .bin file, or a directory holding one)");
}

}  // namespace

StatusOr<Checkpoint> LoadCheckpoint(const std::string& path) {
  return TorchBoundary(path, [&] { return LoadCheckpointImpl(path); });
}

StatusOr<Checkpoint> LoadHfCheckpoint(const std::string& dir) {
  return TorchBoundary(dir, [&] { return LoadHfCheckpointImpl(dir); });
}

StatusOr<Checkpoint> LoadLlama2cCheckpoint(const std::string& file) {
  return TorchBoundary(file, [&] { return LoadLlama2cCheckpointImpl(file); });
}

StatusOr<std::map<std::string, at::Tensor>> ReadSafetensors(
    const std::string& file) {
  return TorchBoundary(file, [&] { return ReadSafetensorsImpl(file); });
}

Status WriteSafetensors(const std::string& file,
                        const std::map<std::string, at::Tensor>& tensors,
                        const std::string& dtype_name) {
  return TorchBoundary(
      file, [&] { return WriteSafetensorsImpl(file, tensors, dtype_name); });
}

Status WriteHfCheckpoint(const std::string& dir, const ModelConfig& config,
                         const std::map<std::string, at::Tensor>& tensors) {
  return TorchBoundary(dir,
                  [&] { return WriteHfCheckpointImpl(dir, config, tensors); });
}

Status WriteLlama2cCheckpoint(
    const std::string& file, const ModelConfig& config,
    const std::map<std::string, at::Tensor>& tensors) {
  return TorchBoundary(
      file, [&] { return WriteLlama2cCheckpointImpl(file, config, tensors); });
}

// Precondition: w has at least one dimension, w.size(0) is n_heads * head_dim
// with head_dim even. Otherwise (or on any libtorch error) the result is an
// undefined tensor; callers check .defined(). The result is a new contiguous
// tensor (w is never modified), same dtype and device as w.
at::Tensor PermuteRopeRows(const at::Tensor& w, int64_t n_heads,
                           bool to_rotate_half) {
  try {
    if (!w.defined() || w.dim() < 1 || n_heads <= 0) return at::Tensor();
    const int64_t rows = w.size(0);
    if (rows % n_heads != 0 || (rows / n_heads) % 2 != 0) return at::Tensor();
    const int64_t half = rows / n_heads / 2;
    const int64_t rest = rows == 0 ? 0 : w.numel() / rows;
    // Adjacent-pair row 2i + j of a head is rotate-half row i + j * half:
    // view as [H, half, 2, rest] <-> [H, 2, half, rest].
    at::Tensor out = to_rotate_half
                         ? w.reshape({n_heads, half, 2, rest}).transpose(1, 2)
                         : w.reshape({n_heads, 2, half, rest}).transpose(1, 2);
    return out.contiguous().view(w.sizes());
  } catch (const std::exception&) {
    return at::Tensor();
  }
}

}  // namespace lede::model
