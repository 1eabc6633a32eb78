#include "shared/model/kv_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
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
// 2: device_index and the CUDA IPC handle; 3: session words, drafter refs;
// 4: KV blocks (block geometry, per-slot block counts, block table, free stack).
constexpr uint32_t kLayoutVersion = 4;
constexpr int64_t kAlign = 64;

// The segment's first bytes (docs/design.md §4). Plain data, same layout in
// every process of one build.
struct PoolHeader {
  char magic[8];
  uint32_t layout_version;
  int32_t dtype;  // c10::ScalarType of the scratch (the compute dtype)
  int32_t kv_dtype;  // c10::ScalarType of K and V
  char fingerprint[64];
  int64_t n_layers, n_kv_heads, head_dim, dim;
  int64_t n_slots, capacity, max_draft_len;
  int64_t block_tokens, n_blocks;
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

// A pool's sizes with the defaults resolved (KvCacheOptions): S slots, C
// tokens per sequence, P per block, MB = ceil(C / P) blocks per slot, NB
// blocks, D drafts.
struct Geometry {
  int64_t S, C, P, MB, NB, D;
  c10::ScalarType dtype, kv_dtype;  // the scratch's, K/V's
};

Geometry Resolve(const checkpoint::ModelConfig& config, const KvCacheOptions& o) {
  Geometry g;
  g.S = o.n_slots;
  g.C = o.capacity == 0 ? config.max_seq_len : o.capacity;
  g.P = o.block_tokens == 0 ? g.C : o.block_tokens;
  g.MB = g.P > 0 ? KvCache::BlocksFor(g.C, g.P) : 0;
  g.NB = o.n_blocks == 0 ? g.S * g.MB : o.n_blocks;
  g.D = o.max_draft_len;
  g.dtype = o.dtype;
  g.kv_dtype = o.kv_dtype == c10::ScalarType::Undefined ? o.dtype : o.kv_dtype;
  return g;
}

// Byte offsets of everything in a pool: the words (KvCache::BindWords's
// order: per-slot lengths, session words, drafter counts, block counts, the
// free stack's top, the block table, the free stack), then K/V and the
// scratch.
struct Layout {
  int64_t words, k0, layer_bytes, exit_hidden, total;
};

Layout ComputeLayout(const checkpoint::ModelConfig& c, const Geometry& g) {
  const int64_t elem = static_cast<int64_t>(c10::elementSize(g.dtype));
  const int64_t kv_elem = static_cast<int64_t>(c10::elementSize(g.kv_dtype));
  Layout l;
  l.words = AlignUp(sizeof(PoolHeader));
  l.k0 = AlignUp(l.words + (4 * g.S + 1 + g.S * g.MB + g.NB) * 8);
  l.layer_bytes = AlignUp(g.NB * c.n_kv_heads * g.P * c.head_dim() * kv_elem);
  l.exit_hidden = l.k0 + 2 * c.n_layers * l.layer_bytes;
  l.total = AlignUp(l.exit_hidden + g.S * (g.D + 1) * c.dim * elem);
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
  h->kv_dtype = static_cast<int32_t>(o.kv_dtype);
  std::strncpy(h->fingerprint, config.ArchitectureFingerprint().c_str(), sizeof(h->fingerprint) - 1);
  h->n_layers = config.n_layers;
  h->n_kv_heads = config.n_kv_heads;
  h->head_dim = config.head_dim();
  h->dim = config.dim;
  h->n_slots = o.n_slots;
  h->capacity = o.capacity;
  h->max_draft_len = o.max_draft_len;
  h->block_tokens = o.block_tokens;
  h->n_blocks = o.n_blocks;
  h->epoch = epoch;
  h->total_bytes = total_bytes;
  h->device_index = -1;
}

}  // namespace

StatusOr<c10::ScalarType> ParseKvDtype(const std::string& name, c10::ScalarType compute, const std::string& field) {
  if (name == "auto") return compute;
  if (name == "bfloat16" || name == "bf16") return c10::kBFloat16;
  if (name == "float32" || name == "f32") return c10::kFloat;
  return InvalidArgumentError(field + ": must be bfloat16, float32 or auto, got '" + name + "'");
}

int64_t KvCache::PoolBytes(const checkpoint::ModelConfig& config, const KvCacheOptions& options) {
  return ComputeLayout(config, Resolve(config, options)).total;
}

