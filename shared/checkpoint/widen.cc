// File: shared/checkpoint/widen.cc
//
// WidenCheckpoint (widen.h): the function-exact zero-padding of a Llama
// checkpoint into a wider shape.
#include "shared/checkpoint/widen.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>
#include <vector>

#include "shared/checkpoint/safetensors.h"
#include "shared/file/file.h"
#include "shared/status/status_macros.h"

namespace lede::checkpoint {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

std::string FieldError(const std::string& source, const std::string& field, const std::string& what) {
  return source + ": field \"" + field + "\" " + what + " (lede widen embeds Llama checkpoints only exactly)";
}

// Fields of config.json that the padding cannot keep exact, checked before
// the config's own parse (which ignores most of them).
Status CheckEmbeddable(const Json& root, const std::string& source) {
  if (auto it = root.find("architectures"); it != root.end() && !it->is_null()) {
    if (!it->is_array() || it->size() != 1 || !(*it)[0].is_string() ||
        (*it)[0].get<std::string>() != "LlamaForCausalLM") {
      return InvalidArgumentError(FieldError(source, "architectures", "is " + it->dump() +
                                                                          ", not [\"LlamaForCausalLM\"]"));
    }
  }
  if (auto it = root.find("model_type"); it != root.end() && !it->is_null()) {
    if (!it->is_string() || it->get<std::string>() != "llama") {
      return InvalidArgumentError(FieldError(source, "model_type", "is " + it->dump() + ", not \"llama\""));
    }
  }
  for (const char* field : {"attention_bias", "mlp_bias"}) {
    if (auto it = root.find(field); it != root.end() && !it->is_null()) {
      if (!it->is_boolean() || it->get<bool>()) {
        return InvalidArgumentError(
            FieldError(source, field, "is " + it->dump() + ": biases are not part of the embedded architecture"));
      }
    }
  }
  if (auto it = root.find("quantization_config"); it != root.end() && !it->is_null()) {
    return InvalidArgumentError(FieldError(source, "quantization_config", "is set: quantized weights are refused"));
  }
  if (auto it = root.find("pretraining_tp"); it != root.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() != 1) {
      return InvalidArgumentError(FieldError(source, "pretraining_tp", "is " + it->dump() + ", not 1"));
    }
  }
  // The head layout, named by its config.json fields (the parse below would
  // name ModelConfig's).
  auto int_field = [&](const char* field, int64_t fallback) -> int64_t {
    auto it = root.find(field);
    return it != root.end() && it->is_number_integer() ? it->get<int64_t>() : fallback;
  };
  const int64_t d = int_field("hidden_size", 0), heads = int_field("num_attention_heads", 0);
  const int64_t kv_heads = int_field("num_key_value_heads", heads);
  if (heads > 0 && d > 0 && (d % heads != 0 || (d / heads) % 2 != 0)) {
    return InvalidArgumentError(FieldError(source, "num_attention_heads",
                                           "does not give an even head_dim (hidden_size " + std::to_string(d) +
                                               " / " + std::to_string(heads) + ")"));
  }
  if (heads > 0 && kv_heads > 0 && heads % kv_heads != 0) {
    return InvalidArgumentError(FieldError(source, "num_key_value_heads",
                                           "does not divide num_attention_heads into GQA groups (" +
                                               std::to_string(heads) + " / " + std::to_string(kv_heads) + ")"));
  }
  return OkStatus();
}

// The source's files that travel with the weights (widen.h).
bool IsCopiedFile(const std::string& name) {
  const fs::path p(name);
  const std::string ext = p.extension().string();
  if (name == "config.json" || name == "model.safetensors" || name == "model.safetensors.index.json") return false;
  if (name.rfind("tokenizer", 0) == 0 && (ext == ".json" || ext == ".model")) return true;
  if (ext == ".model") return true;
  if (name.rfind("tok", 0) == 0 && ext == ".bin") return true;
  if (name.rfind("chat_template", 0) == 0) return true;
  return name == "special_tokens_map.json" || name == "added_tokens.json" || name == "generation_config.json";
}

// rows x cols (row-major) into the top-left block of a zero R x C matrix,
// each value multiplied by `scale`.
std::vector<float> Pad(const std::vector<float>& src, int64_t rows, int64_t cols, int64_t R, int64_t C,
                       double scale = 1.0) {
  std::vector<float> out(static_cast<size_t>(R * C), 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float v = src[static_cast<size_t>(r * cols + c)];
      out[static_cast<size_t>(r * C + c)] = scale == 1.0 ? v : static_cast<float>(static_cast<double>(v) * scale);
    }
  }
  return out;
}

