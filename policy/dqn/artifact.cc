#include "policy/dqn/artifact.h"


#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <new>
#include <optional>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "shared/checkpoint/safetensors.h"
#include "shared/file/file.h"
#include "shared/file/sha256.h"
#include "shared/status/status_macros.h"

namespace lede::policy::dqn {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;




// --- metadata <-> JSON -----------------------------------------------------------

Json MetricsToJson(const std::map<std::string, double>& m) {
  Json j = Json::object();
  for (const auto& [k, v] : m) {
    if (std::isfinite(v)) {
      j[k] = v;
    } else {
      j[k] = nullptr;  // JSON has no NaN / Inf
    }
  }
  return j;
}

std::map<std::string, double> MetricsFromJson(const Json& j) {
  std::map<std::string, double> m;
  for (const auto& [k, v] : j.items()) {
    m[k] = v.is_null() ? std::numeric_limits<double>::quiet_NaN() : v.get<double>();
  }
  return m;
}

Json ToJson(const PolicyMetadata& m, int32_t hidden, const std::string& sha256) {
  const TrainingDataInfo& d = m.training_data;
  Json j;
  j["format"] = kArtifactFormat;
  j["version"] = m.version;
  j["model_fingerprint"] = m.model_fingerprint;
  j["features"] = {{"spec", speculation::kExitFeatureSpec}, {"names", ExitFeatureNames()}, {"dim", speculation::kExitFeatureDim}};
  j["network"] = {{"type", "mlp"},
                  {"hidden", hidden},
                  {"activation", "relu"},
                  {"actions", {"continue", "exit"}}};
  j["candidate_layers"] = m.decision.candidate_layers;
  j["max_draft_len"] = m.decision.max_draft_len;
  j["top_k"] = m.decision.top_k;
  j["trace_window"] = m.decision.trace_window;
  j["probe_candidates"] = m.decision.probe_candidates;
  j["lookahead_probe"] = m.decision.lookahead_probe;
  j["reward"] = {{"cost_model", m.reward_cost_model}};
  j["gamma"] = m.gamma;
  j["n_step"] = m.n_step;
  j["seed"] = m.seed;
  j["training_options"] = MetricsToJson(m.training_options);
  j["training_data"] = {{"first_shard", d.first_shard},
                        {"last_shard", d.last_shard},
                        {"n_shards", d.n_shards},
                        {"n_bad_shards", d.n_bad_shards},
                        {"n_transitions", d.n_transitions},
                        {"n_episodes", d.n_episodes},
                        {"n_requests", d.n_requests},
                        {"n_train_transitions", d.n_train_transitions},
                        {"n_heldout_transitions", d.n_heldout_transitions},
                        {"n_train_episodes", d.n_train_episodes},
                        {"n_heldout_episodes", d.n_heldout_episodes},
                        {"behaviour_versions", d.behaviour_versions}};
  j["offline_metrics"] = MetricsToJson(m.offline_metrics);
  j["weights"] = {{"file", kWeightsFile}, {"dtype", "F32"}};
  j["weights_sha256"] = sha256;
  return j;
}

// Parses policy.json. Throws nlohmann::json exceptions on a missing or
// mistyped field; the caller maps them to kInvalidArgument.
struct ParsedMetadata {
  PolicyMetadata metadata;
  int32_t hidden = 0;
  std::string sha256;
  // Input features stored in fc1.weight: kExitFeatureDim, or that of the
  // older spec read with a zero weight on the features it lacks.
  int64_t stored_features = speculation::kExitFeatureDim;
};

// The older feature specs (speculation::kOlderExitFeatureSpecs) are each a
// prefix of the current one: lede-features-v3 is v4 without the load (the
// 14th feature), v4 is v5 without the cost profile (the next three), v5 is
// v6 without the temperature (the last), so a network of an older spec with
// a zero weight on what it lacks computes the same Q-values from v6
// features whatever the load, costs and temperature.

StatusOr<ParsedMetadata> FromJson(const Json& j, const std::string& where) {
  ParsedMetadata p;
  PolicyMetadata& m = p.metadata;
  const std::string format = j.at("format").get<std::string>();
  if (format != kArtifactFormat) {
    return InvalidArgumentError(where + ": format \"" + format + "\", expected \"" + kArtifactFormat + "\"");
  }
  const Json& features = j.at("features");
  // Artifacts before the spec was versioned were all lede-features-v1 (8 features).
  const std::string spec = features.contains("spec") ? features.at("spec").get<std::string>() : "lede-features-v1";
  int64_t want_dim = spec == speculation::kExitFeatureSpec ? speculation::kExitFeatureDim : 0;
  std::string readable;
  for (const speculation::OlderFeatureSpec& older : speculation::kOlderExitFeatureSpecs) {
    if (spec == older.name) want_dim = older.dim;
    readable += std::string(readable.empty() ? "" : ", ") + "\"" + older.name + "\"";
  }
  if (want_dim == 0) {
    return InvalidArgumentError(where + ": feature spec \"" + spec + "\", but this build computes \"" +
                                speculation::kExitFeatureSpec + "\" (and reads " + readable +
                                "; retrain the policy on experience of this spec)");
  }
  const int64_t dim = features.at("dim").get<int64_t>();
  if (dim != want_dim) {
    return InvalidArgumentError(where + ": wrong feature dim " + std::to_string(dim) + " for spec \"" + spec +
                                "\", expected " + std::to_string(want_dim));
  }
  p.stored_features = dim;
  std::vector<std::string> names = ExitFeatureNames();
  names.resize(static_cast<size_t>(dim));
  if (features.at("names").get<std::vector<std::string>>() != names) {
    return InvalidArgumentError(where + ": feature names differ from speculation::ExitFeatures' (" +
                                features.at("names").dump() + ")");
  }
  m.version = j.at("version").get<std::string>();
  m.model_fingerprint = j.at("model_fingerprint").get<std::string>();
  p.hidden = j.at("network").at("hidden").get<int32_t>();
  m.decision.candidate_layers = j.at("candidate_layers").get<std::vector<int32_t>>();
  m.decision.max_draft_len = j.at("max_draft_len").get<int32_t>();
  m.decision.top_k = j.at("top_k").get<int32_t>();
  m.decision.trace_window = j.at("trace_window").get<int32_t>();
  m.decision.probe_candidates = j.value("probe_candidates", true);
  m.decision.lookahead_probe = j.value("lookahead_probe", true);
  m.reward_cost_model = j.at("reward").at("cost_model").get<std::string>();
  m.gamma = j.at("gamma").get<double>();
  m.n_step = j.at("n_step").get<int32_t>();
  m.seed = j.at("seed").get<uint64_t>();
  if (j.contains("training_options")) m.training_options = MetricsFromJson(j.at("training_options"));
  if (j.contains("training_data")) {
    const Json& d = j.at("training_data");
    TrainingDataInfo& t = m.training_data;
    t.first_shard = d.value("first_shard", "");
    t.last_shard = d.value("last_shard", "");
    t.n_shards = d.value("n_shards", int64_t{0});
    t.n_bad_shards = d.value("n_bad_shards", int64_t{0});
    t.n_transitions = d.value("n_transitions", int64_t{0});
    t.n_episodes = d.value("n_episodes", int64_t{0});
    t.n_requests = d.value("n_requests", int64_t{0});
    t.n_train_transitions = d.value("n_train_transitions", int64_t{0});
    t.n_heldout_transitions = d.value("n_heldout_transitions", int64_t{0});
    t.n_train_episodes = d.value("n_train_episodes", int64_t{0});
    t.n_heldout_episodes = d.value("n_heldout_episodes", int64_t{0});
    t.behaviour_versions = d.value("behaviour_versions", std::vector<std::string>{});
  }
  if (j.contains("offline_metrics")) m.offline_metrics = MetricsFromJson(j.at("offline_metrics"));
  p.sha256 = j.at("weights_sha256").get<std::string>();
  return p;
}

Status ValidateDecisionSpec(const speculation::DecisionSpec& d, const std::string& where) {
  for (size_t i = 0; i < d.candidate_layers.size(); ++i) {
    if (d.candidate_layers[i] < 1 || (i > 0 && d.candidate_layers[i] <= d.candidate_layers[i - 1])) {
      return InvalidArgumentError(where + ": candidate_layers must be ascending and >= 1");
    }
  }
  if (d.max_draft_len < 1 || d.top_k < 1 || d.trace_window < 1) {
    return InvalidArgumentError(where + ": max_draft_len, top_k and trace_window must be >= 1");
  }
  return OkStatus();
}

// --- weights <-> tensors -----------------------------------------------------------

struct TensorSpec {
  const char* name;
  std::vector<float> QNetworkWeights::*field;
  int64_t rows;  // -1: H
  int64_t cols;  // -1: H; 0: a vector
};

std::vector<TensorSpec> TensorSpecs() {
  return {{"fc1.weight", &QNetworkWeights::fc1_weight, -1, speculation::kExitFeatureDim},
          {"fc1.bias", &QNetworkWeights::fc1_bias, -1, 0},
          {"fc2.weight", &QNetworkWeights::fc2_weight, -1, -1},
          {"fc2.bias", &QNetworkWeights::fc2_bias, -1, 0},
          {"fc3.weight", &QNetworkWeights::fc3_weight, kNumActions, -1},
          {"fc3.bias", &QNetworkWeights::fc3_bias, kNumActions, 0}};
}

std::vector<int64_t> Shape(const TensorSpec& s, int64_t h) {
  const int64_t rows = s.rows < 0 ? h : s.rows;
  if (s.cols == 0) return {rows};
  return {rows, s.cols < 0 ? h : s.cols};
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string t = "[";
  for (size_t i = 0; i < shape.size(); ++i) t += (i ? ", " : "") + std::to_string(shape[i]);
  return t + "]";
}

Status SaveArtifactImpl(const std::string& dir, const Artifact& artifact, bool overwrite) {
  const PolicyMetadata& m = artifact.metadata;
  LEDE_RETURN_IF_ERROR(ValidateVersionName(m.version));
  LEDE_RETURN_IF_ERROR(ValidateDecisionSpec(m.decision, dir));
  const fs::path root(dir);
  const std::string json_path = (root / kMetadataFile).string();
  std::error_code ec;
  if (!overwrite && fs::exists(json_path, ec)) {
    return AlreadyExistsError(json_path + " exists; policy versions are immutable");
  }
  fs::create_directories(root, ec);
  if (ec) return InternalError(dir + ": cannot create directory: " + ec.message());

  const QNetworkWeights& w = artifact.network.weights();
  std::map<std::string, checkpoint::TensorBytes> tensors;
  for (const TensorSpec& s : TensorSpecs()) {
    const std::vector<float>& v = w.*(s.field);
    tensors.emplace(s.name, checkpoint::TensorBytes{checkpoint::Dtype::kF32, Shape(s, w.hidden), v.data(),
                                                    v.size() * sizeof(float)});
  }
  const std::string weights_path = (root / kWeightsFile).string();
  LEDE_RETURN_IF_ERROR(checkpoint::WriteSafetensors(weights_path, tensors));
  LEDE_ASSIGN_OR_RETURN(std::string bytes, file::ReadFile(weights_path));
  const Json j = ToJson(m, w.hidden, file::Sha256Hex(bytes));
  // policy.json last: its presence marks a complete artifact.
  return file::WriteFileAtomically(json_path, j.dump(2) + "\n");
}

StatusOr<Artifact> LoadArtifactImpl(const std::string& dir, const std::string& expected_fingerprint) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return NotFoundError(dir + ": no such policy directory");
  const fs::path root(dir);
  const std::string json_path = (root / kMetadataFile).string();
  const std::string weights_path = (root / kWeightsFile).string();

