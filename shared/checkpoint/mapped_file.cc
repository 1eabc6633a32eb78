#include "shared/checkpoint/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "shared/status/status_macros.h"

namespace lede::checkpoint {
namespace {

std::string ErrnoString(int err) { return std::strerror(err); }

// Live mappings (ReleaseMappedPages): start address -> size in bytes.
std::mutex& RegistryMutex() {
  static std::mutex mu;
  return mu;
}
std::map<uintptr_t, size_t>& Registry() {
  static std::map<uintptr_t, size_t> live;
  return live;
}

}  // namespace

StatusOr<std::shared_ptr<const MappedFile>> MappedFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) {
      return NotFoundError(path + ": no such file");
    }
    if (err == EACCES) {
      return Status(StatusCode::kPermissionDenied, path + ": " + ErrnoString(err));
    }
    return InternalError(path + ": open failed: " + ErrnoString(err));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return InternalError(path + ": fstat failed: " + ErrnoString(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgumentError(path + ": not a regular file");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* data = nullptr;
  if (size > 0) {
    data = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (data == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return InternalError(path + ": mmap failed: " + ErrnoString(err));
    }
  }
  ::close(fd);  // the mapping stays valid
  if (data != nullptr) {
    std::lock_guard<std::mutex> lock(RegistryMutex());
    Registry()[reinterpret_cast<uintptr_t>(data)] = size;
  }
  return std::shared_ptr<const MappedFile>(new MappedFile(data, size));
}

MappedFile::~MappedFile() {
  if (data_ == nullptr) return;
  std::lock_guard<std::mutex> lock(RegistryMutex());  // unregistered and unmapped together
  Registry().erase(reinterpret_cast<uintptr_t>(data_));
  ::munmap(data_, size_);
}

bool ReleaseMappedPages(const void* data, size_t size) {
  if (data == nullptr || size == 0) return false;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  const uintptr_t end = begin + size;
  std::lock_guard<std::mutex> lock(RegistryMutex());
  auto& live = Registry();
  auto it = live.upper_bound(begin);
  if (it == live.begin()) return false;
  --it;
  if (end > it->first + it->second) return false;  // not inside this mapping
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = (begin + page - 1) / page * page;  // whole pages inside the range only
  const uintptr_t last = end / page * page;
  if (last <= first) return false;
  return ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED) == 0;
}

Status WriteZeros(AtomicFile& out, size_t n) {
  static const std::vector<uint8_t> zeros(1 << 16, 0);
  while (n > 0) {
    const size_t k = std::min(n, zeros.size());
    LEDE_RETURN_IF_ERROR(out.Append(zeros.data(), k));
    n -= k;
  }
  return OkStatus();
}

}  // namespace lede::checkpoint
