// File: services/model/model_service.h
//
// The model service (docs/design.md §3-§4): gRPC handlers of lede.v1.Verifier
// (all blocks: prefill, verification, autoregressive steps; owns the KV
// pool and its sessions) and lede.v1.Drafter (shallow blocks + exit head +
// the exit controller in-process), over one shared model::KvCache.
//
// Deployments:
//   split:       a verifier process creates the pool in a named shared-memory
//                segment, a drafter process Attach()es it (--role verifier /
//                --role drafter with the same --kv-pool name);
//   co-located:  one process serves both on a private pool (--role both).
// Both run the same handlers; the coordinator cannot tell them apart.
//
// Sessions are KV slots; a request names its slot and the pool epoch. The
// coordinator serializes the rounds of one session (docs/design.md §4), so slots
// need no locks; slot allocation is under a mutex. Handlers run on gRPC's
// sync thread pool. With --max-batch 1 they compute with libtorch on that
// thread; above 1 the verifier's handlers (and DraftAndVerify's verification
// in the co-located mode) submit their work to the batch scheduler
// (batch_scheduler.h): up to --batch-workers batches run at once, each on
// one of the waiting handler threads, over every session ready then, while
// drafting stays on the handler threads, so the drafting of some sessions
// overlaps the batched verification of others.
// Implemented in model_host.cc (LoadModelHost, Readiness; model_host.h is
// the internal ModelHost), verifier_service.cc and drafter_service.cc; the
// process's flags are model_flags.h's. Torch-free header.
#ifndef LEDE_SERVICES_MODEL_MODEL_SERVICE_H_
#define LEDE_SERVICES_MODEL_MODEL_SERVICE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "proto/lede/v1/model.grpc.pb.h"
#include "shared/clock/clock.h"
#include "shared/rpc/security.h"
#include "shared/status/status.h"

namespace prometheus {
class Registry;
}

