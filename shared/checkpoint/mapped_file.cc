#include "shared/checkpoint/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "shared/status/status_macros.h"

namespace lede::checkpoint {
namespace {

std::string ErrnoString(int err) { return std::strerror(err); }

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
  return std::shared_ptr<const MappedFile>(new MappedFile(data, size));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(data_, size_);
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
