// File: services/model/model_flags.h
//
// The flags of a model process (lede-model), declared once beside
// ModelServiceOptions: AddModelFlags registers them, FinishModelFlags checks
// them and fills the options. Torch-free.
#ifndef LEDE_SERVICES_MODEL_MODEL_FLAGS_H_
#define LEDE_SERVICES_MODEL_MODEL_FLAGS_H_

#include <cstdint>
#include <string>

#include "services/model/model_service.h"
#include "shared/flags/model_flags.h"
#include "shared/rpc/server_flags.h"
#include "shared/status/status.h"

namespace lede::flags {
class FlagSet;
}

namespace lede::model_service {

struct ModelFlags {
  std::string role = "both";     // --role verifier | drafter | both
  // --model, --device, --dtype, --threads, --kernels, --graphs, --weights:
  // the model-loading group (shared/flags/model_flags.h); --threads 0 (the
  // default) = every CPU this process may use.
  flags::ModelLoadFlags load;
  ModelServiceOptions options;   // filled by FinishModelFlags
  rpc::ServerFlags server;       // --listen, --metrics, TLS, token, grace
  double attach_timeout_s = 60;  // drafter: wait for the verifier's pool
  // Flag values converted by FinishModelFlags.
  int64_t n_slots = options.n_slots, capacity = options.capacity, max_draft_len = options.max_draft_len;
  int64_t batch_threads = 0;  // 0 = --threads / --batch-workers (at least 1)
  int64_t batch_workers = options.batch_workers;
  int64_t batch_wait_us = absl::ToInt64Microseconds(options.batch_wait);
  double idle_timeout_s = absl::ToDoubleSeconds(options.session_idle_timeout);

  bool drafter_only() const { return role == "drafter"; }
};

// Registers every lede-model flag on `flags`, bound to `values`.
void AddModelFlags(flags::FlagSet* flags, ModelFlags* values);

// After parsing: checks the values (kInvalidArgument naming the flag), loads
// --internal-token-file, fills `values->options` and the role's default
// addresses (127.0.0.1:50052 and :9402; a drafter :50054 and :9404).
Status FinishModelFlags(ModelFlags* values);

}  // namespace lede::model_service

#endif  // LEDE_SERVICES_MODEL_MODEL_FLAGS_H_
