// File: shared/checkpoint/mapped_file.h
//
// The two file primitives of checkpoint readers and writers, torch-free:
// a read-only memory mapping of a whole file (the engine wraps float32 data
// in place, zero copy), and zero padding for shared/file's streamed atomic
// writer.
#ifndef LEDE_SHARED_CHECKPOINT_MAPPED_FILE_H_
#define LEDE_SHARED_CHECKPOINT_MAPPED_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "shared/file/file.h"
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

// Drops this process's resident pages of [data, data + size) when the range
// lies inside a live MappedFile (madvise MADV_DONTNEED on the whole pages
// inside it): the data stays readable and a later read faults the pages back
// in from the page cache, but they stop counting in the resident set. Used by
// LlamaModel once it has converted a mapped matrix into its packed form, so
// that the file's pages and the packed copy are not resident together.
// Returns whether any pages were released; a range outside every mapping
// (heap memory, a freed mapping) is left alone and returns false.
// Thread-safe (a registry of live mappings under a mutex).
bool ReleaseMappedPages(const void* data, size_t size);

// Streamed atomic writes are shared/file's AtomicFileWriter (temporary file
// beside the destination, fsync, rename, fsync of the directory).
using AtomicFile = file::AtomicFileWriter;

// Appends n zero bytes to `out`. Errors: kInternal on a failed write.
Status WriteZeros(AtomicFile& out, size_t n);

}  // namespace lede::checkpoint

#endif  // LEDE_SHARED_CHECKPOINT_MAPPED_FILE_H_
