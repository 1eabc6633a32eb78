// File: services/policy/policy_server.h
//
// The `lede-policy` process (docs/design.md §3 "policy service"): flags, then a
// ServingPolicy polling its policy root, the Policy gRPC service with health
// and reflection (shared/rpc/server.h), /metrics, and a clean stop on
// SIGTERM / SIGINT. main.cc only calls ParsePolicyServerFlags() and
// RunPolicyServer().
//
// Flags (also from --config FILE, one "name = value" per line; the command
// line wins):
//   --policy-root DIR          required; holds SERVING and the versions
//   --policy-store URL         follow this object store's SERVING (s3://..., file:///...):
//                              each poll mirrors its serving version into
//                              --policy-root (policy/dqn/artifact_store.h)
//   --model-fingerprint STR    expected ModelConfig::ArchitectureFingerprint()
//   --model-config FILE        the model's config.json: gives the fingerprint
//                              and L (candidate layers must lie in [1, L))
//   --listen ADDR              gRPC address (default 127.0.0.1:50053)
//   --metrics ADDR             /metrics address (default 127.0.0.1:9403; "" = off)
//   --reload-interval-ms N     SERVING poll period, ms (default 1000)
//   --tls-cert, --tls-key FILE TLS of the gRPC port (PEM); default plaintext
//   --tls-client-ca FILE       require client certificates signed by this CA
//
// Example:
//   lede-policy --policy-root models/lede-tiny/policy
//       --model-config models/lede-tiny/config.json   (one command line)
#ifndef LEDE_SERVICES_POLICY_POLICY_SERVER_H_
#define LEDE_SERVICES_POLICY_POLICY_SERVER_H_

#include <string>
#include <vector>

#include "services/policy/serving_policy.h"
#include "shared/rpc/security.h"
#include "shared/status/status.h"

namespace lede::policy_service {

struct PolicyServerOptions {
  ServingPolicyOptions serving;                 // policy root, fingerprint, L, poll period
  std::string listen_address = "127.0.0.1:50053";  // gRPC; port 0 picks one
  std::string metrics_address = "127.0.0.1:9403";  // HTTP /metrics; "" = none
  // TLS of the gRPC port (PEM files; empty = plaintext) and, with a client
  // CA, mutual TLS (shared/rpc/security.h ServerTlsOptions).
  std::string tls_cert_path;
  std::string tls_key_path;
  std::string tls_client_ca_path;
  // The deployment's internal token: required on every call (security.h).
  rpc::InternalToken internal_token;
};

// Exit codes of RunPolicyServer() and main().
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;  // could not start (address in use, unreadable root)
inline constexpr int kExitUsage = 2;    // bad flags

// Parses `args` (without the program name), expanding --config first.
// Errors: kInvalidArgument naming the flag (unknown flag, missing
// --policy-root, bad value, --model-fingerprint disagreeing with
// --model-config); kNotFound for a missing --config or --model-config file.
StatusOr<PolicyServerOptions> ParsePolicyServerFlags(const std::vector<std::string>& args);

// The flags' help text (for --help).
std::string PolicyServerUsage();

// Serves until SIGTERM or SIGINT: loads the serving version (a missing or
// refused one is logged and retried by the poll; Decide answers
// FAILED_PRECONDITION meanwhile), starts polling, serves, then stops the
// watchers, the server and the poll thread in that order. Call
// rpc::BlockTerminationSignals() first, before any thread starts.
// Returns kExitOk after a signal, kExitFailure if the policy root is not a
// directory or an address cannot be bound (one line on stderr).
int RunPolicyServer(const PolicyServerOptions& options);

}  // namespace lede::policy_service

#endif  // LEDE_SERVICES_POLICY_POLICY_SERVER_H_