struct Planned {
  std::vector<int64_t> src_shape, out_shape;
  bool norm = false;
};

int64_t Parameters(const ModelConfig& c) {
  const int64_t d = c.dim, hd = c.head_dim();
  const int64_t per_layer = 2 * d + (c.n_heads * hd) * d * 2 + 2 * (c.n_kv_heads * hd) * d + 3 * c.hidden_dim * d;
  return c.vocab_size * d * (c.tie_word_embeddings ? 1 : 2) + d + c.n_layers * per_layer;
}

// Every tensor a Llama checkpoint of config `s` holds, with its shape there
// and in the widened config `w`.
std::map<std::string, Planned> PlanTensors(const ModelConfig& s, const ModelConfig& w) {
  const int64_t d = s.dim, D = w.dim, hd = s.head_dim();
  std::map<std::string, Planned> plan;
  plan["model.embed_tokens.weight"] = {{s.vocab_size, d}, {s.vocab_size, D}};
  plan["model.norm.weight"] = {{d}, {D}, true};
  if (!s.tie_word_embeddings) plan["lm_head.weight"] = {{s.vocab_size, d}, {s.vocab_size, D}};
  for (int64_t i = 0; i < s.n_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    plan[p + "input_layernorm.weight"] = {{d}, {D}, true};
    plan[p + "post_attention_layernorm.weight"] = {{d}, {D}, true};
    plan[p + "self_attn.q_proj.weight"] = {{s.n_heads * hd, d}, {w.n_heads * hd, D}};
    plan[p + "self_attn.k_proj.weight"] = {{s.n_kv_heads * hd, d}, {w.n_kv_heads * hd, D}};
    plan[p + "self_attn.v_proj.weight"] = {{s.n_kv_heads * hd, d}, {w.n_kv_heads * hd, D}};
    plan[p + "self_attn.o_proj.weight"] = {{d, s.n_heads * hd}, {D, w.n_heads * hd}};
    plan[p + "mlp.gate_proj.weight"] = {{s.hidden_dim, d}, {w.hidden_dim, D}};
    plan[p + "mlp.up_proj.weight"] = {{s.hidden_dim, d}, {w.hidden_dim, D}};
    plan[p + "mlp.down_proj.weight"] = {{d, s.hidden_dim}, {D, w.hidden_dim}};
  }
  return plan;
}

// The rest of the output directory after its weights: the copied tokenizer
// and generation files, config.json (last: its presence marks a complete
// checkpoint) with the widened fields and a lede_widen record, and the
// removal of a calibration measured for another shape.
Status WriteMetadata(const fs::path& src, const fs::path& out, Json root, int64_t K, int64_t K2,
                     const ModelConfig& s, const ModelConfig& w, WidenResult* result_out) {
  WidenResult& result = *result_out;
  const std::string source_dir = src.string();
  const int64_t hd = s.head_dim();
  std::error_code ec;
  std::vector<std::string> names;
  for (const fs::directory_entry& e : fs::directory_iterator(src, ec)) {
    if (e.is_regular_file(ec) && IsCopiedFile(e.path().filename().string())) {
      names.push_back(e.path().filename().string());
    }
  }
  if (ec) return InternalError(source_dir + ": cannot list directory: " + ec.message());
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    LEDE_ASSIGN_OR_RETURN(std::string bytes, file::ReadFile((src / name).string()));
    LEDE_RETURN_IF_ERROR(file::WriteFileAtomically((out / name).string(), bytes));
  }
  result.copied_files = names;

  // The source's config with the widened fields (other fields kept as they are).
  root["hidden_size"] = w.dim;
  root["intermediate_size"] = w.hidden_dim;
  root["num_attention_heads"] = w.n_heads;
  root["num_key_value_heads"] = w.n_kv_heads;
  root["rms_norm_eps"] = w.rms_norm_eps;
  if (root.contains("head_dim") && !root["head_dim"].is_null()) root["head_dim"] = hd;
  root["torch_dtype"] = "float32";
  root["lede_widen"] = {{"factor", K},
                        {"ffn_factor", K2},
                        {"source_hidden_size", s.dim},
                        {"source_intermediate_size", s.hidden_dim},
                        {"source_num_attention_heads", s.n_heads},
                        {"source_num_key_value_heads", s.n_kv_heads},
                        {"source_rms_norm_eps", s.rms_norm_eps},
                        {"source_fingerprint", s.ArchitectureFingerprint()}};
  LEDE_RETURN_IF_ERROR(file::WriteFileAtomically((out / "config.json").string(), root.dump(2) + "\n"));

  // A measured cost model left in out_dir by an earlier run for another
  // shape does not fit this one: removed (one for this shape is kept).
  const fs::path calibration = out / "calibration-cpu.json";
  if (fs::exists(calibration, ec)) {
    auto text = file::ReadFile(calibration.string());
    const Json j = text.ok() ? Json::parse(*text, nullptr, /*allow_exceptions=*/false) : Json();
    const auto it = j.is_object() ? j.find("model_fingerprint") : j.end();
    if (!j.is_object() || it == j.end() || !it->is_string() || it->get<std::string>() != w.ArchitectureFingerprint()) {
      fs::remove(calibration, ec);
      if (ec) return InternalError(calibration.string() + ": cannot remove: " + ec.message());
      result.removed_files.push_back("calibration-cpu.json");
    }
  }
  return OkStatus();
}

