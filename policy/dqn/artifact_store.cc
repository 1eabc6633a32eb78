#include "policy/dqn/artifact_store.h"

#include <filesystem>
#include <random>
#include <string>
#include <system_error>
#include <vector>

#include "policy/dqn/artifact.h"
#include "shared/file/file.h"
#include "shared/status/status_macros.h"

namespace lede::policy::dqn {
namespace fs = std::filesystem;
namespace {

// Loads `dir` and checks that its metadata names `version`.
Status CheckVersionDir(const std::string& dir, const std::string& version, const std::string& fingerprint) {
  LEDE_ASSIGN_OR_RETURN(Artifact artifact, LoadArtifact(dir, fingerprint));
  if (artifact.metadata.version != version) {
    return InvalidArgumentError(dir + ": policy.json names version \"" + artifact.metadata.version +
                                "\", not \"" + version + "\"");
  }
  return OkStatus();
}

}  // namespace

Status UploadVersion(storage::ObjectStore& store, const std::string& local_root, const std::string& version,
                     bool set_serving, const std::string& expected_fingerprint) {
  LEDE_RETURN_IF_ERROR(ValidateVersionName(version));
  const std::string dir = VersionDir(local_root, version);
  LEDE_RETURN_IF_ERROR(CheckVersionDir(dir, version, expected_fingerprint));
  std::vector<std::string> files;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && name[0] != '.' && name != kMetadataFile) files.push_back(name);
  }
  if (ec) return InternalError(dir + ": " + ec.message());
  files.push_back(kMetadataFile);  // last: its presence marks the version whole
  for (const std::string& name : files) {
    LEDE_ASSIGN_OR_RETURN(std::string bytes, file::ReadFile((fs::path(dir) / name).string()));
    LEDE_RETURN_IF_ERROR(store.Put(version + "/" + name, bytes));
  }
  if (set_serving) LEDE_RETURN_IF_ERROR(store.Put(kServingFile, version + "\n"));
  return OkStatus();
}

StatusOr<std::string> MirrorServingVersion(storage::ObjectStore& store, const std::string& mirror_root,
                                           const std::string& expected_fingerprint) {
  LEDE_ASSIGN_OR_RETURN(std::string pointer, store.Get(kServingFile));
  LEDE_ASSIGN_OR_RETURN(const std::string version, ParseServingPointer(pointer, store.url() + " SERVING"));
  const std::string dir = VersionDir(mirror_root, version);
  std::error_code ec;
  if (!fs::exists(fs::path(dir) / kMetadataFile, ec)) {
    // Download into a hidden directory, validate, then rename into place.
    LEDE_ASSIGN_OR_RETURN(std::vector<storage::ObjectInfo> objects, store.List(version + "/"));
    bool has_metadata = false;
    for (const storage::ObjectInfo& o : objects) has_metadata |= o.key == version + "/" + kMetadataFile;
    if (!has_metadata) {
      return NotFoundError(store.url() + ": version " + version + " has no " + kMetadataFile +
                           " (an upload in progress?)");
    }
    const std::string tmp =
        (fs::path(mirror_root) / (".download-" + version + "-" + std::to_string(std::random_device{}()))).string();
    fs::create_directories(tmp, ec);
    if (ec) return InternalError(tmp + ": " + ec.message());
    auto fail = [&](Status s) {
      fs::remove_all(tmp, ec);
      return s;
    };
    for (const storage::ObjectInfo& o : objects) {
      const std::string name = o.key.substr(version.size() + 1);
      if (name.empty() || name.find('/') != std::string::npos) continue;  // only the version's own files
      StatusOr<std::string> bytes = store.Get(o.key);
      if (!bytes.ok()) return fail(bytes.status());
      if (Status s = file::WriteFileAtomically((fs::path(tmp) / name).string(), *bytes); !s.ok()) return fail(s);
    }
    if (Status s = CheckVersionDir(tmp, version, expected_fingerprint); !s.ok()) {
      return fail(Status(s.code(), store.url() + " version " + version + ": " + std::string(s.message())));
    }
    fs::rename(tmp, dir, ec);
    if (ec) return fail(InternalError("rename " + tmp + " -> " + dir + ": " + ec.message()));
    file::SyncDirectory(mirror_root);
  }
  StatusOr<std::string> current = ResolveServingVersion(mirror_root);
  if (!current.ok() || *current != version) {
    LEDE_RETURN_IF_ERROR(PublishServingVersion(mirror_root, version, expected_fingerprint));
  }
  return version;
}

}  // namespace lede::policy::dqn