namespace lede::model_service {

struct ModelServiceOptions {
  std::string model_path;        // HF directory or llama2.c .bin
  // KV slots = concurrent sessions. Cheap: they share the pool's blocks
  // (kv_cache.h paged), so the sum of live sequences, not slots x capacity,
  // must fit kv_memory.
  int64_t n_slots = 16;
  // Sessions that may wait for a free slot (FIFO) before OpenSession is
  // refused with RESOURCE_EXHAUSTED (admission_queue.h); 0 = no queue.
  int64_t max_waiting = 256;
  // Tokens one sequence may hold (the longest request: prompt + new
  // tokens); 0 = the whole pool, at most the model's max_seq_len.
  int64_t capacity = 0;
  // Verifier: the KV pool's memory budget (--kv-memory): "4GiB", "512MiB",
  // a byte count, or a percentage of MemAvailable at start ("25%"). The pool
  // (its shared segment, reserved at creation) never exceeds it; a start
  // whose budget cannot hold one sequence of --capacity is refused
  // (PlanKvPool).
  // 25%: the weights, the drafter's and the coordinator's memory and the
  // page cache need the rest.
  std::string kv_memory = "25%";
  // Verifier: the dtype K and V are stored in (--kv-dtype): "bfloat16"
  // (half the memory of float32; the fused kernels read it directly),
  // "float32", or "auto" (the compute dtype). The drafter reads the pool's.
  std::string kv_dtype = "bfloat16";
  int64_t max_draft_len = 16;    // D_max of the pool's scratch
  // POSIX shared-memory name of the KV pool ("" = private memory; needed
  // for a split deployment).
  std::string kv_pool_name;
  // Cost model of the rewards (ModelInfo costs): a calibration JSON
  // (`lede calibrate`) = the measured model, or "" = the accelerator model.
  std::string calibration_path;
  // Drafter: where the LEDE policy comes from. policy_target = a policy
  // service address (followed through WatchPolicy); else policy_dir = a
  // policy root with a SERVING pointer or a version directory.
  std::string policy_target;
  std::string policy_dir;
  // TLS of the channel to policy_target (PEM files; all empty = plaintext;
  // --policy-tls-*): the CA of the policy service's certificate, this
  // drafter's client certificate and key (for a policy service with
  // --tls-client-ca), and the certificate's DNS name when it is not the
  // target's host.
  rpc::ChannelTlsOptions policy_tls;
  // The deployment's internal token (security.h InternalToken; empty = none):
  // required on every call to this process's Verifier/Drafter services and
  // sent on its calls to the policy service. Flag --internal-token-file.
  rpc::InternalToken internal_token;
  // Drafter: ask the policy service once per decision instead of running
  // the DQN in-process (evaluation of remote decisions; slow by design).
  bool remote_decisions = false;
  // A session without an owner instance (an older coordinator that holds
  // no lease) idle this long may be reclaimed when the pool is full (its
  // coordinator died). Owned sessions are freed when the owner's lease
  // lapses or is replaced (session_leases.h).
  absl::Duration session_idle_timeout = absl::Seconds(300);
  // Where the model runs and its compute dtype (model::ParseDevice /
  // ParseDtype): "cpu" or "cuda[:N]"; "float32", "bfloat16", "float16". A
  // shared KV pool (kv_pool_name) needs the CPU for now.
  std::string device = "cpu";
  std::string dtype = "float32";
  // Intra-op threads (libtorch's and the fused kernels') of the decode,
  // verification and prefill steps a handler thread runs alone (--threads;
  // 0 there = every CPU this process may use, resolved by FinishModelFlags).
  int threads = 1;
  // Continuous batching (--max-batch; batch_scheduler.h). Above 1, the
  // verifier's handler threads submit their prefill chunks and round
  // verifications to its batch scheduler, which runs up to max_batch
  // sessions' work per step in one pass over the weights (model::RunBatch),
  // and the drafter's submit every draft step and phase-1 probe to its own
  // (model::RunDrafterBatch; its open sessions are the Draft calls in
  // progress); 1 runs each call on its own handler thread, one sequence per
  // pass (the behaviour before batching). batch_threads, batch_workers and
  // batch_wait apply to both schedulers.
  int64_t max_batch = 16;
  // Prompt positions per prefill step when batching (--prefill-chunk): a
  // long prompt shares the steps with running sessions instead of stalling
  // them for its whole length. >= 1.
  int64_t prefill_chunk = 64;
  // Intra-op threads of a batched step (the fused kernels split its
  // products' columns and its attention rows across them; --batch-threads).
  // >= 1. The flag's default (0) is threads / batch_workers, at least 1, so
  // the concurrent batches share the CPUs without oversubscribing them: 1 on
  // 2 cores with 2 workers, where 16 streams ran slower on 2 threads x 1
  // worker than on 1 x 2 (bench/results/serve-widen5-threads.json;
  // docs/serving.md).
  int batch_threads = 1;
  // Batches that may run at once (--batch-workers), each on a handler
  // thread; 2 lets both cores work on verification, as two handler threads
  // do at --max-batch 1. >= 1.
  int batch_workers = 2;
  // Longest a batched step waits for open sessions still between rounds
  // before it starts without them (--batch-wait-us; BatchScheduler's
  // max_wait). One open session never waits. Zero: start at once.
  absl::Duration batch_wait = absl::Microseconds(500);
  // Verifier: a batched step may also wait up to this fraction of the
  // recent steps' run time for those sessions (--batch-wait-fraction;
  // BatchScheduler's wait_fraction), when that is longer than batch_wait.
  // On a model whose step is bound by reading the weights the sessions
  // share the read, so a full batch is worth part of a step's wait. >= 0.
  double batch_wait_fraction = 0.5;
  // Verifier and drafter: with batch_workers > 1, the open (drafting)
  // sessions are split into concurrent batches only as far as each gets
  // this many rows (--batch-split-rows; BatchScheduler's min_split_rows):
  // fewer rows per step are bound by reading the weights, which one batch
  // reads once for all. From about 8 rows a step of the factor-5 widened model is bound by
  // computing instead, and two 8-row steps on two cores (29-33 ms each, side
  // by side) beat one 16-row step on one (43 ms; lede_batch_bench on a quiet
  // VM, docs/serving.md). 0: always split. >= 0.
  int64_t batch_split_rows = 8;
  // Verifier: rows (tokens) per batched step (--max-batch-tokens;
  // BatchScheduler's max_batch_tokens, vLLM's --max-num-batched-tokens). A
  // step of the factor-5 widened model is bound by computing from a few
  // tens of rows (its packed products run at 147-176 GFLOP/s at 32-64 rows,
  // lede_batch_bench --kernel-rows; docs/serving.md), so a budget of one
  // prefill chunk costs no throughput and spreads prompts that arrive
  // together over both batch workers. 0: no limit. >= 0.
  int64_t max_batch_tokens = 64;
  // Decode-path kernels: "fused" (cpu_kernels, CPU float32) or "eager"
  // (libtorch reference); LoadModelHost refuses anything else with
  // kInvalidArgument. A string so this header stays torch-free.
  std::string kernels = "fused";
  // Captured decode graphs (--graphs): "auto" (on for CUDA), "on" or "off"
  // (llama.h GraphMode); LoadModelHost refuses anything else with
  // kInvalidArgument naming the value.
  std::string graphs = "auto";
  // Matrix storage of the fused CPU path (--weights): "auto" (the
  // checkpoint's), "f32", "bf16" or "q8_0" (weight_format.h);
  // LoadModelHost refuses anything else with kInvalidArgument.
  std::string weights = "auto";
  // Verifier: coordinator leases (lede.v1.Verifier/RenewLease). The reaper
  // frees a lapsed instance's sessions within `lease_sweep_interval` of the
  // lapse; `clock` (borrowed; nullptr = Clock::Real()) times both.
  lede::clock::Clock* clock = nullptr;
  absl::Duration lease_default_ttl = absl::Seconds(5);
  absl::Duration lease_sweep_interval = absl::Milliseconds(250);
};

class ModelHost;  // the loaded model and the pool

// Loads the model and creates (verifier, both) or attaches (drafter) the pool.
// Errors: those of the checkpoint loader, KvCache::Create/Attach (kNotFound
// when a drafter finds no pool yet), and of the policy when one is given.
StatusOr<std::shared_ptr<ModelHost>> LoadModelHost(const ModelServiceOptions& options,
                                                   bool create_pool,
                                                   prometheus::Registry* registry);

// Readiness of a model process: can it serve now? (ServerOptions::readiness
// of shared/rpc/server.h: gRPC health service "" and GET /readyz; liveness,
// "live" and /healthz, never calls it.)
//   verifier, both: the model is loaded and the KV pool created.
//   drafter: the KV pool it maps is the verifier's current one. When the
//     verifier made a new pool (it restarted) the drafter re-attaches here,
//     before the first request of the new epoch asks; while no valid pool of
//     that name exists (the verifier is (re)creating it) it is not ready.
//     With a policy service (policy_target) it is ready once it holds a
//     policy: it runs the policy in-process, so a policy service that goes
//     down later does not stop it serving (the follower reconnects).
// Errors: kUnavailable naming what is missing (`kv_pool`, `policy`).
// Thread-safety: thread-safe; bounded (an shm_open + mmap of the pool's
// header at most).
Status Readiness(ModelHost& host);

class VerifierService final : public lede::v1::Verifier::Service {
 public:
  explicit VerifierService(std::shared_ptr<ModelHost> host);
  ~VerifierService() override;
  grpc::Status Describe(grpc::ServerContext*, const lede::v1::DescribeRequest*,
                        lede::v1::ModelInfo*) override;
  grpc::Status OpenSession(grpc::ServerContext*, const lede::v1::OpenSessionRequest*,
                           lede::v1::OpenSessionResponse*) override;
  grpc::Status Verify(grpc::ServerContext*, const lede::v1::VerifyRequest*,
                      lede::v1::VerifyResponse*) override;
  grpc::Status CloseSession(grpc::ServerContext*, const lede::v1::CloseSessionRequest*,
                            lede::v1::CloseSessionResponse*) override;
  // Creates or extends a coordinator instance's lease; frees at once the
  // sessions of the instances it replaces (same owner_name). Errors:
  // INVALID_ARGUMENT without instance_id; FAILED_PRECONDITION for an
  // instance that was itself replaced.
  grpc::Status RenewLease(grpc::ServerContext*, const lede::v1::RenewLeaseRequest*,
                          lede::v1::RenewLeaseResponse*) override;

