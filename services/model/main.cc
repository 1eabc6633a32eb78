// lede-model: the model service process (services/model/model_service.h).
//   --role verifier   creates the KV pool (--kv-pool NAME) and serves Verifier
//   --role drafter    maps that pool and serves Drafter
//   --role both       co-located: one process, a private pool, both services
#include <algorithm>
#include <chrono>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "services/model/model_flags.h"
#include "services/model/model_service.h"
#include "shared/flags/flags.h"
#include "shared/log/log.h"
#include "shared/model/loaders/load_or_exit.h"
#include "shared/rpc/security.h"
#include "shared/rpc/server.h"
#include "shared/rpc/server_flags.h"
#include "shared/telemetry/metrics.h"

namespace {

int Run(const std::vector<std::string>& raw_args) {
  lede::model_service::ModelFlags fl;
  lede::flags::FlagSet flags;
  lede::model_service::AddModelFlags(&flags, &fl);
  if (auto exit_code = lede::rpc::ParseCommandLine(
          "lede-model", "lede-model --model DIR [--role verifier|drafter|both] [--config FILE] [flags]", raw_args,
          flags, [&] { return lede::model_service::FinishModelFlags(&fl); })) {
    return *exit_code;
  }
  const lede::model_service::ModelServiceOptions& o = fl.options;
  const std::string& role = fl.role;
  const bool drafter_only = fl.drafter_only();

  lede::rpc::BlockTerminationSignals();
  lede::log::SetLogProcessName(role == "both" ? "model" : role);
  lede::telemetry::Registry registry;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(fl.attach_timeout_s);
  auto host = lede::model_service::LoadModelHost(o, !drafter_only, &registry);
  while (drafter_only && !host.ok() && host.status().code() == lede::StatusCode::kNotFound &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the verifier has not made the pool yet
    host = lede::model_service::LoadModelHost(o, false, &registry);
  }
  if (!host.ok()) {
    // Whatever stops the start (a bad model file, a KV budget too small for
    // --slots x --capacity, a bad --weights) is one line and exit status 2.
    lede::log::LogEvent("error", "load_failed", {{"error", lede::model::loaders::OneLineMessage(host.status())}});
    return lede::model::loaders::kExitLoadFailure;
  }
  lede::model_service::VerifierService verifier(*host);
  lede::model_service::DrafterService drafter(*host, role == "both" ? &verifier : nullptr);
  lede::rpc::ServerRunner runner(role == "both" ? "model" : role);
  if (role != "drafter") runner.AddService(&verifier);
  if (role != "verifier") runner.AddService(&drafter);
  lede::rpc::ServerOptions so;
  lede::rpc::ApplyServerFlags(fl.server, &so);
  so.reflection = o.internal_token.empty() && fl.server.tls.client_ca_path.empty();
  // One handler thread per session's call (a verification blocks while its
  // batch forms), plus a few for leases, Describe and CloseSession.
  so.max_handler_threads = static_cast<int>(std::min<int64_t>(o.n_slots + 4, 1024));
  // Ready = the pool is there (drafter: the verifier's current pool) and,
  // following a policy service, a policy is held.
  so.readiness = [host = *host] { return lede::model_service::Readiness(*host); };
  return runner.Serve(so, &registry).ok() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) { return Run(std::vector<std::string>(argv + 1, argv + argc)); }