  LEDE_ASSIGN_OR_RETURN(std::string json_text, file::ReadFile(json_path));
  ParsedMetadata parsed;
  try {
    const Json j = Json::parse(json_text);
    LEDE_ASSIGN_OR_RETURN(parsed, FromJson(j, json_path));
  } catch (const Json::exception& e) {
    return InvalidArgumentError(json_path + ": bad policy metadata: " + e.what());
  }
  PolicyMetadata& m = parsed.metadata;
  LEDE_RETURN_IF_ERROR(ValidateDecisionSpec(m.decision, json_path));
  if (!expected_fingerprint.empty() && m.model_fingerprint != expected_fingerprint) {
    return InvalidArgumentError(json_path + ": model fingerprint mismatch: policy trained for \"" +
                                m.model_fingerprint + "\", serving model is \"" + expected_fingerprint + "\"");
  }

  LEDE_ASSIGN_OR_RETURN(std::string weights_bytes, file::ReadFile(weights_path));
  const std::string sha = file::Sha256Hex(weights_bytes);
  if (sha != parsed.sha256) {
    return InvalidArgumentError(weights_path + ": checksum mismatch: sha256 " + sha + ", policy.json says " +
                                parsed.sha256);
  }
  LEDE_ASSIGN_OR_RETURN(std::shared_ptr<const checkpoint::SafetensorsFile> weights,
                        checkpoint::SafetensorsFile::Open(weights_path));
  const std::map<std::string, checkpoint::TensorView>& tensors = weights->tensors();
  const int64_t h = parsed.hidden;
  if (h < 1 || h > kMaxHidden) {
    return InvalidArgumentError(json_path + ": network.hidden " + std::to_string(h) + " outside [1, " +
                                std::to_string(kMaxHidden) + "]");
  }
  QNetworkWeights w;
  w.hidden = static_cast<int32_t>(h);
  for (TensorSpec s : TensorSpecs()) {
    auto it = tensors.find(s.name);
    if (it == tensors.end()) return InvalidArgumentError(weights_path + ": missing tensor " + s.name);
    const bool input = s.field == &QNetworkWeights::fc1_weight;
    if (input) s.cols = parsed.stored_features;
    const std::vector<int64_t> expected = Shape(s, h);
    const checkpoint::TensorView& t = it->second;
    if (t.shape != expected) {
      return InvalidArgumentError(weights_path + ": tensor " + s.name + " has shape " + ShapeText(t.shape) +
                                  ", expected " + ShapeText(expected) + " (hidden " + std::to_string(h) + ")");
    }
    LEDE_ASSIGN_OR_RETURN(w.*(s.field), checkpoint::ToFloat32(t));
    if (input && parsed.stored_features < speculation::kExitFeatureDim) {
      // An older spec: each row gains zero weights on the features it lacks.
      std::vector<float> wide;
      const std::vector<float>& narrow = w.*(s.field);
      for (int64_t r = 0; r < h; ++r) {
        wide.insert(wide.end(), narrow.begin() + r * parsed.stored_features,
                    narrow.begin() + (r + 1) * parsed.stored_features);
        wide.resize(static_cast<size_t>((r + 1) * speculation::kExitFeatureDim), 0.0f);
      }
      w.*(s.field) = std::move(wide);
    }
  }
  if (tensors.size() != TensorSpecs().size()) {
    for (const auto& [name, t] : tensors) {
      bool known = false;
      for (const TensorSpec& s : TensorSpecs()) known = known || name == s.name;
      if (!known) return InvalidArgumentError(weights_path + ": unexpected tensor " + name);
    }
  }
  StatusOr<QNetwork> net = QNetwork::Create(std::move(w));
  if (!net.ok()) return InvalidArgumentError(weights_path + ": " + std::string(net.status().message()));
  m.weights_sha256 = sha;
  return Artifact{std::move(m), std::move(*net)};
}

}  // namespace

