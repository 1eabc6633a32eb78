// File: services/coordinator/coordinator.h
//
// The coordinator (docs/design.md §3): the public lede.v1.Generation API. It
// validates a request, tokenizes it, opens a session on the verifier (a KV
// slot), runs the speculation loop of shared/speculation/generation.h over
// gRPC (Drafter.Draft then Verifier.Verify per round; the drafter runs the
// exit policy in-process), streams text deltas, rewards each round's exit
// decisions (shared/experience/transition.h) and logs them to the object store
// (shared/experience/experience_logger.h), and counts everything in Prometheus
// metrics (docs/design.md §6). It holds no tensors and never links libtorch.
// The OpenAI-compatible HTTP API (openai_server.h) runs its requests through
// GenerateInProcess(): the same validation and loop.
//
// Errors end the stream with a gRPC status: UNAUTHENTICATED without a
// configured API key; INVALID_ARGUMENT naming the field (a prompt, token-id
// list or stop strings too large for the context window are rejected
// before tokenization: request_validation.h ValidateRequestSize);
// RESOURCE_EXHAUSTED when every KV slot is busy and the verifier's queue of
// waiting sessions is full (a request that finds the slots busy waits in
// that queue, up to max_queue_wait, then gets RESOURCE_EXHAUSTED too);
// DEADLINE_EXCEEDED when a prefill outlasts prefill_timeout; UNAVAILABLE when the
// drafter or verifier is down or restarted mid-request (or, with
// autoregressive_fallback, a drafter outage degrades to full-depth steps);
// CANCELLED / DEADLINE_EXCEEDED from the client. The KV slot is closed on
// every path. Thread-safety: requests run concurrently, one worker thread
// each; per-request state is local.
#ifndef LEDE_SERVICES_COORDINATOR_COORDINATOR_H_
#define LEDE_SERVICES_COORDINATOR_COORDINATOR_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "proto/lede/v1/generation.grpc.pb.h"
#include "shared/speculation/method_proto.h"  // speculation::SpeculationMethodName(), ParseSpeculationMethodName()
#include "shared/rpc/security.h"
#include "services/coordinator/replica_set.h"
#include "shared/status/status.h"

namespace prometheus {
class Registry;
}

namespace lede::coordinator {

struct CoordinatorOptions {
  std::string verifier_target = "127.0.0.1:50052";  // lede.v1.Verifier
  // lede.v1.Drafter. The same address as the verifier means co-located: each
  // round is then one Drafter.DraftAndVerify call instead of Draft + Verify.
  std::string drafter_target = "127.0.0.1:50054";
  // Several model replicas (replica_set.h): a static list and/or a DNS name
  // whose addresses are replicas (verifier on replica_verifier_port, drafter
  // on replica_drafter_port, 0 = co-located), re-resolved every
  // replica_refresh_interval. Both empty = the one replica above.
  std::vector<ReplicaTarget> replicas;
  std::string replica_dns;
  int replica_verifier_port = 50052;
  int replica_drafter_port = 50054;
  absl::Duration replica_refresh_interval = absl::Seconds(10);
  std::string tokenizer_path;      // tokenizer.model / tokenizer.bin of the served model (required)
  int64_t max_new_tokens_limit = 1024;  // requests above are INVALID_ARGUMENT
  // Deadline of each call to a model process when the client set none.
  absl::Duration rpc_timeout = absl::Seconds(30);
  // How long a request may wait in the verifier's queue for a free KV slot
  // (RESOURCE_EXHAUSTED after it: the verifier enforces it,
  // OpenSessionRequest.max_queue_wait_ms).
  absl::Duration max_queue_wait = absl::Seconds(300);
  // How long the prefill of an admitted prompt may take when the client set
  // no earlier deadline: it runs beside the other sessions' steps, so eight
  // 2,000-token prompts on a 1B model at 2 threads take minutes each.
  absl::Duration prefill_timeout = absl::Seconds(1800);
  // Requests in flight (running and queued, the load the exit policy sees)
  // above which a speculative request's rounds run as autoregressive steps
  // (LoopOptions::speculation_max_load; vLLM's
  // --speculative-disable-by-batch-size). 0 = no limit; < 0 is refused.
  int32_t speculation_max_load = 0;
  // Serve full-depth steps through the verifier when the drafter is down
  // (instead of failing the request with UNAVAILABLE).
  bool autoregressive_fallback = false;
  // Experience: an object store URL (file:///dir, a directory, or
  // s3://bucket/prefix?endpoint=...); "" logs nothing.
  std::string experience_url;
  std::string experience_prefix = "experience";
  absl::Duration experience_shard_age = absl::Seconds(30);  // publish a shard at least this often
  int64_t experience_queue_records = 1 << 16;
  // Retention of the shards under experience_prefix (shared/experience/
  // retention.h); both 0 = keep everything (the default; docs/serving.md
  // "Experience and retention").
  int64_t experience_max_bytes = 0;                          // bytes
  absl::Duration experience_max_age = absl::ZeroDuration();  // age of a shard
  // The request log (shared/experience/request_log.h): each
  // finished greedy request's prompt and output token ids, method, policy
  // version, load and timings, in the experience store under
  // request_log_prefix, with the experience retention. On whenever
  // experience_url is set; it holds users' token ids (docs/serving.md).
  bool request_log = true;
  std::string request_log_prefix = "requests";
  // Rewards of logged transitions: "throughput" (tokens minus cost under the
  // verifier's cost model) or "paper" (docs/design.md §2).
  std::string reward = "throughput";
  // API keys of the public gRPC API (docs/security.md): a call must carry
  // `authorization: Bearer <key>` metadata with one of them, else it ends
  // UNAUTHENTICATED before its request is parsed. Empty = no authentication.
  // Compared in constant time (shared/rpc/security.h); never logged.
  std::vector<std::string> api_keys;
  // TLS of the channels to the verifier and the drafter (PEM files; all
  // empty = plaintext; --model-tls-*): the CA their certificates chain to,
  // this coordinator's client certificate and key for model services that
  // verify clients (--tls-client-ca there), and the certificates' DNS name
  // when it differs from the target's host.
  rpc::ChannelTlsOptions model_tls;
  // The deployment's internal token (security.h InternalToken), sent on
  // every call to the model services; empty = none. --internal-token-file.
  rpc::InternalToken internal_token;
  // Session ownership on the verifier (session_lease.h): a stable name of
  // this coordinator across restarts ("" = none; a restart's predecessor is
  // then freed when its lease lapses), the lease TTL and renewal period.
  std::string instance_name;
  absl::Duration lease_ttl = absl::Seconds(5);
  absl::Duration lease_renew_interval = absl::Seconds(1);
};

// Implements lede.v1.Generation. Create() checks the options and opens the
// experience store; the model processes are contacted lazily, so the
// coordinator may start first.
class GenerationService final
    : public lede::v1::Generation::WithRawCallbackMethod_Generate<lede::v1::Generation::Service> {
 public:
  // Errors: kInvalidArgument naming the option (tokenizer_path, reward,
  // experience_url, max_new_tokens_limit, api_keys, model_tls); kNotFound
  // for a missing tokenizer or TLS file.
  static StatusOr<std::unique_ptr<GenerationService>> Create(const CoordinatorOptions& options,
                                                             prometheus::Registry* registry);
  ~GenerationService() override;

  // The callback API with the raw request (GenerateRequestText first, so
  // that invalid UTF-8 is INVALID_ARGUMENT naming the field); the
  // generation runs on a worker thread, never on the reactor, and streams
  // through the reactor with at most a few responses buffered.
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* context,
                                                        const grpc::ByteBuffer* request) override;