int64_t KvCache::BlockBytes(const checkpoint::ModelConfig& config, const KvCacheOptions& options) {
  const Geometry g = Resolve(config, options);
  return 2 * config.n_layers * config.n_kv_heads * g.P * config.head_dim() *
         static_cast<int64_t>(c10::elementSize(g.kv_dtype));
}

int64_t KvCache::BlocksWithin(const checkpoint::ModelConfig& config, const KvCacheOptions& options, int64_t budget_bytes) {
  KvCacheOptions o = options;
  o.n_blocks = 1;
  if (o.block_tokens <= 0 || PoolBytes(config, o) > budget_bytes) return 0;
  // PoolBytes grows with the blocks: binary search the most that fit, at
  // most what backs every slot in full.
  const Geometry g = Resolve(config, o);
  int64_t lo = 1, hi = g.S * g.MB;
  while (lo < hi) {
    o.n_blocks = lo + (hi - lo + 1) / 2;
    if (PoolBytes(config, o) <= budget_bytes) {
      lo = o.n_blocks;
    } else {
      hi = o.n_blocks - 1;
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
  std::vector<char> private_words;  // Layout's words of a private pool
  std::mutex blocks_mu;  // giving and taking blocks (the creating process)
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
  if (options.n_slots <= 0) return InvalidArgumentError("KvCacheOptions.n_slots must be > 0");
  if (options.capacity < 0 || options.capacity > config.max_seq_len) {
    return InvalidArgumentError("KvCacheOptions.capacity must be in [1, max_seq_len=" +
                                std::to_string(config.max_seq_len) + "], got " +
                                std::to_string(options.capacity));
  }
  if (options.max_draft_len <= 0) {
    return InvalidArgumentError("KvCacheOptions.max_draft_len must be > 0");
  }
  const Geometry g = Resolve(config, options);
  if (g.P <= 0 || g.P > g.C) {
    return InvalidArgumentError("KvCacheOptions.block_tokens must be in [1, capacity=" + std::to_string(g.C) +
                                "] (0 = capacity), got " + std::to_string(options.block_tokens));
  }
  if (g.NB < g.MB || g.NB > g.S * g.MB) {
    return InvalidArgumentError("KvCacheOptions.n_blocks must be in [" + std::to_string(g.MB) + ", " +
                                std::to_string(g.S * g.MB) + "] (one sequence of the capacity .. every slot " +
                                "backed in full; 0 = the latter), got " + std::to_string(options.n_blocks));
  }
  cache.options_.capacity = g.C;
  cache.options_.kv_dtype = g.kv_dtype;
  cache.options_.block_tokens = g.P;
  cache.options_.n_blocks = g.NB;
  cache.blocks_per_slot_ = g.MB;
  const KvCacheOptions& o = cache.options_;
  std::random_device rd;
  cache.epoch_ = ((static_cast<uint64_t>(rd()) << 32) ^ rd()) | 1;
  cache.storage_ = std::make_shared<Storage>();
  LEDE_RETURN_IF_ERROR(o.shared_memory_name.empty() ? cache.AllocatePrivate(config) : cache.CreateSegment(config));
  cache.InitBlocks();
  return cache;
}

void KvCache::InitBlocks() {
  const int64_t S = n_slots(), MB = blocks_per_slot_, NB = n_blocks();
  if (!paged()) {
    for (int64_t s = 0; s < S; ++s) {
      for (int64_t i = 0; i < MB; ++i) table_[s * MB + i] = s * MB + i;
      slot_blocks_[s] = MB;
    }
    *free_top_ = 0;
  } else {
    std::fill(table_, table_ + S * MB, int64_t{-1});
    std::fill(slot_blocks_, slot_blocks_ + S, int64_t{0});
    // Popped from the top: blocks 0, 1, 2, ... first.
    for (int64_t i = 0; i < NB; ++i) free_[i] = NB - 1 - i;
    *free_top_ = NB;
  }
  for (int64_t s = 0; s < S; ++s) SyncTable(s);
}

void KvCache::SyncTable(int64_t slot) {
  if (block_table_.device().is_cpu()) return;  // a view of table_
  const int64_t MB = blocks_per_slot_;
  at::Tensor row = at::from_blob(table_ + slot * MB, {MB}, at::TensorOptions().dtype(at::kLong));
  block_table_.select(0, slot).copy_(row);
}

Status KvCache::AllocatePrivate(const checkpoint::ModelConfig& config) {
  const KvCacheOptions& o = options_;
  // Everything here is an allocation, so any failure is kResourceExhausted.
  Status alloc = TorchBoundary("KV cache allocation failed", [&]() -> Status {
    auto opts = at::TensorOptions().device(o.device).dtype(o.dtype);
    auto kv_opts = opts.dtype(o.kv_dtype);
    for (int64_t l = 0; l < config.n_layers; ++l) {
      k_.push_back(at::zeros({o.n_blocks, config.n_kv_heads, o.block_tokens, config.head_dim()}, kv_opts));
      v_.push_back(at::zeros({o.n_blocks, config.n_kv_heads, o.block_tokens, config.head_dim()}, kv_opts));
    }
    exit_hidden_ = at::zeros({o.n_slots, o.max_draft_len + 1, config.dim}, opts);
    if (!o.device.is_cpu()) {
      block_table_ = at::full({o.n_slots, blocks_per_slot_}, -1, at::TensorOptions().device(o.device).dtype(at::kLong));
    }
    return OkStatus();
  });
  if (!alloc.ok()) return ResourceExhaustedError(alloc.message());
  const Layout layout = ComputeLayout(config, Resolve(config, o));
  // Only the words: K/V are the tensors above.
  storage_->private_words.assign(layout.k0 - layout.words, 0);
  BindWords(storage_->private_words.data());
  return OkStatus();
}

void KvCache::BindWords(char* words) {
  const int64_t S = n_slots();
  length_ = reinterpret_cast<int64_t*>(words);
  in_use_ = length_ + S;
  drafters_ = in_use_ + S;
  slot_blocks_ = drafters_ + S;
  free_top_ = slot_blocks_ + S;
  table_ = free_top_ + 1;
  free_ = table_ + S * blocks_per_slot_;
  if (!block_table_.defined()) {
    block_table_ = at::from_blob(table_, {S, blocks_per_slot_}, at::TensorOptions().dtype(at::kLong));
  }
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
  const Layout layout = ComputeLayout(config, Resolve(config, o));
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
  // ftruncate zero-fills: K/V, lengths and in-use flags start at 0; the
  // blocks are set by InitBlocks.
  if (on_cuda) {
    block_table_ = at::full({o.n_slots, blocks_per_slot_}, -1, at::TensorOptions().device(o.device).dtype(at::kLong));
  }
  BindWords(static_cast<char*>(base) + layout.words);
  auto opts = at::TensorOptions().dtype(o.dtype).device(o.device);
  auto kv_opts = opts.dtype(o.kv_dtype);
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
    const std::vector<int64_t> shape = {o.n_blocks, config.n_kv_heads, o.block_tokens, config.head_dim()};
    k_.push_back(at::from_blob(kv + (2 * l) * layout.layer_bytes, shape, kv_opts));
    v_.push_back(at::from_blob(kv + (2 * l + 1) * layout.layer_bytes, shape, kv_opts));
  }
  exit_hidden_ = at::from_blob(kv + (layout.exit_hidden - layout.k0), {o.n_slots, o.max_draft_len + 1, config.dim}, opts);
  return OkStatus();
}

namespace {

// What Attach checks of a segment's header against the attaching model and
// options (magic, layout version, fingerprint, dims, dtype, a geometry that
// Create could have made), and the pool's geometry.
// Errors: kFailedPrecondition naming the first field that differs.
StatusOr<Geometry> CheckPoolHeader(const PoolHeader& h, const checkpoint::ModelConfig& config,
                                   const KvCacheOptions& options) {
  auto mismatch = [&](const std::string& field, const std::string& got, const std::string& want) {
    return FailedPreconditionError("KV pool " + options.shared_memory_name + ": " + field + " is " + got +
                                   ", expected " + want);
  };
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0) return mismatch("magic", "unknown", "LEDEKV01");
  if (h.layout_version != kLayoutVersion) {
    return mismatch("layout version", std::to_string(h.layout_version), std::to_string(kLayoutVersion));
  }
  const std::string fp(h.fingerprint, strnlen(h.fingerprint, sizeof(h.fingerprint)));
  if (fp != config.ArchitectureFingerprint().substr(0, sizeof(h.fingerprint) - 1)) {
    return mismatch("model fingerprint", fp, config.ArchitectureFingerprint());
  }
  if (h.n_layers != config.n_layers || h.n_kv_heads != config.n_kv_heads || h.head_dim != config.head_dim() ||
      h.dim != config.dim) {
    return mismatch("dims", "different", "those of the model");
  }
  if (h.dtype != static_cast<int32_t>(options.dtype)) {
    return mismatch("dtype", std::to_string(h.dtype), std::to_string(static_cast<int>(options.dtype)));
  }
  // The K/V dtype is the pool's own (any the kernels read), unless the
  // caller names one.
  if (options.kv_dtype != c10::ScalarType::Undefined && h.kv_dtype != static_cast<int32_t>(options.kv_dtype)) {
    return mismatch("kv_dtype", std::to_string(h.kv_dtype), std::to_string(static_cast<int>(options.kv_dtype)));
  }
  if (h.kv_dtype != static_cast<int32_t>(c10::kFloat) && h.kv_dtype != static_cast<int32_t>(c10::kBFloat16) &&
      h.kv_dtype != h.dtype) {
    return mismatch("kv_dtype", std::to_string(h.kv_dtype), "float32, bfloat16 or the compute dtype");
  }
  KvCacheOptions pooled = options;
  pooled.n_slots = h.n_slots;
  pooled.capacity = h.capacity;
  pooled.block_tokens = h.block_tokens;
  pooled.n_blocks = h.n_blocks;
  pooled.max_draft_len = h.max_draft_len;
  pooled.kv_dtype = static_cast<c10::ScalarType>(h.kv_dtype);
  const Geometry g = Resolve(config, pooled);
  if (g.S <= 0 || g.C <= 0 || g.C > config.max_seq_len || g.P <= 0 || g.P > g.C || g.NB < g.MB ||
      g.NB > g.S * g.MB || g.D <= 0) {
    return mismatch("geometry", "out of range", "that of a pool Create makes");
  }
  return g;
}

}  // namespace

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
  LEDE_ASSIGN_OR_RETURN(const Geometry g, CheckPoolHeader(*h, config, options));
  const Layout layout = ComputeLayout(config, g);
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
  cache.options_.block_tokens = h->block_tokens;
  cache.options_.n_blocks = h->n_blocks;
  cache.options_.kv_dtype = g.kv_dtype;
  cache.blocks_per_slot_ = g.MB;
  cache.options_.max_draft_len = h->max_draft_len;
  cache.epoch_ = h->epoch;
  cache.storage_ = storage;
  char* p = static_cast<char*>(base);
  if (on_cuda) {
    // A device copy of the table would not see the blocks the creator gives
    // later: a paged CUDA pool lives in one process.
    if (g.NB < g.S * g.MB) return mismatch("paging", "paged", "backed in full (a CUDA pool shared across processes)");
    cache.block_table_ = at::from_blob(p + layout.words + (4 * g.S + 1) * 8, {g.S, g.MB},
                                       at::TensorOptions().dtype(at::kLong))
                             .to(cache.options_.device);
  }
  cache.BindWords(p + layout.words);
  auto opts = at::TensorOptions().dtype(options.dtype).device(cache.options_.device);
  auto kv_opts = opts.dtype(g.kv_dtype);
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
  const int64_t S = g.S, D = g.D;
  for (int64_t l = 0; l < config.n_layers; ++l) {
    const std::vector<int64_t> shape = {g.NB, config.n_kv_heads, g.P, config.head_dim()};
    cache.k_.push_back(at::from_blob(kv + (2 * l) * layout.layer_bytes, shape, kv_opts));
    cache.v_.push_back(at::from_blob(kv + (2 * l + 1) * layout.layer_bytes, shape, kv_opts));
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

StatusOr<int64_t> KvCache::Allocate(uint64_t session_id, int64_t reserve_tokens) {
  if (session_id == kNoSession) return InvalidArgumentError("session: 0 names no session");
  if (reserve_tokens < 0) {
    return InvalidArgumentError("reserve_tokens: must be >= 0 (0 = the capacity), got " + std::to_string(reserve_tokens));
  }
  std::unique_lock<std::mutex> lock(storage_->blocks_mu, std::defer_lock);
  int64_t need = 0;
  if (paged()) {
    lock.lock();
    ReclaimBlocks();
    const int64_t tokens = reserve_tokens == 0 ? capacity() : std::min(capacity(), reserve_tokens + max_draft_len() + 1);
    need = BlocksFor(tokens, block_tokens());
  }
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
    if (paged()) {
      ReleaseBlocks(s);  // a draft that ended after ReclaimBlocks looked
      if (!GrowSlot(s, need)) {
        return ResourceExhaustedError("KV blocks: the sequence needs " + std::to_string(need) + " blocks of " +
                                      std::to_string(block_tokens()) + " tokens, " + std::to_string(*free_top_) +
                                      " of the pool's " + std::to_string(n_blocks()) + " are free");
      }
    }
    length_[s] = 0;
    __atomic_store_n(&in_use_[s], static_cast<int64_t>(session_id), __ATOMIC_SEQ_CST);
    return s;
  }
  return ResourceExhaustedError("all " + std::to_string(n_slots()) + " KV slots are in use" +
                                (drafted_on ? " (a freed slot still has a draft of its last session running)" : ""));
}