  // Frees the sessions of instances whose lease lapsed (the reaper thread
  // calls it every lease_sweep_interval; tests with a FakeClock may call it
  // directly). Returns how many sessions it freed.
  int SweepLapsedLeases();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class DrafterService final : public lede::v1::Drafter::Service {
 public:
  // `colocated_verifier` (borrowed, may be null): the verifier of the same
  // process, which DraftAndVerify calls directly.
  explicit DrafterService(std::shared_ptr<ModelHost> host, VerifierService* colocated_verifier = nullptr);
  ~DrafterService() override;
  grpc::Status Describe(grpc::ServerContext*, const lede::v1::DescribeRequest*,
                        lede::v1::ModelInfo*) override;
  // One speculation round's drafting (docs/design.md §2). With max_batch > 1 its
  // draft steps share passes with the other sessions drafting at that
  // moment (model::RunDrafterBatch: bitwise the solo steps on the fused
  // path); its decisions stay its own, on this handler thread.
  grpc::Status Draft(grpc::ServerContext*, const lede::v1::DraftRequest*,
                     lede::v1::DraftResponse*) override;
  // Draft, then the co-located verifier's Verify of the draft (one hop per
  // round). UNIMPLEMENTED without a co-located verifier.
  grpc::Status DraftAndVerify(grpc::ServerContext*, const lede::v1::DraftRequest*,
                              lede::v1::DraftAndVerifyResponse*) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lede::model_service

#endif  // LEDE_SERVICES_MODEL_MODEL_SERVICE_H_
