// lede-policy: the policy service process (services/policy/policy_server.h).
#include <iostream>
#include <string>
#include <vector>

#include "services/policy/policy_server.h"
#include "shared/flags/flags.h"
#include "shared/rpc/server.h"

int main(int argc, char** argv) {
  namespace ps = lede::policy_service;
  lede::rpc::BlockTerminationSignals();  // before any thread starts
  std::vector<std::string> args(argv + 1, argv + argc);
  if (lede::flags::WantsHelp(args)) {
    std::cout << ps::PolicyServerUsage();
    return ps::kExitOk;
  }
  lede::StatusOr<ps::PolicyServerOptions> options = ps::ParsePolicyServerFlags(args);
  if (!options.ok()) {
    std::cerr << "lede-policy: " << options.status().message() << " (see lede-policy --help)\n";
    return ps::kExitUsage;
  }
  return ps::RunPolicyServer(*options);
}
