#include "shared/rpc/security.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>
#include <utility>

#include <grpcpp/create_channel.h>
#include <grpcpp/support/client_interceptor.h>

#include "absl/strings/ascii.h"
#include "shared/flags/flags.h"
#include "shared/status/status_macros.h"

namespace lede::rpc {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

bool PlainKey(std::string_view key) {
  for (unsigned char c : key) {
    if (c <= 0x20 || c == 0x7f) return false;
  }
  return true;
}

}  // namespace

void AddServerTlsFlags(flags::FlagSet* flags, ServerTlsOptions* tls, std::string_view served) {
  flags->Add("tls-cert", &tls->cert_path,
             "TLS certificate chain (PEM) of " + std::string(served) + "; empty = plaintext");
  flags->Add("tls-key", &tls->key_path, "private key (PEM) of --tls-cert");
  flags->Add("tls-client-ca", &tls->client_ca_path,
             "CA bundle (PEM): require client certificates signed by it (mutual TLS)");
}

StatusOr<std::string> ReadPemFile(const std::string& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError(std::string(what) + ": cannot read " + path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const ServerTlsOptions& tls) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  if (tls.cert_path.empty() || tls.key_path.empty()) {
    return InvalidArgumentError("tls-cert, tls-key: give both (tls-client-ca needs them too)");
  }
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  LEDE_ASSIGN_OR_RETURN(pair.cert_chain, ReadPemFile(tls.cert_path, "tls-cert"));
  LEDE_ASSIGN_OR_RETURN(pair.private_key, ReadPemFile(tls.key_path, "tls-key"));
  grpc::SslServerCredentialsOptions options(
      tls.client_ca_path.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                 : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  if (!tls.client_ca_path.empty()) {
    LEDE_ASSIGN_OR_RETURN(options.pem_root_certs, ReadPemFile(tls.client_ca_path, "tls-client-ca"));
  }
  options.pem_key_cert_pairs.push_back(std::move(pair));
  return grpc::SslServerCredentials(options);
}

void AddChannelTlsFlags(flags::FlagSet* flags, std::string_view prefix, std::string_view peer,
                        ChannelTlsOptions* tls) {
  const std::string p(prefix), of(peer);
  flags->Add(p + "-ca", &tls->ca_path, "CA bundle (PEM) of the certificates of " + of + "; empty = plaintext");
  flags->Add(p + "-cert", &tls->cert_path, "client certificate (PEM) for " + of);
  flags->Add(p + "-key", &tls->key_path, "private key (PEM) of --" + p + "-cert");
  flags->Add(p + "-server-name", &tls->server_name,
             "DNS name in the certificates of " + of + " (default: the target's host)");
}

StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(const ChannelTlsOptions& tls,
                                                                         std::string_view field) {
  if (!tls.enabled()) return grpc::InsecureChannelCredentials();
  const std::string prefix = field.empty() ? "" : std::string(field) + ": ";
  if (tls.cert_path.empty() != tls.key_path.empty()) {
    return InvalidArgumentError(prefix + "client certificate and key: give both or neither");
  }
  grpc::SslCredentialsOptions options;
  auto read = [&](const std::string& path, const char* what, std::string* out) -> Status {
    auto pem = ReadPemFile(path, prefix + what);
    if (!pem.ok()) return pem.status();
    *out = std::move(*pem);
    return OkStatus();
  };
  if (!tls.ca_path.empty()) LEDE_RETURN_IF_ERROR(read(tls.ca_path, "CA bundle", &options.pem_root_certs));
  if (!tls.cert_path.empty()) {
    LEDE_RETURN_IF_ERROR(read(tls.cert_path, "client certificate", &options.pem_cert_chain));
    LEDE_RETURN_IF_ERROR(read(tls.key_path, "client key", &options.pem_private_key));
  }
  return grpc::SslCredentials(options);
}

void ApplyServerName(const ChannelTlsOptions& tls, grpc::ChannelArguments* args) {
  if (tls.enabled() && !tls.server_name.empty()) args->SetSslTargetNameOverride(tls.server_name);
}

StatusOr<ApiKeys> ApiKeys::Load(const std::string& file_path, const std::string& env_value) {
  std::vector<std::string> keys;
  if (!file_path.empty()) {
    std::ifstream in(file_path);
    if (!in) return NotFoundError("api-key-file: cannot read " + file_path);
    std::string line;
    int line_no = 0;
    while (std::getline(in, line)) {
      ++line_no;
      const std::string_view key = Trim(line);
      if (key.empty() || key.front() == '#') continue;
      if (!PlainKey(key)) {
        return InvalidArgumentError("api-key-file: line " + std::to_string(line_no) +
                                    " holds whitespace or control characters inside the key");
      }
      keys.emplace_back(key);
    }
    if (keys.empty()) return InvalidArgumentError("api-key-file: " + file_path + " holds no key");
  }
  std::string_view rest = env_value;
  int index = 0;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view key = Trim(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    if (key.empty()) continue;
    if (!PlainKey(key)) {
      return InvalidArgumentError("LEDE_API_KEYS: key " + std::to_string(index) +
                                  " holds whitespace or control characters");
    }
    keys.emplace_back(key);
    ++index;
  }
  return ApiKeys(std::move(keys));
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  // Every byte of `a` is visited whatever `b` holds; a length mismatch is
  // folded into the same accumulator instead of returning early.
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    const unsigned char other = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = diff | (static_cast<unsigned char>(a[i]) ^ other);
  }
  return diff == 0;
}

