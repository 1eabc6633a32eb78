// File: shared/storage/local_store.h
//
// LocalStore: an ObjectStore on a local directory (docs/design.md §3: the default
// object store, embedded and with zero set-up). Key "a/b.lexp" is the file
// <root>/a/b.lexp; folders are created on demand.
#ifndef LEDE_SHARED_STORAGE_LOCAL_STORE_H_
#define LEDE_SHARED_STORAGE_LOCAL_STORE_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "shared/status/status.h"
#include "shared/storage/object_store.h"

namespace lede::storage {

// Put() writes a temporary file named ".<name>.tmp-<pid>-<n>" in the target
// folder, fsyncs it, renames it over <name> and fsyncs the folder, so a
// crash at any point leaves either the old object or the new one; List()
// never reports names that start with '.' (temporary files of a writer that
// died stay invisible; RemoveStaleTemporaries() removes them, and the
// experience logger calls it at start). List() reports each file's mtime as
// ObjectInfo::modified. Empty folders left by Delete() are kept.
// Thread-safety: thread-safe; concurrent Put()s of one key leave one of the
// values whole. Several processes may share one root.
class LocalStore : public ObjectStore {
 public:
  // Permission bits of every object written (experience shards
  // hold users' token ids; never world-readable). Folders are created 0755
  // minus the umask as before; tighten the root's own mode to hide names.
  static constexpr unsigned kObjectFileMode = 0640;

  // Opens `root` (relative paths are made absolute), creating it and its
  // parents if missing. Errors: kInternal if it cannot be created or exists
  // and is not a directory, naming it.
  static StatusOr<std::unique_ptr<LocalStore>> Open(const std::string& root);

  Status Put(std::string_view key, std::string_view bytes) override;
  StatusOr<std::string> Get(std::string_view key) override;
  StatusOr<std::vector<ObjectInfo>> List(std::string_view prefix) override;
  Status Delete(std::string_view key) override;
  // Removes the temporary files under <root>/<prefix's folder> whose writer
  // is gone and that are older than this process
  // (file::RemoveStaleTempFiles(dir, file::ProcessStartTime())).
  StatusOr<StaleTemporaries> RemoveStaleTemporaries(std::string_view prefix) override;
  // "file://" + the absolute root.
  std::string url() const override;

  // The absolute root directory.
  const std::string& root() const { return root_; }

 private:
  explicit LocalStore(std::string root) : root_(std::move(root)) {}
  std::string root_;
};

}  // namespace lede::storage

#endif  // LEDE_SHARED_STORAGE_LOCAL_STORE_H_