const std::vector<std::string>& ExitFeatureNames() {
  static const std::vector<std::string> names = {
      "is_draft_phase", "layer_frac",   "draft_pos_frac", "top1_prob",
      "top_k_nll_div4", "entropy_div4", "trace_nll_div4", "margin_div8",
      "draft_conf",     "accept_ema",   "lookup_match",   "trigram_seen",
      "bias",           "load_log2_div8", "cost_probe",     "cost_layer_div2",
      "cost_verify",    "temperature_div2"};
  static_assert(speculation::kExitFeatureDim == 18, "update ExitFeatureNames with ExitFeatures");
  return names;
}

Status SaveArtifact(const std::string& dir, const Artifact& artifact, bool overwrite) {
  try {
    return SaveArtifactImpl(dir, artifact, overwrite);
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError(dir + ": out of memory");
  } catch (const std::exception& e) {  // nlohmann::json
    return InternalError(dir + ": " + e.what());
  }
}

StatusOr<Artifact> LoadArtifact(const std::string& dir, const std::string& expected_fingerprint) {
  try {
    return LoadArtifactImpl(dir, expected_fingerprint);
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError(dir + ": out of memory");
  } catch (const std::exception& e) {  // nlohmann::json
    return InternalError(dir + ": " + e.what());
  }
}

