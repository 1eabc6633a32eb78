// File: shared/rpc/server_flags.h
//
// The flags every LEDE server process declares the same way, declared once:
// --listen, --metrics, --shutdown-grace-s, the server TLS flags
// (AddServerTlsFlags) and --internal-token-file (AddInternalTokenFlag); and
// the command-line handling around them (--help, --config, parse, check).
// Each main adds its component's own flags beside these and keeps only the
// wiring.
#ifndef LEDE_SHARED_RPC_SERVER_FLAGS_H_
#define LEDE_SHARED_RPC_SERVER_FLAGS_H_

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shared/rpc/security.h"
#include "shared/rpc/server.h"
#include "shared/status/status.h"

namespace lede::flags {
class FlagSet;
}

namespace lede::rpc {

struct ServerFlags {
  std::string listen;                // --listen (gRPC address)
  std::string metrics;               // --metrics (HTTP address of /metrics)
  double shutdown_grace_s = 10;      // --shutdown-grace-s
  ServerTlsOptions tls;              // --tls-cert, --tls-key, --tls-client-ca
  std::string internal_token_file;   // --internal-token-file
};

// The help texts of ServerFlags (each process says what its addresses serve).
struct ServerFlagHelp {
  std::string listen;
  std::string metrics;
  std::string shutdown_grace;
  std::string tls_served = "the gRPC server";  // AddServerTlsFlags' `served`
  std::string internal_token;                  // AddInternalTokenFlag's `role`
};

// Adds --listen, --metrics and --shutdown-grace-s, then the TLS flags and
// --internal-token-file.
void AddServerFlags(flags::FlagSet* flags, ServerFlags* values, const ServerFlagHelp& help);
// Listen and metrics addresses, shutdown grace and TLS of `values`.
void ApplyServerFlags(const ServerFlags& values, ServerOptions* options);

// A server main's command line: on --help prints "usage: ..." and the flags
// and returns 0; else expands --config (flags::ExpandConfigFile), parses
// into `flags` and runs `finish` (the component's checks and conversions;
// may be empty). On an error prints "PROGRAM: message" to stderr and
// returns 2. nullopt = parsed: go on.
std::optional<int> ParseCommandLine(std::string_view program, std::string_view usage,
                                    const std::vector<std::string>& raw_args, flags::FlagSet& flags,
                                    const std::function<Status()>& finish);

}  // namespace lede::rpc

#endif  // LEDE_SHARED_RPC_SERVER_FLAGS_H_
