// File: shared/checkpoint/mapped_file.h
//
// The two file primitives of checkpoint readers and writers, torch-free:
// a read-only memory mapping of a whole file (the engine wraps float32 data
// in place, zero copy), and a streamed atomic write (a temporary file in the
// destination's directory, renamed over it on Commit()).
#ifndef LEDE_SHARED_CHECKPOINT_MAPPED_FILE_H_
#define LEDE_SHARED_CHECKPOINT_MAPPED_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "shared/status/status.h"

namespace lede::checkpoint {

// Read-only memory mapping (MAP_PRIVATE, PROT_READ) of a whole file.
// Immutable after Open; share it (shared_ptr) with whatever points into it:
// the mapping lives as long as its last owner. Writing through data()
// faults (SIGSEGV).
class MappedFile {
 public:
  // Errors: kNotFound if `path` does not exist; kInvalidArgument if it is not
  // a regular file; kPermissionDenied; kInternal if open, fstat or mmap fails.
  static StatusOr<std::shared_ptr<const MappedFile>> Open(const std::string& path);

  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return static_cast<const uint8_t*>(data_); }
  size_t size() const { return size_; }  // bytes

 private:
  MappedFile(void* data, size_t size) : data_(data), size_(size) {}
  void* data_;
  size_t size_;
};

// A file written in pieces and published whole: Create() makes a temporary
// file beside `path` (mode 0644), Write()s append to it, Commit() fsyncs,
// closes and renames it over `path`. Destroyed uncommitted, the temporary
// file is removed and `path` is untouched.
// Thread-safety: one writer per object.
class AtomicFile {
 public:
  // Errors: kInternal if the temporary file cannot be created.
  static StatusOr<std::unique_ptr<AtomicFile>> Create(const std::string& path);

  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();

  // Appends n bytes. Errors: kInternal on a failed write.
  Status Write(const void* data, size_t n);
  // Appends n zero bytes. Errors: kInternal on a failed write.
  Status WriteZeros(size_t n);
  // fsync, close, rename over the destination. Errors: kInternal (the
  // destination is then untouched).
  Status Commit();

 private:
  AtomicFile(std::string path, std::string tmp, int fd)
      : path_(std::move(path)), tmp_(std::move(tmp)), fd_(fd) {}
  std::string path_;
  std::string tmp_;
  int fd_;
  bool committed_ = false;
};

}  // namespace lede::checkpoint

#endif  // LEDE_SHARED_CHECKPOINT_MAPPED_FILE_H_
