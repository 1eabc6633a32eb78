#include "shared/model/kv_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <string>

#include <ATen/ATen.h>

#include "shared/model/torch_boundary.h"
#include "shared/status/status_macros.h"

#if LEDE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace lede::model {
namespace {

constexpr char kMagic[8] = {'L', 'E', 'D', 'E', 'K', 'V', '0', '1'};
constexpr uint32_t kLayoutVersion = 3;  // 2: device_index and the CUDA IPC handle; 3: session words, drafter refs
constexpr int64_t kAlign = 64;

// The segment's first bytes (docs/design.md §4). Plain data, same layout in
// every process of one build.
struct PoolHeader {
  char magic[8];
  uint32_t layout_version;
  int32_t dtype;  // c10::ScalarType
  char fingerprint[64];
  int64_t n_layers, n_kv_heads, head_dim, dim;
  int64_t n_slots, capacity, max_draft_len;
  uint64_t epoch;
  int64_t total_bytes;
  // -1: K/V and the scratch follow in this segment (a CPU pool). >= 0: they
  // live in one allocation on CUDA device device_index, exported by the
  // creator as ipc_handle (a cudaIpcMemHandle_t, 64 bytes); the segment then
  // ends at the K/V offset, and the epoch header, lengths and in-use flags
  // stay in host shared memory (docs/design.md §4).
  int32_t device_index;
  char ipc_handle[64];
};

int64_t AlignUp(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Byte offsets of everything in a pool.
struct Layout {
  int64_t lengths, in_use, drafters, k0, layer_bytes, exit_hidden, total;
};

Layout ComputeLayout(const checkpoint::ModelConfig& c, int64_t S, int64_t C, int64_t D, c10::ScalarType dtype) {
  const int64_t elem = static_cast<int64_t>(c10::elementSize(dtype));
  Layout l;
  l.lengths = AlignUp(sizeof(PoolHeader));
  l.in_use = l.lengths + S * 8;
  l.drafters = l.in_use + S * 8;
  l.k0 = AlignUp(l.drafters + S * 8);
  l.layer_bytes = AlignUp(S * c.n_kv_heads * C * c.head_dim() * elem);
  l.exit_hidden = l.k0 + 2 * c.n_layers * l.layer_bytes;
  l.total = AlignUp(l.exit_hidden + S * (D + 1) * c.dim * elem);
  return l;
}

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

// Creates the shared memory segment `name` of `bytes` bytes (zero-filled;
// a stale one of a previous run is removed first) and maps it read-write.
// ResourceExhaustedError when the system refuses; the name is then removed.
StatusOr<void*> MapNewSegment(const std::string& name, int64_t bytes) {
  shm_unlink(name.c_str());  // a stale pool of a previous run
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return ResourceExhaustedError(Errno("shm_open " + name));
  if (ftruncate(fd, bytes) != 0) {
    close(fd);
    shm_unlink(name.c_str());
    return ResourceExhaustedError(Errno("ftruncate " + name));
  }
  // Reserve the pages now: a sparse segment would start and then fault the
  // process (SIGBUS) on the first write /dev/shm cannot back.
  if (const int err = posix_fallocate(fd, 0, bytes); err != 0) {
    close(fd);
    shm_unlink(name.c_str());
    return ResourceExhaustedError("fallocate " + name + ": " + std::strerror(err) + " (" + std::to_string(bytes) +
                                  " bytes; /dev/shm cannot hold the KV pool: lower --kv-memory or --slots)");
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    shm_unlink(name.c_str());
    return ResourceExhaustedError(Errno("mmap " + name));
  }
  return base;
}

// A new pool's header: what Attach checks (magic, layout version, dtype,
// fingerprint, shape), its epoch and size; device_index -1 (a CUDA pool's
// creator sets it).
void WritePoolHeader(const checkpoint::ModelConfig& config, const KvCacheOptions& o, uint64_t epoch, int64_t total_bytes,
                     PoolHeader* h) {
  std::memset(h, 0, sizeof(PoolHeader));
  std::memcpy(h->magic, kMagic, sizeof(kMagic));
  h->layout_version = kLayoutVersion;
  h->dtype = static_cast<int32_t>(o.dtype);
  std::strncpy(h->fingerprint, config.ArchitectureFingerprint().c_str(), sizeof(h->fingerprint) - 1);
  h->n_layers = config.n_layers;
  h->n_kv_heads = config.n_kv_heads;
  h->head_dim = config.head_dim();
  h->dim = config.dim;
  h->n_slots = o.n_slots;
  h->capacity = o.capacity;
  h->max_draft_len = o.max_draft_len;
  h->epoch = epoch;
  h->total_bytes = total_bytes;
  h->device_index = -1;
}

}  // namespace

int64_t KvCache::PoolBytes(const checkpoint::ModelConfig& config, const KvCacheOptions& options) {
  const int64_t capacity = options.capacity == 0 ? config.max_seq_len : options.capacity;
  return ComputeLayout(config, options.n_slots, capacity, options.max_draft_len, options.dtype).total;
}

int64_t KvCache::CapacityWithin(const checkpoint::ModelConfig& config, const KvCacheOptions& options, int64_t budget_bytes) {
  KvCacheOptions o = options;
  // PoolBytes grows with the capacity: binary search the largest that fits.
  int64_t lo = 0, hi = config.max_seq_len;
  while (lo < hi) {
    o.capacity = lo + (hi - lo + 1) / 2;
    if (PoolBytes(config, o) <= budget_bytes) {
      lo = o.capacity;
    } else {
      hi = o.capacity - 1;
    }
  }
  return lo;
}

struct KvCache::Storage {
  void* base = nullptr;
  size_t bytes = 0;
  bool mapped = false;
  void* device_base = nullptr;  // K/V of a CUDA pool: cudaMalloc'd (creator) or IPC-opened
  bool device_owner = false;
  std::string unlink_name;  // the creator removes the name at the end...
  uint64_t epoch = 0;       // ...if it still names this pool, not a newer one
  std::vector<int64_t> private_state;  // lengths + in_use + drafters of a private pool
  ~Storage() {
#if LEDE_WITH_CUDA
    if (device_base != nullptr) {
      if (device_owner) {
        cudaFree(device_base);
      } else {
        cudaIpcCloseMemHandle(device_base);
      }
    }
#endif
    if (mapped && base != nullptr) munmap(base, bytes);
    if (!unlink_name.empty() && NamedEpoch(unlink_name) == epoch) shm_unlink(unlink_name.c_str());
  }
  // The epoch of the pool a name refers to now (0 if none).
  static uint64_t NamedEpoch(const std::string& name) {
    int fd = shm_open(name.c_str(), O_RDONLY, 0);
    if (fd < 0) return 0;
    PoolHeader h{};
    const bool ok = pread(fd, &h, sizeof(h), 0) == static_cast<ssize_t>(sizeof(h));
    close(fd);
    return ok ? h.epoch : 0;
  }
};

StatusOr<KvCache> KvCache::Create(const checkpoint::ModelConfig& config,
                                  const KvCacheOptions& options) {
  KvCache cache;
  cache.options_ = options;
  if (cache.options_.capacity == 0) cache.options_.capacity = config.max_seq_len;
  const KvCacheOptions& o = cache.options_;
  if (o.n_slots <= 0) return InvalidArgumentError("KvCacheOptions.n_slots must be > 0");
  if (o.capacity <= 0 || o.capacity > config.max_seq_len) {
    return InvalidArgumentError("KvCacheOptions.capacity must be in [1, max_seq_len=" +
                                std::to_string(config.max_seq_len) + "], got " +
                                std::to_string(o.capacity));
  }
  if (o.max_draft_len <= 0) {
    return InvalidArgumentError("KvCacheOptions.max_draft_len must be > 0");
  }
  std::random_device rd;
  cache.epoch_ = ((static_cast<uint64_t>(rd()) << 32) ^ rd()) | 1;
  cache.storage_ = std::make_shared<Storage>();
  LEDE_RETURN_IF_ERROR(o.shared_memory_name.empty() ? cache.AllocatePrivate(config) : cache.CreateSegment(config));
  return cache;
}

Status KvCache::AllocatePrivate(const checkpoint::ModelConfig& config) {
  const KvCacheOptions& o = options_;
  // Everything here is an allocation, so any failure is kResourceExhausted.
  Status alloc = TorchBoundary("KV cache allocation failed", [&]() -> Status {
    auto opts = at::TensorOptions().device(o.device).dtype(o.dtype);
    for (int64_t l = 0; l < config.n_layers; ++l) {
      k_.push_back(at::zeros({o.n_slots, config.n_kv_heads, o.capacity, config.head_dim()}, opts));
      v_.push_back(at::zeros({o.n_slots, config.n_kv_heads, o.capacity, config.head_dim()}, opts));
    }
    exit_hidden_ = at::zeros({o.n_slots, o.max_draft_len + 1, config.dim}, opts);
    return OkStatus();
  });
  if (!alloc.ok()) return ResourceExhaustedError(alloc.message());
  storage_->private_state.assign(3 * o.n_slots, 0);
  length_ = storage_->private_state.data();
  in_use_ = length_ + o.n_slots;
  drafters_ = in_use_ + o.n_slots;
  return OkStatus();
}

#if LEDE_WITH_CUDA
namespace {

// The K/V part of a CUDA pool (`bytes`, zeroed) on o.device, its IPC handle
// and device index in *h. *dev is set as soon as the memory is allocated
// (its owner frees it, also on a later failure); kResourceExhausted on a
// CUDA failure (the segment `name` is then unlinked).
Status AllocateDevicePool(const std::string& name, const KvCacheOptions& o, int64_t bytes, PoolHeader* h,
                          void** dev, bool* dev_owner) {
  const int device = o.device.has_index() ? o.device.index() : 0;
  void* allocated = nullptr;
  if (cudaSetDevice(device) != cudaSuccess || cudaMalloc(&allocated, bytes) != cudaSuccess) {
    shm_unlink(name.c_str());
    return ResourceExhaustedError("KV pool " + name + ": cudaMalloc of " + std::to_string(bytes) + " bytes on cuda:" +
                                  std::to_string(device) + " failed");
  }
  *dev = allocated;
  *dev_owner = true;
  cudaIpcMemHandle_t handle;
  static_assert(sizeof(handle) <= sizeof(h->ipc_handle), "cudaIpcMemHandle_t fits the header");
  if (cudaMemset(*dev, 0, bytes) != cudaSuccess || cudaIpcGetMemHandle(&handle, *dev) != cudaSuccess) {
    shm_unlink(name.c_str());
    return ResourceExhaustedError("KV pool " + name + ": cudaIpcGetMemHandle failed on cuda:" +
                                  std::to_string(device));
  }
  std::memcpy(h->ipc_handle, &handle, sizeof(handle));
  h->device_index = device;
  return OkStatus();
}

}  // namespace
#endif

Status KvCache::CreateSegment(const checkpoint::ModelConfig& config) {
  const KvCacheOptions& o = options_;
#if LEDE_WITH_CUDA
  const bool on_cuda = o.device.is_cuda();
  if (!o.device.is_cpu() && !on_cuda) {
    return InvalidArgumentError("KvCacheOptions.shared_memory_name: shared pools live on the CPU or CUDA");
  }
#else
  const bool on_cuda = false;
  if (!o.device.is_cpu()) {
    return InvalidArgumentError(
        "KvCacheOptions.shared_memory_name: a shared pool on " + o.device.str() +
        " needs a CUDA build of libtorch (CUDA IPC); this build shares CPU pools only");
  }
#endif
  const Layout layout = ComputeLayout(config, o.n_slots, o.capacity, o.max_draft_len, o.dtype);
  // A CUDA pool's host segment ends where K/V would start.
  const int64_t host_bytes = on_cuda ? layout.k0 : layout.total;
  const std::string& name = o.shared_memory_name;
  LEDE_ASSIGN_OR_RETURN(void* base, MapNewSegment(name, host_bytes));
  storage_->base = base;
  storage_->bytes = host_bytes;
  storage_->mapped = true;
  storage_->unlink_name = name;
  storage_->epoch = epoch_;
  auto* h = static_cast<PoolHeader*>(base);
  WritePoolHeader(config, o, epoch_, layout.total, h);
  // ftruncate zero-fills: K/V, lengths and in-use flags start at 0.
  length_ = reinterpret_cast<int64_t*>(static_cast<char*>(base) + layout.lengths);
  in_use_ = reinterpret_cast<int64_t*>(static_cast<char*>(base) + layout.in_use);
  drafters_ = reinterpret_cast<int64_t*>(static_cast<char*>(base) + layout.drafters);
  auto opts = at::TensorOptions().dtype(o.dtype).device(o.device);
  // kv: where K/V and the scratch start, in the segment or (CUDA) in one
  // device allocation laid out as the segment is from k0 on.
  char* kv = static_cast<char*>(base) + layout.k0;
#if LEDE_WITH_CUDA
  if (on_cuda) {
    LEDE_RETURN_IF_ERROR(AllocateDevicePool(name, o, layout.total - layout.k0, h, &storage_->device_base,
                                            &storage_->device_owner));
    kv = static_cast<char*>(storage_->device_base);
  }
#endif
  for (int64_t l = 0; l < config.n_layers; ++l) {
    const std::vector<int64_t> shape = {o.n_slots, config.n_kv_heads, o.capacity, config.head_dim()};
    k_.push_back(at::from_blob(kv + (2 * l) * layout.layer_bytes, shape, opts));
    v_.push_back(at::from_blob(kv + (2 * l + 1) * layout.layer_bytes, shape, opts));
  }
  exit_hidden_ = at::from_blob(kv + (layout.exit_hidden - layout.k0), {o.n_slots, o.max_draft_len + 1, config.dim}, opts);
  return OkStatus();
}

StatusOr<KvCache> KvCache::Attach(const checkpoint::ModelConfig& config, const KvCacheOptions& options) {
  const std::string& name = options.shared_memory_name;
  if (name.empty()) return InvalidArgumentError("KvCacheOptions.shared_memory_name: required to attach");
  int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) return NotFoundError(Errno("KV pool " + name));
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(sizeof(PoolHeader))) {
    close(fd);
    return FailedPreconditionError("KV pool " + name + ": segment smaller than its header");
  }
  void* base = mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) return ResourceExhaustedError(Errno("mmap " + name));
  auto storage = std::make_shared<Storage>();
  storage->base = base;
  storage->bytes = st.st_size;
  storage->mapped = true;
  const auto* h = static_cast<const PoolHeader*>(base);
  auto mismatch = [&](const std::string& field, const std::string& got, const std::string& want) {
    return FailedPreconditionError("KV pool " + name + ": " + field + " is " + got + ", expected " + want);
  };
  if (std::memcmp(h->magic, kMagic, sizeof(kMagic)) != 0) return mismatch("magic", "unknown", "LEDEKV01");
  if (h->layout_version != kLayoutVersion) {
    return mismatch("layout version", std::to_string(h->layout_version), std::to_string(kLayoutVersion));
  }
  const std::string fp(h->fingerprint, strnlen(h->fingerprint, sizeof(h->fingerprint)));
  if (fp != config.ArchitectureFingerprint().substr(0, sizeof(h->fingerprint) - 1)) {
    return mismatch("model fingerprint", fp, config.ArchitectureFingerprint());
  }
  if (h->n_layers != config.n_layers || h->n_kv_heads != config.n_kv_heads ||
      h->head_dim != config.head_dim() || h->dim != config.dim) {
    return mismatch("dims", "different", "those of the model");
  }
  if (h->dtype != static_cast<int32_t>(options.dtype)) {
    return mismatch("dtype", std::to_string(h->dtype), std::to_string(static_cast<int>(options.dtype)));
  }
  const Layout layout = ComputeLayout(config, h->n_slots, h->capacity, h->max_draft_len, options.dtype);
  const bool on_cuda = h->device_index >= 0;
  const int64_t host_bytes = on_cuda ? layout.k0 : layout.total;
  if (layout.total != h->total_bytes || host_bytes > st.st_size) {
    return mismatch("size", std::to_string(st.st_size), std::to_string(host_bytes));
  }
  const std::string pool_device = on_cuda ? "cuda:" + std::to_string(h->device_index) : "cpu";
  if (on_cuda != options.device.is_cuda()) {
    return mismatch("device", pool_device, options.device.str());
  }
  KvCache cache;
  cache.options_ = options;
  cache.options_.device = on_cuda ? c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(h->device_index))
                                  : c10::Device(c10::kCPU);
  cache.options_.n_slots = h->n_slots;
  cache.options_.capacity = h->capacity;
  cache.options_.max_draft_len = h->max_draft_len;
  cache.epoch_ = h->epoch;
  cache.storage_ = storage;
  char* p = static_cast<char*>(base);
  cache.length_ = reinterpret_cast<int64_t*>(p + layout.lengths);
  cache.in_use_ = reinterpret_cast<int64_t*>(p + layout.in_use);
  cache.drafters_ = reinterpret_cast<int64_t*>(p + layout.drafters);
  auto opts = at::TensorOptions().dtype(options.dtype).device(cache.options_.device);
  char* kv = p + layout.k0;
  if (on_cuda) {
#if LEDE_WITH_CUDA
    cudaIpcMemHandle_t handle;
    std::memcpy(&handle, h->ipc_handle, sizeof(handle));
    void* dev = nullptr;
    if (cudaSetDevice(h->device_index) != cudaSuccess ||
        cudaIpcOpenMemHandle(&dev, handle, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess) {
      return FailedPreconditionError("KV pool " + name + ": cudaIpcOpenMemHandle failed on " + pool_device +
                                     " (the verifier's device must be visible to this process)");
    }
    storage->device_base = dev;
    kv = static_cast<char*>(dev);
#else
    return FailedPreconditionError("KV pool " + name + " lives on " + pool_device +
                                   "; attaching it needs a CUDA build of libtorch (CUDA IPC)");
#endif
  }
  const int64_t S = h->n_slots, C = h->capacity, D = h->max_draft_len;
  for (int64_t l = 0; l < config.n_layers; ++l) {
    const std::vector<int64_t> shape = {S, config.n_kv_heads, C, config.head_dim()};
    cache.k_.push_back(at::from_blob(kv + (2 * l) * layout.layer_bytes, shape, opts));
    cache.v_.push_back(at::from_blob(kv + (2 * l + 1) * layout.layer_bytes, shape, opts));
  }
  cache.exit_hidden_ = at::from_blob(kv + (layout.exit_hidden - layout.k0), {S, D + 1, config.dim}, opts);
  return cache;
}