// The policies shipped for this widened shape (widen.h): the source's
// widened/<fingerprint>/policy tree, copied byte for byte into out/policy
// (files of an earlier run replaced, others left).
Status InstallShippedPolicies(const fs::path& src, const fs::path& out, const ModelConfig& w,
                              WidenResult* result) {
  const fs::path shipped = src / "widened" / w.ArchitectureFingerprint() / "policy";
  std::error_code ec;
  if (!fs::is_directory(shipped, ec)) return OkStatus();
  std::vector<fs::path> files;
  for (auto it = fs::recursive_directory_iterator(shipped, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (it->is_regular_file(ec)) files.push_back(it->path());
  }
  if (ec) return InternalError(shipped.string() + ": cannot list: " + ec.message());
  std::sort(files.begin(), files.end());
  for (const fs::path& f : files) {
    const fs::path dest = out / "policy" / fs::relative(f, shipped, ec);
    if (ec) return InternalError(f.string() + ": " + ec.message());
    fs::create_directories(dest.parent_path(), ec);
    if (ec) return InternalError(dest.parent_path().string() + ": cannot create directory: " + ec.message());
    LEDE_ASSIGN_OR_RETURN(std::string bytes, file::ReadFile(f.string()));
    LEDE_RETURN_IF_ERROR(file::WriteFileAtomically(dest.string(), bytes));
  }
  for (auto it = fs::directory_iterator(shipped, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    if (it->is_directory(ec)) result->installed_policies.push_back(it->path().filename().string());
  }
  std::sort(result->installed_policies.begin(), result->installed_policies.end());
  return OkStatus();
}

// The source's tensors (model.safetensors) as float32, each zero-padded to
// its widened shape; norms are scaled by sqrt(d / D) so that RMS norms of the
// padded activations match (docs/models.md, "The memory-bound regime"). Refuses a tensor
// outside `plan` (biases included), a missing one or a wrong shape.
StatusOr<std::map<std::string, std::vector<float>>> ReadPaddedTensors(const fs::path& src,
                                                                     const std::string& config_path,
                                                                     const std::map<std::string, Planned>& plan,
                                                                     const ModelConfig& s,
                                                                     const ModelConfig& w) {
  std::error_code ec;
  const std::string weights_path = (src / "model.safetensors").string();
  if (!fs::exists(weights_path, ec)) return NotFoundError(src.string() + ": no model.safetensors");
  LEDE_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(weights_path));
  for (const auto& [name, view] : file->tensors()) {
    if (plan.count(name)) continue;
    if (name == "lm_head.weight" && s.tie_word_embeddings) continue;  // tied: the embedding serves
    if (name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0) {
      return InvalidArgumentError(weights_path + ": tensor " + name +
                                  " is a bias; biases are not part of the embedded architecture");
    }
    return InvalidArgumentError(weights_path + ": tensor " + name + " is not part of the Llama architecture of " +
                                config_path);
  }
  const int64_t d = s.dim, D = w.dim;
  const double norm_scale = std::sqrt(static_cast<double>(d) / static_cast<double>(D));
  std::map<std::string, std::vector<float>> values;
  for (const auto& [name, p] : plan) {
    auto it = file->tensors().find(name);
    if (it == file->tensors().end()) return InvalidArgumentError(weights_path + ": missing tensor " + name);
    if (it->second.shape != p.src_shape) {
      return InvalidArgumentError(weights_path + ": tensor " + name + " has shape " +
                                  ShapeString(it->second.shape) + ", expected " + ShapeString(p.src_shape) +
                                  " from " + config_path);
    }
    LEDE_ASSIGN_OR_RETURN(std::vector<float> v, ToFloat32(it->second));
    if (p.norm) {
      values[name] = Pad(v, 1, d, 1, D, norm_scale);
    } else {
      values[name] = Pad(v, p.src_shape[0], p.src_shape[1], p.out_shape[0], p.out_shape[1]);
    }
  }
  return values;
}

}  // namespace

