// File: shared/file/file.h
//
// Whole-file reads and the project's one durable atomic write, shared by the
// checkpoint writers, the policy artifacts, the local object store, the
// experience shards and the tools. Torch-free, Abseil-free (the engine-only
// build uses it too).
//
// Atomic write protocol (AtomicFileWriter, WriteFileAtomically):
//   1. create a unique hidden temporary file in the destination's directory,
//      "<dir>/.<name>.tmp-<pid>-<n>" (same file system, so rename() is
//      atomic; hidden, so directory listings skip it);
//   2. write the bytes;
//   3. fsync the file, close it;
//   4. rename it over the destination;
//   5. fsync the directory, so the rename survives a crash (best effort:
//      some file systems refuse to open or sync a directory).
// Readers see either the old content or the new, never a partial file.
//
// A writer killed between steps 1 and 4 (kill -9, power loss) leaves its
// temporary file behind; RemoveStaleTempFiles() removes those of writers
// that are gone, and the writers' owners call it at start (LocalStore via
// ObjectStore::RemoveStaleTemporaries(), so the experience logger's).
#ifndef LEDE_SHARED_FILE_FILE_H_
#define LEDE_SHARED_FILE_FILE_H_

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <memory>
#include <string>
#include <string_view>

#include "shared/status/status.h"

namespace lede::file {

// The bytes of `path`. Errors: kNotFound if it is not a regular file or
// cannot be opened; kInternal on a read error.
StatusOr<std::string> ReadFile(const std::string& path);

// A file written in pieces and published atomically by Commit() (steps 1-5
// above). Until Commit() succeeds the destination is unchanged; a writer
// destroyed without a successful Commit() removes its temporary file.
//
// Example:
//   LEDE_ASSIGN_OR_RETURN(auto out, file::AtomicFileWriter::Create(path));
//   LEDE_RETURN_IF_ERROR(out->Append(header));
//   LEDE_RETURN_IF_ERROR(out->Append(body));
//   LEDE_RETURN_IF_ERROR(out->Commit());
//
// Thread-safety: not thread-safe; one writer per thread. Distinct writers to
// the same destination do not collide (unique temporary names); the last
// Commit() wins.
class AtomicFileWriter {
 public:
  // Creates the temporary file beside `path`. The destination's directory
  // must exist. Errors: kInternal naming the temporary file and the system
  // error (e.g. the directory is missing or not writable); kInvalidArgument
  // if `path` has no file name. `mode`: the file's permission bits (before
  // the umask; 0600 or 0640 for data that holds users' requests).
  static StatusOr<std::unique_ptr<AtomicFileWriter>> Create(const std::string& path, mode_t mode = 0644);

  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();

  // Appends `bytes`. Errors: kInternal naming the temporary file and the
  // system error; kFailedPrecondition after Commit() or a failed Commit().
  Status Append(std::string_view bytes);
  Status Append(const void* data, size_t n) {
    return Append(std::string_view(static_cast<const char*>(data), n));
  }

  // fsync, close, rename over the destination, fsync the directory. Call at
  // most once. On failure the temporary file is removed and the destination
  // is unchanged. Errors: kInternal naming the file and the system error;
  // kFailedPrecondition if called twice.
  Status Commit();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }

 private:
  AtomicFileWriter(std::string path, std::string temp_path, int fd);
  void Discard();

  std::string path_;
  std::string temp_path_;
  int fd_;
  bool done_ = false;  // Commit() was called (successfully or not)
};

// Writes `bytes` to `path` with AtomicFileWriter in one go. On failure `path`
// is left as it was and no temporary file remains. Errors: kInternal naming
// the file and the system error.
// `mode`: the new file's permission bits (before the umask).
Status WriteFileAtomically(const std::string& path, std::string_view bytes, mode_t mode = 0644);

// The pid of the writer that made temporary file `filename` (a bare name,
// no directory), if it has the form ".<name>.tmp-<pid>-<n>" with a non-empty
// <name> and decimal <pid> and <n>; else -1. Example:
// ".a-00000001.lexp.tmp-4242-7" -> 4242; "a.lexp" -> -1.
int64_t TempFileWriterPid(std::string_view filename);

// The time this process started (captured when the program loads), on the
// system clock at its full (nanosecond) resolution: no temporary file
// modified before it can belong to a writer of this process.
std::chrono::system_clock::time_point ProcessStartTime();

// What RemoveStaleTempFiles() removed.
struct StaleTempFiles {
  int64_t files = 0;  // temporary files removed
  int64_t bytes = 0;  // their total size, in bytes
};

// Removes, under directory `dir` and all its sub-folders, every temporary
// file of AtomicFileWriter (TempFileWriterPid() >= 0) that is stale: last
// modified before `older_than` (compared at the file system's timestamp
// resolution, not in whole seconds: a writer killed and restarted within
// one second left a file older than its successor; callers pass
// ProcessStartTime(), "older than this writer's own lifetime") AND whose
// writer pid is not a live process other than this one (kill(pid, 0) fails
// with ESRCH, or pid is this process's own, which then is a previous process
// that had the same pid, as pid 1 in a container after a restart). A live
// writer's in-progress file is therefore never touched: its pid is alive or
// it is newer than `older_than`. Assumes the writers share this host's pid
// namespace (a directory shared across hosts keeps files whose pid happens
// to be alive here; they are removed by a later start once it is not).
// Best effort: a missing `dir` gives {0, 0}; files that vanish meanwhile or
// cannot be removed are skipped; never fails.
// Thread-safety: safe to call from many threads and processes at once.
StaleTempFiles RemoveStaleTempFiles(const std::string& dir, std::chrono::system_clock::time_point older_than);

// fsync of directory `dir` (best effort, see step 5); "" means ".".
void SyncDirectory(const std::string& dir);

}  // namespace lede::file

#endif  // LEDE_SHARED_FILE_FILE_H_
