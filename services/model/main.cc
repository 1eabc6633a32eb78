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
#include "services/model/model_service.h"
#include "shared/flags/flags.h"
#include "shared/rpc/security.h"
#include "shared/rpc/server.h"
#include "shared/telemetry/metrics.h"

namespace {

int Run(const std::vector<std::string>& raw_args) {
  using lede::model_service::ModelServiceOptions;
  ModelServiceOptions o;
  std::string role = "both", listen, metrics;
  int64_t n_slots = o.n_slots, capacity = o.capacity, max_draft_len = o.max_draft_len, threads = o.threads;
  double attach_timeout_s = 60, idle_timeout_s = absl::ToDoubleSeconds(o.session_idle_timeout), grace_s = 10;
  lede::flags::FlagSet flags;
  flags.Add("role", &role, "verifier | drafter | both (co-located)");
  flags.Add("model", &o.model_path, "model directory (Hugging Face layout) or llama2.c .bin", true);
  flags.Add("kv-pool", &o.kv_pool_name, "shared-memory name of the KV pool (split deployments), e.g. /lede-kv");
  flags.Add("slots", &n_slots, "KV slots (concurrent sessions)");
  flags.Add("max-waiting", &o.max_waiting,
            "verifier: sessions that may wait for a free KV slot before OpenSession is refused (0 = no queue)");
  flags.Add("max-batch", &o.max_batch,
            "sessions per batched step (continuous batching: the verifier's rounds and steps, the drafter's "
            "draft steps); 1 = one sequence per pass on each handler thread");
  flags.Add("prefill-chunk", &o.prefill_chunk, "verifier: prompt positions per batched prefill step");
  int64_t batch_threads = o.batch_threads;
  flags.Add("batch-threads", &batch_threads, "intra-op threads of a batched step (verifier and drafter)");
  int64_t batch_workers = o.batch_workers;
  flags.Add("batch-workers", &batch_workers,
            "batched steps that may run at once, per service (each on a handler thread)");
  int64_t batch_wait_us = absl::ToInt64Microseconds(o.batch_wait);
  flags.Add("batch-wait-us", &batch_wait_us,
            "verifier: longest a batched step waits for open sessions still between rounds (0 = never waits)");
  flags.Add("capacity", &capacity, "tokens per KV slot (0 = the model's context window)");
  flags.Add("max-draft-len", &max_draft_len, "largest draft length the pool's scratch holds");
  flags.Add("calibration", &o.calibration_path, "cost-model calibration JSON (lede calibrate); default: accelerator model");
  flags.Add("policy", &o.policy_target, "drafter: policy service address to follow (host:port)");
  flags.Add("policy-dir", &o.policy_dir, "drafter: policy root or version directory (when no --policy)");
  flags.Add("remote-decisions", &o.remote_decisions, "drafter: one Policy.Decide call per decision (evaluation)");
  flags.Add("listen", &listen, "gRPC address (default 127.0.0.1:50052 verifier/both, :50054 drafter)");
  flags.Add("metrics", &metrics, "HTTP address of /metrics (default 127.0.0.1:9402 / :9404)");
  flags.Add("threads", &threads, "libtorch intra-op threads");
  flags.Add("device", &o.device, "cpu, cuda or cuda:N (a CUDA build of libtorch; no --kv-pool there yet)");
  flags.Add("dtype", &o.dtype, "compute dtype: float32, bfloat16 or float16");
  flags.Add("kernels", &o.kernels, "decode-path kernels: fused (CPU float32) or eager (libtorch reference)");
  flags.Add("graphs", &o.graphs, "decode steps as captured CUDA graphs: auto (on for CUDA), on or off");
  flags.Add("weights", &o.weights, "matrix storage of the fused CPU path: auto (the checkpoint's), f32, bf16 or q8_0");
  flags.Add("attach-timeout-s", &attach_timeout_s, "drafter: how long to wait for the verifier's pool");
  flags.Add("session-idle-timeout-s", &idle_timeout_s, "reclaim sessions idle this long when the pool is full");
  flags.Add("shutdown-grace-s", &grace_s, "how long in-flight calls may finish after SIGTERM");
  lede::rpc::ServerTlsOptions tls;
  lede::rpc::AddServerTlsFlags(&flags, &tls);
  lede::rpc::AddChannelTlsFlags(&flags, "policy-tls", "the policy service", &o.policy_tls);
  std::string token_file;
  lede::rpc::AddInternalTokenFlag(&flags, &token_file,
                                  "required on every call to this process, sent on its calls to the policy service");
  if (lede::flags::WantsHelp(raw_args)) {
    std::cout << "usage: lede-model --model DIR [--role verifier|drafter|both] [--config FILE] [flags]\n"
              << flags.Usage();
    return 0;
  }
  auto args = lede::flags::ExpandConfigFile(raw_args);
  lede::Status parsed = args.ok() ? flags.Parse(*args) : args.status();
  if (parsed.ok() && role != "verifier" && role != "drafter" && role != "both") {
    parsed = lede::InvalidArgumentError("--role: must be verifier, drafter or both, got '" + role + "'");
  }
  if (parsed.ok() && o.max_waiting < 0) {
    parsed = lede::InvalidArgumentError("--max-waiting: must be >= 0, got " + std::to_string(o.max_waiting));
  }
  if (parsed.ok() && o.max_batch < 1) {
    parsed = lede::InvalidArgumentError("--max-batch: must be >= 1, got " + std::to_string(o.max_batch));
  }
  if (parsed.ok() && o.prefill_chunk < 1) {
    parsed = lede::InvalidArgumentError("--prefill-chunk: must be >= 1, got " + std::to_string(o.prefill_chunk));
  }
  if (parsed.ok() && (batch_threads < 1 || batch_threads > 256)) {
    parsed = lede::InvalidArgumentError("--batch-threads: must be in [1, 256], got " + std::to_string(batch_threads));
  }
  if (parsed.ok() && (batch_workers < 1 || batch_workers > 64)) {
    parsed = lede::InvalidArgumentError("--batch-workers: must be in [1, 64], got " + std::to_string(batch_workers));
  }
  if (parsed.ok() && (batch_wait_us < 0 || batch_wait_us > 1000000)) {
    parsed = lede::InvalidArgumentError("--batch-wait-us: must be in [0, 1000000], got " +
                                        std::to_string(batch_wait_us));
  }
  if (parsed.ok()) {
    auto token = lede::rpc::InternalToken::LoadIfSet(token_file);
    if (token.ok()) o.internal_token = *std::move(token);
    parsed = token.status();
  }
  if (!parsed.ok()) {
    std::cerr << "lede-model: " << parsed.message() << "\n";
    return 2;
  }
  o.n_slots = n_slots;
  o.capacity = capacity;
  o.max_draft_len = max_draft_len;
  o.threads = static_cast<int>(threads);
  o.batch_threads = static_cast<int>(batch_threads);
  o.batch_workers = static_cast<int>(batch_workers);
  o.batch_wait = absl::Microseconds(batch_wait_us);
  o.session_idle_timeout = absl::Seconds(idle_timeout_s);
  const bool drafter_only = role == "drafter";
  if (listen.empty()) listen = drafter_only ? "127.0.0.1:50054" : "127.0.0.1:50052";
  if (metrics.empty()) metrics = drafter_only ? "127.0.0.1:9404" : "127.0.0.1:9402";

  lede::rpc::BlockTerminationSignals();
  lede::rpc::SetLogProcessName(role == "both" ? "model" : role);
  lede::telemetry::Registry registry;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(attach_timeout_s);
  auto host = lede::model_service::LoadModelHost(o, !drafter_only, &registry);
  while (drafter_only && !host.ok() && host.status().code() == lede::StatusCode::kNotFound &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the verifier has not made the pool yet
    host = lede::model_service::LoadModelHost(o, false, &registry);
  }
  if (!host.ok()) {
    lede::rpc::LogEvent("error", "load_failed", {{"error", host.status().ToString()}});
    return 1;
  }
  lede::model_service::VerifierService verifier(*host);
  lede::model_service::DrafterService drafter(*host, role == "both" ? &verifier : nullptr);
  lede::rpc::ServerRunner runner(role == "both" ? "model" : role);
  if (role != "drafter") runner.AddService(&verifier);
  if (role != "verifier") runner.AddService(&drafter);
  lede::rpc::ServerOptions so;
  so.listen_address = listen;
  so.metrics_address = metrics;
  so.shutdown_grace = absl::Seconds(grace_s);
  so.tls = tls;
  so.reflection = o.internal_token.empty() && tls.client_ca_path.empty();
  // One handler thread per session's call (a verification blocks while its
  // batch forms), plus a few for leases, Describe and CloseSession.
  so.max_handler_threads = static_cast<int>(std::min<int64_t>(n_slots + 4, 1024));
  // Ready = the pool is there (drafter: the verifier's current pool) and,
  // following a policy service, a policy is held.
  so.readiness = [host = *host] { return lede::model_service::Readiness(*host); };
  return runner.Serve(so, &registry).ok() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) { return Run(std::vector<std::string>(argv + 1, argv + argc)); }