bool ApiKeys::Allows(std::string_view authorization) const {
  if (keys_.empty()) return true;
  constexpr std::string_view kScheme = "bearer ";
  if (authorization.size() <= kScheme.size()) return false;
  for (size_t i = 0; i < kScheme.size(); ++i) {
    const char c = authorization[i];
    if ((c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c) != kScheme[i]) return false;
  }
  const std::string_view presented = authorization.substr(kScheme.size());
  bool match = false;
  for (const std::string& key : keys_) match |= ConstantTimeEquals(key, presented);
  return match;
}

namespace {

// Adds `authorization: Bearer <token>` to a call's initial metadata.
class TokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit TokenInterceptor(const std::string* header) : header_(header) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({"authorization", *header_});
    }
    methods->Proceed();
  }

 private:
  const std::string* header_;
};

class TokenInterceptorFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(const std::string& token) : header_("Bearer " + token) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(grpc::experimental::ClientRpcInfo*) override {
    return new TokenInterceptor(&header_);
  }

 private:
  const std::string header_;  // lives as long as the channel (which owns the factory)
};

}  // namespace

void AddInternalTokenFlag(flags::FlagSet* flags, std::string* path, std::string_view role) {
  flags->Add("internal-token-file", path,
             "file (mode 600) holding the deployment's internal token; " + std::string(role) + " (empty = none)");
}

StatusOr<InternalToken> InternalToken::Load(const std::string& path, std::string_view flag) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return NotFoundError(std::string(flag) + ": cannot read " + path);
  }
  if ((st.st_mode & 077) != 0) {
    return InvalidArgumentError(std::string(flag) + ": " + path +
                                " can be read by other users (chmod 600 it: it is the internal plane's credential)");
  }
  std::ifstream in(path);
  if (!in) return NotFoundError(std::string(flag) + ": cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string token(absl::StripAsciiWhitespace(ss.str()));
  if (token.size() < 16) {
    return InvalidArgumentError(std::string(flag) + ": " + path + " holds a token shorter than 16 characters");
  }
  for (char c : token) {
    if (static_cast<unsigned char>(c) <= 0x20 || static_cast<unsigned char>(c) >= 0x7f) {
      return InvalidArgumentError(std::string(flag) + ": " + path + " holds a token with spaces or control characters");
    }
  }
  return InternalToken(std::move(token));
}

grpc::Status InternalToken::Check(const grpc::ServerContextBase& context) const {
  if (token_.empty()) return grpc::Status::OK;
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  const std::string expected = "Bearer " + token_;
  if (it != metadata.end() && ConstantTimeEquals(std::string_view(it->second.data(), it->second.size()), expected)) {
    return grpc::Status::OK;
  }
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      "authorization: this internal service needs the deployment's token (--internal-token-file)");
}

std::shared_ptr<grpc::Channel> InternalToken::Channel(const std::string& target,
                                                      const std::shared_ptr<grpc::ChannelCredentials>& credentials,
                                                      const grpc::ChannelArguments& args) const {
  if (token_.empty()) return grpc::CreateCustomChannel(target, credentials, args);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<TokenInterceptorFactory>(token_));
  return grpc::experimental::CreateCustomChannelWithInterceptors(target, credentials, args, std::move(interceptors));
}

}  // namespace lede::rpc
