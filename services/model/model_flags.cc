#include "services/model/model_flags.h"

#include <algorithm>
#include <string>
#include <utility>

#include "shared/flags/flags.h"
#include "shared/flags/model_flags.h"
#include "shared/rpc/security.h"

namespace lede::model_service {

void AddModelFlags(flags::FlagSet* flags, ModelFlags* v) {
  ModelServiceOptions& o = v->options;
  flags->Add("role", &v->role, "verifier | drafter | both (co-located)");
  flags::AddModelLoadFlags(flags, &v->load, flags::kModelPath);
  flags->Add("kv-pool", &o.kv_pool_name, "shared-memory name of the KV pool (split deployments), e.g. /lede-kv");
  flags->Add("slots", &v->n_slots,
             "KV slots (concurrent sessions); they share the pool's blocks, so more slots cost no KV memory");
  flags->Add("max-waiting", &o.max_waiting,
             "verifier: sessions that may wait for a free KV slot or KV blocks before OpenSession is refused "
             "(0 = no queue)");
  flags->Add("max-batch", &o.max_batch,
             "sessions per batched step (continuous batching: the verifier's rounds and steps, the drafter's "
             "draft steps); 1 = one sequence per pass on each handler thread");
  flags->Add("prefill-chunk", &o.prefill_chunk, "verifier: prompt positions per batched prefill step");
  flags->Add("batch-threads", &v->batch_threads,
             "intra-op threads of a batched step, verifier and drafter (0 = --threads / --batch-workers, at least 1)");
  flags->Add("batch-workers", &v->batch_workers,
             "batched steps that may run at once, per service (each on a handler thread)");
  flags->Add("batch-wait-us", &v->batch_wait_us,
             "verifier: longest a batched step waits for open sessions still between rounds (0 = never waits)");
  flags->Add("batch-wait-fraction", &o.batch_wait_fraction,
             "verifier: a batched step may also wait this fraction of the recent steps' run time for those "
             "sessions, when longer than --batch-wait-us (0 = --batch-wait-us alone)");
  flags->Add("batch-split-rows", &o.batch_split_rows,
             "verifier and drafter: with --batch-workers > 1, split the sessions into concurrent batches only as "
             "far as each gets this many rows (0 = always split)");
  flags->Add("max-batch-tokens", &o.max_batch_tokens,
             "verifier: rows (tokens) per batched step; a batch takes its first job whatever its size (0 = no limit)");
  flags->Add("capacity", &v->capacity,
             "tokens one sequence may hold: the longest request (prompt + new tokens); 0 = the whole KV pool, at "
             "most the model's context window");
  flags->Add("kv-dtype", &o.kv_dtype,
             "verifier: dtype of the KV pool's K and V: bfloat16 (half of float32's memory), float32, or auto (the "
             "compute dtype)");
  flags->Add("kv-memory", &o.kv_memory,
             "verifier: memory budget of the KV pool, e.g. 4GiB, 512MiB or 25% (of MemAvailable at start); the "
             "pool (and its shared-memory segment) never exceeds it");
  flags->Add("max-draft-len", &v->max_draft_len, "largest draft length the pool's scratch holds");
  flags->Add("calibration", &o.calibration_path,
             "cost-model calibration JSON (lede calibrate); default: accelerator model");
  flags->Add("policy", &o.policy_target, "drafter: policy service address to follow (host:port)");
  flags->Add("policy-dir", &o.policy_dir, "drafter: policy root or version directory (when no --policy)");
  flags->Add("remote-decisions", &o.remote_decisions, "drafter: one Policy.Decide call per decision (evaluation)");
  flags::AddModelLoadFlags(flags, &v->load, flags::kAllModelLoadFlags & ~flags::kModelPath);
  flags->Add("attach-timeout-s", &v->attach_timeout_s, "drafter: how long to wait for the verifier's pool");
  flags->Add("session-idle-timeout-s", &v->idle_timeout_s, "reclaim sessions idle this long when the pool is full");
  rpc::ServerFlagHelp help;
  help.listen = "gRPC address (default 127.0.0.1:50052 verifier/both, :50054 drafter)";
  help.metrics = "HTTP address of /metrics (default 127.0.0.1:9402 / :9404)";
  help.shutdown_grace = "how long in-flight calls may finish after SIGTERM";
  help.internal_token = "required on every call to this process, sent on its calls to the policy service";
  rpc::AddServerFlags(flags, &v->server, help);
  rpc::AddChannelTlsFlags(flags, "policy-tls", "the policy service", &o.policy_tls);
}

namespace {

Status CheckRange(const char* flag, int64_t value, int64_t lo, int64_t hi) {
  if (value >= lo && value <= hi) return OkStatus();
  return InvalidArgumentError(std::string("--") + flag + ": must be in [" + std::to_string(lo) + ", " +
                              std::to_string(hi) + "], got " + std::to_string(value));
}

Status CheckAtLeast(const char* flag, int64_t value, int64_t lo) {
  if (value >= lo) return OkStatus();
  return InvalidArgumentError(std::string("--") + flag + ": must be >= " + std::to_string(lo) + ", got " +
                              std::to_string(value));
}

}  // namespace

Status FinishModelFlags(ModelFlags* v) {
  ModelServiceOptions& o = v->options;
  if (v->role != "verifier" && v->role != "drafter" && v->role != "both") {
    return InvalidArgumentError("--role: must be verifier, drafter or both, got '" + v->role + "'");
  }
  if (Status s = CheckAtLeast("max-waiting", o.max_waiting, 0); !s.ok()) return s;
  if (Status s = CheckAtLeast("max-batch", o.max_batch, 1); !s.ok()) return s;
  if (Status s = CheckAtLeast("prefill-chunk", o.prefill_chunk, 1); !s.ok()) return s;
  if (Status s = CheckRange("batch-threads", v->batch_threads, 0, 256); !s.ok()) return s;
  if (Status s = CheckRange("batch-workers", v->batch_workers, 1, 64); !s.ok()) return s;
  if (Status s = CheckRange("batch-wait-us", v->batch_wait_us, 0, 1000000); !s.ok()) return s;
  if (Status s = CheckRange("batch-split-rows", o.batch_split_rows, 0, 1000000); !s.ok()) return s;
  if (Status s = CheckRange("max-batch-tokens", o.max_batch_tokens, 0, 1000000); !s.ok()) return s;
  if (!(o.batch_wait_fraction >= 0 && o.batch_wait_fraction <= 10)) {
    return InvalidArgumentError("--batch-wait-fraction: must be in [0, 10], got " +
                                std::to_string(o.batch_wait_fraction));
  }
  StatusOr<rpc::InternalToken> token = rpc::InternalToken::LoadIfSet(v->server.internal_token_file);
  if (!token.ok()) return token.status();
  o.internal_token = *std::move(token);
  o.n_slots = v->n_slots;
  o.capacity = v->capacity;
  o.max_draft_len = v->max_draft_len;
  StatusOr<int> threads = flags::ResolveThreads(v->load.threads, "threads");
  if (!threads.ok()) return threads.status();
  o.model_path = v->load.model;
  o.device = v->load.device;
  o.dtype = v->load.dtype;
  o.kernels = v->load.kernels;
  o.graphs = v->load.graphs;
  o.weights = v->load.weights;
  o.threads = *threads;
  o.batch_workers = static_cast<int>(v->batch_workers);
  // Batched steps split the threads among the batches that may run at once.
  o.batch_threads = v->batch_threads > 0 ? static_cast<int>(v->batch_threads)
                                         : std::max(1, o.threads / o.batch_workers);
  if (o.kv_memory.empty()) {
    return InvalidArgumentError("--kv-memory: must not be empty (e.g. 4GiB or 25%)");
  }
  o.batch_wait = absl::Microseconds(v->batch_wait_us);
  o.session_idle_timeout = absl::Seconds(v->idle_timeout_s);
  if (v->server.listen.empty()) v->server.listen = v->drafter_only() ? "127.0.0.1:50054" : "127.0.0.1:50052";
  if (v->server.metrics.empty()) v->server.metrics = v->drafter_only() ? "127.0.0.1:9404" : "127.0.0.1:9402";
  return OkStatus();
}

}  // namespace lede::model_service
