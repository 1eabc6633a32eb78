// The service host: LoadModelHost, Readiness and the wire conversions both
// services share (model_host.h).
#include "services/model/model_host.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include <sys/statvfs.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "absl/synchronization/mutex.h"
#include "policy/dqn/artifact.h"
#include "services/model/policy_follower.h"
#include "shared/flags/model_flags.h"
#include "shared/log/log.h"
#include "shared/model/batch.h"
#include "shared/model/cost/cost_model.h"
#include "shared/model/kv_cache.h"
#include "shared/model/llama.h"
#include "shared/model/torch_boundary.h"
#include "shared/model/loaders/weight_format.h"
#include "shared/rpc/security.h"
#include "shared/rpc/server.h"
#include "shared/status/status_macros.h"
#include "shared/telemetry/lede_metrics.h"
#include "shared/telemetry/metrics.h"

namespace lede::model_service {

speculation::SamplingParams SamplingFromProto(const lede::v1::SamplingParams& p) {
  speculation::SamplingParams s;
  s.temperature = p.temperature();
  s.top_p = p.top_p() == 0.0f ? 1.0 : p.top_p();
  s.seed = p.seed();
  return s;
}

Status ValidateSampling(const speculation::SamplingParams& s) {
  if (!(s.temperature >= 0.0) || !std::isfinite(s.temperature)) {
    return InvalidArgumentError("sampling.temperature: must be a finite number >= 0");
  }
  if (!(s.top_p > 0.0 && s.top_p <= 1.0)) return InvalidArgumentError("sampling.top_p: must be in (0, 1]");
  return OkStatus();
}

// [K, V] float32 little-endian bytes <-> tensor (both at the torch boundary).
StatusOr<std::string> ProbsToBytes(const at::Tensor& probs) {
  if (!probs.defined() || probs.numel() == 0) return std::string();
  return model::TorchBoundary("draft_probs", [&]() -> StatusOr<std::string> {
    at::Tensor p = probs.to(at::kFloat).contiguous();
    return std::string(static_cast<const char*>(p.data_ptr()), p.numel() * sizeof(float));
  });
}

StatusOr<at::Tensor> ProbsFromBytes(const std::string& bytes, int64_t K, int64_t V) {
  if (bytes.empty()) return at::Tensor();
  if (static_cast<int64_t>(bytes.size()) != K * V * static_cast<int64_t>(sizeof(float))) {
    return InvalidArgumentError("draft_probs: " + std::to_string(bytes.size()) + " bytes, expected K x V x 4 = " +
                                std::to_string(K * V * 4));
  }
  return model::TorchBoundary("draft_probs", [&]() -> StatusOr<at::Tensor> {
    at::Tensor t = at::empty({K, V}, at::kFloat);
    std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
    return t;
  });
}

// The error of a call whose session id is not the slot's session.
Status NotThisSession(int64_t slot) {
  return FailedPreconditionError("session_id: slot " + std::to_string(slot) +
                                 " holds no session of this id (it was closed, or the caller never opened it)");
}

void SetComputeThreads(int n_threads) {
  static thread_local int threads_set = 0;
  if (threads_set == n_threads) return;
  model::SetDecodeThreads(n_threads);
  threads_set = n_threads;
  // A flag that silently does nothing is the fault this catches (a build
  // once ran every step on one thread whatever --threads said).
  // Checked at the first call only (the load, before any step can hold the
  // worker team: a held team runs a loop on its caller, which is no fault).
  static std::once_flag checked;
  std::call_once(checked, [n_threads] {
    if (const int in_use = model::FusedThreadsInUse(); in_use < n_threads) {
      log::LogEvent("warn", "threads_unavailable",
                    {{"threads", std::to_string(n_threads)}, {"threads_in_use", std::to_string(in_use)}});
    }
  });
}

int StepThreads(int threads, int batch_threads, int other_steps_running) {
  return std::max(1, other_steps_running <= 0 ? std::max(threads, batch_threads) : batch_threads);
}

BatchStepThreads::BatchStepThreads(ModelHost& host) : host_(host) {
  const int others = host_.running_steps.fetch_add(1);
  SetComputeThreads(StepThreads(host_.options.threads, host_.options.batch_threads, others));
}

BatchStepThreads::~BatchStepThreads() { host_.running_steps.fetch_sub(1); }

Status CheckPromptFits(int64_t prompt_tokens, int64_t capacity, int64_t window) {
  if (prompt_tokens < capacity) return OkStatus();
  const std::string n = "prompt_token_ids: " + std::to_string(prompt_tokens) + " tokens";
  if (prompt_tokens >= window) {
    return InvalidArgumentError(n + " do not fit the model's context window of " + std::to_string(window));
  }
  return ResourceExhaustedError(n + " need more KV memory than one sequence may hold (" + std::to_string(capacity) +
                                " tokens, sized by the verifier's --kv-memory; the model's window is " +
                                std::to_string(window) + ")");
}

StatusOr<KvPoolPlan> PlanKvPool(const checkpoint::ModelConfig& config, const ModelServiceOptions& options,
                                c10::ScalarType kv_dtype, int64_t available_bytes, int64_t shm_free_bytes) {
  KvPoolPlan plan;
  LEDE_ASSIGN_OR_RETURN(plan.budget_bytes, flags::ParseMemorySize("kv-memory", options.kv_memory, available_bytes));
  const bool percentage = !options.kv_memory.empty() && options.kv_memory.back() == '%';
  if (percentage && !options.kv_pool_name.empty() && shm_free_bytes > 0) {
    plan.budget_bytes = std::min(plan.budget_bytes, shm_free_bytes);
  }
  if (options.n_slots < 1) return InvalidArgumentError("--slots: must be >= 1, got " + std::to_string(options.n_slots));
  const int64_t window = config.max_seq_len;
  if (options.capacity < 0 || options.capacity > window) {
    return InvalidArgumentError("--capacity: must be in [0, " + std::to_string(window) +
                                "] (the model's context window; 0 = what --kv-memory allows), got " +
                                std::to_string(options.capacity));
  }
  model::KvCacheOptions ko;
  ko.n_slots = options.n_slots;
  ko.max_draft_len = options.max_draft_len;
  ko.kv_dtype = kv_dtype;
  ko.capacity = options.capacity > 0 ? options.capacity : window;
  ko.block_tokens = std::min(kKvBlockTokens, ko.capacity);
  const std::string budget = "--kv-memory " + options.kv_memory + " (" + flags::FormatBytes(plan.budget_bytes) + ")";
  int64_t n_blocks = model::KvCache::BlocksWithin(config, ko, plan.budget_bytes);
  auto holds = [&] {
    return budget + " holds " + std::to_string(n_blocks * ko.block_tokens) + " tokens of KV (" +
           flags::FormatBytes(model::KvCache::BlockBytes(config, ko) / ko.block_tokens) + " per token)";
  };
  if (options.capacity > 0) {
    if (n_blocks < model::KvCache::BlocksFor(ko.capacity, ko.block_tokens)) {
      return InvalidArgumentError(holds() + ", under one sequence of --capacity " + std::to_string(ko.capacity) +
                                  ": raise --kv-memory or lower --capacity");
    }
  } else {
    // One sequence may hold the whole pool, up to the window; a shorter
    // capacity shrinks the block table, which may leave room for a block more.
    ko.capacity = std::min(window, n_blocks * ko.block_tokens);
    const int64_t least = std::min(window, kMinSlotTokens);
    if (ko.capacity < least) {
      return InvalidArgumentError(holds() + ", under the " + std::to_string(least) +
                                  " tokens a request needs: raise --kv-memory");
    }
    n_blocks = model::KvCache::BlocksWithin(config, ko, plan.budget_bytes);
    ko.capacity = std::min(window, n_blocks * ko.block_tokens);
  }
  ko.n_blocks = n_blocks;
  plan.capacity = ko.capacity;
  plan.block_tokens = ko.block_tokens;
  plan.n_blocks = n_blocks;
  plan.pool_bytes = model::KvCache::PoolBytes(config, ko);
  return plan;
}

namespace {

// The model of --model with the engine flags (--kernels, --graphs,
// --weights, --device, --dtype) into host->model and its fingerprint.
Status LoadHostModel(const ModelServiceOptions& options, ModelHost* host) {
  model::ModelOptions mo;
  LEDE_ASSIGN_OR_RETURN(mo.kernels, model::ParseKernels(options.kernels));
  LEDE_ASSIGN_OR_RETURN(mo.graphs, model::ParseGraphMode(options.graphs));
  LEDE_ASSIGN_OR_RETURN(mo.weights, model::loaders::ParseWeightFormat(options.weights));
  LEDE_ASSIGN_OR_RETURN(mo.device, model::ParseDevice(options.device));
  LEDE_ASSIGN_OR_RETURN(mo.dtype, model::ParseDtype(options.dtype));
  if (!mo.device.is_cpu() && !options.kv_pool_name.empty()) {
    return InvalidArgumentError("kv_pool: a shared KV pool (split drafter and verifier) is CPU-only so far; "
                                "on " + options.device + " run --role both without --kv-pool");
  }
  LEDE_ASSIGN_OR_RETURN(std::unique_ptr<model::LlamaModel> loaded,
                        model::LlamaModel::Load(options.model_path, mo));
  host->model = std::shared_ptr<const model::LlamaModel>(std::move(loaded));
  host->fingerprint = host->model->config().ArchitectureFingerprint();
  return OkStatus();
}

// The verifier's pool (create_pool: sized by PlanKvPool from the budget,
// in a shared segment under --kv-pool) or the drafter's attachment to it,
// into host->cache.
Status OpenHostPool(const ModelServiceOptions& options, bool create_pool, ModelHost* host) {
  const checkpoint::ModelConfig& c = host->model->config();
  model::KvCacheOptions ko;
  ko.n_slots = options.n_slots;
  ko.capacity = options.capacity;
  if (create_pool) {
    LEDE_ASSIGN_OR_RETURN(ko.kv_dtype,
                          model::ParseKvDtype(options.kv_dtype, host->model->options().dtype, "--kv-dtype"));
    // The budget: MemAvailable now (the weights are loaded), and for a
    // shared segment the free space of /dev/shm that backs it.
    StatusOr<int64_t> available = flags::MemAvailableBytes();
    int64_t shm_free = 0;
    struct statvfs fs;
    if (!options.kv_pool_name.empty() && statvfs("/dev/shm", &fs) == 0) {
      shm_free = static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
    }
    LEDE_ASSIGN_OR_RETURN(KvPoolPlan plan, PlanKvPool(c, options, ko.kv_dtype, available.ok() ? *available : 0,
                                                      shm_free));
    ko.capacity = plan.capacity;
    ko.block_tokens = plan.block_tokens;
    ko.n_blocks = plan.n_blocks;
    log::LogEvent("info", "kv_pool_planned",
                      {{"kv_memory", options.kv_memory},
                       {"budget_bytes", std::to_string(plan.budget_bytes)},
                       {"slots", std::to_string(options.n_slots)},
                       {"capacity_tokens", std::to_string(plan.capacity)},
                       {"block_tokens", std::to_string(plan.block_tokens)},
                       {"kv_dtype", c10::toString(ko.kv_dtype)},
                       {"n_blocks", std::to_string(plan.n_blocks)},
                       {"window_tokens", std::to_string(c.max_seq_len)},
                       {"pool_bytes", std::to_string(plan.pool_bytes)}});
  }
  ko.max_draft_len = options.max_draft_len;
  ko.shared_memory_name = options.kv_pool_name;
  ko.dtype = host->model->options().dtype;
  ko.device = host->model->options().device;
  std::shared_ptr<model::KvCache> pool;
  if (create_pool) {
    LEDE_ASSIGN_OR_RETURN(model::KvCache cache, model::KvCache::Create(c, ko));
    pool = std::make_shared<model::KvCache>(std::move(cache));
    host->owns_pool = true;
  } else {
    if (options.kv_pool_name.empty()) {
      return InvalidArgumentError("kv_pool: a drafter without a verifier in its process needs the pool's name");
    }
    LEDE_ASSIGN_OR_RETURN(model::KvCache cache, model::KvCache::Attach(c, ko));
    pool = std::make_shared<model::KvCache>(std::move(cache));
  }
  absl::MutexLock lock(&host->pool_mu);
  host->cache = pool;
  return OkStatus();
}

// The served cost model's step costs (ModelInfo) and the meter of the
// measured ones, for a pool of `max_draft_len` drafts.
Status SetHostCosts(const ModelServiceOptions& options, int64_t max_draft_len, ModelHost* host) {
  const checkpoint::ModelConfig& c = host->model->config();
  std::unique_ptr<model::cost::CostModel> cm;
  if (!options.calibration_path.empty()) {
    LEDE_ASSIGN_OR_RETURN(model::cost::Calibration cal, model::cost::ReadCalibrationFile(options.calibration_path));
    cm = model::cost::MakeMeasuredCostModel(cal);
  } else {
    cm = model::cost::MakeAcceleratorCostModel(c);
  }
  host->cost_model = cm->name();
  const int64_t L = c.n_layers, D = max_draft_len;
  for (int64_t l = 0; l <= L; ++l) host->draft_cost.push_back(l == 0 ? 0.0 : cm->ControlledDraftToken(l));
  for (int64_t e = 0; e <= L; ++e) {
    for (int64_t k = 0; k <= D; ++k) host->verify_cost.push_back(e == 0 ? 0.0 : cm->Verify(e, k));
  }
  host->probe_cost = cm->ControlledProbe();
  experience::ServedCostMeterOptions mo;
  mo.n_layers = static_cast<int32_t>(L);
  mo.max_draft_len = static_cast<int32_t>(D);
  mo.weight_format = model::loaders::WeightFormatName(host->model->weight_format());
  mo.threads = at::get_num_threads();
  mo.head_layers = model::cost::HeadLayerEquivalents(c);
  LEDE_ASSIGN_OR_RETURN(host->served_costs, experience::ServedCostMeter::Create(mo));
  return OkStatus();
}

// The LEDE policy: followed from --policy (the policy service), or loaded
// from --policy-dir; neither leaves the host without one.
Status SetHostPolicy(const ModelServiceOptions& options, ModelHost* host) {
  if (!options.policy_target.empty()) {
    PolicyFollowerOptions po;
    po.target = options.policy_target;
    LEDE_ASSIGN_OR_RETURN(po.credentials, rpc::MakeChannelCredentials(options.policy_tls, "policy_tls"));
    po.tls_server_name = options.policy_tls.enabled() ? options.policy_tls.server_name : "";
    po.token = options.internal_token;
    po.model_fingerprint = host->fingerprint;
    po.n_layers = static_cast<int32_t>(host->model->config().n_layers);
    po.metrics = host->metrics.get();
    host->follower = std::make_unique<PolicyFollower>(po);
    Status first = host->follower->FetchOnce();
    if (!first.ok()) log::LogEvent("warn", "policy_fetch_failed", {{"error", first.ToString()}});
    host->follower->Start();
    if (options.remote_decisions) {
      host->policy_stub = lede::v1::Policy::NewStub(MakePolicyChannel(options.policy_target, po.credentials, po.tls_server_name, po.token));
    }
  } else if (!options.policy_dir.empty()) {
    const std::filesystem::path dir(options.policy_dir);
    auto artifact = std::filesystem::exists(dir / policy::dqn::kMetadataFile)
                        ? policy::dqn::LoadArtifact(options.policy_dir, host->fingerprint)
                        : policy::dqn::LoadServingArtifact(options.policy_dir, host->fingerprint);
    if (!artifact.ok()) return artifact.status();
    host->local_policy = std::make_shared<const policy::dqn::Artifact>(std::move(*artifact));
    if (host->metrics) {
      host->metrics->SetPolicyVersion(host->local_policy->metadata.version,
                                      telemetry::PolicyVersionNumber(host->local_policy->metadata.version));
    }
  }
  return OkStatus();
}

}  // namespace

StatusOr<std::shared_ptr<ModelHost>> LoadModelHost(const ModelServiceOptions& options, bool create_pool,
                                                   prometheus::Registry* registry) {
  auto host = std::make_shared<ModelHost>();
  host->options = options;
  SetComputeThreads(std::max(1, options.threads));  // the load and this thread's warm-up
  LEDE_RETURN_IF_ERROR(LoadHostModel(options, host.get()));
  if (registry != nullptr) host->metrics = std::make_unique<telemetry::SpecDecodeMetrics>(*registry);
  LEDE_RETURN_IF_ERROR(OpenHostPool(options, create_pool, host.get()));
  const std::shared_ptr<model::KvCache> pool = host->Pool();
  if (host->metrics) host->metrics->kv_slots_capacity.Set(static_cast<double>(pool->n_slots()));
  LEDE_RETURN_IF_ERROR(SetHostCosts(options, pool->max_draft_len(), host.get()));
  LEDE_RETURN_IF_ERROR(SetHostPolicy(options, host.get()));
  return host;
}

Status Readiness(ModelHost& host) {
  if (!host.model) return UnavailableError("model: not loaded");
  const bool drafter = !host.owns_pool && !host.options.kv_pool_name.empty();
  if (drafter) {
    absl::MutexLock lock(&host.pool_mu);
    model::KvCacheOptions o;
    o.shared_memory_name = host.options.kv_pool_name;
    o.dtype = host.model->options().dtype;
    auto current = model::KvCache::Attach(host.model->config(), o);
    if (!current.ok()) {
      return UnavailableError("kv_pool: " + std::string(current.status().message()) +
                              " (the verifier has not created it yet)");
    }
    if (!host.cache || host.cache->epoch() != current->epoch()) {
      host.cache = std::make_shared<model::KvCache>(std::move(*current));
      log::LogEvent("info", "kv_pool_attached", {{"epoch", std::to_string(host.cache->epoch())}});
    }
  } else if (!host.Pool()) {
    return UnavailableError("kv_pool: not created");
  }
  if (host.follower && host.follower->current() == nullptr) {
    return UnavailableError("policy: no policy fetched yet from the policy service " + host.options.policy_target);
  }
  return OkStatus();
}

}  // namespace lede::model_service
