// File: shared/model/loaders/checkpoint.cc
//
// Checkpoint readers and writers (contracts in checkpoint.h), in four parts:
// this file (the tensors a config requires, the tensor glue, dispatch by
// path, RoPE row permutation), checkpoint_safetensors.cc (safetensors files
// as tensors, over the torch-free shared/checkpoint/safetensors.h),
// checkpoint_hf.cc (Hugging Face directories) and checkpoint_llama2c.cc
// (llama2.c v0 .bin: 7 int32 header, float32 arrays,
// testdata/models/README.md); GGUF files are checkpoint_gguf.cc.
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
// std::bad_alloc); nothing throws out of these files.
#include "shared/model/loaders/checkpoint.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "shared/checkpoint/safetensors.h"
#include "shared/model/loaders/internal/checkpoint_internal.h"
#include "shared/status/status_macros.h"

namespace lede::model::loaders {
namespace internal {

at::Tensor TensorFromMapping(const std::shared_ptr<const void>& owner,
                             const uint8_t* ptr,
                             const std::vector<int64_t>& shape,
                             at::ScalarType dtype, bool keep_dtype) {
  const auto options = at::TensorOptions().dtype(dtype).device(at::kCPU);
  void* data = const_cast<uint8_t*>(ptr);  // never written: PROT_READ mapping
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  if (numel == 0) return at::empty(shape, at::kFloat);
  const size_t elem = at::elementSize(dtype);
  const bool aligned = reinterpret_cast<uintptr_t>(ptr) % elem == 0;
  if ((dtype == at::kFloat || keep_dtype) && aligned) {
    std::shared_ptr<const void> keep = owner;
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
  if (keep_dtype) return src;  // owns a copy
  return src.to(at::kFloat);  // a new buffer: src's dtype differs or src owns
}

// A contiguous CPU tensor of `dtype` (t itself when it already is one).
at::Tensor AsContiguous(const at::Tensor& t, at::ScalarType dtype) {
  return t.to(at::kCPU, dtype).contiguous();
}

Status WriteTensorData(checkpoint::AtomicFile& out, const at::Tensor& t) {
  return out.Append(t.data_ptr(),
                   static_cast<size_t>(t.numel()) * t.element_size());
}

// The tensors a config requires, with their shapes (checkpoint.h).
struct RequiredTensor {
  std::string name;
  std::vector<int64_t> shape;
};

std::vector<RequiredTensor> RequiredTensors(const checkpoint::ModelConfig& c) {
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

namespace {

// Refuses a layer count that `n_tensors` tensors cannot hold (9 per layer)
// before RequiredTensors sizes a list by it.
Status CheckLayerCount(const checkpoint::ModelConfig& c, size_t n_tensors, const std::string& where,
                       const std::string& layers_key) {
  if (c.n_layers > static_cast<int64_t>(n_tensors / 9)) {
    return InvalidArgumentError(where + ": " + layers_key + " is " + std::to_string(c.n_layers) +
                                ", but the weight files hold " + std::to_string(n_tensors) +
                                " tensors (each layer needs 9)");
  }
  return OkStatus();
}

}  // namespace

Status CheckTensorShapes(const checkpoint::ModelConfig& c, const ShapeMap& shapes, const std::string& where,
                         const std::map<std::string, std::string>* origin, const std::string& layers_key) {
  LEDE_RETURN_IF_ERROR(CheckLayerCount(c, shapes.size(), where, layers_key));
  for (const RequiredTensor& req : RequiredTensors(c)) {
    auto it = shapes.find(req.name);
    if (it == shapes.end()) {
      std::string msg = where + ": missing tensor " + req.name;
      if (req.name == "lm_head.weight") msg += " (tie_word_embeddings is false)";
      return InvalidArgumentError(msg);
    }
    if (it->second != req.shape) {
      std::string file = where;
      if (origin != nullptr) {
        auto o = origin->find(req.name);
        if (o != origin->end()) file = o->second;
      }
      return InvalidArgumentError(file + ": tensor " + req.name + " has shape " + checkpoint::ShapeString(it->second) +
                                  ", expected " + checkpoint::ShapeString(req.shape) + " from the model config");
    }
  }
  return OkStatus();
}

Status CheckTensors(const checkpoint::ModelConfig& c, const TensorMap& tensors,
                    const std::string& where,
                    const std::map<std::string, std::string>* origin) {
  LEDE_RETURN_IF_ERROR(CheckLayerCount(c, tensors.size(), where, "n_layers"));
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
          file + ": tensor " + req.name + " has shape " + checkpoint::ShapeString(actual) +
          ", expected " + checkpoint::ShapeString(req.shape) + " from the model config");
    }
  }
  return OkStatus();
}

}  // namespace internal

namespace {

namespace fs = std::filesystem;

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

StatusOr<Checkpoint> LoadCheckpointImpl(const std::string& path, const CheckpointReadOptions& read) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st))
    return NotFoundError(path + ": no such file or directory");
  if (fs::is_directory(st)) {
    if (fs::exists(fs::path(path) / "config.json", ec)) {
      return LoadHfCheckpoint(path, read);
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
  if (EndsWith(path, ".gguf")) return LoadGgufCheckpoint(path);
  if (fs::path(path).filename() == "config.json") {
    return LoadHfCheckpoint(fs::path(path).parent_path().string(), read);
  }
  return InvalidArgumentError(
      path +
      ": not a checkpoint (expected a Hugging Face directory with "
      "config.json, a llama2.c .bin file, or a directory holding one, or a "
      ".gguf file)");
}

}  // namespace

StatusOr<Checkpoint> LoadCheckpoint(const std::string& path, const CheckpointReadOptions& read) {
  return TorchBoundary(path, [&] { return LoadCheckpointImpl(path, read); });
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

}  // namespace lede::model::loaders
