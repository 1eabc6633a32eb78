// File: services/coordinator/coordinator_flags.h
//
// The flags of lede-coordinator, declared once beside CoordinatorOptions and
// OpenAiServerOptions: AddCoordinatorFlags registers them,
// FinishCoordinatorFlags checks them and fills the options, so main.cc is
// wiring only.
#ifndef LEDE_SERVICES_COORDINATOR_COORDINATOR_FLAGS_H_
#define LEDE_SERVICES_COORDINATOR_COORDINATOR_FLAGS_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "services/coordinator/coordinator.h"
#include "services/coordinator/openai_server.h"
#include "shared/rpc/server_flags.h"
#include "shared/status/status.h"

namespace lede::flags {
class FlagSet;
}

namespace lede::coordinator {

struct CoordinatorFlags {
  CoordinatorFlags();

  std::string model;            // --model: the served model directory
  CoordinatorOptions options;   // filled by FinishCoordinatorFlags
  rpc::ServerFlags server;      // --listen, --metrics, grace, TLS, token
  OpenAiServerOptions http;     // --http...; listen_address "" = no HTTP API
  // Sizes of the request limits (0 = derived from the context window;
  // FinishCoordinatorFlags reads the model's when --max-context-tokens is 0).
  int64_t context_tokens = 0, max_request_bytes = 0, max_body_bytes = 0;

  // Flag values converted by FinishCoordinatorFlags.
  std::string replicas;
  double replica_refresh_s;
  int64_t replica_verifier_port, replica_drafter_port;
  int64_t max_new_tokens_limit;
  double rpc_timeout_s, queue_wait_s, prefill_timeout_s, shard_age_s, max_age_h = 0, lease_ttl_s;
  int64_t speculation_max_load;
  std::string instance_name = "auto";
  std::string api_key_file;
  int64_t http_threads, http_max_connections, http_max_per_client, http_listen_backlog;
  double http_deadline_s, http_idle_worker_s;
};

// Registers every lede-coordinator flag on `flags`, bound to `values`.
void AddCoordinatorFlags(flags::FlagSet* flags, CoordinatorFlags* values);

// After parsing: checks the values (kInvalidArgument naming the flag), loads
// the internal token and the API keys (--api-key-file and $LEDE_API_KEYS),
// finds the tokenizer beside --model and its context window, and fills
// `values->options` and `values->http` (model id: the --model directory's
// name). Errors: one line, as lede-coordinator prints it after its name.
Status FinishCoordinatorFlags(CoordinatorFlags* values);

}  // namespace lede::coordinator

#endif  // LEDE_SERVICES_COORDINATOR_COORDINATOR_FLAGS_H_