Status ValidateVersionName(const std::string& version) {
  if (version.empty() || version.size() > 128) {
    return InvalidArgumentError("policy version \"" + version + "\" must have 1-128 characters");
  }
  if (version == "." || version == ".." || version == kServingFile) {
    return InvalidArgumentError("policy version \"" + version + "\" is reserved");
  }
  for (char c : version) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == '-';
    if (!ok) return InvalidArgumentError("policy version \"" + version + "\" may only hold [A-Za-z0-9._-]");
  }
  return OkStatus();
}

std::string VersionDir(const std::string& model_dir, const std::string& version) {
  return (fs::path(model_dir) / version).string();
}

Status PublishServingVersion(const std::string& model_dir, const std::string& version,
                             const std::string& expected_fingerprint) {
  LEDE_RETURN_IF_ERROR(ValidateVersionName(version));
  LEDE_ASSIGN_OR_RETURN(Artifact artifact, LoadArtifact(VersionDir(model_dir, version), expected_fingerprint));
  if (artifact.metadata.version != version) {
    return InvalidArgumentError(VersionDir(model_dir, version) + ": policy.json names version \"" +
                                artifact.metadata.version + "\"");
  }
  return file::WriteFileAtomically((fs::path(model_dir) / kServingFile).string(), version + "\n");
}

