// File: shared/storage/object_store.h
//
// ObjectStore: the one interface through which LEDE keeps data that lasts
// (docs/design.md §3 "object store", §5): experience shards, policy artifacts.
// Two backends sit behind it, chosen by URL with OpenObjectStore():
//   - a local directory (the default; embedded, zero set-up), local_store.h;
//   - any S3-compatible store (AWS, MinIO, Ceph, s3rver), s3_store.h.
// Torch-free and protobuf-free.
//
// Keys are '/'-separated relative paths ("experience/2024-05-01/a-1.lexp"),
// with the same meaning in every backend. A valid key is non-empty, has no
// leading or trailing '/', no empty component ("a//b"), no component that
// starts with '.' (so no "." or "..", and no hidden names: the local backend
// keeps its temporary files under such names), and no NUL byte.
//
// Example:
//   LEDE_ASSIGN_OR_RETURN(std::unique_ptr<storage::ObjectStore> store,
//                         storage::OpenObjectStore("s3://bucket/lede?region=eu-west-1"));
//   LEDE_RETURN_IF_ERROR(store->Put("experience/x.lexp", bytes));
//   LEDE_ASSIGN_OR_RETURN(std::vector<storage::ObjectInfo> objects,
//                         store->List("experience/"));
#ifndef LEDE_SHARED_STORAGE_OBJECT_STORE_H_
#define LEDE_SHARED_STORAGE_OBJECT_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/time/time.h"
#include "shared/status/status.h"

namespace lede::storage {

// One object as List() reports it.
struct ObjectInfo {
  std::string key;         // relative to the store's root (or URL prefix)
  int64_t size_bytes = 0;  // object size, in bytes
  // When the object was last written (local: the file's mtime; S3: the
  // listing's LastModified); InfinitePast() if the backend did not say.
  absl::Time modified = absl::InfinitePast();
};

// What ObjectStore::RemoveStaleTemporaries() removed.
struct StaleTemporaries {
  int64_t files = 0;  // leftover temporary files removed
  int64_t bytes = 0;  // their total size, in bytes
};

// OK if `key` is a valid object key (file comment), else kInvalidArgument
// naming the key and the rule it breaks.
Status ValidateKey(std::string_view key);

// Like ValidateKey() for a List() prefix: "" and a trailing '/' are allowed.
Status ValidatePrefix(std::string_view prefix);

// A flat namespace of immutable-once-written objects addressed by key.
//
// Atomicity: an object is visible to Get() and List() only once Put() has
// written all of it; readers never see a partial object, even if the writer
// crashes mid-Put (the local backend writes a hidden temporary file and
// renames it; an S3 PUT is atomic). A Put() over an existing key replaces it
// whole.
// Thread-safety: every backend is safe to use from many threads at once.
// Errors common to all methods: kInvalidArgument for an invalid key or
// prefix (see the file comment), naming it; kUnavailable when a remote store
// cannot be reached or answers 5xx (retrying may help); kPermissionDenied
// when it refuses the credentials.
class ObjectStore {
 public:
  virtual ~ObjectStore() = default;

  // Stores `bytes` under `key`, replacing any object there, atomically (see
  // the class comment). On failure no partial object is visible and the old
  // object, if any, is unchanged. Errors: also kInternal on a local I/O
  // failure, naming the file and the system error.
  virtual Status Put(std::string_view key, std::string_view bytes) = 0;

  // The bytes of the object `key`. Errors: kNotFound if there is none.
  virtual StatusOr<std::string> Get(std::string_view key) = 0;

  // Every object whose key starts with `prefix` (a plain string prefix, as
  // in S3: "exp/2024" matches "exp/2024-05-01/a.lexp"; use a trailing '/'
  // to mean a folder), sorted by key (byte order). "" lists everything.
  // Remote listings are fetched page by page until complete. A missing
  // prefix gives an empty list, not an error. `prefix` follows the key rules
  // except that it may be empty or end with '/'.
  virtual StatusOr<std::vector<ObjectInfo>> List(std::string_view prefix) = 0;

  // Removes the object `key`. Deleting a key that does not exist is OK (as
  // in S3), so Delete() is idempotent.
  virtual Status Delete(std::string_view key) = 0;

  // Removes what writers that died in the middle of a Put() left behind
  // under `prefix` (a List() prefix, naming a folder or ""): for the local
  // backend the hidden temporary files of writers no longer alive and older
  // than this process (file::RemoveStaleTempFiles()); an S3 PUT leaves
  // nothing, so the default does nothing. A writer calls it when it starts
  // (ExperienceLogger::Create()). Never touches a live writer's file or any
  // visible object. Best effort: files that cannot be removed are skipped.
  // Errors: kInvalidArgument for an invalid prefix.
  virtual StatusOr<StaleTemporaries> RemoveStaleTemporaries(std::string_view prefix) {
    if (Status s = ValidatePrefix(prefix); !s.ok()) return s;
    return StaleTemporaries{};
  }

  // The store's normalized URL ("file:///abs/dir", "s3://bucket/prefix?..."),
  // without credentials; OpenObjectStore(url()) opens the same store.
  virtual std::string url() const = 0;
};

// Opens the store at `url`:
//   "file:///abs/dir" or a plain path "dir", "/abs/dir" → a local directory,
//       created (with its parents) if missing;
//   "s3://bucket[/prefix][?endpoint=URL&region=R&max_keys=N]" → an S3
//       bucket, keys living under "prefix/". The endpoint (default: AWS,
//       virtual-host style) and region (default us-east-1) come from the URL
//       query, else from $AWS_ENDPOINT_URL_S3 / $AWS_ENDPOINT_URL and
//       $AWS_REGION / $AWS_DEFAULT_REGION; credentials from
//       $AWS_ACCESS_KEY_ID, $AWS_SECRET_ACCESS_KEY and optional
//       $AWS_SESSION_TOKEN (requests are unsigned when neither key is set).
//       max_keys (1..1000, default 1000) is the List() page size.
// Nothing is contacted: an unreachable S3 endpoint shows up on first use.
// Errors: kInvalidArgument naming the url if it is malformed (empty, unknown
// scheme, "file://" without an absolute path, bad bucket name, unknown query
// parameter, bad max_keys), or if only one of the two AWS keys is set;
// kInternal (local) if the directory cannot be created or is not a
// directory.
StatusOr<std::unique_ptr<ObjectStore>> OpenObjectStore(std::string_view url);

}  // namespace lede::storage

#endif  // LEDE_SHARED_STORAGE_OBJECT_STORE_H_
