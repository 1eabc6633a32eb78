#include "services/policy/policy_server.h"

#include <cstdint>
#include <filesystem>
#include <iostream>
#include <system_error>

#include "services/policy/policy_service.h"
#include "shared/file/file.h"
#include "shared/flags/flags.h"
#include "shared/checkpoint/gguf.h"
#include "shared/checkpoint/model_config.h"
#include "shared/rpc/security.h"
#include "shared/rpc/server.h"
#include "shared/status/status_macros.h"
#include "shared/storage/object_store.h"
#include "shared/telemetry/lede_metrics.h"
#include "shared/telemetry/metrics.h"

namespace lede::policy_service {
namespace {

// --model-config: a config.json, or a .gguf checkpoint (its llama.* metadata).
StatusOr<checkpoint::ModelConfig> ReadModelConfig(const std::string& path) {
  if (std::filesystem::path(path).extension() == ".gguf") {
    LEDE_ASSIGN_OR_RETURN(std::shared_ptr<const checkpoint::GgufFile> gguf, checkpoint::GgufFile::Open(path));
    return checkpoint::GgufLlamaConfig(*gguf);
  }
  LEDE_ASSIGN_OR_RETURN(std::string text, file::ReadFile(path));
  return checkpoint::ParseHfConfig(text, path);
}

struct FlagValues {
  std::string policy_root;
  std::string policy_store;
  std::string model_fingerprint;
  std::string model_config;
  std::string listen = "127.0.0.1:50053";
  std::string metrics = "127.0.0.1:9403";
  int64_t reload_interval_ms = 1000;
  rpc::ServerTlsOptions tls;
  std::string internal_token_file;
};

void Register(flags::FlagSet& set, FlagValues& v) {
  rpc::AddServerTlsFlags(&set, &v.tls);
  rpc::AddInternalTokenFlag(&set, &v.internal_token_file, "required on every call");
  set.Add("policy-root", &v.policy_root, "directory holding SERVING and one folder per version",
          /*required=*/true);
  set.Add("policy-store", &v.policy_store,
          "object store to follow (s3://bucket/prefix?endpoint=..., file:///dir): its SERVING version is "
          "downloaded into --policy-root, then served; empty = --policy-root alone");
  set.Add("model-fingerprint", &v.model_fingerprint,
          "expected model fingerprint (ModelConfig::ArchitectureFingerprint); empty = any");
  set.Add("model-config", &v.model_config,
          "the model's config.json (or .gguf file): its fingerprint and L are checked against each version");
  set.Add("listen", &v.listen, "gRPC listen address (port 0 picks one)");
  set.Add("metrics", &v.metrics, "HTTP address of /metrics; empty = none");
  set.Add("reload-interval-ms", &v.reload_interval_ms, "SERVING poll period, milliseconds");
}

}  // namespace

std::string PolicyServerUsage() {
  FlagValues v;
  flags::FlagSet set;
  Register(set, v);
  return "usage: lede-policy --policy-root DIR [--config FILE] [flags]\nflags:\n"
         "  --config  FILE of 'name = value' lines, read before the command line\n" +
         set.Usage();
}

StatusOr<PolicyServerOptions> ParsePolicyServerFlags(const std::vector<std::string>& args) {
  LEDE_ASSIGN_OR_RETURN(std::vector<std::string> expanded, flags::ExpandConfigFile(args));
  FlagValues v;
  flags::FlagSet set;
  Register(set, v);
  LEDE_RETURN_IF_ERROR(set.Parse(expanded));
  if (v.policy_root.empty()) return InvalidArgumentError("--policy-root: must not be empty");
  if (v.reload_interval_ms < 1) {
    return InvalidArgumentError("--reload-interval-ms: must be >= 1, got " +
                                std::to_string(v.reload_interval_ms));
  }
  PolicyServerOptions options;
  options.serving.policy_root = v.policy_root;
  if (!v.policy_store.empty()) {
    StatusOr<std::unique_ptr<storage::ObjectStore>> store = storage::OpenObjectStore(v.policy_store);
    if (!store.ok()) return InvalidArgumentError("--policy-store: " + std::string(store.status().message()));
    options.serving.store = std::move(*store);
    std::error_code ec;
    std::filesystem::create_directories(v.policy_root, ec);  // the local mirror
    if (ec) return InvalidArgumentError("--policy-root: cannot create the mirror " + v.policy_root + ": " + ec.message());
  }
  options.serving.model_fingerprint = v.model_fingerprint;
  options.serving.reload_interval = absl::Milliseconds(v.reload_interval_ms);
  options.listen_address = v.listen;
  options.metrics_address = v.metrics;
  options.tls_cert_path = v.tls.cert_path;
  options.tls_key_path = v.tls.key_path;
  options.tls_client_ca_path = v.tls.client_ca_path;
  LEDE_ASSIGN_OR_RETURN(options.internal_token, rpc::InternalToken::LoadIfSet(v.internal_token_file));
  if (!v.model_config.empty()) {
    StatusOr<checkpoint::ModelConfig> config = ReadModelConfig(v.model_config);
    if (!config.ok() && config.status().code() != StatusCode::kInvalidArgument) {
      return Status(config.status().code(), "--model-config: " + std::string(config.status().message()));
    }
    if (!config.ok()) {
      return InvalidArgumentError("--model-config: " + std::string(config.status().message()));
    }
    const std::string fingerprint = config->ArchitectureFingerprint();
    if (!v.model_fingerprint.empty() && v.model_fingerprint != fingerprint) {
      return InvalidArgumentError("--model-fingerprint: '" + v.model_fingerprint + "' differs from '" +
                                  fingerprint + "' of --model-config " + v.model_config);
    }
    options.serving.model_fingerprint = fingerprint;
    options.serving.n_layers = static_cast<int32_t>(config->n_layers);
  }
  return options;
}

int RunPolicyServer(const PolicyServerOptions& options) {
  rpc::SetLogProcessName("policy");
  std::error_code ec;
  if (!std::filesystem::is_directory(options.serving.policy_root, ec)) {
    std::cerr << "lede-policy: --policy-root: not a directory: " << options.serving.policy_root
              << "\n";
    return kExitFailure;
  }
  telemetry::Registry registry;
  telemetry::SpecDecodeMetrics metrics(registry);
  ServingPolicy serving(options.serving, &metrics);
  if (Status s = serving.Reload(); !s.ok()) {
    rpc::LogEvent("warning", "no_policy_yet",
                  {{"policy_root", options.serving.policy_root}, {"reason", s.ToString()}});
  }
  serving.StartPolling();
  PolicyService service(&serving, &metrics, options.internal_token);
  rpc::ServerRunner runner("policy");
  runner.AddService(&service);
  rpc::ServerOptions server_options;
  server_options.listen_address = options.listen_address;
  server_options.metrics_address = options.metrics_address;
  server_options.tls.cert_path = options.tls_cert_path;
  server_options.tls.key_path = options.tls_key_path;
  server_options.tls.client_ca_path = options.tls_client_ca_path;
  server_options.reflection = options.internal_token.empty() && options.tls_client_ca_path.empty();
  if (Status s = runner.Start(server_options, &registry); !s.ok()) {
    std::cerr << "lede-policy: " << s.message() << "\n";
    serving.StopPolling();
    return kExitFailure;
  }
  std::shared_ptr<const LoadedPolicy> current = serving.Current();
  rpc::LogEvent("info", "listening",
                {{"grpc", options.listen_address},
                 {"grpc_port", std::to_string(runner.port())},
                 {"metrics_port", std::to_string(runner.metrics_port())},
                 {"policy_root", options.serving.policy_root},
                 {"version", current != nullptr ? current->version : std::string("none")}});
  runner.WaitForTermination();
  service.Shutdown();  // end the WatchPolicy streams so Shutdown() need not wait for them
  runner.Shutdown();
  serving.StopPolling();
  return kExitOk;
}

}  // namespace lede::policy_service
