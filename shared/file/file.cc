#include "shared/file/file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

namespace lede::file {

namespace fs = std::filesystem;

namespace {

Status SystemError(const std::string& what, const std::string& path, int err) {
  return InternalError(path + ": " + what + ": " + std::strerror(err));
}

// Captured at load time, before main().
const std::chrono::system_clock::time_point g_process_start = std::chrono::system_clock::now();

bool AllDigits(std::string_view s) {
  if (s.empty() || s.size() > 18) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

// Whether `pid` names a live process other than this one.
bool OtherProcessAlive(int64_t pid) {
  if (pid <= 0 || pid > INT32_MAX) return false;
  if (pid == static_cast<int64_t>(::getpid())) return false;
  if (::kill(static_cast<pid_t>(pid), 0) == 0) return true;
  return errno != ESRCH;  // EPERM: alive, owned by someone else
}

}  // namespace

int64_t TempFileWriterPid(std::string_view filename) {
  if (filename.size() < 2 || filename.front() != '.') return -1;
  const size_t tmp = filename.rfind(".tmp-");
  if (tmp == std::string_view::npos || tmp < 2) return -1;  // needs a non-empty <name>
  const std::string_view rest = filename.substr(tmp + 5);
  const size_t dash = rest.find('-');
  if (dash == std::string_view::npos) return -1;
  const std::string_view pid = rest.substr(0, dash);
  if (!AllDigits(pid) || !AllDigits(rest.substr(dash + 1))) return -1;
  return std::stoll(std::string(pid));
}

std::chrono::system_clock::time_point ProcessStartTime() { return g_process_start; }

StaleTempFiles RemoveStaleTempFiles(const std::string& dir, std::chrono::system_clock::time_point older_than) {
  StaleTempFiles removed;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return removed;
  fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec);
  if (ec) return removed;
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) break;
    const std::string name = it->path().filename().string();
    const int64_t pid = TempFileWriterPid(name);
    if (pid < 0) continue;
    const std::string path = it->path().string();
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    const auto modified = std::chrono::system_clock::time_point(std::chrono::duration_cast<
        std::chrono::system_clock::duration>(std::chrono::seconds(st.st_mtim.tv_sec) +
                                             std::chrono::nanoseconds(st.st_mtim.tv_nsec)));
    if (modified >= older_than || OtherProcessAlive(pid)) continue;
    if (::unlink(path.c_str()) == 0) {
      ++removed.files;
      removed.bytes += static_cast<int64_t>(st.st_size);
    }
  }
  return removed;
}

StatusOr<std::string> ReadFile(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return NotFoundError(path + ": no such file");
  std::ifstream f(path, std::ios::binary);
  if (!f) return NotFoundError(path + ": cannot open");
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return InternalError(path + ": read error");
  return ss.str();
}

void SyncDirectory(const std::string& dir) {
  const std::string d = dir.empty() ? "." : dir;
  const int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::fsync(fd);
  ::close(fd);
}

StatusOr<std::unique_ptr<AtomicFileWriter>> AtomicFileWriter::Create(const std::string& path, mode_t mode) {
  static std::atomic<uint64_t> counter{0};
  const fs::path p(path);
  const std::string name = p.filename().string();
  if (name.empty()) return InvalidArgumentError(path + ": not a file name");
  const std::string temp = (p.parent_path() / ("." + name + ".tmp-" + std::to_string(::getpid()) + "-" +
                                               std::to_string(counter++)))
                               .string();
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) return SystemError("cannot create", temp, errno);
  return std::unique_ptr<AtomicFileWriter>(new AtomicFileWriter(path, temp, fd));
}

AtomicFileWriter::AtomicFileWriter(std::string path, std::string temp_path, int fd)
    : path_(std::move(path)), temp_path_(std::move(temp_path)), fd_(fd) {}

AtomicFileWriter::~AtomicFileWriter() { Discard(); }

void AtomicFileWriter::Discard() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
    ::unlink(temp_path_.c_str());
  }
}

Status AtomicFileWriter::Append(std::string_view bytes) {
  if (done_ || fd_ < 0) return FailedPreconditionError(path_ + ": Append() after Commit()");
  const char* p = bytes.data();
  size_t n = bytes.size();
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      return SystemError("write failed", temp_path_, errno);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return OkStatus();
}

Status AtomicFileWriter::Commit() {
  if (done_ || fd_ < 0) return FailedPreconditionError(path_ + ": Commit() called twice");
  done_ = true;
  if (::fsync(fd_) != 0) {
    const int err = errno;
    Discard();
    return SystemError("fsync failed", temp_path_, err);
  }
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(temp_path_.c_str());
    return SystemError("close failed", temp_path_, err);
  }
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp_path_.c_str());
    return SystemError("rename from " + temp_path_ + " failed", path_, err);
  }
  SyncDirectory(fs::path(path_).parent_path().string());
  return OkStatus();
}

Status WriteFileAtomically(const std::string& path, std::string_view bytes, mode_t mode) {
  StatusOr<std::unique_ptr<AtomicFileWriter>> out = AtomicFileWriter::Create(path, mode);
  if (!out.ok()) return out.status();
  if (Status s = (*out)->Append(bytes); !s.ok()) return s;
  return (*out)->Commit();
}

}  // namespace lede::file