int64_t KvCache::n_in_use() const {
  int64_t n = 0;
  for (int64_t s = 0; s < n_slots(); ++s) n += session(s) != kNoSession;
  return n;
}

// The per-slot words live in memory another process maps: every access to a
// session word or a drafter count is a sequentially consistent atomic (GCC
// builtins on the plain int64_t arrays; lock-free on every 64-bit target).
uint64_t KvCache::session(int64_t slot) const {
  return static_cast<uint64_t>(__atomic_load_n(&in_use_[slot], __ATOMIC_SEQ_CST));
}

StatusOr<int64_t> KvCache::Allocate(uint64_t session_id) {
  if (session_id == kNoSession) return InvalidArgumentError("session: 0 names no session");
  bool drafted_on = false;
  for (int64_t s = 0; s < n_slots(); ++s) {
    if (session(s) != kNoSession) continue;
    // A drafter still inside a Draft of the slot's previous session (it
    // checked that session's word before the slot was freed): reusing the
    // slot now would let it write into the new session's K/V.
    if (__atomic_load_n(&drafters_[s], __ATOMIC_SEQ_CST) != 0) {
      drafted_on = true;
      continue;
    }
    length_[s] = 0;
    __atomic_store_n(&in_use_[s], static_cast<int64_t>(session_id), __ATOMIC_SEQ_CST);
    return s;
  }
  return ResourceExhaustedError("all " + std::to_string(n_slots()) + " KV slots are in use" +
                                (drafted_on ? " (a freed slot still has a draft of its last session running)" : ""));
}