StatusOr<WidenResult> WidenCheckpoint(const std::string& source_dir, const std::string& out_dir,
                                      const WidenOptions& options) {
  const int64_t K = options.factor;
  const int64_t K2 = options.ffn_factor == 0 ? options.factor : options.ffn_factor;
  if (K < 1) return InvalidArgumentError("factor must be >= 1, got " + std::to_string(K));
  if (K2 < 1) return InvalidArgumentError("ffn factor must be >= 1, got " + std::to_string(K2));
  std::error_code ec;
  if (!fs::exists(source_dir, ec)) return NotFoundError(source_dir + ": no such directory");
  if (!fs::is_directory(source_dir, ec)) {
    return InvalidArgumentError(source_dir + ": not a Hugging Face checkpoint directory (llama2.c files are refused)");
  }
  const fs::path src(source_dir), out(out_dir);
  const std::string config_path = (src / "config.json").string();
  if (!fs::exists(config_path, ec)) return NotFoundError(source_dir + ": no config.json");
  if (fs::exists(src / "model.safetensors.index.json", ec) && !fs::exists(src / "model.safetensors", ec)) {
    return InvalidArgumentError((src / "model.safetensors.index.json").string() +
                                ": sharded checkpoints are not supported; want one model.safetensors");
  }
  LEDE_ASSIGN_OR_RETURN(std::string config_text, file::ReadFile(config_path));
  Json root = Json::parse(config_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) return InvalidArgumentError(config_path + ": invalid JSON object");
  LEDE_RETURN_IF_ERROR(CheckEmbeddable(root, config_path));
  WidenResult result;
  LEDE_ASSIGN_OR_RETURN(result.source, ParseHfConfig(config_text, config_path));
  const ModelConfig& s = result.source;
  if (s.head_dim() % 2 != 0) {
    return InvalidArgumentError(FieldError(config_path, "num_attention_heads", "gives an odd head_dim"));
  }
  ModelConfig w = s;
  w.dim = s.dim * K;
  w.n_heads = s.n_heads * K;
  w.n_kv_heads = s.n_kv_heads * K;
  w.hidden_dim = s.hidden_dim * K2;
  w.rms_norm_eps = s.rms_norm_eps * static_cast<double>(s.dim) / static_cast<double>(w.dim);
  if (w.head_dim() != s.head_dim() || w.n_heads / w.n_kv_heads != s.n_heads / s.n_kv_heads) {
    return InternalError("widen: head layout changed");  // unreachable: d and the head counts scale alike
  }
  LEDE_RETURN_IF_ERROR(w.Validate());
  result.widened = w;

  // Every tensor the source must hold, with its source and widened shapes.
  const std::map<std::string, Planned> plan = PlanTensors(s, w);

  LEDE_ASSIGN_OR_RETURN(auto values, ReadPaddedTensors(src, config_path, plan, s, w));
  result.source_parameters = Parameters(s);
  result.widened_parameters = Parameters(w);

  // The output directory: refuse to mix with an existing checkpoint.
  if (fs::exists(out / "config.json", ec) && !options.overwrite) {
    return AlreadyExistsError(out_dir + " already holds a checkpoint (config.json); pass overwrite");
  }
  if (fs::equivalent(src, out, ec)) return InvalidArgumentError("the output directory is the source directory");
  fs::create_directories(out, ec);
  if (ec) return InternalError(out_dir + ": cannot create directory: " + ec.message());
  // config.json last (its presence marks a complete checkpoint): remove an old one first.
  fs::remove(out / "config.json", ec);

  std::map<std::string, TensorBytes> tensors;
  for (const auto& [name, v] : values) {
    TensorBytes t;
    t.dtype = Dtype::kF32;
    t.shape = plan.at(name).out_shape;
    t.data = v.data();
    t.nbytes = v.size() * sizeof(float);
    tensors[name] = t;
  }
  LEDE_RETURN_IF_ERROR(WriteSafetensors((out / "model.safetensors").string(), tensors));
  values.clear();

  LEDE_RETURN_IF_ERROR(WriteMetadata(src, out, std::move(root), K, K2, s, w, &result));
  LEDE_RETURN_IF_ERROR(InstallShippedPolicies(src, out, w, &result));
  return result;
}

}  // namespace lede::checkpoint
