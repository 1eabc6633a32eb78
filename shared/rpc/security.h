// File: shared/rpc/security.h
//
// Transport security and API keys of LEDE's servers
// (docs/security.md):
//  - TLS for a gRPC server from PEM files (server certificate chain and
//    private key), optionally requiring and verifying client certificates
//    against a CA bundle (mutual TLS, for the internal model and policy
//    services); the matching channel credentials for their clients;
//  - API keys: a set of secrets loaded from a file (one key per line) and/or
//    an environment variable (comma-separated), checked against an
//    `Authorization: Bearer <key>` header or the gRPC `authorization`
//    metadata in constant time. Keys are never logged or put in errors.
//
// Thread-safety: the functions are pure (they read files); an ApiKeys is
// immutable after Load() and safe to share between threads.
#ifndef LEDE_SHARED_RPC_SECURITY_H_
#define LEDE_SHARED_RPC_SECURITY_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <grpcpp/channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/channel_arguments.h>
#include <grpcpp/security/server_credentials.h>

#include "shared/status/status.h"

namespace lede::flags {
class FlagSet;
}  // namespace lede::flags

namespace lede::rpc {

// The PEM files of a TLS server. All empty = plaintext.
struct ServerTlsOptions {
  std::string cert_path;       // certificate chain, PEM (--tls-cert)
  std::string key_path;        // its private key, PEM (--tls-key)
  // CA bundle, PEM (--tls-client-ca): when set, clients must present a
  // certificate signed by it (mutual TLS); the handshake fails otherwise.
  std::string client_ca_path;
  bool enabled() const { return !cert_path.empty() || !key_path.empty() || !client_ca_path.empty(); }
};

// Adds --tls-cert, --tls-key and --tls-client-ca to a server's flags.
// `served` names what the certificate secures in the help text (e.g. "the
// gRPC API and the OpenAI HTTP API (HTTPS)").
void AddServerTlsFlags(flags::FlagSet* flags, ServerTlsOptions* tls, std::string_view served = "the gRPC server");

// grpc::InsecureServerCredentials() when nothing is set, else
// grpc::SslServerCredentials over the files' contents.
// Errors: kInvalidArgument naming the flag when only one of cert/key is set
// or client_ca_path is set without them; kNotFound naming the flag and path
// of a file that cannot be read. (A file that is not PEM fails later, when
// the server starts: ServerRunner::Start's kUnavailable.)
StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const ServerTlsOptions& tls);

// The PEM files of a TLS client (the coordinator's channels to the model
// services, the drafter's to the policy service). All empty = plaintext.
//
// Example (the coordinator's --model-tls-* flags):
//   ChannelTlsOptions tls{"ca.pem", "client.pem", "client.key", "model.lede.svc"};
//   LEDE_ASSIGN_OR_RETURN(auto creds, MakeChannelCredentials(tls, "model_tls"));
//   grpc::ChannelArguments args;
//   ApplyServerName(tls, &args);
//   auto channel = grpc::CreateCustomChannel(target, creds, args);
struct ChannelTlsOptions {
  std::string ca_path;    // CA bundle the server's certificate must chain to (empty: system roots)
  std::string cert_path;  // client certificate chain, for servers that verify clients
  std::string key_path;   // its private key
  // The DNS name the server's certificate must carry when it is not the
  // target's host (gRPC 1.51 matches DNS names, not IP SANs: with a target
  // of 127.0.0.1, give the certificate's name here). "" = the target's host.
  std::string server_name;
  // TLS when any of the three files is set.
  bool enabled() const { return !ca_path.empty() || !cert_path.empty() || !key_path.empty(); }
};

// Adds --<prefix>-ca, --<prefix>-cert, --<prefix>-key and
// --<prefix>-server-name (e.g. prefix "model-tls") for a client's channel
// to `peer` (help text, e.g. "the model services").
void AddChannelTlsFlags(flags::FlagSet* flags, std::string_view prefix, std::string_view peer,
                        ChannelTlsOptions* tls);

// grpc::InsecureChannelCredentials() when nothing is set, else
// grpc::SslCredentials over the files' contents. `field` (e.g. "model_tls")
// starts every error message, so it names the option.
// Errors: kInvalidArgument when only one of cert/key is set; kNotFound
// naming the path of a file that cannot be read.
StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(const ChannelTlsOptions& tls,
                                                                         std::string_view field = "");