Status KvCache::Free(int64_t slot) {
  if (slot < 0 || slot >= n_slots() || session(slot) == kNoSession) {
    return InvalidArgumentError("KV slot " + std::to_string(slot) + " is not allocated");
  }
  __atomic_store_n(&in_use_[slot], static_cast<int64_t>(kNoSession), __ATOMIC_SEQ_CST);
  length_[slot] = 0;
  return OkStatus();
}

bool KvCache::BeginDrafting(int64_t slot, uint64_t session_id) {
  if (slot < 0 || slot >= n_slots() || session_id == kNoSession) return false;
  __atomic_add_fetch(&drafters_[slot], 1, __ATOMIC_SEQ_CST);
  if (session(slot) == session_id) return true;
  __atomic_sub_fetch(&drafters_[slot], 1, __ATOMIC_SEQ_CST);
  return false;
}

void KvCache::EndDrafting(int64_t slot) { __atomic_sub_fetch(&drafters_[slot], 1, __ATOMIC_SEQ_CST); }

int64_t KvCache::n_drafting(int64_t slot) const { return __atomic_load_n(&drafters_[slot], __ATOMIC_SEQ_CST); }

Status KvCache::Commit(int64_t slot, int64_t new_length) {
  if (new_length < length_[slot] || new_length > capacity()) {
    return OutOfRangeError("commit to " + std::to_string(new_length) + " outside [" +
                           std::to_string(length_[slot]) + ", " + std::to_string(capacity()) + "]");
  }
  length_[slot] = new_length;
  return OkStatus();
}

Status KvCache::Truncate(int64_t slot, int64_t new_length) {
  if (new_length < 0 || new_length > length_[slot]) {
    return OutOfRangeError("truncate to " + std::to_string(new_length) + " outside [0, " +
                           std::to_string(length_[slot]) + "]");
  }
  length_[slot] = new_length;
  return OkStatus();
}

int64_t KvCache::bytes() const {
  int64_t total = exit_hidden_.defined() ? exit_hidden_.nbytes() : 0;
  for (size_t l = 0; l < k_.size(); ++l) total += k_[l].nbytes() + v_[l].nbytes();
  return total;
}

}  // namespace lede::model
