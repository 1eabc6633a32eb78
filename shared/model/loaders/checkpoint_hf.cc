// File: shared/model/loaders/checkpoint_hf.cc
//
// Hugging Face checkpoint directories (LoadHfCheckpoint, WriteHfCheckpoint
// in checkpoint.h): config.json (shared/checkpoint/model_config.h),
// generation_config.json's token ids, and model.safetensors or the shards of
// model.safetensors.index.json.
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "shared/checkpoint/mapped_file.h"
#include "shared/checkpoint/safetensors.h"
#include "shared/file/file.h"
#include "shared/model/loaders/checkpoint.h"
#include "shared/model/loaders/internal/checkpoint_internal.h"
#include "shared/status/status_macros.h"
#include "shared/tokenizer/hf_config.h"

namespace lede::model::loaders {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using internal::TensorMap;

Status WriteTextFileAtomically(const std::string& path,
                               const std::string& text) {
  LEDE_ASSIGN_OR_RETURN(std::unique_ptr<checkpoint::AtomicFile> out,
                        checkpoint::AtomicFile::Create(path));
  LEDE_RETURN_IF_ERROR(out->Append(text.data(), text.size()));
  return out->Commit();
}

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

// The JSON files of a checkpoint directory are read whole and parsed; their
// size is checked first so that a huge (or sparse) file cannot make the
// reader allocate for it. config.json and generation_config.json are a few
// KiB in practice, an index some MiB for the largest sharded models.
constexpr uint64_t kMaxConfigJsonBytes = uint64_t{1} << 20;
constexpr uint64_t kMaxIndexJsonBytes = uint64_t{64} << 20;

StatusOr<std::string> ReadJsonFile(const std::string& path, uint64_t max_bytes) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) return NotFoundError(path + ": cannot read: " + ec.message());
  if (size > max_bytes) {
    return InvalidArgumentError(path + ": " + std::to_string(size) + " bytes, more than the " +
                                std::to_string(max_bytes) + " a JSON file of a checkpoint may have");
  }
  return file::ReadFile(path);
}

// The safetensors files of a checkpoint, opened (headers parsed and
// validated, nothing converted): each file with the tensor names it
// supplies, every name's declared shape and dtype, and its file.
struct WeightFiles {
  std::vector<std::pair<std::shared_ptr<const checkpoint::SafetensorsFile>, std::vector<std::string>>> files;
  internal::ShapeMap shapes;
  std::map<std::string, checkpoint::Dtype> dtypes;
  std::map<std::string, std::string> origin;

  void Add(const std::shared_ptr<const checkpoint::SafetensorsFile>& file, std::vector<std::string> names) {
    for (const std::string& name : names) {
      const checkpoint::TensorView& v = file->tensors().at(name);
      shapes[name] = v.shape;
      dtypes[name] = v.dtype;
      origin[name] = file->path();
    }
    files.emplace_back(file, std::move(names));
  }
};

Status OpenSingle(const std::string& path, WeightFiles* out) {
  LEDE_ASSIGN_OR_RETURN(std::shared_ptr<const checkpoint::SafetensorsFile> file,
                        checkpoint::SafetensorsFile::Open(path));
  std::vector<std::string> names;
  for (const auto& item : file->tensors()) names.push_back(item.first);
  out->Add(file, std::move(names));
  return OkStatus();
}

Status OpenShards(const std::string& dir, const std::string& index_path, WeightFiles* out) {
  LEDE_ASSIGN_OR_RETURN(std::string text, ReadJsonFile(index_path, kMaxIndexJsonBytes));
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
  for (auto& [shard, names] : names_by_shard) {
    const std::string shard_path = (fs::path(dir) / shard).string();
    LEDE_ASSIGN_OR_RETURN(std::shared_ptr<const checkpoint::SafetensorsFile> file,
                          checkpoint::SafetensorsFile::Open(shard_path));
    for (const std::string& name : names) {
      if (file->tensors().count(name) == 0) {
        return InvalidArgumentError(
            index_path + ": tensor " + name +
            " is listed in weight_map but missing from " + shard_path);
      }
    }
    out->Add(file, std::move(names));
  }
  return OkStatus();
}

// Checkpoint::storage of a safetensors checkpoint: kBf16 when the files
// store every matrix the engine multiplies by (the projections and the LM
// head, or the embedding when tied) as BF16, else kF32.
WeightFormat SafetensorsStorage(const std::map<std::string, checkpoint::Dtype>& dtypes, bool tied) {
  auto is_matrix = [&](const std::string& name) {
    auto ends_with = [&](const std::string& tail) {
      return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
    };
    return ends_with("_proj.weight") || name == "lm_head.weight" || (tied && name == "model.embed_tokens.weight");
  };
  int64_t n_matrices = 0;
  for (const auto& [name, dtype] : dtypes) {
    if (!is_matrix(name)) continue;
    if (dtype != checkpoint::Dtype::kBF16) return WeightFormat::kF32;
    ++n_matrices;
  }
  return n_matrices > 0 ? WeightFormat::kBf16 : WeightFormat::kF32;
}