bool KvCache::GrowSlot(int64_t slot, int64_t n) {
  int64_t& held = slot_blocks_[slot];
  if (n <= held) return true;
  if (n - held > *free_top_) return false;
  int64_t* row = table_ + slot * blocks_per_slot_;
  for (; held < n; ++held) row[held] = free_[--*free_top_];
  SyncTable(slot);
  return true;
}

void KvCache::ReleaseBlocks(int64_t slot) {
  int64_t& held = slot_blocks_[slot];
  if (held == 0) return;
  int64_t* row = table_ + slot * blocks_per_slot_;
  for (; held > 0; --held) {
    free_[(*free_top_)++] = row[held - 1];
    row[held - 1] = -1;
  }
  SyncTable(slot);
}

void KvCache::ReclaimBlocks() {
  for (int64_t s = 0; s < n_slots(); ++s) {
    if (slot_blocks_[s] > 0 && session(s) == kNoSession && n_drafting(s) == 0) ReleaseBlocks(s);
  }
}

int64_t KvCache::n_free_blocks() const { return paged() ? __atomic_load_n(free_top_, __ATOMIC_SEQ_CST) : 0; }

int64_t KvCache::mapped_tokens(int64_t slot) const {
  return std::min(capacity(), slot_blocks_[slot] * block_tokens());
}

