#include "shared/rpc/server_flags.h"

#include <iostream>

#include "shared/flags/flags.h"

namespace lede::rpc {

void AddServerFlags(flags::FlagSet* flags, ServerFlags* values, const ServerFlagHelp& help) {
  flags->Add("listen", &values->listen, help.listen);
  flags->Add("metrics", &values->metrics, help.metrics);
  flags->Add("shutdown-grace-s", &values->shutdown_grace_s, help.shutdown_grace);
  AddServerTlsFlags(flags, &values->tls, help.tls_served);
  AddInternalTokenFlag(flags, &values->internal_token_file, help.internal_token);
}

void ApplyServerFlags(const ServerFlags& values, ServerOptions* options) {
  options->listen_address = values.listen;
  options->metrics_address = values.metrics;
  options->shutdown_grace = absl::Seconds(values.shutdown_grace_s);
  options->tls = values.tls;
}

std::optional<int> ParseCommandLine(std::string_view program, std::string_view usage,
                                    const std::vector<std::string>& raw_args, flags::FlagSet& flags,
                                    const std::function<Status()>& finish) {
  if (flags::WantsHelp(raw_args)) {
    std::cout << "usage: " << usage << "\n" << flags.Usage();
    return 0;
  }
  auto args = flags::ExpandConfigFile(raw_args);
  Status parsed = args.ok() ? flags.Parse(*args) : args.status();
  if (parsed.ok() && finish) parsed = finish();
  if (!parsed.ok()) {
    std::cerr << program << ": " << parsed.message() << "\n";
    return 2;
  }
  return std::nullopt;
}

}  // namespace lede::rpc