// Reads config.json, then the weight files' headers; checks the config
// against the declared shapes (layer count first) before any tensor is
// converted, so that a config the files do not back allocates nothing.
StatusOr<Checkpoint> LoadHfCheckpointImpl(const std::string& dir, const CheckpointReadOptions& read) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return NotFoundError(dir + ": no such directory");
  if (!fs::is_directory(dir, ec)) {
    return InvalidArgumentError(dir + ": not a directory");
  }
  const std::string config_path = (fs::path(dir) / "config.json").string();
  if (!fs::exists(config_path, ec)) {
    return NotFoundError(dir + ": no config.json");
  }
  LEDE_ASSIGN_OR_RETURN(std::string config_text, ReadJsonFile(config_path, kMaxConfigJsonBytes));
  Checkpoint ckpt;
  LEDE_ASSIGN_OR_RETURN(ckpt.config, checkpoint::ParseHfConfig(config_text, config_path));
  ckpt.source = dir;
  // generation_config.json's bos/eos ids win over config.json's (Llama-3.1
  // stops on several eos ids that only generation_config.json lists).
  const std::string generation_path = (fs::path(dir) / "generation_config.json").string();
  if (fs::exists(generation_path, ec)) {
    LEDE_ASSIGN_OR_RETURN(std::string generation_text, ReadJsonFile(generation_path, kMaxConfigJsonBytes));
    LEDE_ASSIGN_OR_RETURN(tokenizer::GenerationIds ids,
                          tokenizer::ParseGenerationIds(generation_text, generation_path));
    if (ids.bos_id) ckpt.config.bos_id = *ids.bos_id;
    if (!ids.eos_ids.empty()) ckpt.config.eos_ids = ids.eos_ids;
  }

  WeightFiles weights;
  const std::string single = (fs::path(dir) / "model.safetensors").string();
  const std::string index =
      (fs::path(dir) / "model.safetensors.index.json").string();
  if (fs::exists(single, ec)) {
    LEDE_RETURN_IF_ERROR(OpenSingle(single, &weights));
  } else if (fs::exists(index, ec)) {
    LEDE_RETURN_IF_ERROR(OpenShards(dir, index, &weights));
  } else {
    return NotFoundError(
        dir + ": no model.safetensors or model.safetensors.index.json");
  }
  // Tied: the model reuses the embedding; a stored copy is dropped so that
  // "absent when tied" holds (checkpoint.h).
  if (ckpt.config.tie_word_embeddings) {
    weights.shapes.erase("lm_head.weight");
    weights.dtypes.erase("lm_head.weight");
  }
  LEDE_RETURN_IF_ERROR(internal::CheckTensorShapes(ckpt.config, weights.shapes, config_path, &weights.origin,
                                                   "num_hidden_layers"));
  for (const auto& [file, names] : weights.files) {
    for (auto& [name, tensor] : internal::TensorsFromSafetensors(file, read.keep_half_precision, &names)) {
      ckpt.tensors[name] = std::move(tensor);
    }
  }
  if (ckpt.config.tie_word_embeddings) ckpt.tensors.erase("lm_head.weight");
  LEDE_RETURN_IF_ERROR(internal::CheckTensors(ckpt.config, ckpt.tensors, dir, &weights.origin));
  ckpt.storage = SafetensorsStorage(weights.dtypes, ckpt.config.tie_word_embeddings);
  return ckpt;
}

Status WriteHfCheckpointImpl(const std::string& dir, const checkpoint::ModelConfig& config,
                             const TensorMap& tensors) {
  LEDE_RETURN_IF_ERROR(config.Validate());
  LEDE_RETURN_IF_ERROR(internal::CheckTensors(config, tensors, dir, nullptr));
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
                                 checkpoint::ToHfConfigJson(config));
}

}  // namespace

StatusOr<Checkpoint> LoadHfCheckpoint(const std::string& dir, const CheckpointReadOptions& read) {
  return TorchBoundary(dir, [&] { return LoadHfCheckpointImpl(dir, read); });
}

Status WriteHfCheckpoint(const std::string& dir, const checkpoint::ModelConfig& config,
                         const std::map<std::string, at::Tensor>& tensors) {
  return TorchBoundary(dir,
                  [&] { return WriteHfCheckpointImpl(dir, config, tensors); });
}

}  // namespace lede::model::loaders