// Sets gRPC's target name override to tls.server_name when TLS is on and a
// name is given; otherwise leaves `args` unchanged.
void ApplyServerName(const ChannelTlsOptions& tls, grpc::ChannelArguments* args);

// The whole content of `path`. Errors: kNotFound naming `what` and the path.
StatusOr<std::string> ReadPemFile(const std::string& path, std::string_view what);

// The API keys a server accepts. Empty = no authentication (every request
// is accepted).
class ApiKeys {
 public:
  ApiKeys() = default;
  // Keys from `file_path` (one per line; blank lines and lines starting with
  // '#' are skipped; surrounding spaces and a '\r' are trimmed) and from
  // `env_value` (comma-separated, e.g. getenv("LEDE_API_KEYS")); either may
  // be empty. Errors: kNotFound naming the file when it cannot be read;
  // kInvalidArgument naming the source (never the key) for a key with
  // whitespace or control characters inside, or when a file is given but
  // holds no key.
  static StatusOr<ApiKeys> Load(const std::string& file_path, const std::string& env_value);
  // For tests and embedders: exactly these keys.
  explicit ApiKeys(std::vector<std::string> keys) : keys_(std::move(keys)) {}

  bool empty() const { return keys_.empty(); }
  size_t size() const { return keys_.size(); }
  // The keys themselves (to hand to another front end; never log them).
  const std::vector<std::string>& keys() const { return keys_; }

  // True when no key is configured, or `authorization` is "Bearer <key>"
  // (scheme case-insensitive, one space) for one of the keys. The
  // comparison takes the same time whichever byte differs and visits every
  // key (no early exit), so response timing does not reveal a key's prefix.
  bool Allows(std::string_view authorization) const;

 private:
  std::vector<std::string> keys_;
};

// The internal plane's local credential: a secret the
// deployment's processes on one machine share through a file only their
// user can read (scripts/run writes <state>/internal.token, mode 0600).
// Clients send it as `authorization: Bearer <token>` metadata on every call
// (ChannelWithToken); the verifier, drafter and policy services refuse a
// call without it with UNAUTHENTICATED (Check), so another local user, who
// can reach the loopback ports but not read the file, cannot drive them.
// Across machines use mutual TLS instead (ServerTlsOptions.client_ca_path;
// docs/security.md); the two combine.
class InternalToken {
 public:
  InternalToken() = default;  // empty: no check, nothing sent
  // Reads the token from `path` (surrounding whitespace trimmed; at least 16
  // characters). Errors: kNotFound naming the flag and path when the file
  // cannot be read; kInvalidArgument naming the flag when the token is
  // short or the file can be read by its group or others (mode & 077).
  static StatusOr<InternalToken> Load(const std::string& path, std::string_view flag = "internal_token_file");
  // Load() when `path` is not empty, else the empty token.
  static StatusOr<InternalToken> LoadIfSet(const std::string& path) {
    return path.empty() ? StatusOr<InternalToken>(InternalToken()) : Load(path);
  }
  // For tests: exactly this token.
  explicit InternalToken(std::string token) : token_(std::move(token)) {}

  bool empty() const { return token_.empty(); }
  // OK when no token is configured or the call carries it (constant-time
  // comparison); else UNAUTHENTICATED (the token is never in the message).
  grpc::Status Check(const grpc::ServerContextBase& context) const;
  // A channel whose every call carries the token (a client interceptor);
  // grpc::CreateCustomChannel when the token is empty.
  std::shared_ptr<grpc::Channel> Channel(const std::string& target,
                                         const std::shared_ptr<grpc::ChannelCredentials>& credentials,
                                         const grpc::ChannelArguments& args) const;

 private:
  std::string token_;
};

// Adds --internal-token-file (InternalToken::Load's file) to a process of
// the internal plane; `role` says what it does with it in the help text.
void AddInternalTokenFlag(flags::FlagSet* flags, std::string* path, std::string_view role);

// Compares two byte strings in time that depends only on their lengths
// (never on where they differ). True when equal.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

}  // namespace lede::rpc

#endif  // LEDE_SHARED_RPC_SECURITY_H_