int64_t KvCache::RowOf(int64_t slot, int64_t position, int64_t kv_head) const {
  const int64_t P = block_tokens();
  const int64_t block = table_[slot * blocks_per_slot_ + position / P];
  TORCH_CHECK(block >= 0, "KV position ", position, " of slot ", slot, " has no block (the sequence outgrew the ",
              "tokens it reserved)");
  return (block * k_[0].size(1) + kv_head) * P + position % P;
}

Status KvCache::Free(int64_t slot) {
  if (slot < 0 || slot >= n_slots() || session(slot) == kNoSession) {
    return InvalidArgumentError("KV slot " + std::to_string(slot) + " is not allocated");
  }
  __atomic_store_n(&in_use_[slot], static_cast<int64_t>(kNoSession), __ATOMIC_SEQ_CST);
  length_[slot] = 0;
  if (paged()) {
    // A draft that began before the session word was cleared may still write
    // into the blocks: they go back when it ends (ReclaimBlocks).
    std::lock_guard<std::mutex> lock(storage_->blocks_mu);
    if (n_drafting(slot) == 0) ReleaseBlocks(slot);
  }
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
  const int64_t want = std::min(capacity(), new_length + max_draft_len() + 1);
  if (paged() && mapped_tokens(slot) < want) {
    // The committed positions must have blocks; the room for the next draft
    // is given as far as blocks are free.
    std::lock_guard<std::mutex> lock(storage_->blocks_mu);
    const int64_t P = block_tokens();
    for (int64_t n = BlocksFor(want, P); n > slot_blocks_[slot] && !GrowSlot(slot, n);) --n;
    if (mapped_tokens(slot) < new_length) {
      return ResourceExhaustedError("KV blocks: commit to " + std::to_string(new_length) + " tokens outgrew the " +
                                    std::to_string(mapped_tokens(slot)) + " the sequence holds, and none of the " +
                                    "pool's " + std::to_string(n_blocks()) + " blocks is free");
    }
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