StatusOr<std::string> ResolveServingVersion(const std::string& model_dir) {
  const std::string path = (fs::path(model_dir) / kServingFile).string();
  LEDE_ASSIGN_OR_RETURN(std::string text, file::ReadFile(path));
  return ParseServingPointer(text, path);
}

StatusOr<std::string> ParseServingPointer(const std::string& text, const std::string& where) {
  std::string version(absl::StripAsciiWhitespace(text));
  if (Status s = ValidateVersionName(version); !s.ok()) {
    return InvalidArgumentError(where + ": " + std::string(s.message()));
  }
  return version;
}

StatusOr<Artifact> LoadServingArtifact(const std::string& model_dir, const std::string& expected_fingerprint) {
  LEDE_ASSIGN_OR_RETURN(std::string version, ResolveServingVersion(model_dir));
  LEDE_ASSIGN_OR_RETURN(Artifact artifact, LoadArtifact(VersionDir(model_dir, version), expected_fingerprint));
  if (artifact.metadata.version != version) {
    return InvalidArgumentError(VersionDir(model_dir, version) + ": policy.json names version \"" +
                                artifact.metadata.version + "\", SERVING names \"" + version + "\"");
  }
  return artifact;
}

StatusOr<Artifact> LoadBroadestVersion(const std::string& model_dir, const std::string& cost_model,
                                       const std::string& expected_fingerprint) {
  std::vector<std::string> versions;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(model_dir, ec)) {
    if (entry.is_directory()) versions.push_back(entry.path().filename().string());
  }
  std::sort(versions.rbegin(), versions.rend());  // the last by name first: it wins ties
  std::optional<Artifact> best;
  for (const std::string& v : versions) {
    StatusOr<Artifact> a = LoadArtifact(VersionDir(model_dir, v), expected_fingerprint);
    if (!a.ok() || a->metadata.reward_cost_model != cost_model) continue;
    if (!best || a->metadata.training_data.n_requests > best->metadata.training_data.n_requests) best = *std::move(a);
  }
  if (!best) return NotFoundError(model_dir + ": no policy version trained with the " + cost_model + " cost model");
  return *std::move(best);
}

}  // namespace lede::policy::dqn