  // Runs one request on the calling thread through the same validation,
  // speculation loop, metrics and experience logging as Generate() (one
  // validation, two front ends: the OpenAI HTTP API calls this).
  // `on_response` receives the TokenDelta responses as they are accepted and
  // then exactly one GenerationSummary; returning false means the client is
  // gone: the loop stops after the current round, the KV slot is closed and
  // the result is kCancelled. With `fill_max_tokens`, max_new_tokens == 0
  // means "up to the context window" (capped at max_new_tokens_limit).
  // Errors: those of Generate() (kInvalidArgument naming the GenerateRequest
  // field, e.g. "max_new_tokens: ...", "speculation.exit_layer: ...";
  // kResourceExhausted; kUnavailable), all before the first response unless
  // a model process fails mid-request. Thread-safe; blocks for the request.
  Status GenerateInProcess(const lede::v1::GenerateRequest& request,
                           const std::function<bool(const lede::v1::GenerateResponse&)>& on_response,
                           bool fill_max_tokens = false);

  // OK when the verifier and the drafter accept connections within
  // `timeout`; kUnavailable naming the one that does not.
  Status CheckModelServices(absl::Duration timeout);

  // The most text bytes one token of the served tokenizer covers
  // (Tokenizer::MaxTokenBytes(), computed once at Create()): with the
  // context window it sizes the request limits (request_validation.h).
  int64_t max_token_bytes() const;
  // Graceful stop: from now on new requests (both
  // front ends) are UNAVAILABLE, and the call blocks until the requests in
  // flight finish or `grace` passes. Returns true when none is left. Call
  // before stopping the servers; the model services must stay up meanwhile.
  // Thread-safe.
  bool Drain(absl::Duration grace);
  // Whether Drain() was called (readiness reports not ready then).
  bool draining() const;
  // Readiness of the coordinator (/readyz, gRPC health ""): kUnavailable
  // while draining, else CheckModelServices(timeout). Thread-safe.
  Status Readiness(absl::Duration timeout);

  // Writes buffered experience (at shutdown). Returns the logger's status.
  Status FlushExperience();

 private:
  GenerationService();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lede::coordinator

#endif  // LEDE_SERVICES_COORDINATOR_COORDINATOR_H_
