#include "shared/storage/local_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "shared/file/file.h"
#include "shared/status/status_macros.h"

namespace lede::storage {
namespace {

namespace fs = std::filesystem;

Status ErrnoError(const std::string& what, const std::string& path, int err) {
  return InternalError(what + " " + path + ": " + std::strerror(err));
}

}  // namespace

StatusOr<std::unique_ptr<LocalStore>> LocalStore::Open(const std::string& root) {
  std::error_code ec;
  fs::path abs = fs::absolute(root, ec);
  if (ec) return InternalError("cannot resolve object store directory " + root + ": " + ec.message());
  abs = abs.lexically_normal();
  std::string s = abs.string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  fs::create_directories(s, ec);
  if (ec) return InternalError("cannot create object store directory " + s + ": " + ec.message());
  if (!fs::is_directory(s, ec)) return InternalError("object store path is not a directory: " + s);
  return std::unique_ptr<LocalStore>(new LocalStore(std::move(s)));
}

Status LocalStore::Put(std::string_view key, std::string_view bytes) {
  LEDE_RETURN_IF_ERROR(ValidateKey(key));
  const fs::path path = fs::path(root_) / std::string(key);
  const fs::path dir = path.parent_path();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return InternalError("cannot create directory " + dir.string() + ": " + ec.message());
  // file::WriteFileAtomically's temporary file is hidden (invisible to
  // List()) and in the same folder; it fsyncs the file and the folder.
  // Objects hold users' data (experience records): owner read-write, group
  // read (a trainer in the deployment's group), nothing for others.
  return file::WriteFileAtomically(path.string(), bytes, kObjectFileMode);
}

StatusOr<std::string> LocalStore::Get(std::string_view key) {
  LEDE_RETURN_IF_ERROR(ValidateKey(key));
  const std::string path = (fs::path(root_) / std::string(key)).string();
  StatusOr<std::string> bytes = file::ReadFile(path);
  if (!bytes.ok() && bytes.status().code() == StatusCode::kNotFound) {
    return NotFoundError("no object \"" + std::string(key) + "\" in " + url());
  }
  return bytes;
}

StatusOr<std::vector<ObjectInfo>> LocalStore::List(std::string_view prefix) {
  LEDE_RETURN_IF_ERROR(ValidatePrefix(prefix));
  // Walk only the deepest folder the prefix names in full.
  const size_t slash = prefix.rfind('/');
  const std::string start_rel = slash == std::string_view::npos ? "" : std::string(prefix.substr(0, slash));
  const fs::path start = start_rel.empty() ? fs::path(root_) : fs::path(root_) / start_rel;
  std::vector<ObjectInfo> out;
  std::error_code ec;
  if (!fs::is_directory(start, ec)) return out;
  fs::recursive_directory_iterator it(start, fs::directory_options::skip_permission_denied, ec);
  if (ec) return InternalError("cannot list " + start.string() + ": " + ec.message());
  const size_t root_len = root_.size() + 1;  // root + '/'
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) break;
    const fs::path& p = it->path();
    const std::string name = p.filename().string();
    std::error_code type_ec;
    if (!name.empty() && name.front() == '.') {  // temporary files, hidden folders
      if (it->is_directory(type_ec)) it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file(type_ec)) continue;
    const std::string full = p.string();
    if (full.size() <= root_len) continue;
    std::string key = full.substr(root_len);
    if (key.compare(0, prefix.size(), prefix) != 0) continue;
    struct stat st;
    if (::stat(full.c_str(), &st) != 0) continue;  // removed while listing
    ObjectInfo info;
    info.key = std::move(key);
    info.size_bytes = static_cast<int64_t>(st.st_size);
    info.modified = absl::TimeFromTimespec(st.st_mtim);
    out.push_back(std::move(info));
  }
  if (ec) return InternalError("cannot list " + start.string() + ": " + ec.message());
  std::sort(out.begin(), out.end(),
            [](const ObjectInfo& a, const ObjectInfo& b) { return a.key < b.key; });
  return out;
}

Status LocalStore::Delete(std::string_view key) {
  LEDE_RETURN_IF_ERROR(ValidateKey(key));
  const std::string path = (fs::path(root_) / std::string(key)).string();
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoError("cannot delete", path, errno);
  return OkStatus();
}

StatusOr<StaleTemporaries> LocalStore::RemoveStaleTemporaries(std::string_view prefix) {
  LEDE_RETURN_IF_ERROR(ValidatePrefix(prefix));
  const size_t slash = prefix.rfind('/');
  const std::string rel = slash == std::string_view::npos ? "" : std::string(prefix.substr(0, slash));
  const std::string dir = rel.empty() ? root_ : (fs::path(root_) / rel).string();
  const file::StaleTempFiles removed = file::RemoveStaleTempFiles(dir, file::ProcessStartTime());
  return StaleTemporaries{removed.files, removed.bytes};
}

std::string LocalStore::url() const { return "file://" + root_; }

}  // namespace lede::storage
